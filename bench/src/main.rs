//! `make bench`: dlock against what users would do instead, measured side by side in one run on
//! one server, reported as ratios (these machines are noisy; no absolute figure stands alone).
//!
//! Environment: `BENCH_SECONDS` (per case, default 3), `BENCH_HANDOVER_SECONDS` (per hand-over
//! scheme, default `BENCH_SECONDS`), `BENCH_HANDOVER_WORKERS` (default 16),
//! `BENCH_STORM_LEASES` (default 1000000),
//! `BENCH_STORM_TICKETS` (default 100000), `BENCH_SCALE_SHARED_MAX` (most shared holders the
//! scale table stands up, default 10000), `BENCH_V1_MODULE` (the version-1 module to compare
//! against; `make bench` builds it with `scripts/v1-module.sh`), `BENCH_OUT` (default
//! `bench/results.md`), `DLOCK_MODULE` (default target/release/libdlock.so), `BENCH_ONLY`
//! (`throughput`, `versions`, `handover`, `memory`, `waiters`, `waiter-memory` (the memory half
//! of `waiters`), `shared`, `scale`, `storm` or `ticketstorm`: run only that section). The server is the `redis-server` on the PATH.
//!
//! One file per scenario (`throughput`, `versions`, `cycles`, `handover`, `memory`, `waiters`,
//! `shared`, `scale`, `storm` with the lapsing-ticket storm), each writing its table; `schemes`
//! is what each lock scheme sends, `harness` the server, the client threads and the PING probe,
//! `report` the markdown.

mod cycles;
mod handover;
mod harness;
mod memory;
mod report;
mod scale;
mod schemes;
mod shared;
mod storm;
mod throughput;
mod versions;
mod waiters;

use harness::Result;
use report::Report;

fn main() -> Result<()> {
    let seconds: u64 = env_or("BENCH_SECONDS", 3);
    let storm_leases: u64 = env_or("BENCH_STORM_LEASES", 1_000_000);
    let storm_tickets: u64 = env_or("BENCH_STORM_TICKETS", 100_000);
    let server = harness::start_server()?;
    let mut report = Report::new(&server)?;
    // BENCH_ONLY=storm runs just the expiry storm (for profiling the sweep); BENCH_ONLY=memory
    // and BENCH_ONLY=throughput just those comparisons.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only == "memory" {
        memory::run(&server, &mut report)?;
        return report.finish();
    }
    if only == "waiters" {
        waiters::run(&server, &mut report)?;
        return report.finish();
    }
    if only == "waiter-memory" {
        waiters::memory(&server, &mut report)?;
        return report.finish();
    }
    if only == "shared" {
        shared::run(&server, &mut report, seconds)?;
        return report.finish();
    }
    let handover_seconds: u64 = env_or("BENCH_HANDOVER_SECONDS", seconds);
    if only == "handover" {
        handover::run(&server, &mut report, handover_seconds)?;
        return report.finish();
    }
    if only == "scale" {
        scale::run(&server, &mut report)?;
        return report.finish();
    }
    if only == "ticketstorm" {
        storm::run_tickets(&server, &mut report, storm_tickets)?;
        return report.finish();
    }
    if only == "versions" {
        versions::run(&server, &mut report, seconds)?;
        return report.finish();
    }
    if only == "throughput" {
        throughput::run(&server, &mut report, seconds)?;
        return report.finish();
    }
    if only != "storm" {
        throughput::run(&server, &mut report, seconds)?;
        versions::run(&server, &mut report, seconds)?;
        cycles::run(&server, &mut report, seconds)?;
        handover::run(&server, &mut report, handover_seconds)?;
        memory::run(&server, &mut report)?;
        waiters::run(&server, &mut report)?;
        shared::run(&server, &mut report, seconds)?;
        scale::run(&server, &mut report)?;
    }
    storm::run(&server, &mut report, storm_leases)?;
    if only != "storm" {
        storm::run_tickets(&server, &mut report, storm_tickets)?;
    }
    report.finish()
}

pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
