//! Contended hand-over: 16 workers take turns on one resource, with a retry loop (exponential
//! backoff and jitter) against `DLOCK.ACQUIRE … WAIT`.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use dlock_testkit::Server;

use crate::harness::{Result, client_token, flush, run_clients};
use crate::report::{Report, fmt_rate, percentile, ratio};
use crate::schemes::{LUA_ACQUIRE, LUA_RELEASE, Scheme, lock, unlock};

/// The contended hand-over table.
pub fn run(server: &Server, report: &mut Report, seconds: u64) -> Result<()> {
    report.section("Contended hand-over (16 workers, one resource, 1 ms of work each)");
    report.header(&["scheme", "critical sections/s", "wait p50 ms", "wait p99 ms"]);
    let backoff = contended(server, false, seconds.max(3))?;
    let wait = contended(server, true, seconds.max(3))?;
    for (name, result) in
        [("retry loop, exponential backoff + jitter", &backoff), ("DLOCK.ACQUIRE … WAIT", &wait)]
    {
        report.row(&[
            name.to_owned(),
            fmt_rate(result.rate),
            format!("{:.2}", result.p50_ms),
            format!("{:.2}", result.p99_ms),
        ]);
    }
    report.note(&format!("WAIT / backoff rate: {}", ratio(wait.rate, backoff.rate)));
    flush(server)?;
    Ok(())
}

struct Contention {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// 16 workers take turns on one resource, ~1 ms of work each.
fn contended(server: &Server, wait: bool, seconds: u64) -> Result<Contention> {
    flush(server)?;
    let waits = Arc::new(std::sync::Mutex::new(Vec::<f64>::new()));
    let recorded = waits.clone();
    let started = Instant::now();
    let done = run_clients(server, 16, seconds, move |con, rng, running| {
        let (acquire, release) = (redis::Script::new(LUA_ACQUIRE), redis::Script::new(LUA_RELEASE));
        let token = client_token(rng);
        let mut mine = Vec::new();
        while running() {
            let asked = Instant::now();
            if wait {
                let fence: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
                    .arg("hot")
                    .arg(&token)
                    .arg(5_000)
                    .arg("WAIT")
                    .arg(2_000)
                    .query(con)?;
                if fence.is_none() {
                    continue;
                }
            } else {
                let mut backoff_us = 1_000u64;
                while !lock(con, Scheme::Lua, "hot", &token, 5_000, &acquire)? {
                    if !running() {
                        return Ok(0);
                    }
                    let jitter = rng.next() % backoff_us;
                    thread::sleep(Duration::from_micros(backoff_us + jitter));
                    backoff_us = (backoff_us * 2).min(64_000);
                }
            }
            mine.push(asked.elapsed().as_secs_f64() * 1_000.0);
            thread::sleep(Duration::from_millis(1)); // the work
            let scheme = if wait { Scheme::Dlock } else { Scheme::Lua };
            unlock(con, scheme, "hot", &token, &release)?;
        }
        let count = mine.len() as u64;
        recorded.lock().map_err(|_| "poisoned")?.extend(mine);
        Ok(count)
    })?;
    let rate = done as f64 / started.elapsed().as_secs_f64();
    let mut waits = waits.lock().map_err(|_| "poisoned")?.clone();
    waits.sort_by(f64::total_cmp);
    Ok(Contention { rate, p50_ms: percentile(&waits, 50.0), p99_ms: percentile(&waits, 99.0) })
}
