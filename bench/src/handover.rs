//! Contended hand-over: 16 workers take turns on one resource, 1 ms of work each, with four ways
//! to wait: a retry loop (exponential backoff and jitter), `DLOCK.ACQUIRE … WAIT`, dlock's
//! `QUEUE` tickets told on their own channel (as the clients do it), and a Redisson-style
//! pub/sub wake-up around `SET NX PX`. Each worker is a thread of this process, so every
//! timestamp is on one monotonic clock: the hand-over gap is the time from one holder's release
//! acknowledgement to the next holder's grant acknowledgement.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dlock_testkit::{Server, info_value, resp_command};

use crate::harness::{PingProbe, Result, client_token, flush, run_clients};
use crate::report::{Report, fmt_rate, percentile, ratio};
use crate::schemes::{LUA_ACQUIRE, LUA_RELEASE, Scheme, lock, unlock};

/// Workers taking turns, unless `BENCH_HANDOVER_WORKERS` says otherwise (fewer workers show
/// what a hand-over costs without a crowd woken by each message).
const WORKERS: usize = 16;
/// The one resource.
const RESOURCE: &str = "hot";
/// The channel the pub/sub scheme's release publishes on (Redisson names it after the lock).
const PUBSUB_CHANNEL: &str = "lock-released:{hot}";
/// Every lease's ttl; the pub/sub scheme waits at most this long for a message (as Redisson
/// waits for the holder's remaining ttl).
const LEASE_MS: u64 = 5_000;
/// How long one `WAIT` waits before the worker asks again.
const WAIT_MS: u64 = 2_000;
/// The Rust client's default ticket (`WaitStrategy::TICKETS`): six seconds, refreshed every two.
const TICKET_MS: u64 = 6_000;
/// The pub/sub release: owner-checked DEL, then a message for the waiters.
const LUA_RELEASE_PUBLISH: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    redis.call('DEL', KEYS[1]) redis.call('PUBLISH', KEYS[2], '0') return 1 end return 0";

/// How a worker waits for the lock.
#[derive(Clone, Copy, PartialEq)]
enum Waiting {
    Backoff,
    Wait,
    Tickets,
    PubSub,
}

impl Waiting {
    fn name(self) -> &'static str {
        match self {
            Self::Backoff => "retry loop, exponential backoff + jitter",
            Self::Wait => "DLOCK.ACQUIRE … WAIT",
            Self::Tickets => "DLOCK.ACQUIRE … QUEUE + channel",
            Self::PubSub => "SET NX PX + pub/sub wake-up (Redisson-style)",
        }
    }
}

/// One critical section, in µs since the case started.
#[derive(Clone, Copy)]
struct Section {
    asked: f64,
    granted: f64,
    release_sent: f64,
    released: f64,
}

/// What one worker did.
struct Worker {
    sections: Vec<Section>,
    commands: u64,
}

/// One case's figures.
struct Contention {
    rate: f64,
    gap_p50_us: f64,
    gap_p99_us: f64,
    wait_p99_ms: f64,
    commands_per_section: f64,
    jain: f64,
    ping_p50_us: f64,
    /// From the holder's RELEASE being sent to the next grant's acknowledgement, p50.
    from_send_p50_us: f64,
    /// The holder's RELEASE round trip, p50.
    release_rtt_p50_us: f64,
    /// Server time per release command (`INFO commandstats`), the hand-over included.
    release_server_us: f64,
}

/// The contended hand-over table, and where the dlock hand-over's time goes.
pub fn run(server: &Server, report: &mut Report, seconds: u64) -> Result<()> {
    let seconds = seconds.max(3);
    let workers = crate::env_or("BENCH_HANDOVER_WORKERS", WORKERS).max(2);
    report.section(&format!(
        "Contended hand-over ({workers} workers, one resource, 1 ms of work each, {seconds} s per \
         scheme)"
    ));
    report.header(&[
        "scheme",
        "critical sections/s",
        "gap p50 µs",
        "gap p99 µs",
        "wait p99 ms",
        "commands / section",
        "Jain fairness",
        "PING RTT p50 µs",
        "gap p50 / PING RTT",
    ]);
    let mut results = Vec::new();
    for waiting in [Waiting::Backoff, Waiting::Wait, Waiting::Tickets, Waiting::PubSub] {
        let result = contended(server, waiting, workers, seconds)?;
        report.row(&[
            waiting.name().to_owned(),
            fmt_rate(result.rate),
            format!("{:.0}", result.gap_p50_us),
            format!("{:.0}", result.gap_p99_us),
            format!("{:.2}", result.wait_p99_ms),
            format!("{:.1}", result.commands_per_section),
            format!("{:.2}", result.jain),
            format!("{:.0}", result.ping_p50_us),
            ratio(result.gap_p50_us, result.ping_p50_us),
        ]);
        results.push((waiting, result));
    }
    let rate = |w: Waiting| results.iter().find(|(x, _)| *x == w).map_or(0.0, |(_, r)| r.rate);
    report.note(&format!(
        "WAIT / backoff rate: {}; tickets / backoff: {}; pub/sub / backoff: {}. The gap runs from \
         one holder's RELEASE reply to the next holder's grant reply (threads of one process, one \
         clock); PING RTT is a probe pinging every millisecond during the same case. Commands \
         count everything a worker sends (attempts, refreshes, SUBSCRIBE/UNSUBSCRIBE, releases). \
         Target: dlock's gap p50 at most 2× PING RTT.",
        ratio(rate(Waiting::Wait), rate(Waiting::Backoff)),
        ratio(rate(Waiting::Tickets), rate(Waiting::Backoff)),
        ratio(rate(Waiting::PubSub), rate(Waiting::Backoff)),
    ));
    report.section("Where the dlock hand-over goes (same run)");
    report.header(&[
        "scheme",
        "holder's RELEASE RTT p50 µs",
        "RELEASE sent → next grant reply p50 µs",
        "gap p50 µs",
        "server µs per RELEASE (hand-over included)",
        "PING RTT p50 µs",
    ]);
    for (waiting, result) in &results {
        if matches!(waiting, Waiting::Wait | Waiting::Tickets) {
            report.row(&[
                waiting.name().to_owned(),
                format!("{:.0}", result.release_rtt_p50_us),
                format!("{:.0}", result.from_send_p50_us),
                format!("{:.0}", result.gap_p50_us),
                format!("{:.1}", result.release_server_us),
                format!("{:.0}", result.ping_p50_us),
            ]);
        }
    }
    report.note(
        "The server hands over inside the holder's RELEASE (its server time, from INFO \
         commandstats), and answers both clients in the same event-loop turn; what separates the \
         two replies on the client side is the waking of the next holder's thread (and with \
         tickets, its own channel's message; the claim, a RENEW, goes beside the work).",
    );
    flush(server)
}

/// `workers` workers take turns on [`RESOURCE`], ~1 ms of work each, waiting the `waiting` way.
fn contended(
    server: &Server,
    waiting: Waiting,
    workers: usize,
    seconds: u64,
) -> Result<Contention> {
    flush(server)?;
    let mut admin = server.try_client()?;
    let pubsub_release = redis::Script::new(LUA_RELEASE_PUBLISH);
    pubsub_release.prepare_invoke().load(&mut admin)?;
    redis::Script::new(LUA_ACQUIRE).prepare_invoke().load(&mut admin)?;
    redis::Script::new(LUA_RELEASE).prepare_invoke().load(&mut admin)?;
    redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(&mut admin)?;
    let done = Arc::new(Mutex::new(Vec::<Worker>::new()));
    let recorded = done.clone();
    let port = server.port;
    let epoch = Instant::now();
    let since = move |at: Instant| at.duration_since(epoch).as_secs_f64() * 1e6;
    let probe = PingProbe::start(server)?;
    let started = Instant::now();
    run_clients(server, workers, seconds, move |con, rng, running| {
        let (acquire, release) = (redis::Script::new(LUA_ACQUIRE), redis::Script::new(LUA_RELEASE));
        let release_publish = redis::Script::new(LUA_RELEASE_PUBLISH);
        let token = client_token(rng);
        let mut subscriber = match waiting {
            Waiting::Tickets | Waiting::PubSub => Some(Subscriber::connect(port)?),
            _ => None,
        };
        let mut me = Worker { sections: Vec::new(), commands: 0 };
        let mut claim = None;
        while running() {
            let asked = Instant::now();
            let granted = match waiting {
                Waiting::Backoff => {
                    let mut backoff_us = 1_000u64;
                    loop {
                        me.commands += 1;
                        if lock(con, Scheme::Lua, RESOURCE, &token, LEASE_MS, &acquire)? {
                            break true;
                        }
                        if !running() {
                            break false;
                        }
                        let jitter = rng.next() % backoff_us;
                        thread::sleep(Duration::from_micros(backoff_us + jitter));
                        backoff_us = (backoff_us * 2).min(64_000);
                    }
                }
                Waiting::Wait => {
                    me.commands += 1;
                    let fence: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
                        .arg(RESOURCE)
                        .arg(&token)
                        .arg(LEASE_MS)
                        .arg("WAIT")
                        .arg(WAIT_MS)
                        .query(con)?;
                    fence.is_some()
                }
                Waiting::Tickets => {
                    let sub = subscriber.as_mut().ok_or("no subscriber")?;
                    claim = ticket_wait(con, sub, &token, &mut me.commands, running)?;
                    claim.is_some()
                }
                Waiting::PubSub => {
                    let sub = subscriber.as_mut().ok_or("no subscriber")?;
                    pubsub_wait(con, sub, &token, &mut me.commands, running)?
                }
            };
            if !granted {
                continue;
            }
            let granted = Instant::now();
            thread::sleep(Duration::from_millis(1)); // the work
            if claim.take() == Some(Claim::Sent) {
                // The claim's answer, beside the work: 1, or the lease was lost.
                let claimed: i64 = redis::from_redis_value(&con.recv_response()?)?;
                if claimed != 1 {
                    return Err("a ticket's claim was refused".into());
                }
            }
            let release_sent = Instant::now();
            me.commands += 1;
            match waiting {
                Waiting::Backoff => unlock(con, Scheme::Lua, RESOURCE, &token, &release)?,
                Waiting::PubSub => {
                    release_publish
                        .key(RESOURCE)
                        .key(PUBSUB_CHANNEL)
                        .arg(&token)
                        .invoke::<i64>(con)?;
                }
                _ => unlock(con, Scheme::Dlock, RESOURCE, &token, &release)?,
            }
            me.sections.push(Section {
                asked: since(asked),
                granted: since(granted),
                release_sent: since(release_sent),
                released: since(Instant::now()),
            });
        }
        let count = me.sections.len() as u64;
        recorded.lock().map_err(|_| "poisoned")?.push(me);
        Ok(count)
    })?;
    // Workers still waiting at the end finish their turn (a pub/sub waiter may sleep up to a
    // ttl): the rate and fairness count only the sections granted within the run's seconds.
    let window = (since(started), since(started) + seconds as f64 * 1e6);
    let pings = probe.finish()?;
    let workers = std::mem::take(&mut *done.lock().map_err(|_| "poisoned")?);
    let release_server_us = release_usec(&mut admin, waiting)?;
    Ok(summarize(&workers, window, percentile(&pings, 50.0), release_server_us))
}

fn summarize(
    workers: &[Worker],
    window: (f64, f64),
    ping_p50_us: f64,
    release_server_us: f64,
) -> Contention {
    let mut sections: Vec<Section> = workers.iter().flat_map(|w| w.sections.clone()).collect();
    sections.sort_by(|a, b| a.granted.total_cmp(&b.granted));
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let gaps = sorted(sections.windows(2).map(|w| w[1].granted - w[0].released).collect());
    let from_send = sorted(sections.windows(2).map(|w| w[1].granted - w[0].release_sent).collect());
    let release_rtt = sorted(sections.iter().map(|s| s.released - s.release_sent).collect());
    let waits = sorted(sections.iter().map(|s| (s.granted - s.asked) / 1_000.0).collect());
    let within = |s: &&Section| s.granted <= window.1;
    let counts: Vec<f64> =
        workers.iter().map(|w| w.sections.iter().filter(within).count() as f64).collect();
    let (sum, squares) = (counts.iter().sum::<f64>(), counts.iter().map(|c| c * c).sum::<f64>());
    let commands: u64 = workers.iter().map(|w| w.commands).sum();
    Contention {
        rate: counts.iter().sum::<f64>() / ((window.1 - window.0) / 1e6),
        gap_p50_us: percentile(&gaps, 50.0),
        gap_p99_us: percentile(&gaps, 99.0),
        wait_p99_ms: percentile(&waits, 99.0),
        commands_per_section: commands as f64 / sections.len().max(1) as f64,
        jain: if squares > 0.0 { sum * sum / (counts.len() as f64 * squares) } else { 0.0 },
        ping_p50_us,
        from_send_p50_us: percentile(&from_send, 50.0),
        release_rtt_p50_us: percentile(&release_rtt, 50.0),
        release_server_us,
    }
}

/// Server µs per call of the scheme's release command, from `INFO commandstats`.
fn release_usec(admin: &mut redis::Connection, waiting: Waiting) -> Result<f64> {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(admin)?;
    let name = match waiting {
        Waiting::Wait | Waiting::Tickets => "cmdstat_dlock.release",
        _ => "cmdstat_evalsha",
    };
    let per_call = info_value(&stats, name)
        .and_then(|line| line.split(',').find_map(|f| f.strip_prefix("usec_per_call=")))
        .and_then(|v| v.parse().ok());
    Ok(per_call.unwrap_or(0.0))
}

/// Waits with a `QUEUE` ticket as the clients do: subscribe to the ticket's own channel first
/// (so no message after the first ACQUIRE is missed), send the ACQUIRE numbered by `NOTIFY`, and
/// again a third of the ticket's life later; on `granted <fence> <request> <window-ms>` start at
/// once (the named request's send time plus the window is a safe local expiry) and send the
/// claim, a RENEW with the fence, whose answer is read after the work (as the clients read it
/// beside the work); unsubscribe once granted. A reply with a fence is a grant too.
fn ticket_wait(
    con: &mut redis::Connection,
    sub: &mut Subscriber,
    token: &str,
    commands: &mut u64,
    running: &dyn Fn() -> bool,
) -> Result<Option<Claim>> {
    *commands += 1;
    let channel = dlock_proto::channel::ticket_name_of(RESOURCE, token);
    sub.subscribe(&channel)?;
    let refresh = Duration::from_millis(TICKET_MS / 3);
    let mut sends: Vec<Instant> = Vec::new();
    let granted = loop {
        *commands += 1;
        sends.push(Instant::now());
        let fence: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
            .arg(RESOURCE)
            .arg(token)
            .arg(LEASE_MS)
            .arg("QUEUE")
            .arg(TICKET_MS)
            .arg("NOTIFY")
            .arg(sends.len())
            .query(con)?;
        if fence.is_some() {
            break Some(Claim::Answered);
        }
        if !running() {
            // Leave the line (RELEASE without FENCE withdraws the ticket).
            *commands += 1;
            redis::cmd("DLOCK.RELEASE").arg(RESOURCE).arg(token).query::<i64>(con)?;
            break None;
        }
        let Some(message) = sub.wait_for_line(refresh, b"granted ")? else { continue };
        let Some(granted) = dlock_proto::channel::granted(&message) else { continue };
        let sent_at =
            |request: u64| sends.get(usize::try_from(request).ok()?.checked_sub(1)?).copied();
        let plus_ms = |at: Instant, ms: u64| at + Duration::from_millis(ms);
        let expiry = dlock_proto::channel::granted_expiry(&granted, sent_at, plus_ms);
        if expiry.is_some_and(|expiry| expiry > Instant::now() + Duration::from_millis(100)) {
            *commands += 1;
            let renew = redis::cmd("DLOCK.RENEW")
                .arg(RESOURCE)
                .arg(token)
                .arg(LEASE_MS)
                .arg("FENCE")
                .arg(granted.fence)
                .get_packed_command();
            con.send_packed_command(&renew)?;
            break Some(Claim::Sent);
        }
    };
    *commands += 1;
    sub.unsubscribe(&channel)?;
    Ok(granted)
}

/// How a ticket's grant was claimed.
#[derive(Clone, Copy, PartialEq)]
enum Claim {
    /// By the ACQUIRE that answered the fence.
    Answered,
    /// By a RENEW sent on the message, whose answer is still to be read.
    Sent,
}

/// Redisson's way: try `SET NX PX`; on failure subscribe to the lock's channel, then try again
/// on every message (or after the lease's ttl without one); unsubscribe once granted.
fn pubsub_wait(
    con: &mut redis::Connection,
    sub: &mut Subscriber,
    token: &str,
    commands: &mut u64,
    running: &dyn Fn() -> bool,
) -> Result<bool> {
    let try_lock = |con: &mut redis::Connection| -> Result<bool> {
        Ok(redis::cmd("SET")
            .arg(RESOURCE)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(LEASE_MS)
            .query::<Option<String>>(con)?
            .is_some())
    };
    *commands += 1;
    if try_lock(con)? {
        return Ok(true);
    }
    *commands += 1;
    sub.subscribe(PUBSUB_CHANNEL)?;
    let granted = loop {
        *commands += 1;
        if try_lock(con)? {
            break true;
        }
        if !running() {
            break false;
        }
        sub.wait(Duration::from_millis(LEASE_MS))?;
    };
    *commands += 1;
    sub.unsubscribe(PUBSUB_CHANNEL)?;
    Ok(granted)
}

/// A subscriber connection read as raw bytes, so that a wake-up is "something arrived" and
/// messages that arrive together wake once (as the clients' watch of the channel does).
struct Subscriber {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Subscriber {
    fn connect(port: u16) -> Result<Self> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        Ok(Self { stream, buf: Vec::new() })
    }

    /// Subscribes and reads until the confirmation: whatever arrived before it (the previous
    /// UNSUBSCRIBE's confirmation, messages of an earlier wait) is dropped.
    fn subscribe(&mut self, channel: &str) -> Result<()> {
        self.stream.write_all(&resp_command(&[b"SUBSCRIBE", channel.as_bytes()]))?;
        self.stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        self.buf.clear();
        let confirmation = b"$9\r\nsubscribe\r\n";
        let mut chunk = [0u8; 4096];
        while !self.buf.windows(confirmation.len()).any(|w| w == confirmation) {
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err("subscriber connection closed".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        Ok(())
    }

    /// Waits up to `timeout` for anything on the connection.
    fn wait(&mut self, timeout: Duration) -> Result<()> {
        self.stream.set_read_timeout(Some(timeout))?;
        let mut chunk = [0u8; 4096];
        match self.stream.read(&mut chunk) {
            Ok(0) => Err("subscriber connection closed".into()),
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Waits up to `timeout` until `needle` arrives (what arrived before this call is dropped).
    fn wait_for(&mut self, timeout: Duration, needle: &[u8]) -> Result<()> {
        let until = Instant::now() + timeout;
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        while !self.buf.windows(needle.len()).any(|w| w == needle) {
            let Some(left) = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
            else {
                return Ok(());
            };
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("subscriber connection closed".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` for a message starting with `prefix`, and returns it (`None`: none
    /// came; what arrived before this call is dropped).
    fn wait_for_line(&mut self, timeout: Duration, prefix: &[u8]) -> Result<Option<String>> {
        self.wait_for(timeout, prefix)?;
        let Some(at) = self.buf.windows(prefix.len()).position(|w| w == prefix) else {
            return Ok(None);
        };
        let mut chunk = [0u8; 256];
        while !self.buf[at..].windows(2).any(|w| w == b"\r\n") {
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err("subscriber connection closed".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let line = &self.buf[at..];
        let end = line.windows(2).position(|w| w == b"\r\n").unwrap_or(line.len());
        Ok(Some(String::from_utf8_lossy(&line[..end]).into_owned()))
    }

    /// Sends UNSUBSCRIBE without waiting for its confirmation (the next SUBSCRIBE skips it).
    fn unsubscribe(&mut self, channel: &str) -> Result<()> {
        self.stream.write_all(&resp_command(&[b"UNSUBSCRIBE", channel.as_bytes()]))?;
        Ok(())
    }
}
