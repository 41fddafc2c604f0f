//! `dlock-chaos`: a primary and a replica with the module, a throwaway PostgreSQL, worker
//! processes that lock and write fenced, a seeded nemesis, and checkers over the history. The
//! workers reach the primary, and the replica streams from it, through TCP proxies of the test
//! kit (`dlock-testkit`), which the nemesis delays, drops and cuts. Prints every finding, then a
//! summary line and last
//! `chaos: <ops> ops, <faults> faults (<kind>=<n>, …), <violations> violations`; exits 1 when
//! there is a violation.
//!
//! `dlock-chaos [--seconds N] [--seed S] [--profile always|failover] [--workers N] [--resources N]
//! [--mixed-workers N] [--rw N] [--sem N] [--only KIND]` (`CHAOS_SECONDS` and `CHAOS_SEED` are the
//! defaults of the first two; `--only` makes every fault of the main nemesis one kind). The module is `$DLOCK_MODULE`, else the `libdlock.so` next to this binary.
//! `dlock-chaos worker …`, `dlock-chaos mixed-worker …` and `dlock-chaos cluster-worker …` are
//! how the harness starts its worker processes.
//!
//! `--profile cluster` is a run of its own ([`cluster`]): a 3 + 3 Redis Cluster, each node in a
//! network namespace (root only), workers leasing through the client in cluster mode, the
//! cluster nemesis and checkers (`--only KIND` among its kinds; `--workers`, `--resources`;
//! `--broken-cluster` is its self-check).
//!
//! Self-checks, runs that must end with violations: `--unfenced-sql` (workers drop the SQL fence
//! condition and stall past their lease now and then), `--broken-mixed` (mixed workers ignore
//! the semaphore limit, take shared leases as writers, abandon waiters without a claim window
//! and refresh tickets under new tokens), `--broken-mirror` (the harness deletes a live lock key
//! on the replica before each mirror comparison, and loads a two-second-old copy of the AOF),
//! `--broken-clock` (the servers' monotonic clock steps forward with their wall clock, every
//! fault a clock step on the running primary that keeps stepping while it lasts: leases end
//! early), and `--clock-weakness` (the primary runs without persistence and every fault steps its
//! clock back while it is down: fences fall, which `fence-order` reports, and nothing else may).

mod check;
mod check_clock;
mod check_lines;
mod check_modes;
mod cluster;
mod history;
mod info;
mod mirror_check;
mod mixed;
mod nemesis;
mod observer;
mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

fn arg_value(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn number<T: std::str::FromStr>(args: &[String], name: &str, env: Option<&str>, default: T) -> T {
    let text = arg_value(args, name).or_else(|| env.and_then(|e| std::env::var(e).ok()));
    match text {
        None => default,
        Some(text) => text.parse().unwrap_or_else(|_| {
            eprintln!("dlock-chaos: {name} must be a number, got {text:?}");
            std::process::exit(2)
        }),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        worker::run(worker::Args {
            id: number(&args, "--id", None, 0),
            redis_url: arg_value(&args, "--redis").expect("--redis"),
            pg: arg_value(&args, "--pg").expect("--pg"),
            resources: number(&args, "--resources", None, 3),
            ttl: Duration::from_millis(number(&args, "--ttl-ms", None, 1_000)),
            replicas: number(&args, "--replicas", None, 0),
            seed: number(&args, "--seed", None, 1),
            log: PathBuf::from(arg_value(&args, "--log").expect("--log")),
            unfenced: args.iter().any(|a| a == "--unfenced-sql"),
        });
    }
    if args.first().map(String::as_str) == Some("mixed-worker") {
        mixed::run(mixed::Args {
            id: number(&args, "--id", None, 0),
            redis_url: arg_value(&args, "--redis").expect("--redis"),
            rw: number(&args, "--rw", None, 1),
            sem: number(&args, "--sem", None, 1),
            ttl: Duration::from_millis(number(&args, "--ttl-ms", None, 1_000)),
            replicas: number(&args, "--replicas", None, 0),
            seed: number(&args, "--seed", None, 1),
            log: PathBuf::from(arg_value(&args, "--log").expect("--log")),
            broken: args.iter().any(|a| a == "--broken-mixed"),
        });
    }
    if args.first().map(String::as_str) == Some("cluster-worker") {
        cluster::worker::run(cluster::worker::Args {
            id: number(&args, "--id", None, 0),
            seeds: arg_value(&args, "--seeds")
                .expect("--seeds")
                .split(',')
                .map(String::from)
                .collect(),
            pg: arg_value(&args, "--pg"),
            resources: number(&args, "--resources", None, 12),
            ttl: Duration::from_millis(number(&args, "--ttl-ms", None, 1_000)),
            seed: number(&args, "--seed", None, 1),
            log: PathBuf::from(arg_value(&args, "--log").expect("--log")),
            broken: args.iter().any(|a| a == "--broken"),
        });
    }
    if arg_value(&args, "--profile").as_deref() == Some("cluster") {
        let only = arg_value(&args, "--only").map(|kind| {
            cluster::KINDS.into_iter().find(|k| *k == kind).unwrap_or_else(|| {
                eprintln!("dlock-chaos: unknown --only {kind:?} ({})", cluster::KINDS.join(", "));
                std::process::exit(2)
            })
        });
        let broken = args.iter().any(|a| a == "--broken-cluster");
        cluster::main(&cluster::Config {
            seconds: number(&args, "--seconds", Some("CHAOS_SECONDS"), 60),
            seed: number(&args, "--seed", Some("CHAOS_SEED"), 1),
            workers: number(&args, "--workers", None, 8),
            resources: number(&args, "--resources", None, if broken { 3 } else { 12 }),
            ttl: Duration::from_millis(1_000),
            broken,
            only,
        });
    }
    let profile = match arg_value(&args, "--profile").as_deref() {
        None | Some("always") => nemesis::Profile::Always,
        Some("failover") => nemesis::Profile::Failover,
        Some(other) => {
            eprintln!("dlock-chaos: unknown --profile {other:?} (always, failover, cluster)");
            std::process::exit(2)
        }
    };
    let broken_mixed = args.iter().any(|a| a == "--broken-mixed");
    let broken_clock = args.iter().any(|a| a == "--broken-clock");
    let clock_weakness = args.iter().any(|a| a == "--clock-weakness");
    let only = match arg_value(&args, "--only") {
        Some(kind) => match nemesis::all_kinds().find(|k| *k == kind) {
            Some(kind) => Some(kind),
            None => {
                eprintln!(
                    "dlock-chaos: unknown --only {kind:?} ({})",
                    nemesis::all_kinds().collect::<Vec<_>>().join(", ")
                );
                std::process::exit(2)
            }
        },
        // The broken clock steps a running server only: a restart would excuse a short lease.
        None if broken_clock => Some("clock-step"),
        None if clock_weakness => Some("clock-step-restart"),
        None => None,
    };
    let config = nemesis::Config {
        seconds: number(&args, "--seconds", Some("CHAOS_SECONDS"), 60),
        seed: number(&args, "--seed", Some("CHAOS_SEED"), 1),
        profile,
        workers: number(&args, "--workers", None, 6),
        resources: number(&args, "--resources", None, 3),
        mixed_workers: number(&args, "--mixed-workers", None, 6),
        rw: number(&args, "--rw", None, 2),
        sem: number(&args, "--sem", None, 2),
        ttl: Duration::from_millis(1_000),
        unfenced: args.iter().any(|a| a == "--unfenced-sql"),
        broken_mixed,
        // A self-check has little time: client faults come more often.
        client_faults_every: if broken_mixed { (400, 900) } else { (1_000, 3_000) },
        broken_mirror: args.iter().any(|a| a == "--broken-mirror"),
        broken_clock,
        clock_weakness,
        only,
    };
    let outcome = nemesis::run(&config);
    let report = &outcome.report;
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for fault in outcome.faults.iter().chain(&outcome.client_faults) {
        *kinds.entry(fault.kind).or_default() += 1;
    }
    for finding in &report.excused {
        // The fault that may have lost it: the first of those that may lose leases to end after
        // the finding's history began.
        let fault = outcome
            .faults
            .iter()
            .filter(|f| f.may_lose_leases && f.end >= finding.from)
            .min_by_key(|f| f.start)
            .map_or("?", |f| f.kind);
        println!(
            "excused ({}): {} [{}] (by {fault})",
            finding.checker, finding.message, finding.resource
        );
    }
    for finding in &report.violations {
        println!("VIOLATION ({}): {} [{}]", finding.checker, finding.message, finding.resource);
        for line in outcome.slice(finding) {
            println!("    {line}");
        }
    }
    println!(
        "chaos: profile {:?}, seed {}, {} s: {} grants, {} lost updates, liveness checked after {} faults, {} excused",
        config.profile,
        config.seed,
        config.seconds,
        report.grants,
        report.lost_updates,
        report.liveness_checked,
        report.excused.len()
    );
    let (modes, lines) = (&report.modes, &report.lines);
    let counts = |map: &BTreeMap<String, usize>| {
        map.iter().map(|(resource, n)| format!("{resource} {n}")).collect::<Vec<_>>().join(", ")
    };
    println!(
        "chaos: mixed: {} grants (readers {}, writers {}, permits {}; waits {}, tickets {} ({} started on their own channel's message), plain {}; {} claimed), {} stale fences refused; most permits at once {} (observed {}), most readers {} (observed {})",
        modes.readers + modes.writers + modes.permits,
        modes.readers,
        modes.writers,
        modes.permits,
        modes.waits,
        modes.tickets,
        modes.told,
        modes.plain,
        modes.claims,
        modes.refused,
        counts(&modes.most_permits),
        counts(&lines.most_permits_seen),
        modes.most_readers,
        lines.most_readers_seen,
    );
    println!(
        "chaos: lines: {} abandoned waiters ({} seen in line, {} seen holding, longest {} ms of a {} ms claim window), {} tickets stopped ({} seen granted after), {} tickets kept in line until granted, {} FIFO pairs checked, {} readings",
        lines.abandoned,
        lines.abandoned_queued,
        lines.abandoned_held,
        lines.longest_abandoned.0,
        lines.longest_abandoned.1,
        lines.stopped,
        lines.stopped_held,
        lines.tickets_kept,
        lines.fifo_pairs,
        lines.samples,
    );
    let retried = |kind: history::Kind| {
        outcome
            .events
            .iter()
            .filter(|e| e.op == history::Op::Acquire && e.kind == kind)
            .filter(|e| e.detail.contains("retry after a dropped"))
            .count()
    };
    println!(
        "chaos: retries after a dropped hand-over: {} answered the hand-over's fence, {} not",
        retried(history::Kind::Ok),
        retried(history::Kind::Fail) + retried(history::Kind::Unknown),
    );
    let (mirror, promotions) = (&outcome.mirror, &outcome.promotions);
    println!(
        "chaos: mirror: {} comparisons of the replica ({} quiet points skipped), {} leases equal ({} near their end on one side), {} digests equal, {} agreed on a retry, writes paused {} ms at most; {} AOF copies compared, {} leases equal ({} near their end); sets whole {} times ({} members near their end){}",
        mirror.replica_checks,
        mirror.skipped,
        mirror.holders,
        mirror.settling,
        mirror.digests,
        mirror.retried,
        mirror.longest_pause_ms,
        mirror.aof_checks,
        mirror.aof_holders,
        mirror.aof_settling,
        mirror.whole_sets,
        mirror.sets_settling,
        if mirror.broken > 0 {
            format!("; broken on purpose {} times", mirror.broken)
        } else {
            String::new()
        },
    );
    println!(
        "chaos: promotions: {} ({} with waiters or tickets standing: {} waiters, {} tickets in all); failover-in-delay: {} restart then promote, {} promote twice, {} after the delay had ended",
        promotions.total,
        promotions.with_line,
        promotions.waiters,
        promotions.tickets,
        promotions.restart_then_promote,
        promotions.promote_twice,
        promotions.late,
    );
    let kinds: Vec<String> = kinds.iter().map(|(kind, n)| format!("{kind}={n}")).collect();
    println!(
        "chaos: {} ops, {} faults ({}), {} violations",
        report.operations,
        outcome.faults.len() + outcome.client_faults.len(),
        kinds.join(", "),
        report.violations.len()
    );
    if !report.violations.is_empty() {
        std::process::exit(1);
    }
}
