//! A counting semaphore: eight workers share a database that takes at most three of them at once.
//!
//! Every worker takes a permit of `pool:db` (`SHARED LIMIT 3`) before each job, waiting in the
//! server's queue while all three are out, and gives it back when the job ends. Each permit is a
//! lease of its own, renewed while its job runs and with a fence of its own: a worker that
//! crashes frees its permit when its ttl runs out, and nobody else's permit changes.
//!
//! ```text
//! cargo run -p dlock-client --example semaphore -- redis://127.0.0.1:6379/
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_client::Client;

const POOL: &str = "pool:db";
const PERMITS: u32 = 3;
const TTL: Duration = Duration::from_secs(10);

/// What happened: how many jobs ran, and the most that ever ran at once.
#[derive(Debug, Default)]
pub struct Report {
    /// Jobs done.
    pub jobs: usize,
    /// The most jobs that held a permit at the same time.
    pub most_at_once: usize,
}

/// One worker: `jobs` jobs, each under a permit.
async fn worker(
    dlock: Client,
    who: String,
    jobs: usize,
    busy: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
) -> Result<usize, String> {
    for job in 1..=jobs {
        let wait = Some(Duration::from_secs(30));
        let permit =
            dlock.semaphore(POOL, PERMITS, TTL, wait).await.map_err(|e| format!("{who}: {e}"))?;
        let fence = permit.fence();
        let (busy, most) = (busy.clone(), most.clone());
        let who = who.as_str();
        permit
            .run(|_cancelled| async move {
                let now = busy.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                println!("{who}: job {job} with permit {fence}, {now} of {PERMITS} permits out");
                tokio::time::sleep(Duration::from_millis(100)).await; // the job
                busy.fetch_sub(1, Ordering::SeqCst);
            })
            .await
            .map_err(|e| format!("{who}: {e}"))?;
    }
    Ok(jobs)
}

/// Runs eight workers of `jobs` jobs each against the server at `url`.
pub async fn run_demo(url: &str, jobs: usize) -> Result<Report, String> {
    let dlock = Client::connect(url).await.map_err(|e| e.to_string())?;
    let (busy, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let workers: Vec<_> = (1..=8)
        .map(|n| {
            tokio::spawn(worker(
                dlock.clone(),
                format!("worker-{n}"),
                jobs,
                busy.clone(),
                most.clone(),
            ))
        })
        .collect();
    let mut report = Report::default();
    for worker in workers {
        report.jobs += worker.await.map_err(|e| e.to_string())??;
    }
    report.most_at_once = most.load(Ordering::SeqCst);
    println!("{} jobs, at most {} at once", report.jobs, report.most_at_once);
    Ok(report)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());
    run_demo(&url, 3).await.map(|_| ())
}
