//! The Rust client's conformance driver: JSON lines on stdin and stdout, as `docs/protocol.md`
//! (section 14) specifies. Every request runs in a task of its own; every held lease runs
//! [`Lease::run`] in a task of its own, whose work waits for the harness's `run` or `release`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_client::{
    AcquireError, AcquireOptions, CancellationToken, Client, FencedError, Fencing, Lease, Mode,
    RunError, WaitStrategy,
};
use dlock_conformance::json_of;
use dlock_proto::error::classify;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Lines for stdout, written by one task in the order they are sent.
type Out = mpsc::UnboundedSender<Value>;

/// What the harness asks of a held lease's work.
enum Order {
    /// End the work now: the lease is released.
    Release(u64),
    /// Work for `work_ms`, failing if `fail`, then end: the lease is released.
    Run { id: u64, work_ms: u64, fail: bool },
}

/// A lease the harness named: its orders and handles for fenced writes, one per resource (a
/// set's members), kept after the lease ends, for the writes of a stale holder.
struct Held {
    orders: Option<mpsc::UnboundedSender<Order>>,
    fencings: Vec<(String, Fencing)>,
    /// The order sent last, answered by the end of the work (or by its loss).
    under_way: Arc<Mutex<Option<u64>>>,
}

struct Driver {
    client: Client,
    out: Out,
    leases: Mutex<HashMap<String, Held>>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::var("DLOCK_URL").expect("DLOCK_URL");
    let seeds: Vec<&str> = url.split(',').collect();
    let connected = if seeds.len() > 1 {
        Client::connect_cluster(&seeds).await
    } else {
        Client::connect(seeds[0]).await
    };
    let client = match connected {
        Ok(client) => client,
        Err(error) => {
            eprintln!("dlock-conformance-rust: cannot connect to {url}: {error}");
            std::process::exit(1);
        }
    };
    let (out, mut lines) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = lines.recv().await {
            let mut text = line.to_string();
            text.push('\n');
            if stdout.write_all(text.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let driver = Arc::new(Driver { client, out: out.clone(), leases: Mutex::default() });
    let _ = out.send(
        json!({"event": "ready", "client": format!("dlock-client {}", dlock_client::VERSION)}),
    );
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = stdin.next_line().await {
        let request: Value = match serde_json::from_str(&line) {
            Ok(request) => request,
            Err(error) => {
                eprintln!("dlock-conformance-rust: not JSON: {line}: {error}");
                continue;
            }
        };
        let driver = driver.clone();
        tokio::spawn(async move { driver.serve(request).await });
    }
    // Stdin closed: exit without releasing anything.
    drop(driver);
    drop(out);
    let _ = tokio::time::timeout(Duration::from_millis(200), writer).await;
    std::process::exit(0);
}

fn text(request: &Value, field: &str) -> String {
    request[field].as_str().unwrap_or_default().to_owned()
}

fn millis(request: &Value, field: &str) -> Option<Duration> {
    request[field].as_u64().map(Duration::from_millis)
}

fn error(kind: &str, detail: impl std::fmt::Display) -> Value {
    json!({"kind": kind, "detail": detail.to_string()})
}

/// The kind of an acquire's failure, as the interface names it.
fn acquire_error(failure: &AcquireError) -> Value {
    match failure {
        AcquireError::Unknown { token, released, .. } => {
            json!({"kind": "unknown", "detail": failure.to_string(), "token": token, "released": released})
        }
        AcquireError::Server(source) => error(&server_class(source), failure),
        other => error(other.kind(), other),
    }
}

/// The class of the server's error reply `error` carries (`usage` for a request the client
/// refused before sending it, `server` for any other error of this side).
fn server_class(error: &redis::RedisError) -> String {
    if error.kind() == redis::ErrorKind::ClientError {
        return "usage".to_owned();
    }
    match error.code() {
        Some(code) => {
            let reply = format!("{code} {}", error.detail().unwrap_or_default());
            classify(&reply).name().to_owned()
        }
        None => "server".to_owned(),
    }
}

impl Driver {
    fn reply(&self, id: u64, answer: Result<Value, Value>) {
        let line = match answer {
            Ok(ok) => json!({"id": id, "ok": ok}),
            Err(error) => json!({"id": id, "error": error}),
        };
        let _ = self.out.send(line);
    }

    async fn serve(self: Arc<Self>, request: Value) {
        let id = request["id"].as_u64().unwrap_or_default();
        let op = text(&request, "op");
        match op.as_str() {
            "hold" | "wait" | "ticket" | "shared" | "semaphore" => {
                self.hold(id, &op, &request).await
            }
            "hold_all" => self.hold_all(id, &request).await,
            "campaign" => self.campaign(id, &request).await,
            "release" => self.order(id, &request, Order::Release(id)),
            "run" => {
                let work_ms = request["work_ms"].as_u64().unwrap_or_default();
                let fail = request["fail"].as_bool().unwrap_or_default();
                self.order(id, &request, Order::Run { id, work_ms, fail });
            }
            "fenced" => self.fenced(id, &request).await,
            "observe" => self.observe(id, &request),
            other => self.reply(id, Err(error("usage", format!("unknown op {other:?}")))),
        }
    }

    async fn hold(self: Arc<Self>, id: u64, op: &str, request: &Value) {
        if !request["max_hold_ms"].is_null() {
            let why = "this client has no max_hold option (planned)";
            return self.reply(id, Err(error("unsupported", why)));
        }
        let resource = text(request, "resource");
        let ttl = millis(request, "ttl_ms").unwrap_or(Duration::from_secs(30));
        let mode = match (op, request["mode"].as_str()) {
            ("shared", _) | (_, Some("shared")) => Mode::Shared,
            ("semaphore", _) | (_, Some("permits")) => {
                Mode::Permit(request["permits"].as_u64().unwrap_or(1) as u32)
            }
            _ => Mode::Exclusive,
        };
        let strategy = match (op, request["strategy"].as_str()) {
            ("ticket", _) | (_, Some("tickets")) => Some(WaitStrategy::Tickets {
                ticket: millis(request, "ticket_ms").unwrap_or(Duration::from_secs(6)),
            }),
            _ => Some(WaitStrategy::Blocking),
        };
        let options = AcquireOptions {
            mode,
            wait: millis(request, "wait_ms"),
            meta: request["meta"].as_str().map(str::to_owned),
            strategy,
        };
        match self.client.acquire_with(&resource, ttl, &options).await {
            Ok(lease) => self.held(id, text(request, "lease"), lease),
            Err(failure) => self.reply(id, Err(acquire_error(&failure))),
        }
    }

    /// A set: every resource of `resources` or none, waiting for at most `wait_ms`.
    async fn hold_all(self: Arc<Self>, id: u64, request: &Value) {
        let resources: Vec<String> = request["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|resource| resource.as_str().unwrap_or_default().to_owned())
            .collect();
        let ttl = millis(request, "ttl_ms").unwrap_or(Duration::from_secs(30));
        match self.client.acquire_all(&resources, ttl, millis(request, "wait_ms")).await {
            Ok(set) => {
                let granted = json!({"fences": set.fences(), "token": set.token()});
                let fencings = resources
                    .iter()
                    .filter_map(|resource| Some((resource.clone(), set.fencing(resource)?)))
                    .collect();
                let name = text(request, "lease");
                self.held_with(id, name, fencings, granted, |work| Box::pin(set.run(work)));
            }
            Err(failure) => self.reply(id, Err(acquire_error(&failure))),
        }
    }

    async fn campaign(self: Arc<Self>, id: u64, request: &Value) {
        let name = text(request, "name");
        let address = text(request, "address");
        let ttl = millis(request, "ttl_ms").unwrap_or(Duration::from_secs(10));
        let campaign = self.client.campaign(&name, &address, ttl);
        let won = match millis(request, "wait_ms") {
            Some(wait) => match tokio::time::timeout(wait, campaign).await {
                Ok(won) => won,
                Err(_) => Err(AcquireError::Held),
            },
            None => campaign.await,
        };
        match won {
            // The leadership's lease: `lead` is `run` on it.
            Ok(leadership) => {
                let lease_name = text(request, "lease");
                let fence = leadership.fence();
                let fencing = (name.clone(), leadership.lease().fencing());
                self.held_with(id, lease_name, vec![fencing], json!({"fence": fence}), |work| {
                    Box::pin(leadership.lead(work))
                });
            }
            Err(failure) => self.reply(id, Err(acquire_error(&failure))),
        }
    }

    fn held(self: Arc<Self>, id: u64, name: String, lease: Lease) {
        let granted = json!({"fence": lease.fence(), "token": lease.token()});
        let fencing = (lease.resource().to_owned(), lease.fencing());
        self.held_with(id, name, vec![fencing], granted, |work| Box::pin(lease.run(work)));
    }

    /// Answers the grant, then runs the lease (renewed by the client) until an order ends it or
    /// it is lost; reports the loss as an event, and to the order under way.
    fn held_with<F>(
        self: Arc<Self>,
        id: u64,
        name: String,
        fencings: Vec<(String, Fencing)>,
        granted: Value,
        run: F,
    ) where
        F: FnOnce(Work) -> Running + Send + 'static,
    {
        let (orders, mut incoming) = mpsc::unbounded_channel();
        let under_way: Arc<Mutex<Option<u64>>> = Arc::default();
        self.leases.lock().expect("leases").insert(
            name.clone(),
            Held { orders: Some(orders), fencings, under_way: under_way.clone() },
        );
        self.reply(id, Ok(granted));
        let work: Work = Box::new(move |_cancelled: CancellationToken| {
            Box::pin(async move {
                let order = incoming.recv().await;
                match order {
                    Some(Order::Run { id, work_ms, fail }) => {
                        tokio::time::sleep(Duration::from_millis(work_ms)).await;
                        Ended { id, ran: true, fail }
                    }
                    Some(Order::Release(id)) => Ended { id, ran: false, fail: false },
                    // The driver is exiting: no order will come.
                    None => std::future::pending().await,
                }
            })
        });
        tokio::spawn(async move {
            let outcome = run(work).await;
            if let Some(held) = self.leases.lock().expect("leases").get_mut(&name) {
                held.orders = None;
            }
            match outcome {
                Ok(Ended { id, ran: false, .. }) => self.reply(id, Ok(json!({"released": true}))),
                Ok(Ended { id, fail: true, .. }) => {
                    self.reply(id, Err(error("work", "the work failed")))
                }
                Ok(Ended { id, .. }) => self.reply(id, Ok(json!({"output": "done"}))),
                Err(RunError::NotReleased { output, reason }) => match output {
                    Ended { id, ran: false, .. } => {
                        self.reply(id, Ok(json!({"released": false, "detail": reason})))
                    }
                    // The work's own error is what the caller sees.
                    Ended { id, fail: true, .. } => {
                        self.reply(id, Err(error("work", "the work failed")))
                    }
                    Ended { id, .. } => self.reply(id, Err(error("not_released", reason))),
                },
                Err(RunError::LockLost(reason)) => {
                    let kind = reason.kind();
                    let _ = self.out.send(json!({"event": "lost", "lease": name, "reason": kind}));
                    if let Some(id) = under_way.lock().expect("order").take() {
                        self.reply(id, Err(json!({"kind": "lost", "reason": kind, "detail": reason.to_string()})));
                    }
                }
            }
        });
    }

    /// Hands an order to the lease's work; a lease that ended answers at once.
    fn order(&self, id: u64, request: &Value, order: Order) {
        let name = text(request, "lease");
        let sent = {
            let leases = self.leases.lock().expect("leases");
            let Some(held) = leases.get(&name) else {
                return self.reply(id, Err(error("usage", format!("no lease {name:?}"))));
            };
            // Marked before it is sent: a loss that ends the work answers this order.
            *held.under_way.lock().expect("order") = Some(id);
            held.orders.as_ref().is_some_and(|orders| orders.send(order).is_ok())
        };
        if !sent {
            self.ended(id, request);
        }
    }

    /// An order for a lease that already ended (lost, or released).
    fn ended(&self, id: u64, request: &Value) {
        match text(request, "op").as_str() {
            "release" => self.reply(id, Ok(json!({"released": false}))),
            _ => self.reply(id, Err(error("lost", "the lease already ended"))),
        }
    }

    async fn fenced(&self, id: u64, request: &Value) {
        let name = text(request, "lease");
        // A set's write names the member whose fence guards it; a lease's, its only resource.
        let member = request["resource"].as_str();
        let fencing = self.leases.lock().expect("leases").get(&name).map(|held| {
            let mut fencings = held.fencings.iter();
            match member {
                Some(member) => fencings.find(|(resource, _)| resource == member),
                None => fencings.next(),
            }
            .map(|(_, fencing)| fencing.clone())
        });
        let fencing = match fencing {
            Some(Some(fencing)) => fencing,
            Some(None) => {
                let why = format!("lease {name:?} has no resource {member:?}");
                return self.reply(id, Err(error("usage", why)));
            }
            None => return self.reply(id, Err(error("usage", format!("no lease {name:?}")))),
        };
        let mut command = redis::Cmd::new();
        for arg in request["command"].as_array().into_iter().flatten() {
            command.arg(arg.as_str().unwrap_or_default());
        }
        let answer = match fencing.fenced::<redis::Value>(&command).await {
            Ok(reply) => Ok(json!({"reply": json_of(&reply)})),
            Err(FencedError::Stale(detail)) => Err(error("stale", detail)),
            Err(FencedError::CrossSlot(detail)) => Err(error("cross_slot", detail)),
            Err(FencedError::Redis(failure)) => Err(error(&server_class(&failure), failure)),
        };
        self.reply(id, answer);
    }

    fn observe(self: Arc<Self>, id: u64, request: &Value) {
        let name = text(request, "name");
        let mut changes = self.client.observe(&name);
        self.reply(id, Ok(json!({})));
        tokio::spawn(async move {
            loop {
                let leader = changes.changed().await.map(|leader| {
                    json!({"token": leader.token, "fence": leader.fence, "address": leader.address})
                });
                if self
                    .out
                    .send(json!({"event": "leader", "name": name, "leader": leader}))
                    .is_err()
                {
                    return;
                }
            }
        });
    }
}

/// How a lease's work ended: the order that ended it, whether it worked, whether it failed.
struct Ended {
    id: u64,
    ran: bool,
    fail: bool,
}

type Running =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Ended, RunError<Ended>>> + Send>>;
type Work = Box<
    dyn FnOnce(
            CancellationToken,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Ended> + Send>>
        + Send,
>;
