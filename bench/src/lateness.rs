//! How late the module acts on a deadline: a `WAIT` that times out, and a lease that ends with a
//! waiter in line, on every server in `BENCH_LATENESS_SERVERS` (server binaries, separated by
//! spaces; default `redis-server`) at `hz` 1, 10 and 100. A deadline is set by the module's own
//! timer, never by the server's cron (`hz`), so the lateness should not depend on `hz`: the
//! target is 2 ms at the median everywhere.
//!
//! Each sample times one deadline from the client: the `WAIT` of `ACQUIRE … WAIT t` on a held
//! lock (its answer comes `t` after the command reached the server), and a waiter's grant after
//! the holder's lease of `t` ran out (measured from the holder's reply). Lateness is the time past
//! `t` (a little of it is the round trip on this machine: the `PING` row measures that).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use dlock_testkit::{Launch, Server, info_value};

use crate::harness::Result;
use crate::report::{Report, percentile};

/// Deadlines measured, in milliseconds: not multiples of each other, so that no `hz` lines up.
const DEADLINES_MS: [u64; 5] = [23, 37, 51, 67, 89];
/// Samples per deadline and kind.
const ROUNDS: usize = 4;
const HZ: [u32; 3] = [1, 10, 100];

pub fn run(report: &mut Report, module: PathBuf) -> Result<()> {
    let servers = std::env::var("BENCH_LATENESS_SERVERS").unwrap_or_else(|_| "redis-server".into());
    report.section("Deadline lateness: WAIT time-outs and hand-overs, by server and hz");
    report.note(&format!(
        "Each row: {} samples per kind (deadlines of {:?} ms), time past the deadline seen by a \
         client on this machine; `ping` is one round trip, the floor of any figure here. Target: \
         2 ms late at the median on every server and hz.",
        DEADLINES_MS.len() * ROUNDS,
        DEADLINES_MS
    ));
    report.header(&[
        "server",
        "hz",
        "ping median (ms)",
        "WAIT time-out late, median (ms)",
        "p90",
        "max",
        "hand-over late, median (ms)",
        "p90",
        "max",
    ]);
    for binary in servers.split_whitespace() {
        for hz in HZ {
            let server = Launch::new()
                .binary(binary)
                .module(module.canonicalize()?)
                .args(&["--save", "", "--appendonly", "no", "--loglevel", "warning"])
                .args(&["--hz", &hz.to_string()])
                .try_start()?;
            let version = version(&server)?;
            let ping = sorted(pings(&server)?);
            let timeouts = sorted(wait_timeouts(&server)?);
            let handovers = sorted(handovers(&server)?);
            let ms = |value: f64| format!("{value:.2}");
            report.row(&[
                version,
                hz.to_string(),
                ms(percentile(&ping, 50.0)),
                ms(percentile(&timeouts, 50.0)),
                ms(percentile(&timeouts, 90.0)),
                ms(*timeouts.last().unwrap_or(&0.0)),
                ms(percentile(&handovers, 50.0)),
                ms(percentile(&handovers, 90.0)),
                ms(*handovers.last().unwrap_or(&0.0)),
            ]);
        }
    }
    Ok(())
}

fn version(server: &Server) -> Result<String> {
    let info: String = redis::cmd("INFO").arg("server").query(&mut server.try_client()?)?;
    let name = if info.contains("valkey_version") { "Valkey" } else { "Redis" };
    let version = info_value(&info, "valkey_version")
        .or_else(|| info_value(&info, "redis_version"))
        .unwrap_or("?");
    Ok(format!("{name} {version}"))
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

fn millis_past(started: Instant, deadline_ms: u64) -> f64 {
    started.elapsed().as_secs_f64() * 1_000.0 - deadline_ms as f64
}

fn pings(server: &Server) -> Result<Vec<f64>> {
    let mut con = server.try_client()?;
    let mut samples = Vec::new();
    for _ in 0..DEADLINES_MS.len() * ROUNDS {
        let started = Instant::now();
        redis::cmd("PING").query::<String>(&mut con)?;
        samples.push(millis_past(started, 0));
    }
    Ok(samples)
}

/// `ACQUIRE k w 1000 WAIT t` while another token holds `k` for a minute: answered nil at `t`.
fn wait_timeouts(server: &Server) -> Result<Vec<f64>> {
    let mut holder = server.try_client()?;
    let mut waiter = server.try_client()?;
    redis::cmd("DLOCK.ACQUIRE")
        .arg("held")
        .arg("h")
        .arg(60_000)
        .query::<Option<i64>>(&mut holder)?;
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        for deadline in DEADLINES_MS {
            settle();
            let started = Instant::now();
            let granted: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
                .arg("held")
                .arg("w")
                .arg(1_000)
                .arg("WAIT")
                .arg(deadline)
                .query(&mut waiter)?;
            if granted.is_some() {
                return Err("a WAIT on a held lock was granted".into());
            }
            samples.push(millis_past(started, deadline));
        }
    }
    Ok(samples)
}

/// A lease of `t` ms with a waiter in line: the waiter's grant comes when it ends.
fn handovers(server: &Server) -> Result<Vec<f64>> {
    let mut holder = server.try_client()?;
    let mut waiter = server.try_client()?;
    waiter.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut samples = Vec::new();
    for round in 0..ROUNDS {
        for deadline in DEADLINES_MS {
            settle();
            let resource = format!("handover:{round}:{deadline}");
            // The waiter goes first in the pipe of its own connection once the lease exists.
            let started = Instant::now();
            redis::cmd("DLOCK.ACQUIRE")
                .arg(&resource)
                .arg("holder")
                .arg(deadline)
                .query::<Option<i64>>(&mut holder)?
                .ok_or("the holder was not granted")?;
            let granted: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
                .arg(&resource)
                .arg("waiter")
                .arg(1_000)
                .arg("WAIT")
                .arg(2_000)
                .query(&mut waiter)?;
            if granted.is_none() {
                return Err("the waiter was not handed the lease".into());
            }
            samples.push(millis_past(started, deadline));
        }
    }
    Ok(samples)
}

/// A pause between samples, so that no sample starts in step with the one before.
fn settle() {
    std::thread::sleep(Duration::from_millis(7));
}
