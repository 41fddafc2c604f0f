//! One driver process: started from its command line with `DLOCK_URL`, fed JSON lines on
//! stdin, its stdout read by a thread into a log of replies and events (each with the instant
//! it arrived), its stderr kept in a file for the report.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A deliberately wrong driver, for the harness's self-check: how the answers read from the
/// driver are corrupted before the scenario sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// Every fence is one larger than the driver said.
    Fence,
    /// `lost` events never arrive.
    Silent,
    /// Every error reply reads as `{"ok": {}}`.
    ErrorsOk,
    /// Every token reads as another one.
    Token,
    /// `leader` events never arrive.
    NoLeader,
}

impl Mutation {
    /// `line` as the mutated driver would have written it; `None`: not written at all.
    fn apply(self, mut line: Value) -> Option<Value> {
        match self {
            Self::Fence => bump_fences(&mut line),
            Self::Silent if line["event"] == "lost" => return None,
            Self::NoLeader if line["event"] == "leader" => return None,
            Self::ErrorsOk if line.get("error").is_some() => {
                line = json!({"id": line["id"], "ok": {}});
            }
            Self::Token => {
                if let Some(token) = line.pointer_mut("/ok/token") {
                    *token = json!("forged-token");
                }
            }
            _ => {}
        }
        Some(line)
    }
}

fn bump_fences(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                match field.as_u64() {
                    Some(fence) if name == "fence" => *field = json!(fence + 1),
                    _ => bump_fences(field),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(bump_fences),
        _ => {}
    }
}

/// What the driver wrote so far.
#[derive(Default)]
struct Log {
    replies: Vec<(Instant, Value)>,
    events: Vec<(Instant, Value, bool)>,
    closed: bool,
}

/// A running driver; killed on drop.
pub struct Driver {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    log: Arc<(Mutex<Log>, Condvar)>,
    stderr: PathBuf,
    next_id: u64,
}

impl Driver {
    /// Starts `command` (run by `sh -c`, so it may carry arguments) with `DLOCK_URL` = `url`, and
    /// waits for its `ready` event. `Err` with its stderr if it exits or stays silent.
    pub fn start(
        name: &str,
        command: &str,
        url: &str,
        stderr: PathBuf,
        mutation: Option<Mutation>,
    ) -> Result<Self, String> {
        let errors = std::fs::File::create(&stderr).map_err(|e| format!("stderr file: {e}"))?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {command}"))
            .env("DLOCK_URL", url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(errors)
            .spawn()
            .map_err(|e| format!("cannot start driver {command:?}: {e}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let log: Arc<(Mutex<Log>, Condvar)> = Arc::default();
        let reading = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let now = Instant::now();
                let (log, arrived) = &*reading;
                let mut log = log.lock().expect("driver log");
                let parsed = match serde_json::from_str::<Value>(&line) {
                    Ok(value) => mutation.map_or(Some(value.clone()), |m| m.apply(value)),
                    // Not JSON: kept as an event no scenario expects, reported if it fails.
                    Err(_) => Some(json!({"event": "not-json", "line": line})),
                };
                match parsed {
                    Some(value) if value.get("id").is_some() => log.replies.push((now, value)),
                    Some(value) => log.events.push((now, value, false)),
                    None => {}
                }
                arrived.notify_all();
            }
            let (log, arrived) = &*reading;
            log.lock().expect("driver log").closed = true;
            arrived.notify_all();
        });
        let driver = Driver {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            log,
            stderr,
            next_id: 0,
        };
        let ready = driver.event(
            &json!({"event": "ready"}),
            Duration::from_secs(20),
            &mut Default::default(),
        );
        match ready {
            Some(_) => Ok(driver),
            None => Err(format!(
                "driver {command:?} never said ready; stderr:\n{}",
                driver.stderr_tail()
            )),
        }
    }

    /// The process id (for SIGSTOP and SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The client name and version the driver gave in its `ready` event, if it did.
    pub fn client_version(&self) -> Option<String> {
        let log = self.log.0.lock().expect("driver log");
        log.events
            .iter()
            .find(|(_, e, _)| e["event"] == "ready")
            .and_then(|(_, e, _)| e["client"].as_str().map(str::to_owned))
    }

    /// Sends `request` with a fresh `id`; returns the id.
    pub fn send(&mut self, mut request: Value) -> Result<u64, String> {
        self.next_id += 1;
        request["id"] = json!(self.next_id);
        let mut line = request.to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().ok_or("driver stdin closed")?;
        stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("driver {}: cannot send: {e}", self.name))?;
        Ok(self.next_id)
    }

    /// The reply to `id` and when it arrived, waiting until `deadline`.
    pub fn reply(&self, id: u64, deadline: Instant) -> Option<(Instant, Value)> {
        let (log, arrived) = &*self.log;
        let mut log = log.lock().expect("driver log");
        loop {
            if let Some(found) = log.replies.iter().find(|(_, r)| r["id"] == id) {
                return Some(found.clone());
            }
            let now = Instant::now();
            if now >= deadline || log.closed {
                return None;
            }
            log = arrived.wait_timeout(log, deadline - now).expect("driver log").0;
        }
    }

    /// The first event not taken yet that matches `pattern`, waiting up to `timeout`; taken.
    pub fn event(
        &self,
        pattern: &Value,
        timeout: Duration,
        vars: &mut super::pattern::Vars,
    ) -> Option<(Instant, Value)> {
        let deadline = Instant::now() + timeout;
        let (log, arrived) = &*self.log;
        let mut log = log.lock().expect("driver log");
        loop {
            for (at, event, taken) in log.events.iter_mut() {
                if !*taken && super::pattern::matches(pattern, event, vars).is_ok() {
                    *taken = true;
                    return Some((*at, event.clone()));
                }
            }
            let now = Instant::now();
            if now >= deadline || log.closed {
                return None;
            }
            log = arrived.wait_timeout(log, deadline - now).expect("driver log").0;
        }
    }

    /// Events not taken yet (for a failure's report).
    pub fn pending_events(&self) -> Vec<Value> {
        let log = self.log.0.lock().expect("driver log");
        log.events.iter().filter(|(_, _, taken)| !taken).map(|(_, e, _)| e.clone()).collect()
    }

    /// The last lines of the driver's stderr.
    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Sends `signal` (`-STOP`, `-CONT`) to the process.
    pub fn signal(&self, signal: &str) -> Result<(), String> {
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.pid().to_string())
            .status()
            .map_err(|e| format!("kill: {e}"))?;
        if status.success() { Ok(()) } else { Err(format!("kill {signal} failed")) }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Stdin closed: the driver exits by itself; a stopped or stuck one is killed.
        let _ = self.signal("-CONT");
        self.stdin = None;
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
