//! Several workers pay invoices stored in PostgreSQL. Each invoice is locked with dlock while a
//! worker handles it, and each update is fenced: `… SET fencing_token = $fence WHERE id = $1
//! AND fencing_token <= $fence`.
//!
//! One worker stalls while it holds invoice 1: its runtime thread is blocked (as by a long GC
//! pause, a swapped-out process or a stopped VM), so its renewals stop and its lease expires.
//! Another worker, waiting in the server's queue, takes the invoice over with a larger fence and
//! pays it. When the stalled worker wakes, its late update carries the old fence and PostgreSQL
//! refuses it; the stalled worker never learns in time, and does not have to.
//!
//! ```text
//! cargo run -p dlock-client --example invoice_worker -- \
//!     redis://127.0.0.1:6379/ "host=127.0.0.1 user=postgres dbname=postgres"
//! ```
//!
//! The table `dlock_invoices` is dropped and created again.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_client::sql::{SqlFencedError, execute_fenced};
use dlock_client::{Client, ClientOptions, RunError};

/// How long a lease lasts before it must be renewed.
pub const TTL: Duration = Duration::from_millis(600);
/// How long the stalled worker's thread is blocked: well past its lease.
pub const STALL: Duration = Duration::from_millis(2_000);

/// What happened, for the caller to print or check.
#[derive(Debug, Default)]
pub struct Report {
    /// Updates PostgreSQL accepted: (invoice, worker, fence).
    pub paid: Vec<(i64, String, u64)>,
    /// Updates PostgreSQL refused because a newer fence had written the row: (invoice, worker, fence).
    pub refused: Vec<(i64, String, u64)>,
    /// Leases their worker lost while working: (invoice, worker, why).
    pub lost: Vec<(i64, String, String)>,
    /// The fence of the stalled worker's lease on invoice 1.
    pub stalled_fence: u64,
    /// The table afterwards: (id, status, processed_by, fencing_token).
    pub rows: Vec<(i64, String, Option<String>, i64)>,
}

type Shared = Arc<Mutex<Report>>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime")
}

async fn postgres(config: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(config, tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    client
}

async fn dlock(url: &str) -> Client {
    // Cancelled work gets time to finish its last statement, so that the stale write really
    // reaches the database (and is refused there) instead of being dropped on the client.
    let options = ClientOptions { cancel_grace: Duration::from_secs(2), ..Default::default() };
    Client::connect_with(url, options).await.expect("connect to dlock")
}

/// Pays `id` under `lease`-style fencing: reads the invoice and, if it is still pending, marks it
/// paid with `fence`. Records what PostgreSQL said.
async fn pay(pg: &tokio_postgres::Client, id: i64, worker: &str, fence: u64, report: &Shared) {
    let status: String =
        match pg.query_one("SELECT status FROM dlock_invoices WHERE id = $1", &[&id]).await {
            Ok(row) => row.get(0),
            Err(error) => {
                println!("{worker}: cannot read invoice {id}: {error}");
                return;
            }
        };
    if status != "pending" {
        return;
    }
    pay_now(pg, id, worker, fence, report).await;
}

async fn pay_now(pg: &tokio_postgres::Client, id: i64, worker: &str, fence: u64, report: &Shared) {
    let written = execute_fenced(
        pg,
        "UPDATE dlock_invoices SET status = 'paid', processed_by = $2, fencing_token = $3 \
         WHERE id = $1 AND fencing_token <= $3",
        &[&id, &worker],
        fence,
    )
    .await;
    let mut report = report.lock().expect("report");
    match written {
        Ok(_) => {
            println!("{worker}: paid invoice {id} with fence {fence}");
            report.paid.push((id, worker.to_owned(), fence));
        }
        Err(SqlFencedError::Stale(stale)) => {
            println!("{worker}: update of invoice {id} REFUSED by PostgreSQL: {stale}");
            report.refused.push((id, worker.to_owned(), fence));
        }
        Err(error) => println!("{worker}: update of invoice {id} failed: {error}"),
    }
}

/// The stalled worker: takes invoice 1, tells `holding`, then blocks its thread past the lease
/// and only then writes.
fn stalled_worker(
    redis_url: String,
    pg_config: String,
    holding: mpsc::Sender<u64>,
    report: Shared,
) {
    let worker = "worker-stalled";
    runtime().block_on(async move {
        let dlock = dlock(&redis_url).await;
        let pg = postgres(&pg_config).await;
        let lease = dlock.acquire("invoice:1", TTL).await.expect("invoice 1 is free at start");
        let fence = lease.fence();
        report.lock().expect("report").stalled_fence = fence;
        println!("{worker}: holds invoice 1 with fence {fence}");
        let _ = holding.send(fence);
        let (pg, during) = (&pg, report.clone());
        let outcome = lease
            .run(|_cancelled| async move {
                // Blocks the runtime thread: no renewal can run until the stall ends.
                println!("{worker}: stalls for {STALL:?} (lease ttl {TTL:?})");
                std::thread::sleep(STALL);
                pay_now(pg, 1, worker, fence, &during).await;
            })
            .await;
        if let Err(RunError::LockLost(reason)) = &outcome {
            println!("{worker}: lost invoice 1: {reason}");
            report.lock().expect("report").lost.push((1, worker.to_owned(), reason.to_string()));
        }
    });
}

/// A healthy worker: takes each invoice in turn (waiting in the server's queue while another
/// worker has it) and pays the pending ones.
fn worker(name: String, redis_url: String, pg_config: String, invoices: i64, report: Shared) {
    runtime().block_on(async move {
        let dlock = dlock(&redis_url).await;
        let pg = postgres(&pg_config).await;
        for id in 1..=invoices {
            let lease =
                match dlock.acquire_waiting(&format!("invoice:{id}"), TTL, Some(STALL * 2)).await {
                    Ok(lease) => lease,
                    Err(error) => {
                        println!("{name}: cannot lock invoice {id}: {error}");
                        continue;
                    }
                };
            let fence = lease.fence();
            let (pg, name, report) = (&pg, name.as_str(), &report);
            let outcome = lease
                .run(|_cancelled| async move {
                    tokio::time::sleep(Duration::from_millis(20)).await; // the work itself
                    pay(pg, id, name, fence, report).await;
                })
                .await;
            if let Err(RunError::LockLost(reason)) = outcome {
                report.lock().expect("report").lost.push((id, name.to_owned(), reason.to_string()));
            }
        }
    });
}

/// Creates `invoices` pending invoices, runs the stalled worker and `workers` healthy ones, and
/// reports what happened.
pub fn run_demo(redis_url: &str, pg_config: &str, invoices: i64, workers: usize) -> Report {
    runtime().block_on(async {
        let pg = postgres(pg_config).await;
        pg.batch_execute(
            "DROP TABLE IF EXISTS dlock_invoices;
             CREATE TABLE dlock_invoices (
                 id BIGINT PRIMARY KEY,
                 amount_cents BIGINT NOT NULL,
                 status TEXT NOT NULL DEFAULT 'pending',
                 processed_by TEXT,
                 fencing_token BIGINT NOT NULL DEFAULT 0
             );",
        )
        .await
        .expect("create table");
        for id in 1..=invoices {
            pg.execute(
                "INSERT INTO dlock_invoices (id, amount_cents) VALUES ($1, $2)",
                &[&id, &(id * 1000)],
            )
            .await
            .expect("insert invoice");
        }
    });

    let report: Shared = Arc::default();
    let (holding, held) = mpsc::channel();
    let stalled = {
        let (redis_url, pg_config, report) =
            (redis_url.to_owned(), pg_config.to_owned(), report.clone());
        std::thread::spawn(move || stalled_worker(redis_url, pg_config, holding, report))
    };
    held.recv().expect("the stalled worker took invoice 1");
    let healthy: Vec<_> = (1..=workers)
        .map(|n| {
            let (redis_url, pg_config, report) =
                (redis_url.to_owned(), pg_config.to_owned(), report.clone());
            std::thread::spawn(move || {
                worker(format!("worker-{n}"), redis_url, pg_config, invoices, report)
            })
        })
        .collect();
    for thread in healthy {
        thread.join().expect("worker thread");
    }
    stalled.join().expect("stalled worker thread");

    let rows = runtime().block_on(async {
        let pg = postgres(pg_config).await;
        pg.query(
            "SELECT id, status, processed_by, fencing_token FROM dlock_invoices ORDER BY id",
            &[],
        )
        .await
        .expect("read invoices")
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect()
    });
    let mut report = std::mem::take(&mut *report.lock().expect("report"));
    report.rows = rows;
    report
}

fn main() {
    let mut args = std::env::args().skip(1);
    let redis_url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());
    let pg_config =
        args.next().unwrap_or_else(|| "host=127.0.0.1 user=postgres dbname=postgres".to_owned());
    let report = run_demo(&redis_url, &pg_config, 6, 2);
    println!("\ninvoices:");
    for (id, status, by, fence) in &report.rows {
        println!("  {id}: {status} by {} (fencing_token {fence})", by.as_deref().unwrap_or("-"));
    }
    println!("stale updates refused by PostgreSQL: {}", report.refused.len());
}
