//! Many waiters timing out on one resource: the worst PING while 19,000 `ACQUIRE … WAIT` calls on
//! one held resource time out, against as many `BLPOP` calls on one empty list timing out, in
//! the same run. Joining, leaving and timing out must cost O(log n) per waiter, not a scan of
//! the queue, or the server stalls for every client while the line drains.
//!
//! And what a blocked client costs the server: `used_memory` per client blocked in `BLPOP`, in
//! `FLOOR.BLOCK` (the least a module can do to block, `bench/floor`) and in `ACQUIRE … WAIT`;
//! what stays allocated after they disconnect; and what a standing ticket (`QUEUE`) costs.

use std::io::Write as _;
use std::net::TcpStream;
use std::thread::sleep;
use std::time::{Duration, Instant};

use dlock_testkit::{Server, info_value, resp_command};
use redis::Connection;

use crate::harness::{Result, flush, settled_memory, used_memory_on};
use crate::report::{Report, ratio};

/// Waiters per case: below the bench server's `maxclients` (19,900) and the open-file limit of
/// these machines (20,000 per process, which the server and this client each need one of per
/// connection).
const WAITERS: usize = 19_000;
/// How long each waits, in ms; they all join within about this long.
const WAIT_MS: u64 = 2_000;

/// Clients blocked at once in each case of the memory tables.
const BLOCKED: usize = 3_000;
/// How long the blocked clients stand before the settled figure: the server frees an idle
/// connection's query buffer after 2 s and shrinks its reply buffer when the peak it tracks
/// over 5 s allows (`clientsCron`), so before that a blocked client looks larger than it stays.
const SETTLE: Duration = Duration::from_secs(6);
/// When, after the last of them disconnected, what they left is read.
const DRAIN_MARKS_S: [u64; 4] = [0, 1, 5, 10];

/// The waiters tables: memory first, on a server no crowd has used yet (the server keeps a pool
/// of the clients it creates for module-blocked clients, which the PING case would fill).
pub fn run(server: &Server, report: &mut Report) -> Result<()> {
    memory(server, report)?;
    // Until the server has trimmed the pool the memory tables filled.
    settled_memory(&mut server.try_client()?)?;
    report.section(&format!(
        "{WAITERS} waiters timing out on one resource (worst PING while they join and time out)"
    ));
    report.header(&[
        "BLPOP on one empty list",
        "DLOCK.ACQUIRE … WAIT on one held lock",
        "dlock / BLPOP",
    ]);
    let blpop_timeout = (WAIT_MS / 1_000).to_string();
    let blpop =
        worst_ping(server, |_| resp_command(&[b"BLPOP", b"empty", blpop_timeout.as_bytes()]))?;
    let dlock = {
        let mut con = server.try_client()?;
        let _: Option<i64> =
            redis::cmd("DLOCK.ACQUIRE").arg("one").arg("holder").arg(600_000).query(&mut con)?;
        let wait_ms = WAIT_MS.to_string();
        worst_ping(server, |i| {
            let token = format!("waiter-{i}");
            resp_command(&[
                b"DLOCK.ACQUIRE",
                b"one",
                token.as_bytes(),
                b"60000",
                b"WAIT",
                wait_ms.as_bytes(),
            ])
        })?
    };
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1_000.0);
    report.row(&[ms(blpop), ms(dlock), ratio(dlock.as_secs_f64(), blpop.as_secs_f64())]);
    report.note(
        "Each waiter is a connection of its own that sends its command and reads nothing; the \
         worst PING is taken over the joins and the time-outs.",
    );
    flush(server)
}

/// Opens [`WAITERS`] connections sending `request(i)`, and returns the worst PING round trip
/// seen from the first join until every waiter has timed out.
fn worst_ping(server: &Server, request: impl Fn(usize) -> Vec<u8>) -> Result<Duration> {
    let mut probe = server.try_client()?;
    let mut worst = Duration::ZERO;
    let mut ping = |worst: &mut Duration| -> Result<()> {
        let started = Instant::now();
        let _: String = redis::cmd("PING").query(&mut probe)?;
        *worst = (*worst).max(started.elapsed());
        Ok(())
    };
    let mut waiters = Vec::with_capacity(WAITERS);
    for i in 0..WAITERS {
        let mut socket = TcpStream::connect(("127.0.0.1", server.port))?;
        socket.write_all(&request(i))?;
        waiters.push(socket);
        if i % 500 == 0 {
            ping(&mut worst)?;
        }
    }
    let until = Instant::now() + Duration::from_millis(WAIT_MS + 1_500);
    while Instant::now() < until {
        ping(&mut worst)?;
        sleep(Duration::from_millis(1));
    }
    drop(waiters);
    // Let the server see the disconnections before the next case.
    let mut con = server.try_client()?;
    for _ in 0..200 {
        let info: String = redis::cmd("INFO").arg("clients").query(&mut con)?;
        if info_value(&info, "connected_clients").and_then(|n| n.parse::<usize>().ok()) < Some(10) {
            break;
        }
        sleep(Duration::from_millis(10));
    }
    Ok(worst)
}

/// What one case of the memory tables measured.
struct Cost {
    /// KB per blocked client right after the last one joined, and once settled.
    joined_kb: f64,
    settled_kb: f64,
    /// MB above the starting point at each of [`DRAIN_MARKS_S`] after they all disconnected.
    left_mb: Vec<f64>,
}

/// The memory tables: per blocked client, what stays after a crowd leaves, and per ticket.
pub fn memory(server: &Server, report: &mut Report) -> Result<()> {
    flush(server)?;
    let mut probe = server.try_client()?;
    let blpop = blocked_cost(server, &mut probe, |_| resp_command(&[b"BLPOP", b"empty", b"0"]))?;
    let bare = if floor_loaded(&mut probe)? {
        Some(blocked_cost(server, &mut probe, |_| resp_command(&[b"FLOOR.BLOCK"]))?)
    } else {
        None
    };
    let _: Option<i64> =
        redis::cmd("DLOCK.ACQUIRE").arg("held").arg("holder").arg(600_000).query(&mut probe)?;
    let wait = blocked_cost(server, &mut probe, |i| {
        let token = format!("waiter-{i}");
        resp_command(&[b"DLOCK.ACQUIRE", b"held", token.as_bytes(), b"60000", b"WAIT", b"0"])
    })?;
    let ticket_bytes = ticket_cost(&mut probe)?;
    flush(server)?;

    let kb = |v: f64| format!("{v:.1}");
    let floor_kb = |pick: fn(&Cost) -> f64| bare.as_ref().map_or("n/a".to_owned(), |c| kb(pick(c)));
    let own_bytes = |pick: fn(&Cost) -> f64| {
        bare.as_ref()
            .map_or("n/a".to_owned(), |c| format!("{:.0}", (pick(&wait) - pick(c)) * 1024.0))
    };
    report.section(&format!("Memory per blocked client ({BLOCKED} clients, used_memory, KB)"));
    report.header(&[
        "when",
        "BLPOP",
        "FLOOR.BLOCK (bare module block)",
        "DLOCK.ACQUIRE … WAIT",
        "WAIT / BLPOP",
        "WAIT − FLOOR.BLOCK (bytes, dlock's own)",
    ]);
    // Right after joining, each figure depends on how long the first ones have stood idle (the
    // query buffers go after 2 s), so a difference of two of them is noise: only the settled
    // row gives dlock's own share.
    let settled = format!("settled ({} s later)", SETTLE.as_secs());
    for (when, pick, own) in [
        ("right after the last joined", (|c: &Cost| c.joined_kb) as fn(&Cost) -> f64, false),
        (settled.as_str(), |c: &Cost| c.settled_kb, true),
    ] {
        report.row(&[
            when.to_owned(),
            kb(pick(&blpop)),
            floor_kb(pick),
            kb(pick(&wait)),
            ratio(pick(&wait), pick(&blpop)),
            if own { own_bytes(pick) } else { "—".to_owned() },
        ]);
    }
    report.note(&format!(
        "A standing ticket (`ACQUIRE … QUEUE`, {BLOCKED} on one held lock) costs {ticket_bytes:.0} \
         bytes, a settled waiter {} as much, and a ticket needs no connection of its own.",
        ratio(wait.settled_kb * 1024.0, ticket_bytes)
    ));

    report.section(&format!(
        "Memory left after {BLOCKED} blocked clients disconnect (MB above the start)"
    ));
    let marks: Vec<String> = DRAIN_MARKS_S.iter().map(|s| format!("after {s} s")).collect();
    let mut columns = vec!["blocked in"];
    columns.extend(marks.iter().map(String::as_str));
    report.header(&columns);
    let mut rows = vec![("BLPOP", &blpop), ("DLOCK.ACQUIRE … WAIT", &wait)];
    if let Some(bare) = &bare {
        rows.insert(1, ("FLOOR.BLOCK", bare));
    }
    for (name, cost) in rows {
        let left = cost.left_mb.iter().map(|v| format!("{v:.1}"));
        report.row(&std::iter::once(name.to_owned()).chain(left).collect::<Vec<_>>());
    }
    report.note(
        "The server gives every module-blocked client two clients of its own (a reply client and \
         a thread-safe-context client, 16 KB reply buffer each) and, once unblocked, keeps them \
         in a pool it trims by at most 50 every 100 ms; docs/benchmarks.md has the sources.",
    );
    Ok(())
}

/// Blocks [`BLOCKED`] connections with `request(i)` and measures them, then disconnects them
/// all and reads what stays.
fn blocked_cost(
    server: &Server,
    probe: &mut Connection,
    request: impl Fn(usize) -> Vec<u8>,
) -> Result<Cost> {
    let before = settled_memory(probe)?;
    let mut crowd = Vec::with_capacity(BLOCKED);
    for i in 0..BLOCKED {
        let mut socket = TcpStream::connect(("127.0.0.1", server.port))?;
        socket.write_all(&request(i))?;
        crowd.push(socket);
    }
    wait_until(probe, "blocked_clients", |n| n >= BLOCKED)?;
    let per_client_kb = |bytes: f64| (bytes - before) / BLOCKED as f64 / 1024.0;
    let joined_kb = per_client_kb(used_memory_on(probe)?);
    sleep(SETTLE);
    let settled_kb = per_client_kb(used_memory_on(probe)?);
    drop(crowd);
    wait_until(probe, "connected_clients", |n| n <= 1)?;
    let gone = Instant::now();
    let mut left_mb = Vec::new();
    for mark in DRAIN_MARKS_S {
        sleep(Duration::from_secs(mark).saturating_sub(gone.elapsed()));
        left_mb.push((used_memory_on(probe)? - before) / 1e6);
    }
    Ok(Cost { joined_kb, settled_kb, left_mb })
}

/// Bytes per standing ticket: [`BLOCKED`] tokens queue on one held lock.
fn ticket_cost(probe: &mut Connection) -> Result<f64> {
    let _: Option<i64> =
        redis::cmd("DLOCK.ACQUIRE").arg("ticketed").arg("holder").arg(600_000).query(probe)?;
    let before = settled_memory(probe)?;
    let mut pipe = redis::pipe();
    for i in 0..BLOCKED {
        pipe.cmd("DLOCK.ACQUIRE").arg("ticketed").arg(format!("ticket-{i}")).arg(60_000);
        pipe.arg("QUEUE").arg(600_000).ignore();
    }
    pipe.query::<()>(probe)?;
    Ok((used_memory_on(probe)? - before) / BLOCKED as f64)
}

/// Whether `FLOOR.BLOCK` is there (`bench/floor` was built next to the module).
fn floor_loaded(probe: &mut Connection) -> Result<bool> {
    let info: Vec<redis::Value> =
        redis::cmd("COMMAND").arg("INFO").arg("floor.block").query(probe)?;
    Ok(info.iter().any(|entry| !matches!(entry, redis::Value::Nil)))
}

/// Waits (up to 30 s) until the `INFO clients` field `field` satisfies `done`.
fn wait_until(probe: &mut Connection, field: &str, done: impl Fn(usize) -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info: String = redis::cmd("INFO").arg("clients").query(probe)?;
        if info_value(&info, field).and_then(|n| n.parse().ok()).is_some_and(&done) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{field} never reached its mark").into());
        }
        sleep(Duration::from_millis(5));
    }
}
