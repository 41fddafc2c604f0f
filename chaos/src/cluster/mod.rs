//! The `cluster` profile: three primaries and three replicas with the module (`appendfsync
//! always`, node timeout 2 s), each node in a network namespace of its own with a clock of its
//! own, a throwaway PostgreSQL, worker processes leasing through `dlock-client` in cluster mode,
//! and a seeded nemesis of the operator's routine and the machine's accidents: a manual
//! `CLUSTER FAILOVER`, a primary killed and restarted, stopped past the node timeout, cut off by
//! a partition, slots resharded and rebalanced with `redis-cli --cluster`, a primary and its
//! replica added and removed, the nodes' clocks set apart. The checkers are in [`check`].

mod check;
mod net;
mod nodes;
pub mod worker;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use dlock_testkit::{Postgres, Rng};

use crate::check::{Accepted, Fault, Finding, State};
use crate::history::{Event, now_ns};
use nodes::{Member, NODE_TIMEOUT_MS, Nodes, await_healthy, await_primary, query, redis_cli, view};

/// What one cluster run is asked to do.
pub struct Config {
    pub seconds: u64,
    pub seed: u64,
    pub workers: u32,
    pub resources: u32,
    pub ttl: Duration,
    /// The self-check: broken workers ([`worker::Args::broken`]), and the harness drops the
    /// oldest entry of a register after every fault.
    pub broken: bool,
    pub only: Option<&'static str>,
}

/// Every kind of fault; `membership` adds a primary with its replica when the spares are out,
/// and removes them when they are in (logged as `add-node` and `remove-node`).
pub const KINDS: [&str; 8] = [
    "failover",
    "kill-primary",
    "pause-primary",
    "partition",
    "reshard",
    "rebalance",
    "membership",
    "clock-skew",
];

/// The faults after which a write the replica had not received may be gone: the client does not
/// `WAIT` after a fenced write.
const UNPLANNED: [&str; 3] = ["kill-primary", "pause-primary", "partition"];

/// Nodes 0–5 make the cluster; 6 and 7 are the spare primary and replica.
const NODES: usize = 8;
const FIRST: usize = 6;

/// Filler keys per resource's slot: more than `redis-cli --cluster reshard` moves in one batch
/// (10), so that a slot holding a resource spends time split between two nodes.
const FILLER: u32 = 24;

/// The run's PostgreSQL, where the signal thread can stop it too.
static POSTGRES: std::sync::Mutex<Option<Postgres>> = std::sync::Mutex::new(None);

fn lock_postgres() -> std::sync::MutexGuard<'static, Option<Postgres>> {
    POSTGRES.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Stops the run's PostgreSQL when dropped (at the end of the run, or on a panic).
struct StopPostgres;

impl Drop for StopPostgres {
    fn drop(&mut self) {
        drop(lock_postgres().take());
    }
}

/// Runs the profile, prints its findings and summary, and exits (1 on a violation).
pub fn main(config: &Config) -> ! {
    net::on_interrupt(|| drop(lock_postgres().take()));
    let outcome = run(config);
    for finding in &outcome.report.excused {
        println!("excused ({}): {} [{}]", finding.checker, finding.message, finding.resource);
    }
    for finding in &outcome.report.violations {
        println!("VIOLATION ({}): {} [{}]", finding.checker, finding.message, finding.resource);
        for line in outcome.slice(finding) {
            println!("    {line}");
        }
    }
    let c = &outcome.counts;
    println!(
        "chaos: cluster, seed {}, {} s: {} grants ({} not acquired), {} leases lost; fenced appends: {} acknowledged, {} kept, {} lost with an unplanned failover (excused); sql: {} accepted, {} refused; {} unknown outcomes, {} errors escaped the client",
        config.seed,
        config.seconds,
        outcome.report.grants,
        c.not_acquired,
        c.leases_lost,
        c.appends_acknowledged,
        c.appends_kept,
        outcome.report.excused.iter().filter(|f| f.checker == "lost-writes").count(),
        c.sql_accepted,
        c.sql_refused,
        c.unknown_outcomes,
        c.escaped,
    );
    println!(
        "chaos: minority side of partitions: {} appends acknowledged while cut off, {} of them lost (excused), {} errors from the client while cut off",
        c.minority_acknowledged, c.minority_lost, c.minority_errors,
    );
    println!(
        "chaos: cluster operations: {} resource slots moved, {} operations that did not complete ({}), longest wait for a healthy cluster {} ms",
        outcome.moved,
        outcome.incomplete.len(),
        outcome.incomplete.join("; "),
        outcome.longest_heal_ms,
    );
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for fault in &outcome.faults {
        *kinds.entry(fault.kind).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(kind, n)| format!("{kind}={n}")).collect();
    println!(
        "chaos: {} ops, {} faults ({}), {} violations",
        outcome.report.operations,
        outcome.faults.len(),
        kinds.join(", "),
        outcome.report.violations.len()
    );
    std::process::exit(if outcome.report.violations.is_empty() { 0 } else { 1 })
}

struct Outcome {
    report: crate::check::Report,
    counts: check::Counts,
    faults: Vec<Fault>,
    events: Vec<Event>,
    /// Resources whose slot changed owner in a reshard, a rebalance or a membership change.
    moved: usize,
    /// Operations the nemesis started that did not end well (a reshard that stopped, a cluster
    /// not healthy in time), each with what it said.
    incomplete: Vec<String>,
    longest_heal_ms: u128,
}

impl Outcome {
    fn slice(&self, finding: &Finding) -> Vec<String> {
        let mut lines: Vec<String> = self
            .events
            .iter()
            .filter(|e| {
                (finding.resource.is_empty() || e.resource == finding.resource)
                    && e.at >= finding.from
                    && e.at <= finding.to
            })
            .map(Event::line)
            .collect();
        if lines.len() > 40 {
            let tail = lines.split_off(lines.len() - 20);
            lines.truncate(20);
            lines.push("…".into());
            lines.extend(tail);
        }
        for fault in &self.faults {
            if fault.start <= finding.to && fault.end >= finding.from {
                lines.push(format!("fault {} from {} to {}", fault.kind, fault.start, fault.end));
            }
        }
        lines
    }
}

/// The worker processes; killed when dropped.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for worker in &mut self.0 {
            let _ = worker.kill();
            let _ = worker.wait();
        }
    }
}

/// `cmd` on the node serving its key, found from `entry` by following `MOVED` (and `ASK`, with
/// `ASKING` first on the same connection).
fn routed<T: redis::FromRedisValue>(entry: &str, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let mut endpoint = entry.to_owned();
    let mut asking = false;
    let mut last = None;
    for _ in 0..5 {
        let reply = if asking {
            redis::Client::open(format!("redis://{endpoint}/"))
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                .and_then(|mut con| {
                    let _: () = redis::cmd("ASKING").query(&mut con)?;
                    cmd.query(&mut con)
                })
        } else {
            query::<T>(&endpoint, cmd)
        };
        match reply {
            Err(error) if error.redirect_node().is_some() => {
                asking = error.kind() == redis::ErrorKind::Ask;
                endpoint = error.redirect_node().map(|(a, _)| a.to_owned()).unwrap_or_default();
                last = Some(error);
            }
            other => return other,
        }
    }
    Err(last
        .unwrap_or_else(|| redis::RedisError::from((redis::ErrorKind::ClientError, "no reply"))))
}

fn setup_sql(pg: &str, resources: u32) {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let (client, connection) =
            tokio_postgres::connect(pg, tokio_postgres::NoTls).await.expect("postgres");
        tokio::spawn(connection);
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
                .execute("INSERT INTO registers VALUES ($1, 0, 0)", &[&worker::resource(r)])
                .await
                .expect("insert register");
        }
    });
}

fn read_sql(pg: &str) -> BTreeMap<String, Vec<Accepted>> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let (client, connection) =
            tokio_postgres::connect(pg, tokio_postgres::NoTls).await.expect("postgres");
        tokio::spawn(connection);
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

/// The nemesis's state: the nodes, who is in the cluster, and what it found on the way.
struct Harness {
    nodes: Nodes,
    /// Endpoints of the cluster's members now.
    members: Vec<String>,
    /// The slot of each resource.
    slots: Vec<usize>,
    moved: usize,
    incomplete: Vec<String>,
    longest_heal_ms: u128,
    log: std::fs::File,
    /// Each partition: the node cut off, from the cut to the link's return.
    partitions: Vec<(usize, u64, u64)>,
}

impl Harness {
    fn entry(&self) -> String {
        self.nodes.entry().unwrap_or(&self.nodes.list[0].endpoint).to_owned()
    }

    fn view(&self) -> Vec<Member> {
        view(&self.entry()).unwrap_or_default()
    }

    /// Writes `text` to the run's operations log (`cluster-ops.log`).
    fn note(&mut self, text: &str) {
        use std::io::Write;
        let _ = writeln!(self.log, "{} {text}", now_ns());
    }

    fn incomplete(&mut self, what: String) {
        self.note(&format!("INCOMPLETE {what}"));
        self.incomplete.push(what);
    }

    /// The owner (endpoint) of each resource's slot.
    fn owners(&self) -> Vec<String> {
        let view = self.view();
        self.slots
            .iter()
            .map(|slot| {
                view.iter()
                    .find(|m| m.primary && m.ranges.iter().any(|(a, b)| (a..=b).contains(&slot)))
                    .map(|m| m.endpoint.clone())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// `redis-cli --cluster` with the entry node; notes its output, and what did not complete.
    fn cluster_tool(&mut self, what: &str, args: &[&str]) -> bool {
        let (ok, output) = redis_cli(args, Duration::from_secs(180));
        self.note(&format!("redis-cli --cluster {}\n{output}", args.join(" ")));
        let stopped = output.lines().find(|l| l.contains("[ERR]") || l.contains("ERR "));
        if !ok || stopped.is_some() {
            let why = stopped.unwrap_or("failed").trim().to_owned();
            self.incomplete(format!("{what}: {why}"));
            return false;
        }
        true
    }

    /// Waits until the cluster is whole again; if a slot stays open (a reshard that stopped),
    /// `redis-cli --cluster fix` closes it.
    fn heal(&mut self, after: &str) {
        let started = Instant::now();
        let mut healed = await_healthy(&self.nodes, &self.members, Duration::from_secs(30));
        if !healed && self.view().iter().any(|m| m.open_slots > 0) {
            let entry = self.entry();
            self.cluster_tool(&format!("fix after {after}"), &["fix", &entry, "--cluster-yes"]);
            healed = await_healthy(&self.nodes, &self.members, Duration::from_secs(30));
        }
        if !healed {
            self.incomplete(format!("the cluster was not healthy 30 s after {after}"));
        }
        self.longest_heal_ms = self.longest_heal_ms.max(started.elapsed().as_millis());
    }

    /// A primary serving slots with a replica streaming from it, and that replica.
    fn pick_pair(&self, rng: &mut Rng) -> Option<(usize, usize)> {
        let pairs = nodes::primaries_with_replica(&self.view());
        let (primary, replica) = pairs.get(rng.below(pairs.len().max(1) as u64) as usize)?;
        Some((self.nodes.index_of(&primary.endpoint)?, self.nodes.index_of(&replica.endpoint)?))
    }

    /// Runs one fault; the kind it turned out to be (`membership` is `add-node` or
    /// `remove-node`), or `None` when nothing could be done.
    fn fault(&mut self, kind: &'static str, rng: &mut Rng) -> Option<&'static str> {
        let before = self.owners();
        let done = match kind {
            "failover" => {
                let (_, replica) = self.pick_pair(rng)?;
                let endpoint = self.nodes.list[replica].endpoint.clone();
                let asked: redis::RedisResult<()> =
                    query(&endpoint, redis::cmd("CLUSTER").arg("FAILOVER"));
                if let Err(error) = asked {
                    self.incomplete(format!("CLUSTER FAILOVER on {endpoint}: {error}"));
                } else if !await_primary(&endpoint, Duration::from_secs(15)) {
                    self.incomplete(format!("{endpoint} not promoted by CLUSTER FAILOVER"));
                }
                kind
            }
            "kill-primary" | "pause-primary" | "partition" => {
                let (primary, replica) = self.pick_pair(rng)?;
                let endpoint = self.nodes.list[replica].endpoint.clone();
                let cut = now_ns();
                match kind {
                    "kill-primary" => self.nodes.kill(primary),
                    "pause-primary" => self.nodes.signal(primary, true),
                    _ => self.nodes.net.set_link(primary, false),
                }
                if !await_primary(&endpoint, Duration::from_secs(20)) {
                    self.incomplete(format!("{endpoint} not promoted after {kind}"));
                }
                sleep(Duration::from_millis(rng.between(0, 1_500)));
                match kind {
                    "kill-primary" => self.nodes.start(primary, false),
                    "pause-primary" => self.nodes.signal(primary, false),
                    _ => {
                        self.nodes.net.set_link(primary, true);
                        self.partitions.push((primary, cut, now_ns()));
                    }
                }
                kind
            }
            "reshard" => {
                let view = self.view();
                let primaries: Vec<&Member> =
                    view.iter().filter(|m| m.primary && !m.failing).collect();
                let sources: Vec<&&Member> = primaries.iter().filter(|m| m.slots > 1).collect();
                let from = **sources.get(rng.below(sources.len().max(1) as u64) as usize)?;
                let targets: Vec<&&Member> = primaries.iter().filter(|m| m.id != from.id).collect();
                let to = **targets.get(rng.below(targets.len().max(1) as u64) as usize)?;
                let most = (from.slots as u64 - 1).min(2_000);
                let count = rng.between(most.min(100), most).to_string();
                let entry = self.entry();
                self.cluster_tool(
                    "reshard",
                    &[
                        "reshard",
                        &entry,
                        "--cluster-from",
                        &from.id,
                        "--cluster-to",
                        &to.id,
                        "--cluster-slots",
                        &count,
                        "--cluster-yes",
                    ],
                );
                kind
            }
            "rebalance" => {
                let entry = self.entry();
                self.cluster_tool(
                    "rebalance",
                    &["rebalance", &entry, "--cluster-use-empty-masters", "--cluster-yes"],
                );
                kind
            }
            "membership" => {
                if self.members.len() == FIRST {
                    self.add_nodes()
                } else {
                    self.remove_nodes()
                }
            }
            "clock-skew" => {
                let mut offsets = Vec::new();
                for node in &self.nodes.list {
                    let offset = rng.between(0, 2_000) as i64 - 1_000;
                    node.clock.set_offset_us(offset * 1_000);
                    offsets.push(offset);
                }
                self.note(&format!("clock offsets (ms) of nodes 0..{NODES}: {offsets:?}"));
                kind
            }
            _ => unreachable!("every kind is handled"),
        };
        self.heal(done);
        let after = self.owners();
        self.moved += before.iter().zip(&after).filter(|(a, b)| a != b).count();
        Some(done)
    }

    /// `add-node`: the spare primary joins empty, the spare replica joins as its replica, and a
    /// rebalance gives the new primary its share of the slots.
    fn add_nodes(&mut self) -> &'static str {
        let entry = self.entry();
        self.nodes.start(FIRST, true);
        self.nodes.start(FIRST + 1, true);
        let (primary, replica) =
            (self.nodes.list[FIRST].endpoint.clone(), self.nodes.list[FIRST + 1].endpoint.clone());
        self.cluster_tool("add-node (primary)", &["add-node", &primary, &entry]);
        let id: String = query(&primary, redis::cmd("CLUSTER").arg("MYID")).unwrap_or_default();
        // The replica can only be added once every node knows the primary.
        sleep(Duration::from_millis(1_000));
        self.cluster_tool(
            "add-node (replica)",
            &["add-node", &replica, &entry, "--cluster-slave", "--cluster-master-id", &id],
        );
        self.members.push(primary);
        self.members.push(replica);
        self.heal("add-node");
        self.cluster_tool(
            "rebalance onto the new primary",
            &["rebalance", &entry, "--cluster-use-empty-masters", "--cluster-yes"],
        );
        "add-node"
    }

    /// `remove-node`: the spare pair's primary (whichever of the two is primary now) is emptied
    /// by a rebalance that weighs it 0, then both are deleted (`del-node`) and stopped.
    fn remove_nodes(&mut self) -> &'static str {
        let entry = self.entry();
        let view = self.view();
        let spares: Vec<&Member> =
            view.iter().filter(|m| self.members[FIRST..].contains(&m.endpoint)).collect();
        let serving = |view: &[Member], members: &[String]| {
            view.iter().any(|m| members[FIRST..].contains(&m.endpoint) && m.slots > 0)
        };
        // Twice at most: a move may stop half-way (Valkey's SETSLOT answers NOREPLICAS when the
        // source's replica does not acknowledge in time); the cluster is mended in between.
        for attempt in 1..=2 {
            let Some(primary) = spares.iter().find(|m| m.primary) else { break };
            let weight = format!("{}=0", primary.id);
            self.cluster_tool(
                &format!("rebalance off the spare primary (attempt {attempt})"),
                &["rebalance", &entry, "--cluster-weight", &weight, "--cluster-yes"],
            );
            if !serving(&self.view(), &self.members) {
                break;
            }
            self.heal("a rebalance off the spare primary");
        }
        if serving(&self.view(), &self.members) {
            self.incomplete("remove-node: the spare primary still serves slots".into());
            return "remove-node";
        }
        // The replica first: del-node refuses a primary with replicas.
        let mut order: Vec<&Member> = spares.clone();
        order.sort_by_key(|m| m.primary);
        for member in order {
            self.cluster_tool("del-node", &["del-node", &entry, &member.id]);
        }
        self.nodes.kill(FIRST);
        self.nodes.kill(FIRST + 1);
        self.members.truncate(FIRST);
        "remove-node"
    }
}

/// Starts cluster worker `id`: in the harness's namespace with PostgreSQL, or (`namespace`) in a
/// node's namespace, Redis only, where a partition of that node leaves it on the minority side.
fn spawn_worker(
    config: &Config,
    dir: &Path,
    id: u32,
    seeds: &str,
    pg: &str,
    namespace: Option<String>,
) -> Child {
    let exe = std::env::current_exe().expect("own path");
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("worker-{id}.stderr")))
        .expect("worker stderr");
    let mut command = match &namespace {
        Some(namespace) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", namespace]).arg(exe);
            command
        }
        None => Command::new(exe),
    };
    command.arg("cluster-worker");
    if namespace.is_none() {
        command.args(["--pg", pg]);
    }
    command
        .args(["--id", &id.to_string(), "--seeds", seeds])
        .args(["--resources", &config.resources.to_string()])
        .args(["--ttl-ms", &config.ttl.as_millis().to_string()])
        .args(["--seed", &(config.seed.wrapping_mul(1_000_003) ^ u64::from(id)).to_string()])
        .arg("--log")
        .arg(dir.join(format!("worker-{id}.history")))
        .args(config.broken.then_some("--broken"))
        .stdout(Stdio::null())
        .stderr(stderr);
    let child = net::unblock_in_child(&mut command).spawn().expect("spawn cluster worker");
    net::track(child.id());
    child
}

fn run(config: &Config) -> Outcome {
    let dir = tempfile::Builder::new().prefix("dlock-chaos-cluster-").tempdir().expect("run dir");
    let net = net::Net::create(NODES).unwrap_or_else(|error| {
        eprintln!("dlock-chaos: cannot build the cluster's network: {error}");
        std::process::exit(2)
    });
    let ttl_ms = config.ttl.as_millis().to_string();
    let args: Vec<String> = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &NODE_TIMEOUT_MS.to_string(),
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
        "--repl-diskless-sync-delay",
        "0",
        "--dlock.restart-grant-delay-ms",
        &ttl_ms,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut nodes = Nodes::new(net, dir.path(), args);
    for i in 0..FIRST {
        nodes.start(i, true);
    }
    let members: Vec<String> = (0..FIRST).map(|i| nodes.list[i].endpoint.clone()).collect();
    let mut create = vec!["create"];
    create.extend(members.iter().map(String::as_str));
    create.extend(["--cluster-replicas", "1", "--cluster-yes"]);
    let (created, output) = redis_cli(&create, Duration::from_secs(60));
    assert!(created, "redis-cli --cluster create failed:\n{output}");
    assert!(
        await_healthy(&nodes, &members, Duration::from_secs(60)),
        "the new cluster is not healthy"
    );
    let entry = members[0].clone();
    let slots: Vec<usize> = (0..config.resources)
        .map(|r| {
            let slot: i64 =
                query(&entry, redis::cmd("CLUSTER").arg("KEYSLOT").arg(worker::resource(r)))
                    .expect("KEYSLOT");
            slot as usize
        })
        .collect();
    for r in 0..config.resources {
        for k in 0..FILLER {
            let set = redis::cmd("SET").arg(worker::filler(r, k)).arg("filler").clone();
            let _: () = routed(&entry, &set).expect("SET filler");
        }
    }
    let pg = {
        let mut kept = lock_postgres();
        kept.insert(Postgres::start()).config()
    };
    let stop_postgres = StopPostgres;
    setup_sql(&pg, config.resources);
    let seeds = members.join(",");
    // The workers in the harness's namespace, then one in each first node's namespace.
    let mut workers = Workers(
        (0..config.workers)
            .map(|id| spawn_worker(config, dir.path(), id, &seeds, &pg, None))
            .chain((0..FIRST).map(|i| {
                let id = config.workers + i as u32;
                let namespace = Some(nodes.net.namespace(i));
                spawn_worker(config, dir.path(), id, &seeds, &pg, namespace)
            }))
            .collect(),
    );
    let log = std::fs::File::create(dir.path().join("cluster-ops.log")).expect("ops log");
    let mut harness = Harness {
        nodes,
        members,
        slots,
        moved: 0,
        incomplete: Vec::new(),
        longest_heal_ms: 0,
        log,
        partitions: Vec::new(),
    };
    let mut rng = Rng::new(config.seed);
    let mut faults = Vec::new();
    let end = Instant::now() + Duration::from_secs(config.seconds);
    sleep(Duration::from_millis(rng.between(1_000, 2_000)));
    while Instant::now() + Duration::from_secs(3) < end {
        let kind = config.only.unwrap_or_else(|| *rng.pick(&KINDS));
        let start = now_ns();
        harness.note(&format!("fault {kind}"));
        let Some(kind) = harness.fault(kind, &mut rng) else {
            sleep(Duration::from_millis(200));
            continue;
        };
        faults.push(Fault {
            kind,
            start,
            end: now_ns(),
            may_lose_leases: UNPLANNED.contains(&kind),
        });
        if config.broken {
            // The self-check of lost-writes: an acknowledged append disappears.
            let r = rng.below(u64::from(config.resources)) as u32;
            let _: redis::RedisResult<Option<String>> =
                routed(&harness.entry(), redis::cmd("LPOP").arg(worker::register(r)));
        }
        sleep(Duration::from_millis(rng.between(1_000, 3_000)));
    }
    sleep(end.saturating_duration_since(Instant::now()));
    for child in &workers.0 {
        net::untrack(child.id());
    }
    workers.0.iter_mut().for_each(|w| {
        let _ = w.kill();
        let _ = w.wait();
    });
    drop(workers);
    harness.heal("the run");

    let mut state = State { sql: read_sql(&pg), ..State::default() };
    drop(stop_postgres);
    let entry = harness.entry();
    for r in 0..config.resources {
        let entries: Vec<String> =
            routed(&entry, redis::cmd("LRANGE").arg(worker::register(r)).arg(0).arg(-1))
                .unwrap_or_else(|e| panic!("LRANGE {}: {e}", worker::register(r)));
        state.redis.insert(
            worker::resource(r),
            entries.iter().filter_map(|e| Accepted::parse(e)).collect(),
        );
    }
    let events = read_history(dir.path(), config.workers + FIRST as u32);
    let minority: Vec<check::Minority> = harness
        .partitions
        .iter()
        .filter(|(node, _, _)| *node < FIRST)
        .map(|&(node, from, to)| check::Minority { worker: config.workers + node as u32, from, to })
        .collect();
    let (report, counts) = check::check(&events, &faults, &state, &minority);
    if !report.violations.is_empty() || !harness.incomplete.is_empty() {
        let kept = dir.keep();
        eprintln!(
            "dlock-chaos: histories, node logs and cluster-ops.log kept in {}",
            kept.display()
        );
    }
    Outcome {
        report,
        counts,
        faults,
        events,
        moved: harness.moved,
        incomplete: harness.incomplete,
        longest_heal_ms: harness.longest_heal_ms,
    }
}

fn read_history(dir: &Path, workers: u32) -> Vec<Event> {
    let mut events = Vec::new();
    for id in 0..workers {
        let text =
            std::fs::read_to_string(dir.join(format!("worker-{id}.history"))).unwrap_or_default();
        events.extend(text.lines().filter_map(Event::parse));
    }
    events.sort_by_key(|e| e.at);
    events
}
