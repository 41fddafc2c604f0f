//! The observer: a thread of the harness that reads `DLOCK.INFO` of every mixed resource on the
//! primary itself (not through the workers' proxy, so a partition does not blind it), over and
//! over, and logs each reading to its own history file. The checkers read the server's view of
//! the holders and the line from it: how long an abandoned grant lived, whether a line stood
//! still, how many permits were out at once.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::thread::{JoinHandle, sleep, spawn};
use std::time::Duration;

use crate::history::{Kind, Log, Op};
use crate::info::Sample;

/// The observer's "worker" number in the history.
pub const OBSERVER: u32 = 1_000;

/// How long the observer rests between two rounds over the resources.
const ROUND: Duration = Duration::from_millis(15);

/// A running observer; [`Observer::stop`] ends it.
pub struct Observer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Observer {
    /// Starts reading `resources` on the server at `port` (read anew before each connection:
    /// it changes with a promotion), logging to `log`.
    pub fn start(
        port: Arc<AtomicU16>,
        resources: Vec<String>,
        log: &Path,
    ) -> std::io::Result<Self> {
        let mut log = Log::create(log, OBSERVER)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = spawn(move || {
            let mut con: Option<redis::Connection> = None;
            while !stopped.load(Ordering::SeqCst) {
                let Some(connection) = con.as_mut() else {
                    con = connect(port.load(Ordering::SeqCst));
                    if con.is_none() {
                        sleep(Duration::from_millis(50));
                    }
                    continue;
                };
                for resource in &resources {
                    log.record(Op::Observe, Kind::Invoke, resource, 0, "");
                    let reply: redis::RedisResult<redis::Value> =
                        redis::cmd("DLOCK.INFO").arg(resource).query(connection);
                    match reply.map(|reply| Sample::parse(&reply)) {
                        Ok(Some(sample)) => {
                            log.record(Op::Observe, Kind::Ok, resource, 0, &sample.encode())
                        }
                        Ok(None) => log.record(Op::Observe, Kind::Fail, resource, 0, "unreadable"),
                        Err(error) => {
                            log.record(Op::Observe, Kind::Unknown, resource, 0, &error.to_string());
                            con = None;
                            break;
                        }
                    }
                }
                sleep(ROUND);
            }
        });
        Ok(Self { stop, thread: Some(thread) })
    }

    /// Ends the observer and waits for its thread.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A connection to the server at `port` with short timeouts (a crashed primary must not stall
/// the observer), or `None`.
fn connect(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let con = client.get_connection_with_timeout(Duration::from_millis(300)).ok()?;
    con.set_read_timeout(Some(Duration::from_millis(300))).ok()?;
    con.set_write_timeout(Some(Duration::from_millis(300))).ok()?;
    Some(con)
}
