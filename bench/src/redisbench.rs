//! The same comparison as `throughput`, measured by the system's `redis-benchmark` (from the same
//! Redis as the server) rather than by this harness: `-c 50 -r 100000` at pipeline 1 and 16, for
//! PING, `SET key NX PX` and `DLOCK.ACQUIRE`, leases and PX of an hour (none expires during a run),
//! with one token for every request (a held key drawn again is dlock's idempotent re-acquire) and
//! with a random token per request (a held key drawn again is refused, as by SET NX). Each run
//! starts from an empty server; the three commands alternate, three runs each, and the median
//! counts, so the machine's drift falls on all of them alike.

use std::process::Command;

use dlock_testkit::Server;

use crate::harness::{Result, flush};
use crate::report::{Report, fmt_rate, ratio};
use crate::schemes::HELD_MS;

/// Runs of each command per pipeline depth (alternating); the median is reported.
const REPEATS: usize = 3;
/// `redis-benchmark -r`: how many random keys the runs draw from.
const KEYSPACE: u64 = 100_000;

/// The redis-benchmark table.
pub fn run(server: &Server, report: &mut Report, seconds: u64) -> Result<()> {
    report.section(&format!(
        "redis-benchmark, leases that do not expire (-c 50 -r {KEYSPACE}, requests/s, median of \
         {REPEATS})"
    ));
    let ttl = HELD_MS.to_string();
    report.header(&[
        "pipeline",
        "token",
        "requests",
        "PING",
        "SET NX PX",
        "DLOCK.ACQUIRE",
        "dlock / SET",
    ]);
    let mut granted = Vec::new();
    for pipeline in [1u64, 16] {
        // A short SET run sizes the others to about `seconds` each (and warms the server up).
        let probe = ["SET", "key:__rand_int__", "tok", "NX", "PX", &ttl];
        let probe = redis_benchmark(server, pipeline, 50_000 * pipeline, &probe)?;
        let requests = ((probe.rate * seconds as f64) as u64).max(10_000 * pipeline);
        for token in ["tok", "tok:__rand_int__"] {
            let set = ["SET", "key:__rand_int__", token, "NX", "PX", &ttl];
            let acquire = ["DLOCK.ACQUIRE", "key:__rand_int__", token, &ttl];
            let (mut pings, mut sets, mut acquires) = (Vec::new(), Vec::new(), Vec::new());
            let (mut set_keys, mut acquire_keys) = (0, 0);
            for _ in 0..REPEATS {
                pings.push(redis_benchmark(server, pipeline, requests, &["PING"])?.rate);
                let run = redis_benchmark(server, pipeline, requests, &set)?;
                sets.push(run.rate);
                set_keys = run.keys;
                let run = redis_benchmark(server, pipeline, requests, &acquire)?;
                acquires.push(run.rate);
                acquire_keys = run.keys;
            }
            let (set, acquire) = (median(&mut sets), median(&mut acquires));
            report.row(&[
                pipeline.to_string(),
                format!("`{token}`"),
                requests.to_string(),
                fmt_rate(median(&mut pings)),
                fmt_rate(set),
                fmt_rate(acquire),
                ratio(acquire, set),
            ]);
            granted.push(format!(
                "pipeline {pipeline}, `{token}`: SET NX PX {set_keys}, dlock {acquire_keys}"
            ));
        }
    }
    report.note(&format!(
        "`redis-benchmark -c 50 -n <requests> -r {KEYSPACE} -P <pipeline> --csv <command>`, \
         commands `PING`, `SET key:__rand_int__ <token> NX PX {HELD_MS}` and `DLOCK.ACQUIRE \
         key:__rand_int__ <token> {HELD_MS}`, FLUSHALL before each run; requests sized from a \
         short SET run to take about {seconds} s. Once a key is held, a later draw of it is a \
         refusal for SET NX; for DLOCK.ACQUIRE it is the holder's idempotent re-acquire (its \
         fence again) with one token `tok` for every request, and a refusal with a random token \
         per request (`tok:__rand_int__`, as SET). Keys held after the last run: {}.",
        granted.join("; ")
    ));
    flush(server)
}

/// What one redis-benchmark run measured.
struct Run {
    /// Requests a second, as redis-benchmark reports them.
    rate: f64,
    /// Keys in the server afterwards.
    keys: u64,
}

/// One `redis-benchmark` run of `command` on an empty server.
fn redis_benchmark(server: &Server, pipeline: u64, requests: u64, command: &[&str]) -> Result<Run> {
    flush(server)?;
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string(), "-c", "50"])
        .args(["-n", &requests.to_string(), "-r", &KEYSPACE.to_string()])
        .args(["-P", &pipeline.to_string(), "--csv"])
        .args(command)
        .output()
        .map_err(|e| format!("redis-benchmark (from redis-tools, on the PATH): {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "redis-benchmark {}: {}{stdout}{}",
            command.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    // `"test","rps",…` then `"<command>","<requests/s>",…`.
    let rate = stdout
        .lines()
        .filter(|line| !line.starts_with("\"test\""))
        .find_map(|line| line.split(',').nth(1)?.trim_matches('"').parse::<f64>().ok())
        .ok_or_else(|| format!("no requests/s in redis-benchmark's output: {stdout:?}"))?;
    let keys = redis::cmd("DBSIZE").query(&mut server.try_client()?)?;
    Ok(Run { rate, keys })
}

/// The median of `values` (reordered).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
