//! An async client for dlock: leases with fencing tokens, held in a Redis (or Valkey) server with
//! the dlock module, whose renewal lives and dies with the work they protect.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! let client = dlock_client::Client::connect("redis://127.0.0.1:6379/").await?;
//! let lease = client.acquire("invoice:123", Duration::from_secs(30)).await?;
//! let fence = lease.fence(); // send it with every write the lease protects
//! let total = lease
//!     .run(|cancelled| async move {
//!         // The work: check `cancelled.is_cancelled()` between steps; if the lease is lost the
//!         // future is cancelled (and dropped if it does not stop by itself).
//!         fence * 2
//!     })
//!     .await?;
//! # let _ = total;
//! # Ok(())
//! # }
//! ```
//!
//! What the API guarantees:
//! - A token is made (UUID v4) before the first send, and an ambiguous ACQUIRE (a timeout, a
//!   dropped connection) is retried with the *same* token until the caller's deadline, so one
//!   grant never gets two fences; if the outcome stays unknown the error carries the token.
//! - [`Lease::run`] renews every third of the ttl only while the work runs, in the same task (the
//!   renewal cannot outlive `run`); a refused renewal, renewals failing until the lease's
//!   conservative local expiry, or the server announcing the lease's end
//!   ([`ClientOptions::watch_events`]) cancel the work and return [`RunError::LockLost`]; when
//!   the work ends, an owner-checked RELEASE is sent with a bounded timeout and a failed release
//!   is reported, not swallowed.
//! - The local expiry is conservative: counted from *before* the ACQUIRE or RENEW was sent, so it
//!   is never later than the server's deadline (unless the server caps the ttl with
//!   `dlock.max-hold-ms`).
//! - With [`ClientOptions::replicas`], a grant or renewal counts only once that many replicas
//!   acknowledged it (`WAIT`); a grant they did not acknowledge is released and reported as
//!   [`AcquireError::NotReplicated`], a renewal they did not acknowledge counts as failed.
//! - Fenced writes: [`Lease::fenced`] for data in the same Redis (`DLOCK.FENCED`), [`sql`] for
//!   rows elsewhere; a stale worker's refused write is its own error, never a silent no-op.
//! - Figures go through the `metrics` facade and ownership transitions are `tracing` events
//!   ([`observe`] lists them).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::RedisError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubStream};
pub use tokio_util::sync::CancellationToken;

mod error;
pub mod observe;
pub mod sql;

pub use error::{AcquireError, FencedError, LossReason, RunError};

/// Settings of a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long one request may take before its outcome counts as unknown (a WAIT adds its own
    /// timeout to this).
    pub request_timeout: Duration,
    /// How long an ACQUIRE keeps retrying an unknown outcome with the same token.
    pub acquire_deadline: Duration,
    /// How long `run` lets cancelled work finish before dropping it.
    pub cancel_grace: Duration,
    /// Durability: count a grant or renewal only once this many replicas acknowledged it.
    /// Each such request uses a connection of its own (WAIT blocks the connection it runs on).
    pub replicas: Option<Replicas>,
    /// While [`Lease::run`] works, subscribe to the resource's keyspace channel and cancel the
    /// work as soon as the server announces the lease's end (`dlock.expired`; a deletion is
    /// confirmed with FENCECHECK first). Needs `notify-keyspace-events` with `K` and `d` on the
    /// server, and one more connection per running lease. Off by default; renewals alone still
    /// detect the loss within a third of the ttl.
    pub watch_events: bool,
}

/// How many replicas must acknowledge a grant or renewal, and how long to wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replicas {
    /// Replicas that must acknowledge (`WAIT numreplicas`).
    pub count: u32,
    /// How long to wait for them (`WAIT timeout`).
    pub timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(2),
            acquire_deadline: Duration::from_secs(10),
            cancel_grace: Duration::from_millis(100),
            replicas: None,
            watch_events: false,
        }
    }
}

/// A connection to a dlock server that reconnects by itself. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    /// The shared connection: it reconnects by itself after an I/O error, and is replaced after a
    /// request timed out (a half-open socket never errors, it only goes silent).
    /// The generation counts replacements.
    connection: Arc<Mutex<(u64, ConnectionManager)>>,
    /// For blocking waits, WAIT and subscriptions, which must not hold up other requests on the
    /// shared connection.
    redis: redis::Client,
    options: ClientOptions,
}

/// An error after which the request may or may not have been carried out, or that a retry may
/// get past (a server loading its data, a failover in progress).
fn is_ambiguous(error: &RedisError) -> bool {
    error.is_timeout()
        || error.is_connection_dropped()
        || error.is_io_error()
        || matches!(error.code(), Some("LOADING" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN"))
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "request timed out"))
}

/// A duration as the server is told it, in whole milliseconds (at least 1).
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Client {
    /// Connects to `url` (`redis://host:port/db`) with default options.
    pub async fn connect(url: &str) -> Result<Self, RedisError> {
        Self::connect_with(url, ClientOptions::default()).await
    }

    /// Connects to `url` with `options`.
    pub async fn connect_with(url: &str, options: ClientOptions) -> Result<Self, RedisError> {
        let redis = redis::Client::open(url)?;
        let connection = Self::open_shared(&redis, &options).await?;
        Ok(Self { connection: Arc::new(Mutex::new((0, connection))), redis, options })
    }

    async fn open_shared(
        redis: &redis::Client,
        options: &ClientOptions,
    ) -> Result<ConnectionManager, RedisError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(options.request_timeout)
            .set_number_of_retries(2);
        ConnectionManager::new_with_config(redis.clone(), config).await
    }

    /// The shared connection (a cheap handle to it) and its generation.
    fn shared(&self) -> (u64, ConnectionManager) {
        self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Replaces the shared connection of generation `timed_out` after a request on it timed out: the socket
    /// may be half-open (the peer vanished without a FIN), and then every later request on it
    /// would time out too. If a new connection cannot be opened now, the old one stays (it
    /// reconnects by itself on the next I/O error).
    async fn replace_after_timeout(&self, timed_out: u64) {
        let opened = tokio::time::timeout(
            self.options.request_timeout,
            Self::open_shared(&self.redis, &self.options),
        )
        .await;
        if let Ok(Ok(fresh)) = opened {
            let mut shared =
                self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            // Unless another timed-out request replaced it meanwhile.
            if shared.0 == timed_out {
                *shared = (timed_out + 1, fresh);
                tracing::debug!("dlock: replaced the shared connection after a request timed out");
            }
        }
    }

    /// Sends one command with a timeout of `request_timeout + extra`. A command that may block
    /// (`extra` > 0) gets a connection of its own: on the shared one it would hold up every other
    /// request of this client, its own lease's RELEASE included.
    async fn send<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        extra: Duration,
    ) -> Result<T, RedisError> {
        let limit = self.options.request_timeout + extra;
        let reply = if extra.is_zero() {
            let (generation, mut connection) = self.shared();
            let reply = tokio::time::timeout(limit, cmd.query_async(&mut connection)).await;
            if reply.is_err() {
                self.replace_after_timeout(generation).await;
            }
            reply
        } else {
            tokio::time::timeout(limit, async {
                let mut connection = self.redis.get_multiplexed_async_connection().await?;
                cmd.query_async(&mut connection).await
            })
            .await
        };
        reply.unwrap_or_else(|_| Err(timed_out()))
    }

    /// Sends a command that grants or renews, followed by `WAIT` when [`ClientOptions::replicas`]
    /// asks for it (on a connection of its own: WAIT counts the writes of its own connection and
    /// blocks it). Returns the reply and the number of replicas that acknowledged, if asked.
    async fn send_write<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        extra: Duration,
    ) -> Result<(T, Option<u64>), RedisError> {
        let Some(replicas) = self.options.replicas else {
            return self.send(cmd, extra).await.map(|reply| (reply, None));
        };
        let limit = self.options.request_timeout + extra + replicas.timeout;
        let reply = tokio::time::timeout(limit, async {
            let mut connection = self.redis.get_multiplexed_async_connection().await?;
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone());
            pipe.cmd("WAIT").arg(replicas.count).arg(millis(replicas.timeout));
            let (reply, acked): (T, u64) = pipe.query_async(&mut connection).await?;
            Ok((reply, Some(acked)))
        })
        .await;
        reply.unwrap_or_else(|_| Err(timed_out()))
    }

    /// Acquires `resource` for `ttl` without waiting: [`AcquireError::Held`] when someone else has it.
    pub async fn acquire(&self, resource: &str, ttl: Duration) -> Result<Lease, AcquireError> {
        self.acquire_waiting(resource, ttl, None).await
    }

    /// Acquires `resource` for `ttl`, waiting in the server's queue for at most `wait` (FIFO, no
    /// polling) when someone else holds it.
    pub async fn acquire_waiting(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Lease, AcquireError> {
        observe::acquire_attempt();
        let started = Instant::now();
        let acquired = self.try_acquire(resource, ttl, wait, started).await;
        match &acquired {
            Ok(lease) => observe::acquired(resource, &lease.token, lease.fence, started.elapsed()),
            Err(error) => observe::acquire_failed(error.kind()),
        }
        acquired
    }

    async fn try_acquire(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Option<Duration>,
        started: Instant,
    ) -> Result<Lease, AcquireError> {
        let token = uuid::Uuid::new_v4().to_string();
        let wait_ends = wait.map(|wait| started + wait);
        let deadline = started + self.options.acquire_deadline + wait.unwrap_or_default();
        let ttl_ms = millis(ttl);
        let mut reached_server = false;
        loop {
            // A retry waits only for what is left of the wait, with the same token: the server
            // replaces this token's earlier place in the queue, or answers with its grant.
            let waiting = wait_ends.map(|end| end.saturating_duration_since(Instant::now()));
            let mut cmd = redis::cmd("DLOCK.ACQUIRE");
            cmd.arg(resource).arg(&token).arg(ttl_ms);
            if let Some(wait) = waiting {
                cmd.arg("WAIT").arg(millis(wait));
            }
            let sent = Instant::now();
            match self.send_write::<Option<u64>>(&cmd, waiting.unwrap_or_default()).await {
                Ok((Some(fence), acked)) => {
                    let lease = Lease {
                        client: self.clone(),
                        resource: resource.to_owned(),
                        token,
                        fence,
                        ttl,
                        local_expiry: sent + Duration::from_millis(ttl_ms),
                        granted: Instant::now(),
                    };
                    return match (self.options.replicas, acked) {
                        (Some(replicas), Some(acked)) if acked < u64::from(replicas.count) => {
                            // Never reported as granted: released without a hold to record.
                            let token = lease.token.clone();
                            let released = matches!(self.release(resource, &token).await, Ok(true));
                            Err(AcquireError::NotReplicated {
                                token,
                                acked,
                                wanted: replicas.count,
                                released,
                            })
                        }
                        _ => Ok(lease),
                    };
                }
                Ok((None, _)) => return Err(AcquireError::Held),
                Err(error) if is_ambiguous(&error) => {
                    // Anything but a refused connection may have left a grant behind.
                    reached_server |= !error.is_connection_refusal();
                    if Instant::now() >= deadline {
                        return Err(if reached_server {
                            AcquireError::Unknown { token, source: error }
                        } else {
                            AcquireError::Unreachable(error)
                        });
                    }
                    // Retry with the same token: the server's idempotent ACQUIRE tells the truth.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // After an attempt that may have been granted, the token must not be lost.
                Err(error) if reached_server => {
                    return Err(AcquireError::Unknown { token, source: error });
                }
                Err(error) => return Err(AcquireError::Server(error)),
            }
        }
    }

    /// Releases a grant known only by its token (after [`AcquireError::Unknown`]): `true` if it
    /// was held and is released now.
    pub async fn release(&self, resource: &str, token: &str) -> Result<bool, RedisError> {
        let released: i64 =
            self.send(redis::cmd("DLOCK.RELEASE").arg(resource).arg(token), Duration::ZERO).await?;
        Ok(released == 1)
    }

    /// Whether `fence` is still the live lease's fence on `resource` (`DLOCK.FENCECHECK`).
    pub async fn fence_is_live(&self, resource: &str, fence: u64) -> Result<bool, RedisError> {
        let live: i64 = self
            .send(redis::cmd("DLOCK.FENCECHECK").arg(resource).arg(fence), Duration::ZERO)
            .await?;
        Ok(live == 1)
    }

    /// The keyspace-event stream of `resource`, or `None` if it cannot be subscribed to (then
    /// renewals alone watch the lease).
    async fn subscribe(&self, resource: &str) -> Option<PubSubStream> {
        let db = self.redis.get_connection_info().redis.db;
        let channel = format!("__keyspace@{db}__:{resource}");
        let subscribed = tokio::time::timeout(self.options.request_timeout, async {
            let mut pubsub = self.redis.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, RedisError>(pubsub.into_on_message())
        })
        .await;
        match subscribed {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(error)) => {
                tracing::debug!(resource, %error, "dlock: cannot watch keyspace events");
                None
            }
            Err(_) => None,
        }
    }
}

/// A granted lease: `token` owns `resource` with `fence` until the server's deadline.
pub struct Lease {
    client: Client,
    resource: String,
    token: String,
    fence: u64,
    ttl: Duration,
    local_expiry: Instant,
    granted: Instant,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.resource)
            .field("token", &self.token)
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Lease {
    /// The locked resource.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// This lease's owner token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The fencing token: send it with every write the lease protects.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// A conservative end of the lease on this machine's clock: never after the server's deadline.
    pub fn local_expiry(&self) -> Instant {
        self.local_expiry
    }

    /// Renews the lease for another ttl: `Ok(true)` renewed, `Ok(false)` refused (the lease is
    /// lost), `Err` when the server did not answer (or too few replicas acknowledged).
    pub async fn renew(&mut self) -> Result<bool, RedisError> {
        let renewed =
            renew_once(&self.client, &self.resource, &self.token, self.fence, self.ttl).await?;
        if let Some(expiry) = renewed {
            self.local_expiry = expiry;
        }
        Ok(renewed.is_some())
    }

    /// Runs `command` in the server only if this lease's fence is still the live one
    /// (`DLOCK.FENCED`), atomically: a stale lease's write never happens.
    ///
    /// ```no_run
    /// # async fn example(lease: &dlock_client::Lease) -> Result<(), dlock_client::FencedError> {
    /// let mut write = redis::cmd("HSET");
    /// write.arg("invoice:123:data").arg("status").arg("paid");
    /// let _added: i64 = lease.fenced(&write).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn fenced<T: redis::FromRedisValue>(
        &self,
        command: &redis::Cmd,
    ) -> Result<T, FencedError> {
        let mut fenced = redis::cmd("DLOCK.FENCED");
        fenced.arg(&self.resource).arg(self.fence);
        for arg in command.args_iter() {
            if let redis::Arg::Simple(bytes) = arg {
                fenced.arg(bytes);
            }
        }
        self.client.send(&fenced, Duration::ZERO).await.map_err(|error| {
            if error.code() == Some("STALE") {
                observe::stale_write_refused();
                FencedError::Stale(error.detail().unwrap_or_default().to_owned())
            } else {
                FencedError::Redis(error)
            }
        })
    }

    /// Releases the lease: `Ok(true)` released, `Ok(false)` it was no longer held.
    pub async fn release(self) -> Result<bool, RedisError> {
        let released = self.client.release(&self.resource, &self.token).await;
        let ok = matches!(released, Ok(true));
        observe::released(&self.resource, &self.token, self.fence, self.granted.elapsed(), ok);
        released
    }

    /// Runs `work` while keeping the lease: renewals every third of the ttl, in this task, only
    /// while `work` runs. If the lease is lost, `work`'s token is cancelled, `work` gets
    /// `cancel_grace` to stop and is then dropped, and `run` returns [`RunError::LockLost`].
    /// When `work` ends, the lease is released; a failed release is [`RunError::NotReleased`].
    pub async fn run<F, Fut, T>(mut self, work: F) -> Result<T, RunError<T>>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let cancelled = CancellationToken::new();
        let mut events = if self.client.options.watch_events {
            self.client.subscribe(&self.resource).await
        } else {
            None
        };
        let work = work(cancelled.clone());
        tokio::pin!(work);
        // When the next renewal is due: an absolute instant, so that a loop pass for another
        // branch (a keyspace event, such as our own `dlock.renewed`) never postpones it.
        let mut next_renewal = Instant::now() + self.ttl / 3;
        let lost = loop {
            // The renewal is polled beside the work, so the work never waits for a round trip.
            let (client, resource, token, fence, ttl) =
                (&self.client, &self.resource, &self.token, self.fence, self.ttl);
            let renewal = async move {
                tokio::time::sleep_until(next_renewal.into()).await;
                renew_once(client, resource, token, fence, ttl).await
            };
            let expiry = tokio::time::sleep_until(self.local_expiry.into());
            let event = async {
                match events.as_mut() {
                    Some(stream) => stream.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                output = &mut work => {
                    return match self.release().await {
                        Ok(true) => Ok(output),
                        Ok(false) => Err(RunError::NotReleased {
                            output,
                            reason: "the lease was no longer held".into(),
                        }),
                        Err(error) => Err(RunError::NotReleased { output, reason: error.to_string() }),
                    };
                }
                renewed = renewal => match renewed {
                    Ok(Some(expiry)) => {
                        self.local_expiry = expiry;
                        next_renewal = Instant::now() + ttl / 3;
                    }
                    Ok(None) => break LossReason::RenewalRefused,
                    Err(error) if Instant::now() >= self.local_expiry => {
                        break LossReason::Unreachable(error.to_string());
                    }
                    // Retry sooner, until the local expiry.
                    Err(_) => next_renewal = Instant::now() + ttl / 10,
                },
                // The lease may already be over on the server: stop at the local expiry.
                _ = expiry => break LossReason::Unreachable("no renewal was answered in time".into()),
                message = event => match message {
                    // The subscription's connection ended: renewals alone watch the lease now.
                    None => events = None,
                    Some(message) => {
                        let name: String = message.get_payload().unwrap_or_default();
                        if let Some(reason) = self.ended_by(&name).await {
                            break reason;
                        }
                    }
                },
            }
        };
        cancelled.cancel();
        let _ = tokio::time::timeout(self.client.options.cancel_grace, &mut work).await;
        observe::lost(&self.resource, &self.token, self.fence, self.granted.elapsed(), lost.kind());
        // Best effort: a RENEW still in flight must not keep the lease for work that stopped.
        let _ = self.client.release(&self.resource, &self.token).await;
        Err(RunError::LockLost(lost))
    }

    /// Whether the keyspace event `name` on this lease's resource means the lease ended:
    /// `dlock.expired` says so; our own renewals say nothing; anything else (a DEL, a hand-over,
    /// a rename) is confirmed with FENCECHECK.
    async fn ended_by(&self, name: &str) -> Option<LossReason> {
        match name {
            "dlock.expired" => Some(LossReason::Ended(name.to_owned())),
            "dlock.renewed" => None,
            _ => match self.client.fence_is_live(&self.resource, self.fence).await {
                Ok(false) => Some(LossReason::Ended(name.to_owned())),
                // Live, or unknown: renewals decide.
                Ok(true) | Err(_) => None,
            },
        }
    }
}

/// One RENEW (and WAIT, if asked): the new conservative local expiry when renewed, `None` when
/// refused; a renewal too few replicas acknowledged is an error (it could be lost in a failover).
async fn renew_once(
    client: &Client,
    resource: &str,
    token: &str,
    fence: u64,
    ttl: Duration,
) -> Result<Option<Instant>, RedisError> {
    let sent = Instant::now();
    let ttl_ms = millis(ttl);
    let cmd = redis::cmd("DLOCK.RENEW").arg(resource).arg(token).arg(ttl_ms).clone();
    let renewed = client.send_write::<i64>(&cmd, Duration::ZERO).await;
    let renewed = match (renewed, client.options.replicas) {
        (Ok((1, Some(acked))), Some(replicas)) if acked < u64::from(replicas.count) => {
            Err(RedisError::from((
                redis::ErrorKind::ResponseError,
                "renewal acknowledged by too few replicas",
                format!("{acked} of {}", replicas.count),
            )))
        }
        (Ok((renewed, _)), _) => Ok(renewed == 1),
        (Err(error), _) => Err(error),
    };
    match &renewed {
        Ok(true) => {}
        Ok(false) => observe::renewal_failed(resource, token, fence, true),
        Err(_) => observe::renewal_failed(resource, token, fence, false),
    }
    Ok(renewed?.then_some(sent + Duration::from_millis(ttl_ms)))
}
