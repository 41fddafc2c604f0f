//! Sets up the servers, the proxies, PostgreSQL and the workers, injects faults on a seeded
//! schedule, then collects the history and the final state for the checkers.

mod in_delay;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::thread::{JoinHandle, sleep, spawn};
use std::time::{Duration, Instant};

use dlock_testkit::{Clock, Launch, LinkProxy, Postgres, Rng, Server, wait_until_replica_streams};

use crate::check::{self, Accepted, Fault, Finding, Report, Settings, State};
use crate::history::{Event, Kind, now_ns};
use crate::mirror_check::{Mirror, MirrorReport};
use crate::mixed;
use crate::observer::{OBSERVER, Observer};
use in_delay::{IN_DELAY_STREAM, Promotions};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// `appendfsync always`, no promotion: nothing acknowledged may be lost.
    Always,
    /// `appendfsync everysec`, clients WAIT for one replica, and promotions.
    Failover,
}

pub struct Config {
    pub seconds: u64,
    pub seed: u64,
    pub profile: Profile,
    pub workers: u32,
    pub resources: u32,
    /// Mixed workers (readers, writers, permits; waits, tickets), after the exclusive ones.
    pub mixed_workers: u32,
    /// Their read-write resources and semaphores.
    pub rw: u32,
    pub sem: u32,
    pub ttl: Duration,
    /// Workers write SQL without the fence condition (the self-check).
    pub unfenced: bool,
    /// Mixed workers misbehave (the self-check of the checkers of modes and lines).
    pub broken_mixed: bool,
    /// How often (ms, from, to) the client nemesis asks a mixed worker for a client fault.
    pub client_faults_every: (u64, u64),
    /// The mirror checker's self-check: the harness breaks the replica and the AOF copy.
    pub broken_mirror: bool,
    /// The clock checker's self-check: the servers' monotonic clock steps with their wall clock.
    pub broken_clock: bool,
    /// The admitted weakness: the primary runs without persistence, and every fault steps its
    /// clock back while it is down.
    pub clock_weakness: bool,
    /// Every fault of the main nemesis is this kind (`--only`, to reproduce one kind's findings).
    pub only: Option<&'static str>,
}

pub struct Outcome {
    pub report: Report,
    /// Faults of the servers and the links, and of worker processes.
    pub faults: Vec<Fault>,
    /// Faults of the mixed workers as clients: abandoned waiters, tickets no longer refreshed.
    pub client_faults: Vec<Fault>,
    pub events: Vec<Event>,
    /// What the mirror checker compared (its findings are among the report's violations).
    pub mirror: MirrorReport,
    /// What stood in line at the promotions, and the promotions within a grant delay.
    pub promotions: Promotions,
}

impl Outcome {
    /// The history lines around a finding: its resource (or all), in its time range.
    pub fn slice(&self, finding: &Finding) -> Vec<String> {
        let in_range = |e: &&Event| {
            (finding.resource.is_empty() || e.resource == finding.resource)
                && e.at >= finding.from
                && e.at <= finding.to
        };
        let (observed, worked): (Vec<&Event>, Vec<&Event>) =
            self.events.iter().filter(in_range).partition(|e| e.worker == OBSERVER);
        let mut lines = shorten(worked.into_iter().map(Event::line).collect(), 60);
        // The observer's readings, fewer: what the primary showed meanwhile.
        let readings = observed.into_iter().filter(|e| e.kind != Kind::Invoke).map(Event::line);
        lines.extend(shorten(readings.collect(), 16));
        for fault in self.faults.iter().chain(&self.client_faults) {
            if fault.start <= finding.to && fault.end >= finding.from {
                lines.push(format!("fault {} from {} to {}", fault.kind, fault.start, fault.end));
            }
        }
        lines
    }
}

/// At most `most` lines: the first and the last halves.
fn shorten(mut lines: Vec<String>, most: usize) -> Vec<String> {
    if lines.len() > most {
        let tail = lines.split_off(lines.len() - most / 2);
        lines.truncate(most / 2);
        lines.push("…".into());
        lines.extend(tail);
    }
    lines
}

struct Node {
    server: Server,
}

struct Cluster {
    primary: Node,
    replica: Node,
    /// The workers' link to the primary.
    clients: LinkProxy,
    /// The replica's replication link to the primary.
    replication: LinkProxy,
    args: Vec<String>,
    /// The primary's port now, for the observer (it changes with a promotion).
    primary_port: Arc<AtomicU16>,
}

impl Cluster {
    fn replica_args(&self) -> Vec<String> {
        let mut args = self.args.clone();
        args.extend(["--replicaof".into(), "127.0.0.1".into(), self.replication.port.to_string()]);
        args
    }

    fn wait_for_replica(&self) -> bool {
        wait_until_replica_streams(&self.primary.server, &self.replica.server)
    }
}

/// Starts worker `id` (exclusive below `config.workers`, mixed from there); `generation` counts
/// its restarts, so that a run is reproducible from its seed.
fn spawn_worker(
    config: &Config,
    dir: &Path,
    id: u32,
    generation: u64,
    redis_url: &str,
    pg: &str,
    clock: &Clock,
) -> Child {
    let exe = std::env::current_exe().expect("own path");
    let replicas = if config.profile == Profile::Failover { 1 } else { 0 };
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("worker-{id}.stderr")))
        .expect("worker stderr");
    let mut command = Command::new(exe);
    if id < config.workers {
        command
            .arg("worker")
            .args(["--id", &id.to_string(), "--redis", redis_url, "--pg", pg])
            .args(["--resources", &config.resources.to_string()])
            .args(config.unfenced.then_some("--unfenced-sql"));
    } else {
        command
            .arg("mixed-worker")
            .args(["--id", &id.to_string(), "--redis", redis_url])
            .args(["--rw", &config.rw.to_string(), "--sem", &config.sem.to_string()])
            .args(config.broken_mixed.then_some("--broken-mixed"));
    }
    command
        .args(["--ttl-ms", &config.ttl.as_millis().to_string()])
        .args(["--replicas", &replicas.to_string()])
        .args([
            "--seed",
            &(config.seed.wrapping_mul(1_000_003) ^ (u64::from(id) << 20) ^ generation).to_string(),
        ])
        .arg("--log")
        .arg(dir.join(format!("worker-{id}.history")))
        .envs(clock.env())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn worker")
}

/// The mixed workers' resources, and for each semaphore its number of permits.
pub fn mixed_resources(config: &Config) -> BTreeMap<String, Option<u32>> {
    let rw = (0..config.rw).map(|i| (mixed::rw_resource(i), None));
    let sem = (0..config.sem).map(|i| (mixed::sem_resource(i), Some(mixed::permits(i))));
    rw.chain(sem).collect()
}

/// Client faults, drawn from a stream of their own (seed ^ this) on a thread of their own, so
/// that the schedule of the other faults stays what a seed gave before they existed.
const CLIENT_STREAM: u64 = 0xc11e_47fa_0175_5eed;

/// The client nemesis: every so often it asks a mixed worker (a trigger file) to abandon a
/// waiter or to stop refreshing its ticket, until `stop`.
fn client_nemesis(config: &Config, dir: &Path, stop: Arc<AtomicBool>) -> JoinHandle<Vec<Fault>> {
    let mut rng = Rng::new(config.seed ^ CLIENT_STREAM);
    let ids: Vec<u32> = (config.workers..config.workers + config.mixed_workers).collect();
    let (every_from, every_to) = config.client_faults_every;
    let dir = dir.to_path_buf();
    spawn(move || {
        let mut faults = Vec::new();
        if ids.is_empty() {
            return faults;
        }
        let rest = |ms: u64| {
            let until = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                sleep(Duration::from_millis(20));
            }
        };
        rest(rng.between(every_from / 2, every_to / 2));
        while !stop.load(Ordering::SeqCst) {
            let kind = *rng.pick(&["abandon-waiter", "stop-refreshing", "retry-handover"]);
            let id = *rng.pick(&ids);
            let start = now_ns();
            if std::fs::write(mixed::trigger(&dir, id, kind), b"").is_ok() {
                faults.push(Fault { kind, start, end: start, may_lose_leases: false });
            }
            rest(rng.between(every_from, every_to));
        }
        faults
    })
}

/// Client clock steps, drawn from a stream of their own (seed ^ this).
const CLIENT_CLOCK_STREAM: u64 = 0xc10c_4c11_e475_eed5;
/// How far the workers' wall clock may drift from the machine's, in seconds.
const CLIENT_CLOCK_MOST_S: i64 = 900;

/// The client-clock nemesis: every 2–6 s it steps the wall clock of every worker process forward
/// or backward by 1 s to 10 minutes (within [`CLIENT_CLOCK_MOST_S`] of the machine's), until `stop`.
/// The workers time leases by the monotonic clock, so nothing may change.
fn client_clock_nemesis(
    config: &Config,
    clock: Arc<Clock>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Vec<Fault>> {
    let mut rng = Rng::new(config.seed ^ CLIENT_CLOCK_STREAM);
    spawn(move || {
        let mut faults = Vec::new();
        loop {
            let until = Instant::now() + Duration::from_millis(rng.between(2_000, 6_000));
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                sleep(Duration::from_millis(20));
            }
            if stop.load(Ordering::SeqCst) {
                return faults;
            }
            let by = rng.between(1, 600) as i64 * 1_000_000;
            let offset = clock.offset_us();
            let forward = rng.below(2) == 0;
            let next = if forward { offset + by } else { offset - by };
            let next = if next.abs() > CLIENT_CLOCK_MOST_S * 1_000_000 {
                offset - next.signum() * by
            } else {
                next
            };
            let start = now_ns();
            clock.set_offset_us(next);
            faults.push(Fault { kind: "client-clock", start, end: start, may_lose_leases: false });
        }
    })
}

/// Server clock steps, drawn from a stream of their own (seed ^ this).
const CLOCK_STREAM: u64 = 0xc10c_57e9_5eed_0001;

/// The servers' clock steps: `clock-step` steps the wall clock of both servers (one machine's
/// clock) forward or backward on a running primary, holds it there a while and steps it back;
/// `clock-step-restart` steps it forward while the primary is down (a crash and restart), then
/// back once it runs. Steps are 1 s to 2 minutes with `appendfsync always`, and 1–10 s in the
/// failover profile, which then waits as long as the step before the next fault: there a crash may
/// lose the fence counter's last second, and the clock must have passed the fences minted ahead
/// of it again (the one assumption of the fence rule). With `clock_weakness` (a primary without
/// persistence) `clock-step-restart` steps back instead: the assumption broken on purpose.
/// Returns whether the fault may lose leases.
fn clock_fault(
    kind: &str,
    cluster: &mut Cluster,
    clock: &Clock,
    config: &Config,
    rng: &mut Rng,
) -> bool {
    let most = if config.profile == Profile::Always { 120 } else { 10 };
    let by = Duration::from_millis(rng.between(1_000, most * 1_000));
    let hold = Duration::from_millis(rng.between(1_000, 3_000));
    let forward = !config.clock_weakness
        && (kind == "clock-step-restart" || config.broken_clock || rng.below(2) == 0);
    if forward {
        clock.forward(by)
    } else {
        clock.backward(by)
    }
    if kind == "clock-step-restart" {
        let args: Vec<&str> = cluster.args.iter().map(String::as_str).collect();
        cluster.primary.server.crash_and_restart_with(&args);
    }
    if config.broken_clock {
        // A monotonic clock that keeps jumping ahead: every lease renewed in the hold is cut short.
        let until = Instant::now() + hold;
        while Instant::now() < until {
            sleep(Duration::from_millis(rng.between(200, 500)));
            clock.forward(Duration::from_millis(rng.between(1_000, 3_000)));
        }
    } else {
        sleep(hold);
    }
    // The broken clock stays stepped: its monotonic clock would step back too.
    if !config.broken_clock {
        clock.set_offset_us(0);
        if config.profile == Profile::Failover && forward {
            sleep(by);
        }
    }
    kind == "clock-step-restart" && (config.profile != Profile::Always || config.clock_weakness)
}

/// The worker processes; killed when dropped, so that a failed run leaves none behind.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for worker in &mut self.0 {
            let _ = worker.kill();
            let _ = worker.wait();
        }
    }
}

fn signal(child: &Child, signal: &str) {
    let _ = Command::new("kill").arg(signal).arg(child.id().to_string()).status();
}

/// Runs `f` with a PostgreSQL connection, on a runtime of its own.
fn with_postgres<T>(pg: &str, f: impl AsyncFnOnce(tokio_postgres::Client) -> T) -> T {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let (client, connection) =
            tokio_postgres::connect(pg, tokio_postgres::NoTls).await.expect("postgres");
        tokio::spawn(connection);
        f(client).await
    })
}

fn setup_sql(pg: &str, resources: u32) {
    with_postgres(pg, async |client| {
        client
            .batch_execute(
                "CREATE TABLE registers (resource TEXT PRIMARY KEY, value BIGINT NOT NULL,
                                         fencing_token BIGINT NOT NULL);
                 CREATE TABLE writes (id BIGSERIAL PRIMARY KEY, resource TEXT NOT NULL,
                                      fence BIGINT NOT NULL, worker BIGINT NOT NULL,
                                      seq BIGINT NOT NULL, value BIGINT NOT NULL);",
            )
            .await
            .expect("create tables");
        for r in 0..resources {
            client
                .execute("INSERT INTO registers VALUES ($1, 0, 0)", &[&format!("res:{{{r}}}")])
                .await
                .expect("insert register");
        }
    });
}

fn read_sql(pg: &str) -> BTreeMap<String, Vec<Accepted>> {
    with_postgres(pg, async |client| {
        let rows = client
            .query("SELECT resource, fence, worker, seq, value FROM writes ORDER BY id", &[])
            .await
            .expect("read writes");
        let mut map: BTreeMap<String, Vec<Accepted>> = BTreeMap::new();
        for row in rows {
            map.entry(row.get(0)).or_default().push(Accepted {
                fence: row.get::<_, i64>(1) as u64,
                worker: row.get::<_, i64>(2) as u32,
                seq: row.get::<_, i64>(3) as u64,
                value: row.get(4),
            });
        }
        map
    })
}

/// Every kind of fault; the `always` profile draws from all but the last (promotion).
const KINDS: [&str; 8] = [
    "pause-worker",
    "kill-worker",
    "kill-primary",
    "delay-link",
    "drop-link",
    "partition-clients",
    "partition-replica",
    "promote",
];

/// Faults of the server's own write pauses, drawn from a second stream (seed ^ this), so that
/// the schedule of the kinds above stays what a seed gave before they existed.
const PAUSE_STREAM: u64 = 0x9a05_e5ee_d5ee_d5ee;

/// The write-pause kinds a profile draws from: a `CLIENT PAUSE … WRITE`, and (with a replica to
/// hand over to) a `FAILOVER` that succeeds or times out, or one there and back again.
fn pause_kinds(profile: Profile) -> &'static [&'static str] {
    match profile {
        Profile::Always => &["pause-writes"],
        Profile::Failover => &["pause-writes", "failover", "failover-and-back"],
    }
}

/// The kinds drawn from streams of their own: promotions in a grant delay, clock steps.
const OTHER_KINDS: [&str; 3] = ["failover-in-delay", "clock-step", "clock-step-restart"];

/// Every kind of fault the main nemesis may draw (the client faults have threads of their own).
pub fn all_kinds() -> impl Iterator<Item = &'static str> {
    KINDS.into_iter().chain(pause_kinds(Profile::Failover).iter().copied()).chain(OTHER_KINDS)
}

/// The kinds of fault a profile draws from.
fn kinds(profile: Profile) -> &'static [&'static str] {
    match profile {
        Profile::Always => &KINDS[..KINDS.len() - 1],
        Profile::Failover => &KINDS,
    }
}

pub fn run(config: &Config) -> Outcome {
    let dir = tempfile::Builder::new().prefix("dlock-chaos-").tempdir().expect("run dir");
    let ttl_ms = config.ttl.as_millis().to_string();
    let fsync = if config.profile == Profile::Always { "always" } else { "everysec" };
    let appendonly = if config.clock_weakness { "no" } else { "yes" };
    let args: Vec<String> = [
        "--save",
        "",
        "--appendonly",
        appendonly,
        "--appendfsync",
        fsync,
        "--repl-diskless-sync-delay",
        "0",
        "--dlock.restart-grant-delay-ms",
        &ttl_ms,
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(
        // The weakness shown with the bare fence rule: a start-up lead would absorb steps back
        // shorter than itself, and hold a fallen counter below the old fences for up to its
        // length after the clock came back (docs/chaos.md).
        config
            .clock_weakness
            .then_some(["--dlock.fence-lead-ms", "0"])
            .into_iter()
            .flatten()
            .map(String::from),
    )
    .collect();
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    // One clock for both servers: they share this machine's.
    let server_clock =
        if config.broken_clock { Clock::stepping_monotonic_too() } else { Clock::new() };
    let client_clock = Arc::new(Clock::new());
    let primary = Launch::new().clock(&server_clock).args(&arg_refs).start();
    let replication = LinkProxy::start(primary.port);
    let clients = LinkProxy::start(primary.port);
    let primary_port = Arc::new(AtomicU16::new(primary.port));
    let mut cluster = Cluster {
        primary: Node { server: primary },
        replica: Node { server: Launch::new().clock(&server_clock).args(&["--save", ""]).start() },
        clients,
        replication,
        args,
        primary_port: primary_port.clone(),
    };
    let replica_args = cluster.replica_args();
    cluster
        .replica
        .server
        .crash_and_restart_with(&replica_args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(cluster.wait_for_replica(), "the replica does not stream from the primary");

    let pg = Postgres::start();
    setup_sql(&pg.config(), config.resources);
    let redis_url = format!("redis://127.0.0.1:{}/", cluster.clients.port);
    let mut workers = Workers(
        (0..config.workers + config.mixed_workers)
            .map(|id| {
                spawn_worker(config, dir.path(), id, 0, &redis_url, &pg.config(), &client_clock)
            })
            .collect(),
    );
    let mixed = mixed_resources(config);
    let observer = Observer::start(
        primary_port,
        mixed.keys().cloned().collect(),
        &dir.path().join("observer.history"),
    )
    .expect("observer history");
    let stop_clients = Arc::new(AtomicBool::new(false));
    let client_faults = client_nemesis(config, dir.path(), stop_clients.clone());
    let client_clock_faults =
        client_clock_nemesis(config, client_clock.clone(), stop_clients.clone());

    let ttl = config.ttl;
    let mut settings = Settings {
        ttl_ns: ttl.as_nanos() as u64,
        grant_delay_ns: ttl.as_nanos() as u64,
        slack_ns: 2_000_000_000,
        durable: config.profile == Profile::Always && !config.clock_weakness,
        run_end: u64::MAX,
        mixed,
    };
    let mut rng = Rng::new(config.seed);
    let mut pauses = Rng::new(config.seed ^ PAUSE_STREAM);
    let mut in_delay = Rng::new(config.seed ^ IN_DELAY_STREAM);
    let mut clock_steps = Rng::new(config.seed ^ CLOCK_STREAM);
    let mixed_names: Vec<String> = settings.mixed.keys().cloned().collect();
    let mut promotions = Promotions::default();
    let resources = (0..config.resources).map(|r| format!("res:{{{r}}}"));
    let mut mirror =
        Mirror::new(resources.chain(mixed_names.clone()).collect(), config.broken_mirror);
    let mut faults = Vec::new();
    let started = Instant::now();
    let end = started + Duration::from_secs(config.seconds);
    sleep(Duration::from_millis(rng.between(500, 1_500)));
    while Instant::now() + Duration::from_secs(2) < end {
        let kind = if let Some(only) = config.only {
            only
        } else if clock_steps.below(6) == 0 {
            *clock_steps.pick(&OTHER_KINDS[1..])
        } else if config.profile == Profile::Failover && in_delay.below(5) == 0 {
            "failover-in-delay"
        } else if pauses.below(4) == 0 {
            *pauses.pick(pause_kinds(config.profile))
        } else {
            kinds(config.profile)[rng.below(kinds(config.profile).len() as u64) as usize]
        };
        let start = now_ns();
        let mut may_lose_leases = false;
        match kind {
            "pause-worker" => {
                let victim = &workers.0[rng.below(workers.0.len() as u64) as usize];
                signal(victim, "-STOP");
                sleep(ttl.mul_f64(1.5 + rng.below(150) as f64 / 100.0));
                signal(victim, "-CONT");
            }
            "kill-worker" => {
                let id = rng.below(workers.0.len() as u64) as usize;
                let _ = workers.0[id].kill();
                let _ = workers.0[id].wait();
                sleep(Duration::from_millis(rng.between(50, 500)));
                let generation = faults.len() as u64 + 1;
                workers.0[id] = spawn_worker(
                    config,
                    dir.path(),
                    id as u32,
                    generation,
                    &redis_url,
                    &pg.config(),
                    &client_clock,
                );
            }
            "kill-primary" => {
                may_lose_leases = config.profile != Profile::Always;
                // As a primary: after a promotion this node was started as a replica.
                let args: Vec<&str> = cluster.args.iter().map(String::as_str).collect();
                cluster.primary.server.crash_and_restart_with(&args);
            }
            "delay-link" => {
                cluster.clients.set_delay(Duration::from_millis(rng.between(20, 300)));
                sleep(Duration::from_millis(rng.between(500, 2_000)));
                cluster.clients.heal();
            }
            "drop-link" => cluster.clients.drop_connections(),
            "partition-clients" => {
                cluster.clients.cut();
                sleep(ttl.mul_f64(0.5 + rng.below(150) as f64 / 100.0));
                cluster.clients.heal();
            }
            "partition-replica" => {
                cluster.replication.cut();
                sleep(Duration::from_millis(rng.between(500, 3_000)));
                cluster.replication.heal();
            }
            "promote" => {
                may_lose_leases = true;
                promotions.promote(&mut cluster, &mixed_names);
            }
            "failover-in-delay" => {
                may_lose_leases = true;
                let delay = Duration::from_nanos(settings.grant_delay_ns);
                promotions.in_delay(&mut cluster, &mixed_names, &mut in_delay, delay);
            }
            "pause-writes" => {
                // Leases end and waiters wait while writes are paused; the module catches up after.
                let pause = ttl.mul_f64(0.5 + pauses.below(100) as f64 / 100.0);
                let mut con = cluster.primary.server.client();
                let _: () = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(pause.as_millis() as u64)
                    .arg("WRITE")
                    .query(&mut con)
                    .expect("CLIENT PAUSE");
                sleep(pause);
            }
            "failover" => {
                let times_out = pauses.below(2) == 0;
                let seen = promotions.await_line(&cluster, &mixed_names, Duration::from_secs(1));
                if failover(&mut cluster, times_out) {
                    promotions.record(seen);
                }
            }
            "failover-and-back" => {
                let stay = Duration::from_millis(pauses.between(300, 2_000));
                let seen = promotions.await_line(&cluster, &mixed_names, Duration::from_secs(1));
                if failover_and_back(&mut cluster, stay) {
                    promotions.record(seen);
                }
            }
            "clock-step" | "clock-step-restart" => {
                may_lose_leases =
                    clock_fault(kind, &mut cluster, &server_clock, config, &mut clock_steps);
            }
            _ => unreachable!("every kind is handled"),
        }
        faults.push(Fault { kind, start, end: now_ns(), may_lose_leases });
        // Quiet until the liveness checker has seen the system heal, then a little more.
        let window = Duration::from_nanos(settings.liveness_window(kind));
        sleep(window + Duration::from_millis(rng.between(0, 2_000)));
        mirror.replica(&cluster.primary.server, &cluster.replica.server, &format!("after {kind}"));
    }
    let remaining = end.saturating_duration_since(Instant::now());
    sleep(remaining);
    mirror.replica(&cluster.primary.server, &cluster.replica.server, "at the end");
    if config.profile == Profile::Always && !config.clock_weakness {
        mirror.aof(&cluster.primary.server);
    }
    settings.run_end = now_ns();
    stop_clients.store(true, Ordering::SeqCst);
    drop(workers);
    observer.stop();
    let mut client_faults = client_faults.join().unwrap_or_default();
    client_faults.extend(client_clock_faults.join().unwrap_or_default());
    client_faults.sort_by_key(|fault| fault.start);

    let events = read_history(dir.path(), config.workers + config.mixed_workers);
    let mut con = cluster.primary.server.client();
    let mut state = State { sql: read_sql(&pg.config()), ..State::default() };
    for r in 0..config.resources {
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("reg:{{{r}}}"))
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .expect("LRANGE");
        state.redis.insert(
            format!("res:{{{r}}}"),
            entries.iter().filter_map(|e| Accepted::parse(e)).collect(),
        );
    }
    for i in 0..config.rw {
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(mixed::rw_register(i))
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .expect("LRANGE");
        state.redis.insert(
            mixed::rw_resource(i),
            entries.iter().filter_map(|e| Accepted::parse(e)).collect(),
        );
    }
    let mut report = check::check(&events, &faults, &state, &settings);
    report.violations.append(&mut mirror.findings);
    if !report.violations.is_empty() {
        let kept = dir.keep();
        eprintln!("dlock-chaos: histories and logs kept in {}", kept.display());
    }
    Outcome { report, faults, client_faults, events, mirror: mirror.report, promotions }
}

/// `FAILOVER` under load: the primary pauses writes until the replica has caught up, then the
/// two swap roles and the client link follows. With `times_out`, the replication link is cut
/// first, so the failover gives up after its timeout and the primary stays (its writes were
/// paused all along). Nothing acknowledged is lost either way.
fn failover(cluster: &mut Cluster, times_out: bool) -> bool {
    if times_out {
        cluster.replication.cut();
    }
    let mut con = cluster.primary.server.client();
    let started: redis::RedisResult<()> =
        redis::cmd("FAILOVER").arg("TIMEOUT").arg(2_000).query(&mut con);
    if let Err(error) = started {
        eprintln!("dlock-chaos: FAILOVER refused: {error}");
    }
    let mut replica = cluster.replica.server.client();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut promoted = false;
    while Instant::now() < deadline {
        let role: String =
            redis::cmd("INFO").arg("replication").query(&mut replica).unwrap_or_default();
        let state: String =
            redis::cmd("INFO").arg("replication").query(&mut con).unwrap_or_default();
        promoted = role.contains("role:master");
        if promoted || state.contains("master_failover_state:no-failover") {
            break;
        }
        sleep(Duration::from_millis(20));
    }
    cluster.replication.heal();
    if !promoted {
        return false;
    }
    cluster.clients.drop_connections();
    swap_roles(cluster);
    true
}

/// `FAILOVER` to the replica, `stay` there (the workers renew and hand over on it), then
/// `FAILOVER` back, with neither server restarted: each keeps its data and its memory of its
/// earlier term, as in an operator's planned switch-over and switch-back. Both links follow each
/// move; at the end the replica streams through the replication link again. Returns whether
/// both moves happened.
fn failover_and_back(cluster: &mut Cluster, stay: Duration) -> bool {
    let first = cluster.primary.server.port;
    let second = cluster.replica.server.port;
    if !switch_over(first, second) {
        return false;
    }
    cluster.clients.retarget(second);
    cluster.primary_port.store(second, Ordering::SeqCst);
    cluster.clients.drop_connections();
    sleep(stay);
    let back = switch_over(second, first);
    let primary = if back { first } else { second };
    cluster.clients.retarget(primary);
    cluster.replication.retarget(primary);
    cluster.primary_port.store(primary, Ordering::SeqCst);
    cluster.clients.drop_connections();
    if !back {
        std::mem::swap(&mut cluster.primary, &mut cluster.replica);
    }
    // The replica follows through the replication link again (a partial resync, no restart).
    let mut replica = cluster.replica.server.client();
    let _: redis::RedisResult<()> =
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(cluster.replication.port).query(&mut replica);
    if !cluster.wait_for_replica() {
        eprintln!("dlock-chaos: the replica does not stream again after failover-and-back");
    }
    back
}

/// `FAILOVER` from the primary on `from` to its replica on `to`; whether `to` became primary
/// within 10 s.
fn switch_over(from: u16, to: u16) -> bool {
    let client = |port: u16| {
        redis::Client::open(format!("redis://127.0.0.1:{port}/")).and_then(|c| c.get_connection())
    };
    let (Ok(mut old), Ok(mut new)) = (client(from), client(to)) else { return false };
    let started: redis::RedisResult<()> = redis::cmd("FAILOVER")
        .arg("TO")
        .arg("127.0.0.1")
        .arg(to)
        .arg("TIMEOUT")
        .arg(5_000)
        .query(&mut old);
    if let Err(error) = started {
        eprintln!("dlock-chaos: FAILOVER TO {to} refused: {error}");
        return false;
    }
    // Done when the old primary has left its failover state; then the target says how it went.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let state: String =
            redis::cmd("INFO").arg("replication").query(&mut old).unwrap_or_default();
        if state.contains("master_failover_state:no-failover") {
            break;
        }
        sleep(Duration::from_millis(20));
    }
    let settled = Instant::now() + Duration::from_secs(2);
    while Instant::now() < settled {
        let role: String =
            redis::cmd("INFO").arg("replication").query(&mut new).unwrap_or_default();
        if role.contains("role:master") {
            return true;
        }
        sleep(Duration::from_millis(20));
    }
    false
}

/// The replica is the primary now: both links follow it (connections already open stay where
/// they are unless dropped), and the old primary is restarted as its replica, through the
/// replication link again.
fn swap_roles(cluster: &mut Cluster) {
    cluster.clients.retarget(cluster.replica.server.port);
    cluster.replication.retarget(cluster.replica.server.port);
    cluster.primary_port.store(cluster.replica.server.port, Ordering::SeqCst);
    std::mem::swap(&mut cluster.primary, &mut cluster.replica);
    let args = cluster.replica_args();
    cluster
        .replica
        .server
        .crash_and_restart_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
}

fn read_history(dir: &Path, workers: u32) -> Vec<Event> {
    let mut events = Vec::new();
    for id in 0..workers {
        let path: PathBuf = dir.join(format!("worker-{id}.history"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        events.extend(text.lines().filter_map(Event::parse));
    }
    let observed = std::fs::read_to_string(dir.join("observer.history")).unwrap_or_default();
    events.extend(observed.lines().filter_map(Event::parse));
    events.sort_by_key(|e| e.at);
    events
}
