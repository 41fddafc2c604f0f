//! The expiry path apart: `BENCH_EXPIRY_KEYS` leases (default 200,000) that all come due at one
//! deadline, against as many `SET k v PX` keys that Redis's own active expiry removes, on the same
//! server after a FLUSHALL, with no other traffic. Measured: how long after the deadline until every
//! key is gone (DBSIZE), and the server's CPU (`INFO cpu`, user + sys) from just before the
//! deadline until then, less its idle CPU over as long. Redis's active expiry is sampled and
//! adaptive (`hz`, `active-expire-effort`, and a fast cycle each time the event loop wakes); dlock's
//! is its own timer, in slices of at most 2 ms.

use std::thread;
use std::time::{Duration, Instant};

use dlock_testkit::{Server, info_value};

use crate::harness::{Result, flush};
use crate::report::{Report, ratio};
use crate::schemes::TOKEN;

/// How often DBSIZE is polled while the keys drain (each poll wakes the server's event loop).
const POLL: Duration = Duration::from_millis(10);
/// Keys sent per pipeline while loading (each batch's ttl aims at the one deadline).
const BATCH: u64 = 1_000;
/// How long the idle CPU is measured before loading.
const IDLE: Duration = Duration::from_secs(1);
/// Drains of each scheme (alternating, Redis first); each figure is the median.
const ROUNDS: usize = 3;

/// The expiry table: Redis's own expiry of `SET k v PX` keys, then dlock's of leases.
pub fn run(server: &Server, report: &mut Report, keys: u64) -> Result<()> {
    report.section(&format!(
        "Expiry path: {keys} leases coming due at one deadline, on an otherwise idle server"
    ));
    report.header(&[
        "expiry",
        "all gone after deadline (s)",
        "server CPU draining (ms)",
        "CPU per expired key (µs)",
    ]);
    let (mut redis, mut dlock) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        redis.push(drain(server, keys, false)?);
        dlock.push(drain(server, keys, true)?);
    }
    let (redis, dlock) = (Drained::median(redis), Drained::median(dlock));
    for (label, drained) in
        [("SET k v PX (Redis's own expiry)", &redis), ("DLOCK.ACQUIRE (dlock's timer)", &dlock)]
    {
        report.row(&[
            label.to_owned(),
            format!("{:.3}", drained.gone_after_s),
            format!("{:.1}", drained.cpu_s * 1e3),
            format!("{:.2}", drained.cpu_s * 1e6 / keys as f64),
        ]);
    }
    report.row(&[
        "dlock / Redis".to_owned(),
        ratio(dlock.gone_after_s, redis.gone_after_s),
        ratio(dlock.cpu_s, redis.cpu_s),
        ratio(dlock.cpu_s, redis.cpu_s),
    ]);
    let mut con = server.try_client()?;
    let config = |con: &mut redis::Connection, name: &str| -> String {
        redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query::<Vec<String>>(con)
            .ok()
            .and_then(|pair| pair.get(1).cloned())
            .unwrap_or_else(|| "?".to_owned())
    };
    report.note(&format!(
        "Each figure is the median of {ROUNDS} drains, the two schemes alternating (Redis first), \
         each after a FLUSHALL; leases and PX aim at one deadline {:.1} s after loading starts. The server's `hz` is {}, `active-expire-effort` {} (Redis \
         expires in serverCron and in a fast cycle when the event loop wakes, here by a DBSIZE \
         poll every {} ms). CPU is `used_cpu_user + used_cpu_sys` from {} ms before the deadline \
         until DBSIZE reads 0, less the idle CPU of the same span (measured for 1 s before \
         each drain, polled the same way: {:.2} ms/s before Redis's, {:.2} ms/s before \
         dlock's). No replica and no AOF: what each expiry propagates costs little here.",
        budget(keys).as_secs_f64(),
        config(&mut con, "hz"),
        config(&mut con, "active-expire-effort"),
        POLL.as_millis(),
        LEAD.as_millis(),
        redis.idle_ms_per_s,
        dlock.idle_ms_per_s,
    ));
    flush(server)
}

/// How long before the deadline the CPU is first read.
const LEAD: Duration = Duration::from_millis(20);

/// From the start of loading to the deadline: 2 s, plus 10 µs a key to load them.
fn budget(keys: u64) -> Duration {
    Duration::from_secs(2) + Duration::from_micros(10 * keys)
}

struct Drained {
    /// From the deadline until DBSIZE read 0.
    gone_after_s: f64,
    /// Server CPU from just before the deadline until then, less the idle CPU of as long.
    cpu_s: f64,
    /// The idle CPU rate subtracted.
    idle_ms_per_s: f64,
}

impl Drained {
    /// Each figure's median over `drains` (figure by figure).
    fn median(drains: Vec<Self>) -> Self {
        let median = |figure: fn(&Self) -> f64| {
            let mut values: Vec<f64> = drains.iter().map(figure).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        Self {
            gone_after_s: median(|d| d.gone_after_s),
            cpu_s: median(|d| d.cpu_s),
            idle_ms_per_s: median(|d| d.idle_ms_per_s),
        }
    }
}

/// Loads `keys` leases (`dlock`) or `SET k v PX` keys due at one deadline, then waits for them
/// to go.
fn drain(server: &Server, keys: u64, dlock: bool) -> Result<Drained> {
    flush(server)?;
    let mut con = server.try_client()?;
    // The idle rate, polled as the drain will be.
    let (idle_from, idle_cpu) = (Instant::now(), cpu(&mut con)?);
    while idle_from.elapsed() < IDLE {
        redis::cmd("DBSIZE").query::<u64>(&mut con)?;
        thread::sleep(POLL);
    }
    let idle_rate = (cpu(&mut con)? - idle_cpu) / idle_from.elapsed().as_secs_f64();
    let deadline = Instant::now() + budget(keys);
    for batch in 0..keys.div_ceil(BATCH) {
        let ttl = deadline.saturating_duration_since(Instant::now()).as_millis().max(1) as u64;
        let mut pipe = redis::pipe();
        for i in batch * BATCH..((batch + 1) * BATCH).min(keys) {
            let key = format!("expiry:{i}");
            if dlock {
                pipe.cmd("DLOCK.ACQUIRE").arg(key).arg(TOKEN).arg(ttl);
            } else {
                pipe.cmd("SET").arg(key).arg(TOKEN).arg("PX").arg(ttl);
            }
        }
        pipe.query::<redis::Value>(&mut con)?;
    }
    let loaded: u64 = redis::cmd("DBSIZE").query(&mut con)?;
    if Instant::now() + LEAD > deadline || loaded != keys {
        return Err(format!(
            "expiry: {loaded} of {keys} keys loaded, {} ms before the deadline (budget {} ms): \
             lower BENCH_EXPIRY_KEYS",
            deadline.saturating_duration_since(Instant::now()).as_millis(),
            budget(keys).as_millis()
        )
        .into());
    }
    thread::sleep(deadline.saturating_duration_since(Instant::now() + LEAD));
    let (from, cpu_before) = (Instant::now(), cpu(&mut con)?);
    let gone_at = loop {
        if redis::cmd("DBSIZE").query::<u64>(&mut con)? == 0 {
            break Instant::now();
        }
        if Instant::now() > deadline + Duration::from_secs(60) {
            return Err("expiry: keys still present a minute after their deadline".into());
        }
        thread::sleep(POLL);
    };
    let spent = cpu(&mut con)? - cpu_before;
    Ok(Drained {
        gone_after_s: gone_at.saturating_duration_since(deadline).as_secs_f64(),
        cpu_s: (spent - idle_rate * from.elapsed().as_secs_f64()).max(0.0),
        idle_ms_per_s: idle_rate * 1e3,
    })
}

/// The server's CPU so far, user + sys, in seconds.
fn cpu(con: &mut redis::Connection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query(con)?;
    let field = |name| -> Result<f64> {
        Ok(info_value(&info, name).ok_or_else(|| format!("no {name} in INFO cpu"))?.parse()?)
    };
    Ok(field("used_cpu_user")? + field("used_cpu_sys")?)
}
