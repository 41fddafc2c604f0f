//! A mixed worker process. On a read-write resource (`rw:{i}`) it is a reader (`SHARED`) or a
//! writer (exclusive, appending to the resource's register under `DLOCK.FENCED`); on a semaphore
//! (`sem:{i}`, [`permits`]`(i)` permits, `SHARED LIMIT n`) a permit holder. It waits for its turn
//! with `WAIT … CLAIM` and claims the hand-over (a `RENEW … FENCE` or the same ACQUIRE again),
//! with a `QUEUE` ticket refreshed until it is granted (half of the tickets numbered by `NOTIFY`
//! and started on their own channel's `granted` message, then claimed as a wait's hand-over is),
//! or with a plain ACQUIRE retried; it
//! renews with `FENCE`, uses the lease under `DLOCK.FENCED`, and releases with `FENCE`. All raw
//! commands: the Rust client has no shared leases yet.
//!
//! The nemesis asks it, with a trigger file ([`trigger`]), to abandon a waiter (`ACQUIRE … WAIT 0
//! CLAIM c` sent on a connection that is never read, while the worker holds the resource, so
//! that the waiter stands in line) or to stop refreshing its ticket. After a pause past its lease
//! it tries the lease once more (a fenced use and a RENEW), which the server must refuse.
//!
//! `--broken-mixed` is the self-check: permits ignore the limit, writers take shared leases,
//! abandoned waiters carry no claim window (the history says they do), ticket refreshes send a
//! new token each time, and a set (taken one time in three) lets one member go and holds the
//! rest for 3–5 s. The checkers must fail the run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dlock_testkit::Rng;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr};
use tokio::io::AsyncWriteExt;

use crate::check::Accepted;
use crate::history::{Kind, Log, Op};
use crate::info::Sample;

/// What a mixed worker is told on its command line.
pub struct Args {
    pub id: u32,
    pub redis_url: String,
    /// Read-write resources `rw:{0}` …
    pub rw: u32,
    /// Semaphores `sem:{0}` …
    pub sem: u32,
    pub ttl: Duration,
    pub replicas: u32,
    pub seed: u64,
    pub log: PathBuf,
    /// The self-check: misbehave (see the module's comment).
    pub broken: bool,
}

/// How many permits semaphore `i` has.
pub fn permits(i: u32) -> u32 {
    2 + i
}

pub fn rw_resource(i: u32) -> String {
    format!("rw:{{{i}}}")
}

pub fn rw_register(i: u32) -> String {
    format!("rwreg:{{{i}}}")
}

pub fn sem_resource(i: u32) -> String {
    format!("sem:{{{i}}}")
}

fn sem_counter(i: u32) -> String {
    format!("semuse:{{{i}}}")
}

/// The file whose appearance asks mixed worker `id` for a client fault (`abandon-waiter`,
/// `stop-refreshing`); the worker removes it when it takes it up.
pub fn trigger(dir: &Path, id: u32, kind: &str) -> PathBuf {
    dir.join(format!("worker-{id}.{kind}"))
}

/// How long one request may take before its outcome counts as unknown (a WAIT adds its timeout).
const REQUEST: Duration = Duration::from_millis(500);
/// How long an abandoned connection stays open (unread) before the worker drops it.
const ABANDONED_FOR: Duration = Duration::from_secs(8);
/// A lease this close to its local expiry is not used any more.
const MARGIN: Duration = Duration::from_millis(30);

/// What a holder is, as the first letter of its tokens says (`r-…`, `w-…`, `p-…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Reader,
    Writer,
    /// A permit of a semaphore with this many permits.
    Permit(u32),
}

impl Role {
    fn letter(self) -> char {
        match self {
            Self::Reader => 'r',
            Self::Writer => 'w',
            Self::Permit(_) => 'p',
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    /// `WAIT timeout CLAIM claim`, then a claim.
    Wait,
    /// `QUEUE ticket`, re-sent until granted.
    Ticket,
    /// A plain ACQUIRE, retried.
    Plain,
}

/// How a request ended.
enum Reply<T> {
    Ok(T),
    /// An error reply, or no connection to send it on: nothing was done.
    Refused(String),
    /// Timed out or the connection broke: it may have been done.
    Unknown(String),
}

/// One connection to the server, opened again after it broke or a request on it timed out (a
/// request that timed out may still block it: a WAIT).
struct Link {
    client: redis::Client,
    con: Option<MultiplexedConnection>,
}

impl Link {
    async fn query<T: redis::FromRedisValue>(
        &mut self,
        cmd: &redis::Cmd,
        extra: Duration,
    ) -> Reply<T> {
        let mut con = match &self.con {
            Some(con) => con.clone(),
            None => {
                let config = AsyncConnectionConfig::new().set_connection_timeout(REQUEST);
                let opened = tokio::time::timeout(
                    REQUEST,
                    self.client.get_multiplexed_async_connection_with_config(&config),
                )
                .await;
                match opened {
                    Ok(Ok(con)) => {
                        self.con = Some(con.clone());
                        con
                    }
                    Ok(Err(error)) => return Reply::Refused(format!("not connected: {error}")),
                    Err(_) => return Reply::Refused("not connected: timed out".into()),
                }
            }
        };
        let reply: Result<redis::RedisResult<T>, _> =
            tokio::time::timeout(REQUEST + extra, cmd.query_async(&mut con)).await;
        match reply {
            Ok(Ok(value)) => Reply::Ok(value),
            Ok(Err(error)) if error.code().is_some() => Reply::Refused(error.to_string()),
            Ok(Err(error)) => {
                self.con = None;
                Reply::Unknown(error.to_string())
            }
            Err(_) => {
                self.con = None;
                Reply::Unknown("timed out".into())
            }
        }
    }
}

/// A lease this worker holds.
struct Held {
    resource: String,
    /// The resource's index among its kind.
    index: u32,
    /// The token on the wire (the logged one, except for a broken ticket worker).
    token: String,
    fence: u64,
    role: Role,
    /// A conservative end of the lease here: the send of the request that last set its deadline,
    /// plus what that request asked for.
    expiry: Instant,
}

struct Worker {
    args: Args,
    log: Log,
    link: Link,
    rng: Rng,
    nonce: u64,
    tokens: u64,
    writes: u64,
    /// Connections of abandoned waiters, never read, and when to drop them.
    abandoned: Vec<(tokio::net::TcpStream, Instant)>,
    abandon_pending: bool,
    stop_pending: bool,
    /// A retry after a dropped hand-over is asked for (see `retry_after_dropped_handover`).
    retry_pending: bool,
    dir: PathBuf,
}

pub fn run(args: Args) -> ! {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(work(args));
    std::process::exit(0)
}

async fn work(args: Args) {
    let log = Log::create(&args.log, args.id).expect("history file");
    let client = redis::Client::open(args.redis_url.as_str()).expect("redis url");
    let mut rng = Rng::new(args.seed ^ (u64::from(args.id) << 32));
    let nonce = rng.next() & 0xff_ffff;
    let dir = args.log.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut worker = Worker {
        args,
        log,
        link: Link { client, con: None },
        rng,
        nonce,
        tokens: 0,
        writes: 0,
        abandoned: Vec::new(),
        abandon_pending: false,
        stop_pending: false,
        retry_pending: false,
        dir,
    };
    loop {
        worker.take_triggers();
        let now = Instant::now();
        worker.abandoned.retain(|(_, until)| *until > now);
        if let Some((members, ticket)) = worker.plan_set() {
            match worker.acquire_set(&members, ticket).await {
                Some(held) => worker.hold_set(held).await,
                None => tokio::time::sleep(Duration::from_millis(10 + worker.rng.below(30))).await,
            }
            continue;
        }
        let (resource, index, role, style) = worker.plan();
        match worker.acquire(&resource, index, role, style).await {
            Some(held) => worker.hold(held).await,
            None => tokio::time::sleep(Duration::from_millis(10 + worker.rng.below(30))).await,
        }
    }
}

/// What a retry after a dropped hand-over left this worker with.
enum Handover {
    /// It holds the lease the retry was answered, as its new token.
    Retried(Held),
    /// Its own lease was released (or may have been), and it holds nothing.
    Released,
    /// Nothing was sent: it still holds its lease.
    Untouched,
}

/// The next `granted` message on a ticket's own channel within `wait`, if one comes.
async fn told_within(
    pubsub: &mut redis::aio::PubSub,
    wait: Duration,
) -> Option<dlock_proto::channel::Granted> {
    use futures_util::StreamExt as _;
    let until = tokio::time::Instant::now() + wait;
    let mut messages = pubsub.on_message();
    loop {
        let message = tokio::time::timeout_at(until, messages.next()).await.ok()??;
        let payload: String = message.get_payload().ok()?;
        if let Some(granted) = dlock_proto::channel::granted(&payload) {
            return Some(granted);
        }
    }
}

/// Reads `n` one-line replies (integers, simple strings, errors, nils) from `stream`.
async fn read_lines(stream: &mut tokio::net::TcpStream, n: usize) -> std::io::Result<Vec<String>> {
    use tokio::io::AsyncReadExt;
    let mut buffer = Vec::new();
    let mut lines = Vec::new();
    while lines.len() < n {
        let mut chunk = [0u8; 512];
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::Error::other("closed"));
        }
        buffer.extend_from_slice(&chunk[..read]);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\r\n") {
            lines.push(String::from_utf8_lossy(&buffer[..end]).into_owned());
            buffer.drain(..end + 2);
        }
    }
    Ok(lines)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Worker {
    fn record(&mut self, op: Op, kind: Kind, resource: &str, fence: u64, detail: &str) {
        self.log.record(op, kind, resource, fence, detail);
    }

    fn take_triggers(&mut self) {
        let id = self.args.id;
        if std::fs::remove_file(trigger(&self.dir, id, "abandon-waiter")).is_ok() {
            self.abandon_pending = true;
        }
        if std::fs::remove_file(trigger(&self.dir, id, "stop-refreshing")).is_ok() {
            self.stop_pending = true;
        }
        if std::fs::remove_file(trigger(&self.dir, id, "retry-handover")).is_ok() {
            self.retry_pending = true;
        }
    }

    fn token(&mut self, letter: char) -> String {
        self.tokens += 1;
        format!("{letter}-{}-{:x}-{}", self.args.id, self.nonce, self.tokens)
    }

    /// The next lease to ask for: which resource, as what, waiting how. A pending abandonment
    /// needs a writer's lease (the abandoned waiter then stands in line behind it); a pending
    /// stop needs a ticket.
    fn plan(&mut self) -> (String, u32, Role, Style) {
        let (rw, sem) = (self.args.rw, self.args.sem);
        let (resource, index, role) = if (self.abandon_pending || self.retry_pending) && rw > 0 {
            let i = self.rng.below(u64::from(rw)) as u32;
            (rw_resource(i), i, Role::Writer)
        } else {
            let k = self.rng.below(u64::from(rw + sem)) as u32;
            if k < rw {
                let role = if self.rng.below(5) < 3 { Role::Reader } else { Role::Writer };
                (rw_resource(k), k, role)
            } else {
                let i = k - rw;
                (sem_resource(i), i, Role::Permit(permits(i)))
            }
        };
        let style = if self.stop_pending {
            Style::Ticket
        } else {
            match self.rng.below(10) {
                0..=3 => Style::Wait,
                4..=7 => Style::Ticket,
                _ => Style::Plain,
            }
        };
        (resource, index, role, style)
    }

    /// Now and then (no client fault pending, two read-write resources or more): a set of two or
    /// three of them, in a random order, and whether to wait with a ticket (`QUEUE` ms).
    fn plan_set(&mut self) -> Option<(Vec<u32>, Option<u64>)> {
        let rw = self.args.rw;
        // Broken sets are taken more often (one in three), so that the short self-check meets one.
        let odds = if self.args.broken { 3 } else { 8 };
        if rw < 2
            || self.abandon_pending
            || self.retry_pending
            || self.stop_pending
            || self.rng.below(odds) != 0
        {
            return None;
        }
        let size = 2 + self.rng.below(u64::from(rw.min(3)) - 1) as usize;
        let mut members = Vec::with_capacity(size);
        while members.len() < size {
            let i = self.rng.below(u64::from(rw)) as u32;
            if !members.contains(&i) {
                members.push(i);
            }
        }
        let ticket = (self.rng.below(2) == 0).then(|| self.rng.between(300, 600));
        Some((members, ticket))
    }

    /// `DLOCK.ACQUIREALL` of `members` (read-write resources) by one token, plainly retried for
    /// two seconds or with a ticket refreshed for four; each member's grant is logged as a
    /// writer's. An attempt that ends without a grant withdraws (`RELEASEALL` without `FENCES`).
    async fn acquire_set(&mut self, members: &[u32], ticket: Option<u64>) -> Option<Vec<Held>> {
        self.tokens += 1;
        let names: Vec<String> = members.iter().map(u32::to_string).collect();
        let token =
            format!("s-{}-{:x}-{}-{}", self.args.id, self.nonce, self.tokens, names.join("."));
        let resources: Vec<String> = members.iter().map(|&i| rw_resource(i)).collect();
        let (op, give_up) = match ticket {
            Some(_) => (Op::Queue, Instant::now() + Duration::from_secs(4)),
            None => (Op::Acquire, Instant::now() + Duration::from_secs(2)),
        };
        let request = match ticket {
            Some(ms) => format!("{token} ticket={ms}"),
            None => token.clone(),
        };
        let mut cmd = redis::cmd("DLOCK.ACQUIREALL");
        cmd.arg(resources.len()).arg(&resources).arg(&token).arg(millis(self.args.ttl));
        if let Some(ms) = ticket {
            cmd.arg("QUEUE").arg(ms);
        }
        loop {
            for resource in &resources {
                self.record(op, Kind::Invoke, resource, 0, &request);
            }
            let sent = Instant::now();
            match self.link.query::<Option<Vec<u64>>>(&cmd, Duration::ZERO).await {
                Reply::Ok(Some(fences)) if fences.len() == resources.len() => {
                    let expiry = sent + self.args.ttl;
                    let held: Vec<Held> = resources
                        .iter()
                        .zip(members)
                        .zip(&fences)
                        .map(|((resource, &index), &fence)| Held {
                            resource: resource.clone(),
                            index,
                            token: token.clone(),
                            fence,
                            role: Role::Writer,
                            expiry,
                        })
                        .collect();
                    for member in &held {
                        self.record(op, Kind::Ok, &member.resource, member.fence, &token);
                    }
                    if self.replicated().await {
                        return Some(held);
                    }
                    self.release_set(&held, "not replicated").await;
                    return None;
                }
                Reply::Ok(other) => {
                    // nil: a ticket's request is in line (as `acquire_ticket` logs it), a plain
                    // one refused.
                    let why = match (&other, ticket) {
                        (Some(_), _) => "a reply without a fence per member",
                        (None, Some(_)) => "queued",
                        (None, None) => "held",
                    };
                    for resource in &resources {
                        self.record(op, Kind::Fail, resource, 0, why);
                    }
                }
                Reply::Refused(why) => {
                    for resource in &resources {
                        self.record(op, Kind::Fail, resource, 0, &why);
                    }
                }
                Reply::Unknown(why) => {
                    for resource in &resources {
                        self.record(op, Kind::Unknown, resource, 0, &why);
                    }
                }
            }
            if Instant::now() >= give_up {
                self.withdraw_set(&resources, &token).await;
                return None;
            }
            let pause = match ticket {
                Some(ms) => self.rng.between(ms / 4, ms / 3),
                None => self.rng.between(30, 80),
            };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// `RELEASEALL` without `FENCES`: withdraws the set's tickets and releases a grant whose
    /// reply was lost.
    async fn withdraw_set(&mut self, resources: &[String], token: &str) {
        for resource in resources {
            self.record(Op::Release, Kind::Invoke, resource, 0, token);
        }
        let mut cmd = redis::cmd("DLOCK.RELEASEALL");
        cmd.arg(resources.len()).arg(resources).arg(token);
        let reply = self.link.query::<i64>(&cmd, Duration::ZERO).await;
        for resource in resources {
            match &reply {
                Reply::Ok(n) if *n > 0 => {
                    self.record(Op::Release, Kind::Ok, resource, 0, "forgot a grant")
                }
                Reply::Ok(_) => {
                    self.record(Op::Release, Kind::Fail, resource, 0, "nothing to forget")
                }
                Reply::Refused(why) => self.record(Op::Release, Kind::Fail, resource, 0, why),
                Reply::Unknown(why) => self.record(Op::Release, Kind::Unknown, resource, 0, why),
            }
        }
    }

    /// A set's command with every member and, after `rest`, `FENCES` with every member's fence.
    fn set_cmd(name: &str, held: &[Held], rest: &[String]) -> redis::Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(held.len());
        for member in held {
            cmd.arg(&member.resource);
        }
        cmd.arg(&held[0].token).arg(rest).arg("FENCES");
        for member in held {
            cmd.arg(member.fence);
        }
        cmd
    }

    /// Holds a set as `hold` holds a lease: uses each member under its fence, renews the set
    /// every third of the ttl (`RENEWALL`), releases it (`RELEASEALL`); stops at the local expiry.
    async fn hold_set(&mut self, mut held: Vec<Held>) {
        // Broken: lets one member go and holds the rest, as a set that is not one, for longer.
        let hold_ms = if self.args.broken {
            let first = held.remove(0);
            self.release(&first, "broken set").await;
            self.rng.between(3_000, 5_000)
        } else {
            self.rng.between(20, 700)
        };
        let ttl = self.args.ttl;
        let end = Instant::now() + Duration::from_millis(hold_ms);
        let mut next_renewal = Instant::now() + ttl / 3;
        loop {
            let now = Instant::now();
            if now + MARGIN >= held[0].expiry {
                for member in &held {
                    self.use_lease(member).await;
                    let detail = "local expiry passed";
                    self.record(Op::Lost, Kind::Ok, &member.resource, member.fence, detail);
                }
                return self.release_set(&held, "after loss").await;
            }
            if now >= end {
                break;
            }
            if now >= next_renewal {
                for member in &held {
                    self.record(
                        Op::Renew,
                        Kind::Invoke,
                        &member.resource,
                        member.fence,
                        &member.token,
                    );
                }
                let cmd = Self::set_cmd("DLOCK.RENEWALL", &held, &[millis(ttl).to_string()]);
                let sent = Instant::now();
                let reply = self.link.query::<i64>(&cmd, Duration::ZERO).await;
                for member in &held {
                    let (resource, fence) = (member.resource.as_str(), member.fence);
                    match &reply {
                        Reply::Ok(1) => self.record(Op::Renew, Kind::Ok, resource, fence, ""),
                        Reply::Ok(_) => {
                            self.record(Op::Renew, Kind::Fail, resource, fence, "not held")
                        }
                        Reply::Refused(why) => {
                            self.record(Op::Renew, Kind::Fail, resource, fence, why)
                        }
                        Reply::Unknown(why) => {
                            self.record(Op::Renew, Kind::Unknown, resource, fence, why)
                        }
                    }
                }
                match reply {
                    Reply::Ok(1) if self.replicated().await => {
                        for member in &mut held {
                            member.expiry = sent + ttl;
                        }
                        next_renewal = Instant::now() + ttl / 3;
                    }
                    Reply::Ok(0) => {
                        for member in &held {
                            let (resource, fence) = (member.resource.as_str(), member.fence);
                            self.record(Op::Lost, Kind::Ok, resource, fence, "renewal refused");
                        }
                        return self.release_set(&held, "after loss").await;
                    }
                    _ => next_renewal = Instant::now() + ttl / 10,
                }
                continue;
            }
            for member in &held {
                self.use_lease(member).await;
            }
            let pause = Duration::from_millis(self.rng.between(5, 40));
            let until = (Instant::now() + pause).min(next_renewal).min(end);
            tokio::time::sleep_until(until.into()).await;
        }
        self.release_set(&held, "").await;
    }

    /// `RELEASEALL … FENCES`: every member released, or (fewer) some had ended before.
    async fn release_set(&mut self, held: &[Held], why: &str) {
        for member in held {
            self.record(Op::Release, Kind::Invoke, &member.resource, member.fence, why);
        }
        let cmd = Self::set_cmd("DLOCK.RELEASEALL", held, &[]);
        let reply = self.link.query::<i64>(&cmd, Duration::ZERO).await;
        for member in held {
            let (resource, fence) = (member.resource.as_str(), member.fence);
            match &reply {
                Reply::Ok(n) if *n == held.len() as i64 => {
                    self.record(Op::Release, Kind::Ok, resource, fence, why)
                }
                Reply::Ok(_) => {
                    self.record(Op::Release, Kind::Fail, resource, fence, "not all held")
                }
                Reply::Refused(error) => {
                    self.record(Op::Release, Kind::Fail, resource, fence, error)
                }
                Reply::Unknown(error) => {
                    self.record(Op::Release, Kind::Unknown, resource, fence, error)
                }
            }
        }
    }

    /// `DLOCK.ACQUIRE resource token ttl` and the mode's options.
    fn acquire_cmd(&self, resource: &str, token: &str, role: Role) -> redis::Cmd {
        let mut cmd = redis::cmd("DLOCK.ACQUIRE");
        cmd.arg(resource).arg(token).arg(millis(self.args.ttl));
        match role {
            Role::Reader => {
                cmd.arg("SHARED");
            }
            // Broken: a writer that takes a reader's lease, a permit that ignores the limit.
            Role::Writer | Role::Permit(_) if self.args.broken => {
                cmd.arg("SHARED");
            }
            Role::Writer => {}
            Role::Permit(n) => {
                cmd.arg("SHARED").arg("LIMIT").arg(n);
            }
        }
        cmd
    }

    async fn acquire(
        &mut self,
        resource: &str,
        index: u32,
        role: Role,
        style: Style,
    ) -> Option<Held> {
        let held = match style {
            Style::Wait => self.acquire_waiting(resource, index, role).await,
            Style::Ticket => self.acquire_ticket(resource, index, role).await,
            Style::Plain => self.acquire_plain(resource, index, role).await,
        }?;
        if self.replicated().await {
            return Some(held);
        }
        // Never counted as held: released at once (the grant stays in the history).
        self.release(&held, "not replicated").await;
        None
    }

    /// With replicas asked for (profile `failover`), whether they acknowledged this connection's
    /// writes so far.
    async fn replicated(&mut self) -> bool {
        if self.args.replicas == 0 {
            return true;
        }
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.args.replicas).arg(200);
        matches!(
            self.link.query::<u64>(&cmd, Duration::from_millis(200)).await,
            Reply::Ok(acked) if acked >= u64::from(self.args.replicas)
        )
    }

    /// `WAIT … CLAIM`, then the claim.
    async fn acquire_waiting(&mut self, resource: &str, index: u32, role: Role) -> Option<Held> {
        let token = self.token(role.letter());
        let claim = self.rng.between(200, 600);
        let wait = self.rng.between(300, 2_000);
        let request = format!("{token} wait={wait} claim={claim}");
        self.record(Op::Acquire, Kind::Invoke, resource, 0, &request);
        let mut cmd = self.acquire_cmd(resource, &token, role);
        cmd.arg("WAIT").arg(wait).arg("CLAIM").arg(claim);
        let sent = Instant::now();
        match self.link.query::<Option<u64>>(&cmd, Duration::from_millis(wait)).await {
            Reply::Ok(Some(fence)) => {
                self.record(Op::Acquire, Kind::Ok, resource, fence, &token);
                // Handed over, it runs only the claim window until claimed.
                let window = self.args.ttl.min(Duration::from_millis(claim));
                let mut held = Held {
                    resource: resource.to_owned(),
                    index,
                    token,
                    fence,
                    role,
                    expiry: sent + window,
                };
                self.claim(&mut held).await.then_some(held)
            }
            Reply::Ok(None) => {
                self.record(Op::Acquire, Kind::Fail, resource, 0, "timed out in line");
                None
            }
            Reply::Refused(why) => {
                self.record(Op::Acquire, Kind::Fail, resource, 0, &why);
                None
            }
            Reply::Unknown(why) => {
                self.record(Op::Acquire, Kind::Unknown, resource, 0, &why);
                self.forget(resource, &token).await;
                None
            }
        }
    }

    /// Claims a grant answered to a WAIT: `RENEW … FENCE` or the same ACQUIRE again (which
    /// answers the same fence, or a new one if the window had lapsed and the resource was free).
    /// `false` when the grant lapsed before the claim.
    async fn claim(&mut self, held: &mut Held) -> bool {
        let (resource, token) = (held.resource.clone(), held.token.clone());
        let sent = Instant::now();
        if self.rng.below(2) == 0 {
            self.record(Op::Renew, Kind::Invoke, &resource, held.fence, &token);
            match self.renew_cmd(held).await {
                Reply::Ok(1) => {
                    self.record(Op::Renew, Kind::Ok, &resource, held.fence, "claimed");
                    held.expiry = sent + self.args.ttl;
                    true
                }
                Reply::Ok(_) => {
                    self.record(
                        Op::Renew,
                        Kind::Fail,
                        &resource,
                        held.fence,
                        "claim window lapsed",
                    );
                    self.record(Op::Lost, Kind::Ok, &resource, held.fence, "claim window lapsed");
                    false
                }
                Reply::Refused(why) => {
                    self.record(Op::Renew, Kind::Fail, &resource, held.fence, &why);
                    true
                }
                Reply::Unknown(why) => {
                    self.record(Op::Renew, Kind::Unknown, &resource, held.fence, &why);
                    true
                }
            }
        } else {
            // The invoke names the grant it claims.
            self.record(
                Op::Acquire,
                Kind::Invoke,
                &resource,
                held.fence,
                &format!("{token} claim"),
            );
            let cmd = self.acquire_cmd(&resource, &token, held.role);
            match self.link.query::<Option<u64>>(&cmd, Duration::ZERO).await {
                Reply::Ok(Some(fence)) => {
                    self.record(Op::Acquire, Kind::Ok, &resource, fence, &token);
                    held.fence = fence;
                    held.expiry = sent + self.args.ttl;
                    true
                }
                Reply::Ok(None) => {
                    self.record(
                        Op::Acquire,
                        Kind::Fail,
                        &resource,
                        held.fence,
                        "claim window lapsed",
                    );
                    self.record(Op::Lost, Kind::Ok, &resource, held.fence, "claim window lapsed");
                    false
                }
                Reply::Refused(why) => {
                    self.record(Op::Acquire, Kind::Fail, &resource, held.fence, &why);
                    true
                }
                Reply::Unknown(why) => {
                    self.record(Op::Acquire, Kind::Unknown, &resource, held.fence, &why);
                    true
                }
            }
        }
    }

    /// A ticket, refreshed every third of its life until granted, stopped on the nemesis's
    /// request, or given up after a while (then it lapses by itself). Half of them (never the
    /// broken worker's) listen on their own channel, every ACQUIRE numbered by `NOTIFY`: a
    /// `granted` message there is the grant (logged as a told request and its answer), held from
    /// then on until the named request's send time plus the window, and claimed at once.
    async fn acquire_ticket(&mut self, resource: &str, index: u32, role: Role) -> Option<Held> {
        let token = self.token(role.letter());
        let ticket = self.rng.between(300, 600);
        let told = !self.args.broken && self.rng.below(2) == 0;
        let mut channel = if told { self.own_channel(resource, &token).await } else { None };
        // Each numbered ACQUIRE's send time, by its `NOTIFY` number (from 1).
        let mut sends: Vec<Instant> = Vec::new();
        // The claim window of a ticket's turn is the ticket's life (by default or said so): a
        // ticket refreshed in time is also claimed in time.
        let explicit_claim = self.rng.below(2) == 0;
        let give_up = Instant::now() + Duration::from_secs(4);
        let request = format!("{token} ticket={ticket}");
        let mut wire = token.clone();
        let mut placed = false;
        loop {
            self.record(Op::Queue, Kind::Invoke, resource, 0, &request);
            let mut cmd = self.acquire_cmd(resource, &wire, role);
            cmd.arg("QUEUE").arg(ticket);
            if channel.is_some() {
                sends.push(Instant::now());
                cmd.arg("NOTIFY").arg(sends.len());
            }
            if explicit_claim {
                cmd.arg("CLAIM").arg(ticket);
            }
            let sent = Instant::now();
            match self.link.query::<Option<u64>>(&cmd, Duration::ZERO).await {
                Reply::Ok(Some(fence)) => {
                    self.record(Op::Queue, Kind::Ok, resource, fence, &token);
                    let resource = resource.to_owned();
                    let expiry = sent + self.args.ttl;
                    return Some(Held { resource, index, token: wire, fence, role, expiry });
                }
                Reply::Ok(None) => {
                    self.record(Op::Queue, Kind::Fail, resource, 0, "queued");
                    placed = true;
                }
                Reply::Refused(why) => self.record(Op::Queue, Kind::Fail, resource, 0, &why),
                Reply::Unknown(why) => self.record(Op::Queue, Kind::Unknown, resource, 0, &why),
            }
            self.take_triggers();
            if self.stop_pending && placed {
                self.stop_pending = false;
                let detail = format!("{token} ticket={ticket} stopped");
                self.record(Op::Abandon, Kind::Ok, resource, 0, &detail);
                return None;
            }
            if Instant::now() >= give_up {
                let detail = format!("{token} ticket={ticket} gave-up");
                self.record(Op::Abandon, Kind::Ok, resource, 0, &detail);
                return None;
            }
            if self.args.broken && placed {
                wire = self.token(role.letter()); // a new place each time, logged as the first
            }
            let refresh = ticket / 3;
            let nap = Duration::from_millis(self.rng.between(refresh * 3 / 4, refresh));
            let Some(pubsub) = channel.as_mut() else {
                tokio::time::sleep(nap).await;
                continue;
            };
            let Some(granted) = told_within(pubsub, nap).await else { continue };
            let sent_at = |n: u64| sends.get(usize::try_from(n).ok()?.checked_sub(1)?).copied();
            let plus_ms = |at: Instant, ms: u64| at + Duration::from_millis(ms);
            let Some(expiry) = dlock_proto::channel::granted_expiry(&granted, sent_at, plus_ms)
                .filter(|expiry| *expiry > Instant::now() + Duration::from_millis(50))
            else {
                continue; // too little left: the next ACQUIRE claims it
            };
            // The grant as the channel told it: an answer to no request, logged as one.
            let told = format!("{request} told={}", granted.request);
            self.record(Op::Queue, Kind::Invoke, resource, 0, &told);
            self.record(Op::Queue, Kind::Ok, resource, granted.fence, &token);
            let (resource, fence) = (resource.to_owned(), granted.fence);
            let mut held = Held { resource, index, token: wire, fence, role, expiry };
            return self.claim(&mut held).await.then_some(held);
        }
    }

    /// A subscription to the own channel of `token`'s ticket on `resource`, confirmed; `None`
    /// when it could not be made (the ticket then waits by its refreshes, without `NOTIFY`).
    async fn own_channel(&mut self, resource: &str, token: &str) -> Option<redis::aio::PubSub> {
        let channel = dlock_proto::channel::ticket_name_of(resource, token);
        let subscribed = tokio::time::timeout(REQUEST, async {
            let mut pubsub = self.link.client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        subscribed.ok()?.ok()
    }

    /// A plain ACQUIRE, retried with the same token (a retry after an unknown outcome learns the
    /// truth from the same fence), for at most two seconds.
    async fn acquire_plain(&mut self, resource: &str, index: u32, role: Role) -> Option<Held> {
        let token = self.token(role.letter());
        let give_up = Instant::now() + Duration::from_secs(2);
        let mut unknown = false;
        loop {
            self.record(Op::Acquire, Kind::Invoke, resource, 0, &token);
            let cmd = self.acquire_cmd(resource, &token, role);
            let sent = Instant::now();
            match self.link.query::<Option<u64>>(&cmd, Duration::ZERO).await {
                Reply::Ok(Some(fence)) => {
                    self.record(Op::Acquire, Kind::Ok, resource, fence, &token);
                    let resource = resource.to_owned();
                    let expiry = sent + self.args.ttl;
                    return Some(Held { resource, index, token, fence, role, expiry });
                }
                Reply::Ok(None) => self.record(Op::Acquire, Kind::Fail, resource, 0, "held"),
                Reply::Refused(why) => self.record(Op::Acquire, Kind::Fail, resource, 0, &why),
                Reply::Unknown(why) => {
                    unknown = true;
                    self.record(Op::Acquire, Kind::Unknown, resource, 0, &why);
                }
            }
            if Instant::now() >= give_up {
                if unknown {
                    self.forget(resource, &token).await;
                }
                return None;
            }
            tokio::time::sleep(Duration::from_millis(self.rng.between(30, 80))).await;
        }
    }

    /// Releases whatever grant `token` may have after an acquire whose outcome stayed unknown
    /// (no FENCE: the fence is unknown; the token is this attempt's alone).
    async fn forget(&mut self, resource: &str, token: &str) {
        self.record(Op::Release, Kind::Invoke, resource, 0, token);
        let mut cmd = redis::cmd("DLOCK.RELEASE");
        cmd.arg(resource).arg(token);
        match self.link.query::<i64>(&cmd, Duration::ZERO).await {
            Reply::Ok(1) => self.record(Op::Release, Kind::Ok, resource, 0, "forgot a grant"),
            Reply::Ok(_) => self.record(Op::Release, Kind::Fail, resource, 0, "nothing to forget"),
            Reply::Refused(why) => self.record(Op::Release, Kind::Fail, resource, 0, &why),
            Reply::Unknown(why) => self.record(Op::Release, Kind::Unknown, resource, 0, &why),
        }
    }

    async fn renew_cmd(&mut self, held: &Held) -> Reply<i64> {
        let mut cmd = redis::cmd("DLOCK.RENEW");
        cmd.arg(&held.resource)
            .arg(&held.token)
            .arg(millis(self.args.ttl))
            .arg("FENCE")
            .arg(held.fence);
        self.link.query::<i64>(&cmd, Duration::ZERO).await
    }

    /// One RENEW: `Some(true)` renewed (and replicated, when asked), `Some(false)` refused (the
    /// lease is over), `None` unknown or not replicated.
    async fn renew(&mut self, held: &mut Held) -> Option<bool> {
        let (resource, token, fence) = (held.resource.clone(), held.token.clone(), held.fence);
        self.record(Op::Renew, Kind::Invoke, &resource, fence, &token);
        let sent = Instant::now();
        match self.renew_cmd(held).await {
            Reply::Ok(1) => {
                self.record(Op::Renew, Kind::Ok, &resource, fence, "");
                if !self.replicated().await {
                    return None;
                }
                held.expiry = sent + self.args.ttl;
                Some(true)
            }
            Reply::Ok(_) => {
                self.record(Op::Renew, Kind::Fail, &resource, fence, "not held");
                Some(false)
            }
            Reply::Refused(why) => {
                self.record(Op::Renew, Kind::Fail, &resource, fence, &why);
                None
            }
            Reply::Unknown(why) => {
                self.record(Op::Renew, Kind::Unknown, &resource, fence, &why);
                None
            }
        }
    }

    /// Holds the lease for a while: uses it, renews it every third of the ttl, and releases it;
    /// stops using it when its local expiry comes (a pause, renewals that failed).
    async fn hold(&mut self, mut held: Held) {
        if self.retry_pending && held.role == Role::Writer && held.resource.starts_with("rw:") {
            self.retry_pending = false;
            match self.retry_after_dropped_handover(&held).await {
                Handover::Retried(next) => held = next,
                Handover::Released => return,
                Handover::Untouched => {}
            }
        }
        let ttl = self.args.ttl;
        let hold_for = match self.rng.below(20) {
            0..=13 => Duration::from_millis(self.rng.between(20, 200)),
            14..=18 => Duration::from_millis(self.rng.between(200, 700)),
            _ => Duration::from_millis(self.rng.between(700, 1_500)),
        };
        let end = Instant::now() + hold_for;
        let mut next_renewal = held.expiry.checked_sub(ttl * 2 / 3).unwrap_or_else(Instant::now);
        if self.abandon_pending && held.role == Role::Writer && held.resource.starts_with("rw:") {
            self.abandon_waiter(&held).await;
        }
        loop {
            let now = Instant::now();
            if now + MARGIN >= held.expiry {
                return self.expired(held).await;
            }
            if now >= end {
                break;
            }
            if now >= next_renewal {
                match self.renew(&mut held).await {
                    Some(true) => next_renewal = Instant::now() + ttl / 3,
                    Some(false) => {
                        self.record(
                            Op::Lost,
                            Kind::Ok,
                            &held.resource,
                            held.fence,
                            "renewal refused",
                        );
                        return;
                    }
                    None => next_renewal = Instant::now() + ttl / 10,
                }
                continue;
            }
            self.use_lease(&held).await;
            let pause = Duration::from_millis(self.rng.between(5, 40));
            let until = (Instant::now() + pause).min(next_renewal).min(end);
            tokio::time::sleep_until(until.into()).await;
        }
        self.release(&held, "").await;
    }

    /// The local expiry came (the worker was paused, or its renewals went unanswered): the lease
    /// may be over. One more fenced use and one RENEW, which the server must refuse once the
    /// deadline passed; then released if it still held after all, else given up as lost.
    async fn expired(&mut self, mut held: Held) {
        self.use_lease(&held).await;
        match self.renew(&mut held).await {
            Some(true) => self.release(&held, "").await,
            _ => {
                self.record(Op::Lost, Kind::Ok, &held.resource, held.fence, "local expiry passed");
                self.release(&held, "after loss").await;
            }
        }
    }

    /// `RELEASE … FENCE`.
    async fn release(&mut self, held: &Held, why: &str) {
        let (resource, fence) = (held.resource.as_str(), held.fence);
        self.record(Op::Release, Kind::Invoke, resource, fence, why);
        let mut cmd = redis::cmd("DLOCK.RELEASE");
        cmd.arg(resource).arg(&held.token).arg("FENCE").arg(fence);
        match self.link.query::<i64>(&cmd, Duration::ZERO).await {
            Reply::Ok(1) => self.record(Op::Release, Kind::Ok, resource, fence, why),
            Reply::Ok(_) => self.record(Op::Release, Kind::Fail, resource, fence, "no longer held"),
            Reply::Refused(error) => self.record(Op::Release, Kind::Fail, resource, fence, &error),
            Reply::Unknown(error) => {
                self.record(Op::Release, Kind::Unknown, resource, fence, &error)
            }
        }
    }

    /// One use of the lease under its fence: a writer appends the next entry to the register, a
    /// reader reads the register's length, a permit counts itself.
    async fn use_lease(&mut self, held: &Held) {
        let (resource, fence) = (held.resource.as_str(), held.fence);
        let mut fenced = redis::cmd("DLOCK.FENCED");
        fenced.arg(resource).arg(fence);
        let op = match held.role {
            Role::Writer => {
                let register = rw_register(held.index);
                let mut last = redis::cmd("LINDEX");
                last.arg(&register).arg(-1);
                let Reply::Ok(last) =
                    self.link.query::<Option<String>>(&last, Duration::ZERO).await
                else {
                    return; // no read, no write
                };
                let value = last.as_deref().and_then(Accepted::parse).map_or(0, |a| a.value) + 1;
                self.writes += 1;
                let entry =
                    Accepted { fence, worker: self.args.id, seq: self.writes, value }.entry();
                self.record(Op::RedisWrite, Kind::Invoke, resource, fence, &entry);
                fenced.arg("RPUSH").arg(&register).arg(&entry);
                return match self.link.query::<i64>(&fenced, Duration::ZERO).await {
                    Reply::Ok(_) => self.record(Op::RedisWrite, Kind::Ok, resource, fence, &entry),
                    Reply::Refused(why) => {
                        self.record(Op::RedisWrite, Kind::Fail, resource, fence, &why)
                    }
                    Reply::Unknown(why) => {
                        self.record(Op::RedisWrite, Kind::Unknown, resource, fence, &why)
                    }
                };
            }
            Role::Reader => {
                fenced.arg("LLEN").arg(rw_register(held.index));
                Op::Use
            }
            Role::Permit(_) => {
                fenced.arg("INCR").arg(sem_counter(held.index));
                Op::Use
            }
        };
        self.record(op, Kind::Invoke, resource, fence, &held.token);
        match self.link.query::<i64>(&fenced, Duration::ZERO).await {
            Reply::Ok(_) => self.record(op, Kind::Ok, resource, fence, ""),
            Reply::Refused(why) => self.record(op, Kind::Fail, resource, fence, &why),
            Reply::Unknown(why) => self.record(op, Kind::Unknown, resource, fence, &why),
        }
    }

    /// Abandons a waiter while holding `held` (a writer's lease): `ACQUIRE … WAIT 0 CLAIM c` by a
    /// new token on a connection of its own that is never read (as a client that gave up on its
    /// own timeout but kept its multiplexed connection). It is logged as queued once `DLOCK.INFO`
    /// shows it in line: its turn then comes as a hand-over, with the claim window.
    async fn abandon_waiter(&mut self, held: &Held) {
        self.abandon_pending = false;
        let token = self.token('a');
        let claim = self.rng.between(200, 600);
        let ttl = millis(self.args.ttl);
        let detail = format!("{token} claim={claim} ttl={ttl}");
        let resource = held.resource.as_str();
        self.record(Op::Abandon, Kind::Invoke, resource, 0, &detail);
        let mut cmd = redis::cmd("DLOCK.ACQUIRE");
        cmd.arg(resource).arg(&token).arg(ttl);
        if !self.args.broken && self.rng.below(3) == 0 {
            cmd.arg("SHARED");
        }
        cmd.arg("WAIT").arg(0);
        if !self.args.broken {
            cmd.arg("CLAIM").arg(claim);
        }
        let stream = match self.send_unread(&cmd).await {
            Ok(stream) => stream,
            Err(why) => {
                let detail = format!("{detail} not sent: {why}");
                return self.record(Op::Abandon, Kind::Fail, resource, 0, &detail);
            }
        };
        self.abandoned.push((stream, Instant::now() + ABANDONED_FOR));
        let deadline = Instant::now() + Duration::from_millis(400);
        while Instant::now() < deadline {
            let mut info = redis::cmd("DLOCK.INFO");
            info.arg(resource);
            if let Reply::Ok(reply) = self.link.query::<redis::Value>(&info, Duration::ZERO).await
                && Sample::parse(&reply).is_some_and(|sample| sample.next.contains(&token))
            {
                let detail = format!("{detail} queued");
                return self.record(Op::Abandon, Kind::Ok, resource, 0, &detail);
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        self.record(Op::Abandon, Kind::Fail, resource, 0, &format!("{detail} unseen"));
    }

    /// The retry after a dropped hand-over, as a real client does it: a waiter `W` (a new token)
    /// blocks in `ACQUIRE … WAIT 0` on a connection of its own while this worker holds `held`;
    /// then, in one write on another connection, `held` is released (the lease is handed to `W`),
    /// `W`'s connection is killed before the reply reaches it, and `W` sends its ACQUIRE again,
    /// which answers the fence of the hand-over. From then on this worker is `W` and uses that
    /// lease: the server must not take it back (a confirmed answer stands; `clock-lease` sees a
    /// lease refused sooner than its ttl after that answer).
    async fn retry_after_dropped_handover(&mut self, held: &Held) -> Handover {
        let token = self.token('h');
        let ttl = millis(self.args.ttl);
        let resource = held.resource.clone();
        let waiter = async {
            let (mut stream, id) = self.connect_with_id().await?;
            let mut wait = redis::cmd("DLOCK.ACQUIRE");
            wait.arg(&resource).arg(&token).arg(ttl).arg("WAIT").arg(0);
            stream.write_all(&wait.get_packed_command()).await?;
            Ok::<_, std::io::Error>((stream, id))
        };
        let Ok(Ok((waiting, id))) = tokio::time::timeout(REQUEST, waiter).await else {
            return Handover::Untouched;
        };
        let deadline = Instant::now() + Duration::from_millis(400);
        let mut in_line = false;
        while !in_line && Instant::now() < deadline {
            let mut info = redis::cmd("DLOCK.INFO");
            info.arg(&resource);
            // Alone in line, so that the release hands the lease to it.
            in_line = matches!(
                self.link.query::<redis::Value>(&info, Duration::ZERO).await,
                Reply::Ok(reply) if Sample::parse(&reply)
                    .is_some_and(|s| s.next == [token.clone()] && s.waiters + s.tickets == 1)
            );
            if !in_line {
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }
        if !in_line {
            drop(waiting);
            return Handover::Untouched;
        }
        let mut release = redis::cmd("DLOCK.RELEASE");
        release.arg(&resource).arg(&held.token).arg("FENCE").arg(held.fence);
        let mut kill = redis::cmd("CLIENT");
        kill.arg("KILL").arg("ID").arg(id);
        let mut retry = redis::cmd("DLOCK.ACQUIRE");
        retry.arg(&resource).arg(&token).arg(ttl);
        let mut write = release.get_packed_command();
        write.extend(kill.get_packed_command());
        write.extend(retry.get_packed_command());
        let detail = format!("{token} retry after a dropped hand-over");
        // One operation at a time in the history: the retry's invoke is recorded once the
        // release's reply is in (it was sent with it, so its window here starts late).
        self.record(Op::Release, Kind::Invoke, &resource, held.fence, "for a dropped hand-over");
        let sent = Instant::now();
        let replies = async {
            let (mut stream, _) = self.connect_with_id().await?;
            stream.write_all(&write).await?;
            read_lines(&mut stream, 3).await
        };
        let replies = tokio::time::timeout(REQUEST, replies).await;
        drop(waiting);
        let Ok(Ok(replies)) = replies else {
            self.record(Op::Release, Kind::Unknown, &resource, held.fence, "timed out");
            return Handover::Released;
        };
        match replies[0].as_str() {
            ":1" => self.record(Op::Release, Kind::Ok, &resource, held.fence, ""),
            other => self.record(Op::Release, Kind::Fail, &resource, held.fence, other),
        }
        self.record(Op::Acquire, Kind::Invoke, &resource, 0, &detail);
        let Some(fence) = replies[2].strip_prefix(':').and_then(|f| f.parse::<u64>().ok()) else {
            self.record(Op::Acquire, Kind::Fail, &resource, 0, &replies[2]);
            return Handover::Released;
        };
        self.record(Op::Acquire, Kind::Ok, &resource, fence, &detail);
        Handover::Retried(Held {
            resource,
            index: held.index,
            token,
            fence,
            role: Role::Writer,
            expiry: sent + self.args.ttl,
        })
    }

    /// A new connection and its `CLIENT ID`.
    async fn connect_with_id(&self) -> std::io::Result<(tokio::net::TcpStream, String)> {
        let ConnectionAddr::Tcp(host, port) = &self.link.client.get_connection_info().addr else {
            return Err(std::io::Error::other("not a TCP address"));
        };
        let mut stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
        stream.write_all(&redis::cmd("CLIENT").arg("ID").get_packed_command()).await?;
        let id = read_lines(&mut stream, 1).await?.remove(0);
        let id = id.strip_prefix(':').ok_or_else(|| std::io::Error::other(id.clone()))?.to_owned();
        Ok((stream, id))
    }

    /// Sends `cmd` on a new connection and returns it without reading anything.
    async fn send_unread(&self, cmd: &redis::Cmd) -> Result<tokio::net::TcpStream, String> {
        let ConnectionAddr::Tcp(host, port) = &self.link.client.get_connection_info().addr else {
            return Err("not a TCP address".into());
        };
        let sending = async {
            let mut stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            stream.write_all(&cmd.get_packed_command()).await?;
            stream.flush().await?;
            Ok::<_, std::io::Error>(stream)
        };
        match tokio::time::timeout(REQUEST, sending).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }
}
