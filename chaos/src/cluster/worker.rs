//! A cluster worker process: leases through `dlock-client` in cluster mode
//! (`Client::connect_cluster_with`, grants and renewals acknowledged by a replica), each used for
//! a `DLOCK.FENCED RPUSH` to the resource's register ([`Lease::fenced`]: routed by the client to
//! the slot's primary) and a fenced SQL update (`WHERE fencing_token < $fence`), renewed between
//! steps and released. The lease is driven by hand rather than by `Lease::run`, so that the
//! worker knows its local expiry at every step. Every step goes to its history file; so does
//! every error the client API returned, classified.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use dlock_client::sql::{SqlFencedError, execute_fenced};
use dlock_client::{AcquireError, Client, ClientOptions, FencedError, Lease, Replicas};
use dlock_testkit::Rng;

use crate::check::Accepted;
use crate::history::{Kind, Log, Op};

/// What a cluster worker is told on its command line.
pub struct Args {
    pub id: u32,
    /// `host:port` of the nodes it starts from.
    pub seeds: Vec<String>,
    /// PostgreSQL; `None` for a worker in a node's namespace, which writes to Redis only (the
    /// database listens on the harness's loopback).
    pub pg: Option<String>,
    pub resources: u32,
    pub ttl: Duration,
    pub seed: u64,
    pub log: PathBuf,
    /// The self-check: every fourth lease stalls past its ttl and writes SQL without the fence
    /// condition; every sixth writes SQL under a fence it was never granted (far above its own);
    /// every fifth sends a fenced write naming a key of another slot.
    pub broken: bool,
}

/// How long one request may take before its outcome counts as unknown.
const REQUEST: Duration = Duration::from_millis(500);

/// The resource, register and filler keys of resource `r`: one hash tag, one slot.
pub fn resource(r: u32) -> String {
    format!("res:{{c{r}}}")
}
pub fn register(r: u32) -> String {
    format!("reg:{{c{r}}}")
}
pub fn filler(r: u32, k: u32) -> String {
    format!("fill:{{c{r}}}:{k}")
}

pub fn run(args: Args) -> ! {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(work(args));
    std::process::exit(0)
}

/// The detail an error of the client API is logged with: `<class> <kind>: <error>`, the class
/// being what the `client-errors` checker judges: `lost` (the lease is gone: LeaseLost),
/// `not-acquired` (nothing is held: NotAcquired), `unknown` (the request may have been carried
/// out and its answer never came: a timeout or a connection that dropped after sending), or
/// `escaped` (anything else).
///
/// The client sends a fenced write or a release again while the server cannot have carried it
/// out, until the lease's local expiry; an error after that expiry is the lease's end (LeaseLost),
/// not an error the client let escape.
fn fenced_error(error: &FencedError, expired: bool) -> String {
    match error {
        FencedError::Stale(detail) => format!("lost stale: {detail}"),
        FencedError::CrossSlot(detail) => format!("escaped cross-slot: {detail}"),
        FencedError::Redis(e) if e.is_timeout() || e.is_connection_dropped() => {
            format!("unknown redis: {e}")
        }
        FencedError::Redis(e) if expired => format!("lost expired: {e}"),
        FencedError::Redis(e) => format!("escaped redis: {e}"),
    }
}

fn acquire_error(error: &AcquireError) -> String {
    let class = match error {
        AcquireError::Held | AcquireError::NotReplicated { .. } => "not-acquired",
        AcquireError::Unknown { released: true, .. } => "not-acquired",
        AcquireError::Unknown { .. } | AcquireError::Unreachable(_) | AcquireError::Server(_) => {
            "escaped"
        }
    };
    format!("{class} {}: {error}", error.kind())
}

async fn work(args: Args) {
    let log = RefCell::new(Log::create(&args.log, args.id).expect("history file"));
    let options = ClientOptions {
        connect_timeout: REQUEST,
        request_timeout: REQUEST,
        // Longer than a failover (node timeout 2 s, election, the map read again).
        acquire_deadline: Duration::from_secs(10),
        cancel_grace: Duration::from_millis(200),
        replicas: Some(Replicas { count: 1, timeout: Duration::from_millis(300) }),
        watch_events: false,
        ..ClientOptions::default()
    };
    let urls: Vec<String> = args.seeds.iter().map(|s| format!("redis://{s}")).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let dlock = loop {
        match Client::connect_cluster_with(&urls, options.clone()).await {
            Ok(client) => break client,
            Err(error) => {
                eprintln!("cluster worker: cannot connect: {error}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let mut pg = match &args.pg {
        None => None,
        Some(config) => Some(loop {
            match tokio_postgres::connect(config, tokio_postgres::NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    break client;
                }
                Err(error) => {
                    eprintln!("cluster worker: cannot connect to postgres: {error}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }),
    };
    let mut rng = Rng::new(args.seed ^ (u64::from(args.id) << 32));
    let seq = RefCell::new(0u64);
    let mut leases = 0u64;
    loop {
        let r = rng.below(u64::from(args.resources)) as u32;
        let resource = resource(r);
        log.borrow_mut().record(Op::Acquire, Kind::Invoke, &resource, 0, "");
        let lease = match dlock.acquire_waiting(&resource, args.ttl, Some(args.ttl)).await {
            Ok(lease) => {
                let (fence, token) = (lease.fence(), lease.token().to_owned());
                log.borrow_mut().record(Op::Acquire, Kind::Ok, &resource, fence, &token);
                lease
            }
            Err(error) => {
                let kind = if matches!(error, AcquireError::Unknown { released: false, .. }) {
                    Kind::Unknown
                } else {
                    Kind::Fail
                };
                log.borrow_mut().record(Op::Acquire, kind, &resource, 0, &acquire_error(&error));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let fence = lease.fence();
        leases += 1;
        let broken = Broken {
            stall: (args.broken && leases.is_multiple_of(4)).then_some(args.ttl * 2),
            forged: args.broken && leases.is_multiple_of(6),
            cross_slot: args.broken && leases.is_multiple_of(5),
        };
        let step = Step {
            log: &log,
            seq: &seq,
            worker: args.id,
            resource: &resource,
            fence,
            ttl: args.ttl,
        };
        let mut lease = lease;
        if step.holds(&mut lease).await {
            step.append(&lease, &register(r), broken.cross_slot).await;
        }
        if let Some(pg) = pg.as_mut() {
            if let Some(stall) = broken.stall {
                std::thread::sleep(stall); // no renewal: the lease expires meanwhile
                step.sql(pg, broken).await;
            } else if step.holds(&mut lease).await {
                step.sql(pg, broken).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(5 + rng.below(25))).await;
        if !step.holds(&mut lease).await {
            let detail = "lost the local expiry passed or a renewal was refused";
            log.borrow_mut().record(Op::Lost, Kind::Ok, &resource, fence, detail);
            // Best effort, as `Lease::run` does: a renewal in flight must not keep it.
            let _ = lease.release().await;
            continue;
        }
        log.borrow_mut().record(Op::Release, Kind::Invoke, &resource, fence, "");
        let expiry = lease.local_expiry();
        let released = lease.release().await;
        let mut log = log.borrow_mut();
        match released {
            Ok(true) => log.record(Op::Release, Kind::Ok, &resource, fence, ""),
            Ok(false) => {
                log.record(Op::Release, Kind::Fail, &resource, fence, "lost no longer held")
            }
            Err(e) if e.is_timeout() || e.is_connection_dropped() => {
                log.record(Op::Release, Kind::Unknown, &resource, fence, &format!("unknown {e}"))
            }
            Err(e) if Instant::now() >= expiry => {
                log.record(Op::Release, Kind::Fail, &resource, fence, &format!("lost expired: {e}"))
            }
            Err(e) => {
                log.record(Op::Release, Kind::Unknown, &resource, fence, &format!("escaped {e}"))
            }
        }
    }
}

/// What the self-check's broken worker does with one lease.
#[derive(Clone, Copy)]
struct Broken {
    stall: Option<Duration>,
    forged: bool,
    cross_slot: bool,
}

/// One lease's work, logged.
struct Step<'a> {
    log: &'a RefCell<Log>,
    seq: &'a RefCell<u64>,
    worker: u32,
    resource: &'a str,
    fence: u64,
    ttl: Duration,
}

impl Step<'_> {
    /// Whether the worker still believes it holds the lease: before its conservative local
    /// expiry (counted by the client from the send of the request that set it), renewed first
    /// once a third of the ttl has gone (a refused renewal ends the belief; one that fails is
    /// retried at the next step, the local expiry deciding meanwhile). Every write and release
    /// the worker invokes follows a `true` here: the `double-holders` checker reads those
    /// invokes as moments the worker believed it held the lease.
    async fn holds(&self, lease: &mut Lease) -> bool {
        let left = lease.local_expiry().saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        if left < self.ttl * 2 / 3 {
            match lease.renew().await {
                Ok(true) | Err(_) => {}
                Ok(false) => return false,
            }
        }
        Instant::now() < lease.local_expiry()
    }

    fn next_seq(&self) -> u64 {
        *self.seq.borrow_mut() += 1;
        *self.seq.borrow()
    }

    /// Appends the next entry to the register under the fence, through the client.
    async fn append(&self, lease: &Lease, register: &str, cross_slot: bool) {
        let seq = self.next_seq();
        let entry =
            Accepted { fence: self.fence, worker: self.worker, seq, value: seq as i64 }.entry();
        let mut push = redis::cmd("RPUSH");
        // The self-check's broken worker names a key of another slot now and then.
        push.arg(if cross_slot { "elsewhere" } else { register }).arg(&entry);
        self.log.borrow_mut().record(
            Op::RedisWrite,
            Kind::Invoke,
            self.resource,
            self.fence,
            &entry,
        );
        let written: Result<i64, FencedError> = lease.fenced(&push).await;
        let mut log = self.log.borrow_mut();
        match written {
            Ok(_) => log.record(Op::RedisWrite, Kind::Ok, self.resource, self.fence, &entry),
            Err(error) => {
                let expired = Instant::now() >= lease.local_expiry();
                let detail = format!("{} {entry}", fenced_error(&error, expired));
                let kind = if detail.starts_with("unknown") { Kind::Unknown } else { Kind::Fail };
                log.record(Op::RedisWrite, kind, self.resource, self.fence, &detail)
            }
        }
    }

    /// The fenced read-modify-write of the resource's row: refused unless the fence is above
    /// the one the row keeps (`WHERE fencing_token < $fence`); the accepted write logged in the
    /// same transaction, a refusal logged with the fence the row kept.
    async fn sql(&self, pg: &mut tokio_postgres::Client, broken: Broken) {
        let seq = self.next_seq();
        // The forged fence: one no grant gave, far above every real one.
        let fence = if broken.forged { self.fence + (1 << 40) } else { self.fence };
        self.log.borrow_mut().record(Op::SqlWrite, Kind::Invoke, self.resource, self.fence, "");
        let resource = self.resource;
        let worker = self.worker;
        let outcome = async {
            let tx = pg.transaction().await.map_err(|e| (SqlFencedError::Postgres(e), 0))?;
            let row = tx
                .query_one(
                    "SELECT value, fencing_token FROM registers WHERE resource = $1 FOR UPDATE",
                    &[&resource],
                )
                .await
                .map_err(|e| (SqlFencedError::Postgres(e), 0))?;
            let (value, kept): (i64, i64) = (row.get(0), row.get(1));
            let next = value + 1;
            let statement = if broken.stall.is_some() {
                "UPDATE registers SET value = $2, fencing_token = $3 WHERE resource = $1"
            } else {
                "UPDATE registers SET value = $2, fencing_token = $3 \
                 WHERE resource = $1 AND fencing_token < $3"
            };
            execute_fenced(&tx, statement, &[&resource, &next], fence)
                .await
                .map_err(|e| (e, kept))?;
            tx.execute(
                "INSERT INTO writes (resource, fence, worker, seq, value) VALUES ($1, $2, $3, $4, $5)",
                &[&resource, &(fence as i64), &i64::from(worker), &(seq as i64), &next],
            )
            .await
            .map_err(|e| (SqlFencedError::Postgres(e), kept))?;
            tx.commit().await.map_err(|e| (SqlFencedError::Postgres(e), kept))?;
            Ok::<_, (SqlFencedError, i64)>(Accepted { fence, worker, seq, value: next }.entry())
        };
        let outcome = tokio::time::timeout(REQUEST * 4, outcome).await;
        let mut log = self.log.borrow_mut();
        match outcome {
            Ok(Ok(entry)) => log.record(Op::SqlWrite, Kind::Ok, resource, self.fence, &entry),
            Ok(Err((SqlFencedError::Stale(_), kept))) => {
                log.record(Op::SqlWrite, Kind::Fail, resource, self.fence, &format!("kept={kept}"))
            }
            Ok(Err((error, _))) => {
                log.record(Op::SqlWrite, Kind::Unknown, resource, self.fence, &error.to_string())
            }
            Err(_) => log.record(Op::SqlWrite, Kind::Unknown, resource, self.fence, "timed out"),
        }
    }
}
