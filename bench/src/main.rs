//! `make bench`: dlock against what users would do instead, measured side by side in one run on
//! one server, reported as ratios (these machines are noisy; no absolute figure stands alone).
//!
//! Environment: `BENCH_SECONDS` (per case, default 3), `BENCH_HANDOVER_SECONDS` (per hand-over
//! scheme, default `BENCH_SECONDS`), `BENCH_HANDOVER_WORKERS` (default 16),
//! `BENCH_STORM_LEASES` (default 1000000),
//! `BENCH_STORM_TICKETS` (default 100000), `BENCH_EXPIRY_KEYS` (leases the expiry section lets
//! lapse, default 200000), `BENCH_CROWD` (readers granted at once, default 100000), `BENCH_LATENESS_SERVERS` (server binaries the
//! lateness section starts, at hz 1, 10 and 100; default `redis-server`), `BENCH_SCALE_SHARED_MAX` (most shared holders the
//! scale table stands up, default 10000), `BENCH_V1_MODULE` (the version-1 module to compare
//! against; `make bench` builds it with `scripts/v1-module.sh`), `BENCH_OUT` (default
//! `bench/results.md`), `DLOCK_MODULE` (default target/release/libdlock.so), `BENCH_ONLY`
//! (a comma-separated list of sections, see [`SECTIONS`], run in that order on one server). The server is the `redis-server` on the PATH.
//!
//! One file per scenario (`throughput`, `redisbench` for the `redis-benchmark` section, `versions`,
//! `cycles`, `expiry`, `handover`, `memory`, `waiters`, `shared`, `scale`, `storm` with the
//! lapsing-ticket storm, `lateness`), each writing its table; `schemes`
//! is what each lock scheme sends, `harness` the server, the client threads and the PING probe,
//! `report` the markdown.

mod crowd;
mod cycles;
mod expiry;
mod handover;
mod harness;
mod lateness;
mod list;
mod memory;
mod redisbench;
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

/// Every section, in the order a full run takes them.
const SECTIONS: [&str; 16] = [
    "throughput",
    "redis-benchmark",
    "versions",
    "cycles",
    "expiry",
    "handover",
    "memory",
    "waiters",
    "shared",
    "scale",
    "storm",
    "ticketstorm",
    "lateness",
    "crowd",
    "list",
    // The memory half of `waiters`, only when named.
    "waiter-memory",
];

fn main() -> Result<()> {
    let seconds: u64 = env_or("BENCH_SECONDS", 3);
    let storm_leases: u64 = env_or("BENCH_STORM_LEASES", 1_000_000);
    let storm_tickets: u64 = env_or("BENCH_STORM_TICKETS", 100_000);
    let handover_seconds: u64 = env_or("BENCH_HANDOVER_SECONDS", seconds);
    // BENCH_ONLY=a,b,… runs those sections in that order (one server, as a full run would).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let chosen: Vec<&str> = if only.is_empty() {
        SECTIONS[..SECTIONS.len() - 1].to_vec()
    } else {
        only.split(',').map(str::trim).collect()
    };
    if let Some(unknown) = chosen.iter().find(|name| !SECTIONS.contains(name)) {
        return Err(format!(
            "BENCH_ONLY: no section {unknown:?} (sections: {})",
            SECTIONS.join(", ")
        )
        .into());
    }
    let server = harness::start_server()?;
    let mut report = Report::new(&server)?;
    for section in chosen {
        match section {
            "throughput" => throughput::run(&server, &mut report, seconds)?,
            "versions" => versions::run(&server, &mut report, seconds)?,
            "redis-benchmark" => redisbench::run(&server, &mut report, seconds)?,
            "cycles" => cycles::run(&server, &mut report, seconds)?,
            "expiry" => expiry::run(&server, &mut report, env_or("BENCH_EXPIRY_KEYS", 200_000))?,
            "handover" => handover::run(&server, &mut report, handover_seconds)?,
            "memory" => memory::run(&server, &mut report)?,
            "waiters" => waiters::run(&server, &mut report)?,
            "waiter-memory" => waiters::memory(&server, &mut report)?,
            "shared" => shared::run(&server, &mut report, seconds)?,
            "scale" => scale::run(&server, &mut report)?,
            "storm" => storm::run(&server, &mut report, storm_leases)?,
            "lateness" => lateness::run(&mut report, harness::module_path())?,
            "crowd" => crowd::run(&server, &mut report, env_or("BENCH_CROWD", 100_000))?,
            "list" => list::run(&server, &mut report, env_or("BENCH_LIST_LOCKS", 1_000_000))?,
            _ => storm::run_tickets(&server, &mut report, storm_tickets)?,
        }
    }
    report.finish()
}

pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
