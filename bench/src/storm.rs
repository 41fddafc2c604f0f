//! An expiry storm: a million leases whose deadlines fall within one second, and how long PING
//! and a lock take meanwhile; and the same for 100,000 `QUEUE` tickets lapsing within one second
//! (on as many resources, and on one).

use std::thread;
use std::time::{Duration, Instant};

use dlock_testkit::{Rng, Server};

use dlock_testkit::info_line;

use crate::harness::{Result, flush};
use crate::report::{Report, percentile};
use crate::schemes::TOKEN;

/// The expiry storm table: Redis's own expiry of SET NX PX keys, then dlock's sweep.
pub fn run(server: &Server, report: &mut Report, storm_leases: u64) -> Result<()> {
    report.section(&format!("Expiry storm ({storm_leases} leases expiring within one second)"));
    report.header(&[
        "leases",
        "PING p99 ms",
        "PING max ms",
        "lock p99 ms",
        "lock max ms",
        "all gone after last deadline (s)",
    ]);
    let mut gone = Vec::new();
    for (label, dlock) in [("SET NX PX (Redis's own expiry)", false), ("DLOCK.ACQUIRE", true)] {
        let load = Load {
            dlock,
            setup: &|_| Ok(()),
            add: &|pipe, i, ttl| {
                if dlock {
                    pipe.cmd("DLOCK.ACQUIRE").arg(format!("storm:{i}")).arg(TOKEN).arg(ttl);
                } else {
                    pipe.cmd("SET")
                        .arg(format!("storm:{i}"))
                        .arg(TOKEN)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl);
                }
            },
            left: &|con| Ok(redis::cmd("DBSIZE").query(con)?),
        };
        let storm = storm(server, storm_leases, &load)?;
        report.row(&[
            label.to_owned(),
            format!("{:.2}", storm.ping_p99_ms),
            format!("{:.2}", storm.ping_max_ms),
            format!("{:.2}", storm.acquire_p99_ms),
            format!("{:.2}", storm.acquire_max_ms),
            format!("{:.2}", storm.gone_after_s),
        ]);
        gone.push(storm.gone_after_s);
    }
    report.note(&format!(
        "Redis's own expiry of SET NX PX keys takes {:.1}× as long as dlock's sweep.",
        gone[0] / gone[1].max(0.001)
    ));
    Ok(())
}

/// The lapsing-ticket storm table: `tickets` tickets whose lapses fall within one second, on as
/// many resources (each held, one ticket each) and on one held resource.
pub fn run_tickets(server: &Server, report: &mut Report, tickets: u64) -> Result<()> {
    report.section(&format!(
        "Lapsing-ticket storm ({tickets} QUEUE tickets lapsing within one second)"
    ));
    report.header(&[
        "tickets",
        "PING p99 ms",
        "PING max ms",
        "lock p99 ms",
        "lock max ms",
        "all lapsed after last deadline (s)",
    ]);
    let hold = |pipe: &mut redis::Pipeline, key: String| {
        pipe.cmd("DLOCK.ACQUIRE").arg(key).arg("holder").arg(3_600_000);
    };
    let ticket = |pipe: &mut redis::Pipeline, key: String, i: u64, ttl: u64| {
        pipe.cmd("DLOCK.ACQUIRE")
            .arg(key)
            .arg(format!("ticket-{i:029}"))
            .arg(60_000)
            .arg("QUEUE")
            .arg(ttl);
    };
    let standing = |con: &mut redis::Connection| -> Result<i64> {
        let n = info_line(con, "dlock", "dlock_tickets").ok_or("no dlock_tickets in INFO")?;
        Ok(n.parse()?)
    };
    let mut worst: f64 = 0.0;
    let many = Load {
        dlock: true,
        setup: &|con| {
            for batch in 0..tickets.div_ceil(10_000) {
                let mut pipe = redis::pipe();
                for i in batch * 10_000..((batch + 1) * 10_000).min(tickets) {
                    hold(&mut pipe, format!("storm:{i}"));
                }
                pipe.query::<redis::Value>(con)?;
            }
            Ok(())
        },
        add: &|pipe, i, ttl| ticket(pipe, format!("storm:{i}"), i, ttl),
        left: &standing,
    };
    let one = Load {
        dlock: true,
        setup: &|con| {
            let mut pipe = redis::pipe();
            hold(&mut pipe, "line".to_owned());
            pipe.query::<redis::Value>(con)?;
            Ok(())
        },
        add: &|pipe, i, ttl| ticket(pipe, "line".to_owned(), i, ttl),
        left: &standing,
    };
    for (label, load) in [
        (format!("{tickets} resources × 1 ticket"), &many),
        (format!("1 resource × {tickets} tickets"), &one),
    ] {
        let storm = storm(server, tickets, load)?;
        report.row(&[
            label,
            format!("{:.2}", storm.ping_p99_ms),
            format!("{:.2}", storm.ping_max_ms),
            format!("{:.2}", storm.acquire_p99_ms),
            format!("{:.2}", storm.acquire_max_ms),
            format!("{:.2}", storm.gone_after_s),
        ]);
        worst = worst.max(storm.ping_max_ms).max(storm.acquire_max_ms);
    }
    report.note(&format!(
        "Each resource is held for an hour, so its tickets can only lapse; the lock probe is \
         DLOCK.ACQUIRE and RELEASE of a fresh key, every millisecond beside a PING. Worst stall \
         seen: {worst:.2} ms (target: nothing over 10 ms)."
    ));
    flush(server)
}

/// What a storm loads, and how to tell it is over.
struct Load<'a> {
    /// Probe with `DLOCK.ACQUIRE` (else `SET NX PX`).
    dlock: bool,
    /// Run before the deadlines are fixed (what the storm's entries need in place).
    setup: &'a dyn Fn(&mut redis::Connection) -> Result<()>,
    /// Adds entry `i`, to end in `ttl` ms.
    add: &'a dyn Fn(&mut redis::Pipeline, u64, u64),
    /// How many entries are left.
    left: &'a dyn Fn(&mut redis::Connection) -> Result<i64>,
}

struct Storm {
    ping_p99_ms: f64,
    ping_max_ms: f64,
    acquire_p99_ms: f64,
    acquire_max_ms: f64,
    gone_after_s: f64,
}

/// `leases` entries (leases, or tickets) whose deadlines all fall within one second; probes
/// latency meanwhile. Plain `SET NX PX` keys, which Redis's own active expiry removes, are the
/// baseline.
fn storm(server: &Server, leases: u64, load: &Load) -> Result<Storm> {
    flush(server)?;
    let mut con = server.try_client()?;
    (load.setup)(&mut con)?;
    let dlock = load.dlock;
    // Leave time to load them all: about 5 µs a lease here, with a wide margin.
    let load_budget = Duration::from_millis(3_000 + leases / 100);
    let first_deadline = Instant::now() + load_budget;
    let mut rng = Rng::new(42);
    for batch in 0..leases.div_ceil(10_000) {
        let mut pipe = redis::pipe();
        for i in batch * 10_000..((batch + 1) * 10_000).min(leases) {
            let deadline = first_deadline + Duration::from_millis(rng.next() % 1_000);
            let ttl = deadline.saturating_duration_since(Instant::now()).as_millis().max(1) as u64;
            (load.add)(&mut pipe, i, ttl);
        }
        pipe.query::<redis::Value>(&mut con)?;
    }
    let last_deadline = first_deadline + Duration::from_secs(1);
    let (mut pings, mut acquires) = (Vec::new(), Vec::new());
    thread::sleep(
        first_deadline.saturating_duration_since(Instant::now() + Duration::from_millis(200)),
    );
    let mut probe = 0u64;
    let gone_at = loop {
        let sent = Instant::now();
        redis::cmd("PING").query::<String>(&mut con)?;
        pings.push(sent.elapsed().as_secs_f64() * 1_000.0);
        let sent = Instant::now();
        let key = format!("probe:{probe}");
        if dlock {
            redis::cmd("DLOCK.ACQUIRE")
                .arg(&key)
                .arg(TOKEN)
                .arg(1_000)
                .query::<Option<i64>>(&mut con)?;
            acquires.push(sent.elapsed().as_secs_f64() * 1_000.0);
            redis::cmd("DLOCK.RELEASE").arg(&key).arg(TOKEN).query::<i64>(&mut con)?;
        } else {
            redis::cmd("SET")
                .arg(&key)
                .arg(TOKEN)
                .arg("NX")
                .arg("PX")
                .arg(1_000)
                .query::<Option<String>>(&mut con)?;
            acquires.push(sent.elapsed().as_secs_f64() * 1_000.0);
            redis::cmd("DEL").arg(&key).query::<i64>(&mut con)?;
        }
        probe += 1;
        if Instant::now() > last_deadline && probe.is_multiple_of(10) {
            if (load.left)(&mut con)? == 0 {
                break Instant::now();
            }
            if Instant::now() > last_deadline + Duration::from_secs(60) {
                return Err("entries still present a minute after their deadline".into());
            }
        }
        thread::sleep(Duration::from_millis(1));
    };
    pings.sort_by(f64::total_cmp);
    acquires.sort_by(f64::total_cmp);
    Ok(Storm {
        ping_p99_ms: percentile(&pings, 99.0),
        ping_max_ms: pings.last().copied().unwrap_or_default(),
        acquire_p99_ms: percentile(&acquires, 99.0),
        acquire_max_ms: acquires.last().copied().unwrap_or_default(),
        gone_after_s: gone_at.saturating_duration_since(last_deadline).as_secs_f64(),
    })
}
