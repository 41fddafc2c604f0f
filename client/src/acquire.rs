//! Acquiring: one token per attempt made before the first send, waits in the server's queue,
//! retries of an unknown outcome with the same token until the caller's deadline, and the release
//! of that token when the outcome stays unknown (or the caller drops the attempt).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dlock_proto::channel;
use dlock_proto::command::{self, Acquire, Wait};
use dlock_proto::error::ErrorClass;
use redis::RedisError;

use crate::connection::{Failure, millis};
use crate::lease::Grants;
use crate::{AcquireError, Client, Lease, observe, protocol};

/// The kind of lease an acquire asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The only lease on the resource: a mutex, or the writer of a read-write lock.
    #[default]
    Exclusive,
    /// A reader of a read-write lock (`SHARED`): beside any number of other readers, never
    /// beside a writer.
    Shared,
    /// A permit of a counting semaphore of this many permits (`SHARED LIMIT n`): granted only
    /// while fewer than `n` permits are out. Give every request on the resource the same `n`.
    Permit(u32),
}

impl Mode {
    /// Whether leases of this mode live beside each other.
    pub fn is_shared(self) -> bool {
        !matches!(self, Self::Exclusive)
    }

    /// A short label for logs: `exclusive`, `shared`, `permit`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Shared => "shared",
            Self::Permit(_) => "permit",
        }
    }
}

/// How a wait in the server's queue is carried out. Both wait in the same first-in, first-out
/// line, across modes, and both bound the wait by the caller's `wait`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WaitStrategy {
    /// `WAIT` with `CLAIM`: the server blocks the request and answers the hand-over itself, at
    /// once and with no traffic while waiting. Each waiter uses a connection of its own for the
    /// length of its wait (a blocked request would hold up everything else on a shared one).
    /// The default: the quickest hand-over, no subscription, and no load on the server while
    /// waiting; right for a few waiters per client.
    #[default]
    Blocking,
    /// `QUEUE` tickets: the waiter takes a place in line with an ACQUIRE on the client's shared
    /// connection, and re-sends it on every message of the resource's channel (one subscriber
    /// connection per client, for all its waiters) and at least every third of `ticket`; the
    /// reply with a fence is the grant, claimed. Any number of waiters cost two connections per
    /// client, for one more round trip per hand-over and one ACQUIRE per waiter every
    /// `ticket / 3` (and per channel message). A waiter that gives up or is dropped leaves the
    /// line, and a grant that may have reached it is released.
    Tickets {
        /// How long the place stands without a refresh (`QUEUE ticket-ms`); a waiter that
        /// vanishes blocks nobody for longer than this (its turn lapses after the claim window).
        ticket: Duration,
    },
}

impl WaitStrategy {
    /// Tickets of six seconds (refreshed every two).
    pub const TICKETS: Self = Self::Tickets { ticket: Duration::from_secs(6) };
}

/// What an acquire asks for beside the resource and the ttl: the mode, a wait in the server's
/// queue, and metadata describing the holder. The default: an exclusive lease, no wait, no
/// metadata ([`Client::acquire`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    /// The kind of lease.
    pub mode: Mode,
    /// Wait in the server's queue (FIFO across modes, no polling) for at most this long when
    /// the lease cannot be granted at once; `None` answers [`AcquireError::Held`] at once.
    pub wait: Option<Duration>,
    /// `META`: up to 1024 bytes describing the holder (a host, a pid, a leader's address),
    /// stored with the lease and shown by `DLOCK.INFO`.
    pub meta: Option<String>,
    /// How to wait: `None` takes [`ClientOptions::wait_strategy`](crate::ClientOptions::wait_strategy).
    pub strategy: Option<WaitStrategy>,
}

/// The shortest claim window: twice the request timeout, but never less than this.
const CLAIM_AT_LEAST: Duration = Duration::from_secs(1);

/// How long after a RELEASE of an unknown grant that found nothing the second one is sent.
const FORGET_AGAIN_AFTER: Duration = Duration::from_millis(100);

/// A server older than `CLAIM` refusing it.
fn refuses_claim(error: &RedisError) -> bool {
    protocol::unsupported_option(error) == Some("CLAIM")
}

/// An error after which the request may or may not have been carried out, or that a retry may
/// get past (a server loading its data, a slot in migration: [`ErrorClass::Retry`]).
pub(crate) fn is_ambiguous(error: &RedisError) -> bool {
    error.is_timeout()
        || error.is_connection_dropped()
        || error.is_io_error()
        || protocol::class_of(error) == Some(ErrorClass::Retry)
}

/// How long a request that cannot have been carried out waits before it is sent again.
const RETRY_AFTER: Duration = Duration::from_millis(50);

/// A request the server cannot have carried out: it never left (no connection could be opened:
/// a killed primary refuses), or a node answered that it ran nothing (the slot is failing over
/// or migrating: [`ErrorClass::ran_nothing`]).
fn never_ran(failure: &Failure) -> bool {
    !failure.was_sent() || protocol::class_of(failure.error()).is_some_and(ErrorClass::ran_nothing)
}

/// A failover under way: a wait the server ended as it turned into a replica
/// ([`ErrorClass::Unblocked`]: a grant made an instant before is undone by the server), a
/// request that reached the demoted primary ([`ErrorClass::Failover`]), or the `WAIT` for
/// replicas after it that did. The request is sent again with the same token (to the new
/// primary, once the client follows it) until the deadline: it answers the grant if one was
/// made and kept.
pub(crate) fn is_failing_over(error: &RedisError) -> bool {
    matches!(protocol::class_of(error), Some(ErrorClass::Failover | ErrorClass::Unblocked))
        // The `WAIT` after the request (`ClientOptions::replicas`) reached the old primary once
        // it was a replica (Valkey 9 answers a demoted primary's blocked wait first).
        || error.detail().is_some_and(|d| d.starts_with("WAIT cannot be used with replica"))
}

/// A wait answered nil this long or more before its end did not time out: the server ended it
/// early (the key migrated to another node, was deleted, renamed or swapped away), and the
/// waiter waits again for what is left, on whichever node serves the resource now.
const ENDED_EARLY_BY: Duration = Duration::from_millis(50);

impl Client {
    /// Acquires `resource` for `ttl` without waiting: [`AcquireError::Held`] when someone else has it.
    pub async fn acquire(&self, resource: &str, ttl: Duration) -> Result<Lease, AcquireError> {
        self.acquire_waiting(resource, ttl, None).await
    }

    /// Acquires `resource` for `ttl`, waiting in the server's queue for at most `wait` (FIFO, no
    /// polling) when someone else holds it: [`Client::acquire_with`] with an exclusive lease.
    pub async fn acquire_waiting(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Lease, AcquireError> {
        self.acquire_with(resource, ttl, &AcquireOptions { wait, ..AcquireOptions::default() })
            .await
    }

    /// Acquires the write side of the read-write lock `resource` for `ttl`: an exclusive lease,
    /// granted once no reader and no other writer holds it, waiting for at most `wait` (readers
    /// that come after a waiting writer wait behind it). The same as
    /// [`Client::acquire_waiting`]: a writer is a mutex's holder.
    pub async fn write(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Lease, AcquireError> {
        self.acquire_waiting(resource, ttl, wait).await
    }

    /// Acquires the read side of the read-write lock `resource` for `ttl`: a shared lease,
    /// beside other readers, granted once no writer holds it or waits before this reader;
    /// waiting for at most `wait`. The lease has a mutex's lifecycle and a fence of its own.
    pub async fn read(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Lease, AcquireError> {
        let options = AcquireOptions { mode: Mode::Shared, wait, ..AcquireOptions::default() };
        self.acquire_with(resource, ttl, &options).await
    }

    /// Acquires one of the `permits` permits of the semaphore `resource` for `ttl`, waiting for
    /// at most `wait` while all are out. Every caller of a semaphore must give the same
    /// `permits`. The lease has a mutex's lifecycle and a fence of its own.
    pub async fn semaphore(
        &self,
        resource: &str,
        permits: u32,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Lease, AcquireError> {
        let options =
            AcquireOptions { mode: Mode::Permit(permits), wait, ..AcquireOptions::default() };
        self.acquire_with(resource, ttl, &options).await
    }

    /// Acquires `resource` for `ttl` as `options` ask (mode, wait, metadata); every other
    /// acquire is this one. A wait carries a claim window, and a grant is claimed with one more
    /// ACQUIRE by the same token. If the outcome stays unknown, or this future is dropped before
    /// it answers, the attempt's token is released from a connection of its own
    /// ([`AcquireError::Unknown`]).
    pub async fn acquire_with(
        &self,
        resource: &str,
        ttl: Duration,
        options: &AcquireOptions,
    ) -> Result<Lease, AcquireError> {
        observe::acquire_attempt();
        let started = Instant::now();
        let acquired = self.try_acquire(resource, ttl, options, started).await;
        match &acquired {
            Ok(lease) => observe::acquired(lease, started.elapsed()),
            Err(error) => observe::acquire_failed(error.kind()),
        }
        acquired
    }

    async fn try_acquire(
        &self,
        resource: &str,
        ttl: Duration,
        options: &AcquireOptions,
        started: Instant,
    ) -> Result<Lease, AcquireError> {
        let token = uuid::Uuid::new_v4().to_string();
        // Dropped before the attempt has an answer (the caller's own timeout, a cancelled task),
        // it releases the token in the background: a grant may be on its way.
        let withdraw = protocol::cmd(command::release(resource, &token, None));
        let mut attempt = Attempt { client: self, release: &withdraw, armed: true };
        let answer = self.attempts(resource, ttl, options, started, &token).await;
        attempt.armed = false;
        answer
    }

    async fn attempts(
        &self,
        resource: &str,
        ttl: Duration,
        options: &AcquireOptions,
        started: Instant,
        token: &str,
    ) -> Result<Lease, AcquireError> {
        let wait = options.wait;
        let strategy = options.strategy.unwrap_or(self.options.wait_strategy);
        if let (Some(wait), WaitStrategy::Tickets { ticket }) = (wait, strategy) {
            return self
                .ticket_attempts(resource, ttl, options, started + wait, token, ticket)
                .await;
        }
        let wait_ends = wait.map(|wait| started + wait);
        let deadline = started + self.options.acquire_deadline + wait.unwrap_or_default();
        let ttl_ms = millis(ttl);
        // A lease handed over while waiting first runs only this long, until claimed: if this
        // client never reads the hand-over (it gave up, its connection went silent) and its
        // RELEASE cannot reach the server either, the lease lapses after it, not after the ttl.
        let claim_ms = millis(ttl.min((2 * self.options.request_timeout).max(CLAIM_AT_LEAST)));
        let mut reached_server = false;
        // The next request claims a grant answered to a WAIT with CLAIM.
        let mut claiming = false;
        loop {
            // A retry waits only for what is left of the wait, with the same token: the server
            // replaces this token's earlier place in the queue, or answers with its grant.
            let waiting = if claiming {
                None
            } else {
                wait_ends.map(|end| end.saturating_duration_since(Instant::now()))
            };
            let with_claim = waiting.is_some() && !self.claim_refused.load(Ordering::Relaxed);
            // The claim repeats the mode (another mode is a LOCKMODE error) and the metadata.
            let cmd = protocol::cmd(
                Acquire {
                    mode: protocol::mode(options.mode),
                    wait: waiting.map_or(Wait::No, |wait| Wait::Block(millis(wait))),
                    claim_ms: with_claim.then_some(claim_ms),
                    meta: options.meta.as_deref().map(str::as_bytes),
                    ..Acquire::new(resource, token, ttl_ms)
                }
                .args(),
            );
            let sent = Instant::now();
            match self.send_write::<Option<u64>>(&cmd, waiting.unwrap_or_default()).await {
                // Granted at once or handed over, perhaps with a claim window: the same ACQUIRE
                // without WAIT claims it, answers the same fence and starts the full ttl from its
                // own send (so the local expiry is known).
                Ok((Some(_), _)) if with_claim => claiming = true,
                Ok((Some(fence), acked)) => {
                    let grant = Grant { fence, acked, sent };
                    return self.granted(resource, token, ttl, options.mode, grant).await;
                }
                Ok((None, _)) if claiming => {
                    // The claim came after the window: the grant lapsed and passed on.
                    claiming = false;
                    if wait_ends.is_none_or(|end| Instant::now() >= end) {
                        return Err(AcquireError::Held);
                    }
                }
                Ok((None, _))
                    if waiting.is_some()
                        && wait_ends.is_some_and(|end| Instant::now() + ENDED_EARLY_BY < end) =>
                {
                    // Not a time-out: wait again, after a breath (a server that keeps ending
                    // the wait at once costs one request per 10 ms until the wait is over).
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok((None, _)) => return Err(AcquireError::Held),
                Err(failure) if with_claim && refuses_claim(failure.error()) => {
                    // A server older than CLAIM: wait without it from now on (its hand-overs run
                    // the whole ttl when nobody reads them).
                    self.claim_refused.store(true, Ordering::Relaxed);
                }
                Err(failure) if is_failing_over(failure.error()) && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(failure) if is_ambiguous(failure.error()) => {
                    // Anything but a request that never left may have left a grant behind.
                    reached_server |= failure.was_sent();
                    let error = RedisError::from(failure);
                    if Instant::now() >= deadline {
                        return Err(if reached_server {
                            self.unknown(resource, token, error).await
                        } else {
                            AcquireError::Unreachable(error)
                        });
                    }
                    // Retry with the same token: the server's idempotent ACQUIRE tells the truth.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // After an attempt that may have been granted, the token must not be lost.
                Err(failure) if reached_server => {
                    return Err(self.unknown(resource, token, failure.into()).await);
                }
                Err(failure) => return Err(AcquireError::Server(failure.into())),
            }
        }
    }

    /// The lease of a grant, or, if too few replicas acknowledged it, its release and
    /// [`AcquireError::NotReplicated`].
    async fn granted(
        &self,
        resource: &str,
        token: &str,
        ttl: Duration,
        mode: Mode,
        grant: Grant,
    ) -> Result<Lease, AcquireError> {
        let Grant { fence, acked, sent } = grant;
        let lease = Lease {
            client: self.clone(),
            grants: Grants::one(resource, fence),
            token: token.to_owned(),
            ttl,
            mode,
            local_expiry: sent + Duration::from_millis(millis(ttl)),
            granted: Instant::now(),
            revocations: Vec::new(),
            claim: None,
        };
        match (self.options.replicas, acked) {
            (Some(replicas), Some(acked)) if acked < u64::from(replicas.count) => {
                // Never reported as granted: released without a hold to record.
                let token = lease.token.clone();
                let released =
                    matches!(self.release_grant(resource, &token, Some(fence)).await, Ok(true));
                Err(AcquireError::NotReplicated { token, acked, wanted: replicas.count, released })
            }
            _ => {
                // Listens for the lease's revocation from now on, on the node that granted it;
                // the subscription is not awaited (a revocation that races it is caught by the
                // next renewal).
                let address = self.node_address(resource).await;
                let holder = self.channels.hold(self, address, resource, fence);
                Ok(Lease { revocations: vec![holder], ..lease })
            }
        }
    }

    /// The lease a ticket's own channel announced (`started`): held from now on, its claim (a
    /// RENEW with its fence, which sets the full ttl) sent at once in a task of its own, whose
    /// answer the lease's first renewal reads.
    async fn started(
        &self,
        resource: &str,
        token: &str,
        ttl: Duration,
        mode: Mode,
        started: Started,
    ) -> Result<Lease, AcquireError> {
        let grants = Grants::one(resource, started.fence);
        let claim = {
            let (client, grants, token) = (self.clone(), grants.clone(), token.to_owned());
            tokio::spawn(
                async move { crate::lease::renew_once(&client, &grants, &token, ttl).await },
            )
        };
        let address = self.node_address(resource).await;
        let holder = self.channels.hold(self, address, resource, started.fence);
        Ok(Lease {
            client: self.clone(),
            grants,
            token: token.to_owned(),
            ttl,
            mode,
            local_expiry: started.local_expiry,
            granted: Instant::now(),
            revocations: vec![holder],
            claim: Some(claim),
        })
    }

    /// A wait with a `QUEUE` ticket until `wait_ends`: the ACQUIRE goes on the shared
    /// connection, numbered by `NOTIFY`, and the ticket listens on its own channel, where the
    /// server tells it alone of its grant (`granted <fence> <request> <window-ms>`). The lease
    /// starts on that message: it runs at least until the named request's send time plus the
    /// window (that request reached the server before the hand-over), and its claim, a RENEW
    /// with the fence, goes out at once without holding the work back ([`Lease`]'s first
    /// renewal reads its answer). With replicas to wait for, or too little of the window left,
    /// the message only wakes the ticket, whose next ACQUIRE claims the turn. A server without
    /// `NOTIFY` is waited on through the resource's channel instead: the ACQUIRE is sent again
    /// when a `handoff` names this token's tag (or names none: an older server). Either way the
    /// ACQUIRE goes again at least every third of `ticket`, and the subscription comes first,
    /// so no message after the first ACQUIRE is missed. Giving up leaves the line and releases
    /// whatever grant the token has.
    async fn ticket_attempts(
        &self,
        resource: &str,
        ttl: Duration,
        options: &AcquireOptions,
        wait_ends: Instant,
        token: &str,
        ticket: Duration,
    ) -> Result<Lease, AcquireError> {
        let deadline = wait_ends + self.options.acquire_deadline;
        let ticket_ms = millis(ticket);
        let refresh = Duration::from_millis(ticket_ms / 3).max(Duration::from_millis(1));
        // A turn this client never claims (it gave up, its connection went silent, and the
        // RELEASE could not reach the server) lapses after this, as a wait's hand-over does; at
        // least the ticket's length, so that a refresh claims a turn whose message was missed.
        let claim = (2 * self.options.request_timeout).max(CLAIM_AT_LEAST).max(ticket);
        let claim_ms = millis(ttl.min(claim));
        let mut notify = !self.notify_refused.load(Ordering::Relaxed);
        let mut waiter = if notify {
            self.channels.join_own(self, resource, token).await
        } else {
            self.channels.join(self, resource, token).await
        };
        // The send time of each ACQUIRE, numbered from 1 by `NOTIFY`.
        let mut sends: Vec<Instant> = Vec::new();
        let mut reached_server = false;
        loop {
            let claim = (!self.claim_refused.load(Ordering::Relaxed)).then_some(claim_ms);
            let request = notify.then_some(sends.len() as u64 + 1);
            let cmd = ticket_cmd(resource, token, ttl, options, ticket_ms, claim, request);
            waiter.seen();
            let mut sent = Instant::now();
            sends.push(sent);
            let reply = match self.send::<Option<u64>>(&cmd, Duration::ZERO).await {
                // Granted and claimed. With replicas to wait for, the same ACQUIRE once more (it
                // answers the same fence and renews) on a connection that can WAIT after it.
                Ok(Some(_)) if self.options.replicas.is_some() => {
                    sent = Instant::now();
                    self.send_write::<Option<u64>>(&cmd, Duration::ZERO).await
                }
                reply => reply.map(|fence| (fence, None)),
            };
            match reply {
                Ok((Some(fence), acked)) => {
                    let grant = Grant { fence, acked, sent };
                    return self.granted(resource, token, ttl, options.mode, grant).await;
                }
                Ok((None, _)) => reached_server = true, // in line
                Err(failure) if claim.is_some() && refuses_claim(failure.error()) => {
                    self.claim_refused.store(true, Ordering::Relaxed);
                    continue;
                }
                Err(failure)
                    if notify
                        && protocol::unsupported_option(failure.error()) == Some("NOTIFY") =>
                {
                    // An older server (or, after a failover, an older replica): the resource's
                    // channel, subscribed before the next ACQUIRE.
                    self.notify_refused.store(true, Ordering::Relaxed);
                    notify = false;
                    waiter = self.channels.join(self, resource, token).await;
                    continue;
                }
                Err(failure) if is_ambiguous(failure.error()) => {
                    reached_server |= failure.was_sent();
                    let error = RedisError::from(failure);
                    if Instant::now() >= deadline {
                        return Err(if reached_server {
                            let released = self.forget(resource, token).await;
                            AcquireError::Unknown {
                                token: token.to_owned(),
                                source: error,
                                released,
                            }
                        } else {
                            AcquireError::Unreachable(error)
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(failure) if reached_server => {
                    let released = self.forget(resource, token).await;
                    let source = failure.into();
                    return Err(AcquireError::Unknown {
                        token: token.to_owned(),
                        source,
                        released,
                    });
                }
                Err(failure) => return Err(AcquireError::Server(failure.into())),
            }
            let now = Instant::now();
            if now >= wait_ends {
                self.forget(resource, token).await;
                return Err(AcquireError::Held);
            }
            let nap = refresh.min(wait_ends - now);
            tokio::select! {
                () = waiter.woken() => {}
                () = tokio::time::sleep(nap) => {}
            }
            if let Some(granted) = waiter.granted().filter(|_| self.options.replicas.is_none()) {
                let sent_at = |request: u64| {
                    let index = usize::try_from(request).ok()?.checked_sub(1)?;
                    sends.get(index).copied()
                };
                // Started only with a request timeout of the window left for the claim.
                let plus_ms = |at: Instant, ms: u64| at + Duration::from_millis(ms);
                let started = channel::granted_expiry(&granted, sent_at, plus_ms)
                    .filter(|expiry| *expiry > Instant::now() + self.options.request_timeout);
                if let Some(local_expiry) = started {
                    let grant = Started { fence: granted.fence, local_expiry };
                    return self.started(resource, token, ttl, options.mode, grant).await;
                }
            }
            waiter = self.channels.keep(self, resource, waiter).await;
        }
    }

    /// The error of an attempt whose outcome stayed unknown, after releasing whatever grant its
    /// token may have.
    async fn unknown(&self, resource: &str, token: &str, source: RedisError) -> AcquireError {
        let released = self.forget(resource, token).await;
        AcquireError::Unknown { token: token.to_owned(), source, released }
    }

    /// Releases the grant `token` may have from an attempt that failed on this side (its reply
    /// lost, its connection dropped, its timeout passed as the server handed it the lease):
    /// `true` if a grant was found and released. The token is this attempt's alone, so the
    /// RELEASE (without FENCE: the fence is unknown) can only free this attempt's grant.
    ///
    /// It goes on a connection opened for it, never the failed one (which may be silent), and
    /// the failed attempt's own connection is closed by then: whatever it carried reaches the
    /// server before that close, so the server either drops the waiter or grants before it
    /// learns of the close. A RELEASE that finds nothing may still have overtaken the attempt's
    /// ACQUIRE on the way (another path, a proxy): one more follows after
    /// [`FORGET_AGAIN_AFTER`], and no more, so that a failed acquire returns in bounded time
    /// (two requests and the pause). A grant that arrives later still, or that no RELEASE could
    /// reach, ends with its ttl.
    async fn forget(&self, resource: &str, token: &str) -> bool {
        self.withdraw(&protocol::cmd(command::release(resource, token, None))).await
    }

    /// [`Client::forget`] with `release`, the RELEASE (or a set's RELEASEALL) of the attempt's
    /// token without a fence: `true` if it released something.
    pub(crate) async fn withdraw(&self, release: &redis::Cmd) -> bool {
        match self.release_alone(release).await {
            Ok(true) => return true,
            Ok(false) => {}
            Err(error) => {
                tracing::debug!(%error, "dlock: unknown grant not released");
                return false;
            }
        }
        tokio::time::sleep(FORGET_AGAIN_AFTER).await;
        matches!(self.release_alone(release).await, Ok(true))
    }

    /// `release` on a connection of its own, within
    /// [`ClientOptions::connect_timeout`](crate::ClientOptions::connect_timeout) and
    /// [`ClientOptions::request_timeout`](crate::ClientOptions::request_timeout): whether it
    /// released anything.
    async fn release_alone(&self, release: &redis::Cmd) -> Result<bool, RedisError> {
        let released: i64 = self.send_alone(release).await?;
        Ok(released > 0)
    }

    /// Releases a grant known only by its token (after [`AcquireError::Unknown`] whose
    /// `released` is false): `true` if it was held and is released now.
    pub async fn release(&self, resource: &str, token: &str) -> Result<bool, RedisError> {
        self.release_grant(resource, token, None).await
    }

    /// `cmd` (on the shared connection), sent again while the server cannot have carried it out
    /// ([`never_ran`]) and `until` has not come.
    pub(crate) async fn send_until<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        until: Instant,
    ) -> Result<T, Failure> {
        loop {
            match self.send::<T>(cmd, Duration::ZERO).await {
                // The last attempt goes at `until`: the server's deadline is later still.
                Err(failure) if never_ran(&failure) && Instant::now() < until => {
                    let left = until.saturating_duration_since(Instant::now());
                    tokio::time::sleep(RETRY_AFTER.min(left)).await;
                }
                reply => return reply,
            }
        }
    }

    /// Releases the grant of `token` with `fence` (when known): a retried or late RELEASE can then
    /// never free a later grant of the same token.
    pub(crate) async fn release_grant(
        &self,
        resource: &str,
        token: &str,
        fence: Option<u64>,
    ) -> Result<bool, RedisError> {
        let cmd = protocol::cmd(command::release(resource, token, fence));
        let released: i64 = self.send(&cmd, Duration::ZERO).await?;
        Ok(released == 1)
    }
}

/// What a grant answered: its fence, the replicas that acknowledged it (if asked), and when the
/// request that answered it was sent (the conservative start of its ttl).
struct Grant {
    fence: u64,
    acked: Option<u64>,
    sent: Instant,
}

/// A lease handed to a ticket, known from its own channel's `granted` message: its fence, and
/// the earliest its server deadline may be, on this machine's clock.
struct Started {
    fence: u64,
    local_expiry: Instant,
}

/// `DLOCK.ACQUIRE resource token ttl … QUEUE ticket-ms [NOTIFY request] [CLAIM claim-ms] …`
/// with the mode and the metadata `options` ask for.
fn ticket_cmd(
    resource: &str,
    token: &str,
    ttl: Duration,
    options: &AcquireOptions,
    ticket_ms: u64,
    claim_ms: Option<u64>,
    notify: Option<u64>,
) -> redis::Cmd {
    protocol::cmd(
        Acquire {
            mode: protocol::mode(options.mode),
            wait: Wait::Queue(ticket_ms),
            notify,
            claim_ms,
            meta: options.meta.as_deref().map(str::as_bytes),
            ..Acquire::new(resource, token, millis(ttl))
        }
        .args(),
    )
}

/// An acquire attempt in progress; dropped while armed, it releases the attempt's token in a
/// background task (on the runtime it ran on) with `release` (a RELEASE, or a set's RELEASEALL,
/// without a fence).
pub(crate) struct Attempt<'a> {
    pub(crate) client: &'a Client,
    pub(crate) release: &'a redis::Cmd,
    pub(crate) armed: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (client, release) = (self.client.clone(), self.release.clone());
        runtime.spawn(async move {
            client.withdraw(&release).await;
        });
    }
}
