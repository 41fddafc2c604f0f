//! A worker process: acquire (waiting in the server's queue) → read-modify-write of the
//! resource's protected state, fenced twice (a DLOCK.FENCED write to a Redis register and a
//! fenced SQL update) → release; every step logged to its history file.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Duration;

use dlock_client::sql::{SqlFencedError, execute_fenced};
use dlock_client::{AcquireError, Client, ClientOptions, Replicas, RunError};
use dlock_testkit::Rng;

use crate::check::Accepted;
use crate::history::{Kind, Log, Op};

/// What a worker is told on its command line.
pub struct Args {
    pub id: u32,
    pub redis_url: String,
    pub pg: String,
    pub resources: u32,
    pub ttl: Duration,
    pub replicas: u32,
    pub seed: u64,
    pub log: PathBuf,
    /// The harness's self-check: every fourth lease, block the thread past the lease before the
    /// SQL write, and write without the fence condition. The checkers must then fail the run.
    pub unfenced: bool,
}

/// How long one Redis or SQL request may take before its outcome counts as unknown.
const REQUEST: Duration = Duration::from_millis(500);

pub fn run(args: Args) -> ! {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(work(args));
    std::process::exit(0)
}

async fn connect<T>(what: &str, mut attempt: impl AsyncFnMut() -> Option<T>) -> T {
    loop {
        if let Some(connected) = attempt().await {
            return connected;
        }
        eprintln!("worker: cannot connect to {what}; retrying");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn work(args: Args) {
    let log = RefCell::new(Log::create(&args.log, args.id).expect("history file"));
    let options = ClientOptions {
        request_timeout: REQUEST,
        acquire_deadline: Duration::from_secs(2),
        cancel_grace: Duration::from_millis(200),
        replicas: (args.replicas > 0)
            .then_some(Replicas { count: args.replicas, timeout: Duration::from_millis(200) }),
        watch_events: false,
        ..ClientOptions::default()
    };
    let dlock = connect("dlock", async || {
        Client::connect_with(&args.redis_url, options.clone()).await.ok()
    })
    .await;
    let redis = connect("redis", async || {
        let client = redis::Client::open(args.redis_url.as_str()).ok()?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(REQUEST)
            .set_response_timeout(REQUEST);
        redis::aio::ConnectionManager::new_with_config(client, config).await.ok()
    })
    .await;
    let mut pg = connect("postgres", async || {
        let (client, connection) =
            tokio_postgres::connect(&args.pg, tokio_postgres::NoTls).await.ok()?;
        tokio::spawn(connection);
        Some(client)
    })
    .await;
    let mut rng = Rng::new(args.seed ^ (u64::from(args.id) << 32));
    let seq = RefCell::new(0u64);
    let mut leases = 0u64;
    loop {
        let r = rng.below(u64::from(args.resources));
        let resource = format!("res:{{{r}}}");
        let register = format!("reg:{{{r}}}");
        log.borrow_mut().record(Op::Acquire, Kind::Invoke, &resource, 0, "");
        let lease = match dlock.acquire_waiting(&resource, args.ttl, Some(args.ttl)).await {
            Ok(lease) => {
                log.borrow_mut().record(
                    Op::Acquire,
                    Kind::Ok,
                    &resource,
                    lease.fence(),
                    lease.token(),
                );
                lease
            }
            Err(AcquireError::Unknown { token, .. }) => {
                log.borrow_mut().record(Op::Acquire, Kind::Unknown, &resource, 0, &token);
                continue;
            }
            Err(error) => {
                let detail = format!("{}: {error}", error.kind());
                log.borrow_mut().record(Op::Acquire, Kind::Fail, &resource, 0, &detail);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let fence = lease.fence();
        leases += 1;
        let stall = (args.unfenced && leases.is_multiple_of(4)).then_some(args.ttl * 2);
        let think = Duration::from_millis(5 + rng.below(25));
        let (log, seq, redis, pg, resource_ref) = (&log, &seq, &redis, &mut pg, resource.as_str());
        let outcome = lease
            .run(|_cancelled| async move {
                redis_write(redis, log, seq, args.id, resource_ref, &register, fence).await;
                if let Some(stall) = stall {
                    std::thread::sleep(stall); // renewals stop: the lease expires meanwhile
                }
                sql_write(pg, log, seq, args.id, resource_ref, fence, args.unfenced).await;
                tokio::time::sleep(think).await;
                log.borrow_mut().record(Op::Release, Kind::Invoke, resource_ref, fence, "");
            })
            .await;
        let mut log = log.borrow_mut();
        match outcome {
            Ok(()) => log.record(Op::Release, Kind::Ok, &resource, fence, ""),
            Err(RunError::NotReleased { reason, .. }) if reason.contains("no longer held") => {
                log.record(Op::Release, Kind::Fail, &resource, fence, &reason)
            }
            Err(RunError::NotReleased { reason, .. }) => {
                log.record(Op::Release, Kind::Unknown, &resource, fence, &reason)
            }
            Err(RunError::LockLost(reason)) => {
                log.record(Op::Lost, Kind::Ok, &resource, fence, &reason.to_string())
            }
        }
    }
}

/// Reads the register's last value and appends the next one under the fence (DLOCK.FENCED).
async fn redis_write(
    redis: &redis::aio::ConnectionManager,
    log: &RefCell<Log>,
    seq: &RefCell<u64>,
    worker: u32,
    resource: &str,
    register: &str,
    fence: u64,
) {
    let mut con = redis.clone();
    let last: Option<String> =
        match redis::cmd("LINDEX").arg(register).arg(-1).query_async(&mut con).await {
            Ok(last) => last,
            Err(_) => return, // no read, no write
        };
    let value = last.as_deref().and_then(Accepted::parse).map_or(0, |a| a.value) + 1;
    *seq.borrow_mut() += 1;
    let entry = Accepted { fence, worker, seq: *seq.borrow(), value }.entry();
    log.borrow_mut().record(Op::RedisWrite, Kind::Invoke, resource, fence, &entry);
    let written: redis::RedisResult<i64> = redis::cmd("DLOCK.FENCED")
        .arg(resource)
        .arg(fence)
        .arg("RPUSH")
        .arg(register)
        .arg(&entry)
        .query_async(&mut con)
        .await;
    let mut log = log.borrow_mut();
    match written {
        Ok(_) => log.record(Op::RedisWrite, Kind::Ok, resource, fence, &entry),
        // An error reply: the server refused it (STALE, READONLY, LOADING …); nothing was written.
        Err(error) if error.code().is_some() => {
            log.record(Op::RedisWrite, Kind::Fail, resource, fence, &error.to_string())
        }
        Err(error) => {
            log.record(Op::RedisWrite, Kind::Unknown, resource, fence, &error.to_string())
        }
    }
}

/// Reads the row's value and writes the next one under the fence, logging the accepted write in
/// the same transaction.
async fn sql_write(
    pg: &mut tokio_postgres::Client,
    log: &RefCell<Log>,
    seq: &RefCell<u64>,
    worker: u32,
    resource: &str,
    fence: u64,
    unfenced: bool,
) {
    *seq.borrow_mut() += 1;
    let seq = *seq.borrow();
    log.borrow_mut().record(Op::SqlWrite, Kind::Invoke, resource, fence, "");
    let outcome = async {
        let tx = pg.transaction().await.map_err(SqlFencedError::Postgres)?;
        let value: i64 = tx
            .query_one("SELECT value FROM registers WHERE resource = $1", &[&resource])
            .await
            .map_err(SqlFencedError::Postgres)?
            .get(0);
        let next = value + 1;
        let statement = if unfenced {
            "UPDATE registers SET value = $2, fencing_token = $3 WHERE resource = $1"
        } else {
            "UPDATE registers SET value = $2, fencing_token = $3 \
             WHERE resource = $1 AND fencing_token <= $3"
        };
        execute_fenced(&tx, statement, &[&resource, &next], fence).await?;
        tx.execute(
            "INSERT INTO writes (resource, fence, worker, seq, value) VALUES ($1, $2, $3, $4, $5)",
            &[&resource, &(fence as i64), &i64::from(worker), &(seq as i64), &next],
        )
        .await
        .map_err(SqlFencedError::Postgres)?;
        tx.commit().await.map_err(SqlFencedError::Postgres)?;
        Ok::<_, SqlFencedError>(Accepted { fence, worker, seq, value: next }.entry())
    };
    let outcome = tokio::time::timeout(REQUEST * 4, outcome).await;
    let mut log = log.borrow_mut();
    match outcome {
        Ok(Ok(entry)) => log.record(Op::SqlWrite, Kind::Ok, resource, fence, &entry),
        Ok(Err(SqlFencedError::Stale(stale))) => {
            log.record(Op::SqlWrite, Kind::Fail, resource, fence, &stale.to_string())
        }
        Ok(Err(error)) => {
            log.record(Op::SqlWrite, Kind::Unknown, resource, fence, &error.to_string())
        }
        Err(_) => log.record(Op::SqlWrite, Kind::Unknown, resource, fence, "timed out"),
    }
}
