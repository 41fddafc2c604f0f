//! A read-write lock on a report: readers read it together, a writer rewrites it alone.
//!
//! Three readers hold `report:{7}` together. A writer asks while they read and waits for all of
//! them; a reader that asks after the writer waits behind it (first in, first out across modes,
//! so a writer is never starved by a stream of readers) and reads what the writer wrote. Every
//! read and write goes through `DLOCK.FENCED` under its own lease's fence, so a reader or writer
//! whose lease had ended could not touch the report at all.
//!
//! ```text
//! cargo run -p dlock-client --example rwlock -- redis://127.0.0.1:6379/
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_client::{Client, Lease};

const REPORT: &str = "report:{7}";
const TEXT: &str = "report:{7}:text";
const TTL: Duration = Duration::from_secs(10);
const WAIT: Option<Duration> = Some(Duration::from_secs(20));

/// What happened, in order: (who, fence, what they read or wrote).
pub type Log = Arc<Mutex<Vec<(String, u64, String)>>>;

fn note(log: &Log, who: &str, lease: &Lease, what: String) {
    println!("{who}: {what} (fence {})", lease.fence());
    if let Ok(mut log) = log.lock() {
        log.push((who.to_owned(), lease.fence(), what));
    }
}

/// A reader: shares the lock with the other readers while it reads the report for `reading`.
async fn reader(dlock: Client, who: String, reading: Duration, log: Log) -> Result<(), String> {
    let lease = dlock.read(REPORT, TTL, WAIT).await.map_err(|e| format!("{who}: {e}"))?;
    let mut get = redis::cmd("GET");
    get.arg(TEXT);
    let text: Option<String> = lease.fenced(&get).await.map_err(|e| format!("{who}: {e}"))?;
    note(&log, &who, &lease, format!("reads {:?}", text.unwrap_or_default()));
    // Renewed while it reads; released when it is done.
    lease.run(|_cancelled| tokio::time::sleep(reading)).await.map_err(|e| format!("{who}: {e}"))
}

/// The writer: waits for every reader, then rewrites the report alone, under its fence.
async fn writer(dlock: Client, log: Log) -> Result<(), String> {
    let lease = dlock.write(REPORT, TTL, WAIT).await.map_err(|e| format!("writer: {e}"))?;
    let text = format!("revision {}", lease.fence());
    let mut set = redis::cmd("SET");
    set.arg(TEXT).arg(&text);
    let _: () = lease.fenced(&set).await.map_err(|e| format!("writer: {e}"))?;
    note(&log, "writer", &lease, format!("writes {text:?}"));
    let writing = Duration::from_millis(200);
    lease.run(|_cancelled| tokio::time::sleep(writing)).await.map_err(|e| format!("writer: {e}"))
}

/// Runs three readers, the writer and a late reader against the server at `url`; returns the log.
pub async fn run_demo(url: &str) -> Result<Vec<(String, u64, String)>, String> {
    let dlock = Client::connect(url).await.map_err(|e| e.to_string())?;
    let log = Log::default();
    let mut tasks = Vec::new();
    for n in 1..=3 {
        let reading = Duration::from_millis(1_000);
        tasks.push(tokio::spawn(reader(
            dlock.clone(),
            format!("reader-{n}"),
            reading,
            log.clone(),
        )));
    }
    // The writer asks while the readers read, and the late reader asks while the writer waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    tasks.push(tokio::spawn(writer(dlock.clone(), log.clone())));
    tokio::time::sleep(Duration::from_millis(300)).await;
    tasks.push(tokio::spawn(reader(
        dlock.clone(),
        "late-reader".into(),
        Duration::ZERO,
        log.clone(),
    )));
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    let log = log.lock().map_err(|e| e.to_string())?.clone();
    Ok(log)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());
    run_demo(&url).await.map(|_| ())
}
