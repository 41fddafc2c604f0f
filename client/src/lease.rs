//! The held lease: renewal tied to the work it protects, release, fenced writes, and noticing
//! that the lease was lost. A set of resources ([`crate::SetLease`]) is a lease with a set
//! inside (`Grants`): the same lifecycle, renewed and released whole.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use dlock_proto::command;
use dlock_proto::error::ErrorClass;
use redis::RedisError;

use crate::connection::millis;
use crate::tickets::Holder;
use crate::{
    CancellationToken, Client, FencedError, LossReason, Mode, RunError, observe, protocol,
};

impl Client {
    /// Whether `fence` is still the live lease's fence on `resource` (`DLOCK.FENCECHECK`).
    pub async fn fence_is_live(&self, resource: &str, fence: u64) -> Result<bool, RedisError> {
        let live: i64 =
            self.send(&protocol::cmd(command::fencecheck(resource, fence)), Duration::ZERO).await?;
        Ok(live == 1)
    }
}

/// What a hold keeps alive: one grant (`DLOCK.RENEW`, `DLOCK.RELEASE`), or the members of a
/// set, each with its own fence (`DLOCK.RENEWALL`, `DLOCK.RELEASEALL`: all or none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Grants {
    /// The resource, or the set's members in the caller's order.
    resources: Vec<String>,
    /// Their fences, in the same order.
    fences: Vec<u64>,
    /// A set: renewed and released with the commands of sets, even with one member.
    set: bool,
}

impl Grants {
    pub(crate) fn one(resource: &str, fence: u64) -> Self {
        Self { resources: vec![resource.to_owned()], fences: vec![fence], set: false }
    }

    pub(crate) fn set(resources: Vec<String>, fences: Vec<u64>) -> Self {
        Self { resources, fences, set: true }
    }

    pub(crate) fn resources(&self) -> &[String] {
        &self.resources
    }

    pub(crate) fn fences(&self) -> &[u64] {
        &self.fences
    }

    pub(crate) fn is_set(&self) -> bool {
        self.set
    }

    /// The `resource` field of log lines: the resource, or a set's members joined by `,`.
    pub(crate) fn label(&self) -> String {
        self.resources.join(",")
    }

    /// The renewal of every grant for `ttl_ms`, with their fences: a late or retried one never
    /// extends a later grant of the same token.
    fn renew(&self, token: &str, ttl_ms: u64) -> redis::Cmd {
        if self.set {
            crate::set::renew_all(&self.resources, token, ttl_ms, &self.fences)
        } else {
            protocol::cmd(command::renew(&self.resources[0], token, ttl_ms, Some(self.fences[0])))
        }
    }

    /// The release of every grant, with their fences: a retried or late one never frees a later
    /// grant of the same token.
    pub(crate) fn release(&self, token: &str) -> redis::Cmd {
        if self.set {
            crate::set::release_all(&self.resources, token, Some(&self.fences))
        } else {
            protocol::cmd(command::release(&self.resources[0], token, Some(self.fences[0])))
        }
    }

    /// Whether a release's answer (how many grants it released) says every grant was still
    /// held: fewer means one ended before (the loss `ended`).
    fn all_released(&self, released: i64) -> bool {
        usize::try_from(released).is_ok_and(|n| n == self.fences.len())
    }
}

/// A granted lease: `token` owns `resource` with `fence` until the server's deadline.
pub struct Lease {
    pub(crate) client: Client,
    /// The resource and its fence (a set's members and theirs, inside a [`crate::SetLease`]).
    pub(crate) grants: Grants,
    pub(crate) token: String,
    pub(crate) ttl: Duration,
    pub(crate) mode: Mode,
    pub(crate) local_expiry: Instant,
    pub(crate) granted: Instant,
    /// Per grant, its place among the holders listening on its resource's channel, told of an
    /// operator's `DLOCK.REVOKE`; leaves the channel with the lease.
    pub(crate) revocations: Vec<Holder>,
    /// A lease started on its ticket's `granted` message: its claim (a RENEW with the fence,
    /// sent at the grant), whose answer the first renewal reads instead of sending its own.
    pub(crate) claim: Option<Claim>,
}

/// The claim of a lease started on its ticket's message: the answer of its first renewal.
pub(crate) type Claim = tokio::task::JoinHandle<Result<Option<Instant>, RedisError>>;

/// The answer of `claim`, as a renewal's (a task that did not finish is a failed renewal).
async fn claimed(claim: &mut Claim) -> Result<Option<Instant>, RedisError> {
    claim.await.unwrap_or_else(|stopped| {
        Err(RedisError::from((redis::ErrorKind::IoError, "claim not sent", stopped.to_string())))
    })
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.resource())
            .field("token", &self.token)
            .field("fence", &self.fence())
            .field("ttl", &self.ttl)
            .field("mode", &self.mode)
            .finish()
    }
}

impl Lease {
    /// The locked resource.
    pub fn resource(&self) -> &str {
        &self.grants.resources[0]
    }

    /// This lease's owner token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The fencing token: send it with every write the lease protects.
    pub fn fence(&self) -> u64 {
        self.grants.fences[0]
    }

    /// The lease's mode: exclusive (a mutex or a writer), shared (a reader) or a semaphore's
    /// permit.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// A conservative end of the lease on this machine's clock: never after the server's deadline.
    /// A lease a ticket took from its own channel's message (the default with
    /// [`WaitStrategy::Tickets`](crate::WaitStrategy::Tickets)) starts with the claim window
    /// until its claim's answer is read ([`Lease::run`] reads it first, [`Lease::renew`] too).
    pub fn local_expiry(&self) -> Instant {
        self.local_expiry
    }

    /// The reason an operator gave when revoking this lease (`DLOCK.REVOKE`; empty if none), once
    /// the resource's channel said so: from the grant on, the client listens there for it. A
    /// revocation that came before that subscription was confirmed, or while the channel could
    /// not be heard, shows only as a refused renewal. [`Lease::run`] reports it as
    /// [`LossReason::Revoked`].
    pub fn revocation(&self) -> Option<String> {
        self.revocations.iter().find_map(Holder::heard)
    }

    /// Renews the lease for another ttl: `Ok(true)` renewed, `Ok(false)` refused (the lease is
    /// lost), `Err` when the server did not answer (or too few replicas acknowledged).
    /// A lease started on its ticket's message answers with its claim first (sent at the grant).
    pub async fn renew(&mut self) -> Result<bool, RedisError> {
        let renewed = match self.claim.take() {
            Some(mut claim) => claimed(&mut claim).await?,
            None => renew_once(&self.client, &self.grants, &self.token, self.ttl).await?,
        };
        if let Some(expiry) = renewed {
            self.local_expiry = expiry;
        }
        Ok(renewed.is_some())
    }

    /// Runs `command` in the server only if this lease's fence is still the live one
    /// (`DLOCK.FENCED`), atomically: a stale lease's write never happens. In Redis Cluster every
    /// key of `command` must hash to the resource's slot (use hash tags), or the server refuses
    /// it: [`FencedError::CrossSlot`]. A write the server cannot have carried out (no connection
    /// to the resource's primary could be opened, or `TRYAGAIN` while its slot migrates with the
    /// keys apart, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, `READONLY` during a failover) is sent
    /// again, to the primary serving the resource then, until the lease's local expiry. The same
    /// as [`Fencing::fenced`] on [`Lease::fencing`].
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
        self.fencing().fenced(command).await
    }

    /// A handle for fenced writes under this lease's fence, to move into the work of
    /// [`Lease::run`] (which takes the lease itself): its writes stay fenced by this grant's
    /// fence, so once the lease is lost they are refused as [`FencedError::Stale`].
    ///
    /// ```no_run
    /// # async fn example(lease: dlock_client::Lease) {
    /// let fencing = lease.fencing();
    /// let written = lease
    ///     .run(|_cancelled| async move {
    ///         let mut write = redis::cmd("SET");
    ///         write.arg("invoice:123:status").arg("paid");
    ///         fencing.fenced::<()>(&write).await
    ///     })
    ///     .await;
    /// # let _ = written;
    /// # }
    /// ```
    pub fn fencing(&self) -> Fencing {
        self.fencing_of(0)
    }

    /// The handle for fenced writes under the fence of the grant at `index`.
    pub(crate) fn fencing_of(&self, index: usize) -> Fencing {
        Fencing {
            client: self.client.clone(),
            resource: self.grants.resources[index].clone(),
            fence: self.grants.fences[index],
            local_expiry: self.local_expiry,
        }
    }

    /// Releases the lease: `Ok(true)` released, `Ok(false)` it was no longer held (counted and
    /// logged as the loss `ended`, not as a release failure; only an `Err` is one). A RELEASE
    /// the server cannot have carried out (no connection could be opened to the resource's
    /// primary, or the cluster answered that it is failing over or migrating the slot:
    /// `CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`, `LOADING`, `READONLY`) is sent again, to the
    /// primary serving the resource then, until the lease's local expiry: after a failover the
    /// promoted replica holds the lease and releases it there.
    pub async fn release(self) -> Result<bool, RedisError> {
        let cmd = self.grants.release(&self.token);
        let released = match self.client.send_until::<i64>(&cmd, self.local_expiry).await {
            Ok(released) => Ok(self.grants.all_released(released)),
            Err(failure) => Err(RedisError::from(failure)),
        };
        let outcome = released.as_ref().ok().copied();
        observe::released(&self.grants, &self.token, self.granted.elapsed(), outcome);
        released
    }

    /// Runs `work` while keeping the lease: renewals every third of the ttl, in this task, only
    /// while `work` runs. If the lease is lost, `work`'s token is cancelled, `work` gets
    /// `cancel_grace` to stop and is then dropped, and `run` returns [`RunError::LockLost`].
    /// When `work` ends, the lease is released; a failed release is [`RunError::NotReleased`].
    ///
    /// A lease is lost when a renewal is refused, at its local expiry without an answered
    /// renewal ([`LossReason::Unreachable`] when the last renewal sent got no answer,
    /// [`LossReason::Stalled`] when none was waiting for one: this task did not run in time to
    /// send it), when the server announces its end ([`ClientOptions::watch_events`]), and at
    /// once when the resource's channel says an operator revoked it ([`LossReason::Revoked`], no
    /// RELEASE follows: the lease is gone). The best-effort RELEASE after a loss is not a
    /// release failure, whatever it answers.
    ///
    /// [`ClientOptions::watch_events`]: crate::ClientOptions::watch_events
    pub async fn run<F, Fut, T>(mut self, work: F) -> Result<T, RunError<T>>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let cancelled = CancellationToken::new();
        // Keyspace events are watched for a single lease; a set's renewals alone watch it.
        let mut events = if self.client.options.watch_events && !self.grants.is_set() {
            self.client.subscribe(self.resource()).await
        } else {
            None
        };
        let work = work(cancelled.clone());
        tokio::pin!(work);
        // When the next renewal is due: an absolute instant, so that a loop pass for another
        // branch (a keyspace event, such as our own `dlock.renewed`) never postpones it.
        let mut next_renewal = Instant::now() + self.ttl / 3;
        // A lease started on its ticket's message: the claim sent at the grant is the first
        // renewal, read as soon as it answers.
        let mut claim = self.claim.take();
        // Whether the last renewal sent got no answer (still outstanding, or failed): at the
        // local expiry that is `Unreachable`; with none waiting for an answer, the process
        // itself did not run in time (`Stalled`).
        let awaiting_answer = AtomicBool::new(false);
        let mut last_failed = false;
        let lost = loop {
            // The renewal is polled beside the work, so the work never waits for a round trip.
            let (client, grants, token, ttl, local_expiry) =
                (&self.client, &self.grants, &self.token, self.ttl, self.local_expiry);
            let awaiting = &awaiting_answer;
            let pending_claim = claim.as_mut();
            let renewal = async move {
                let renewed = if let Some(claim) = pending_claim {
                    awaiting.store(true, Ordering::Relaxed);
                    claimed(claim).await
                } else {
                    tokio::time::sleep_until(next_renewal.into()).await;
                    // Due after the local expiry (the process did not run in time): not sent,
                    // the expiry decides.
                    if Instant::now() >= local_expiry {
                        std::future::pending::<()>().await;
                    }
                    awaiting.store(true, Ordering::Relaxed);
                    renew_once(client, grants, token, ttl).await
                };
                awaiting.store(false, Ordering::Relaxed);
                // Where the lease lives now (a slot may have moved): its channel is there (a
                // set's members share one slot).
                let address = match renewed {
                    Ok(Some(_)) => client.node_address(&grants.resources[0]).await,
                    _ => String::new(),
                };
                (renewed, address)
            };
            // Any grant's revocation: one member revoked is the whole set lost.
            let revocations = &mut self.revocations;
            let revoked = first(revocations.iter_mut().map(|holder| Box::pin(holder.revoked())));
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
                (renewed, address) = renewal => {
                    claim = None;
                    match renewed {
                    Ok(Some(expiry)) => {
                        last_failed = false;
                        self.local_expiry = expiry;
                        next_renewal = Instant::now() + ttl / 3;
                        // Still listening: subscribed again if the subscriber went down, on
                        // the node serving the resource now.
                        for holder in &mut self.revocations {
                            holder.keep(&self.client.channels, &self.client, address.clone());
                        }
                    }
                    Ok(None) => break LossReason::RenewalRefused,
                    Err(error) if Instant::now() >= self.local_expiry => {
                        break LossReason::Unreachable(error.to_string());
                    }
                    // Retry sooner, until the local expiry.
                    Err(_) => {
                        last_failed = true;
                        next_renewal = Instant::now() + ttl / 10;
                    }
                    }
                }
                // The lease may already be over on the server: stop at the local expiry.
                _ = expiry => {
                    break if last_failed || awaiting_answer.load(Ordering::Relaxed) {
                        LossReason::Unreachable("no renewal was answered in time".into())
                    } else {
                        LossReason::Stalled
                    };
                }
                // An operator's DLOCK.REVOKE: the channel named this lease's fence (or one of
                // a set's).
                reason = revoked => break LossReason::Revoked(reason),
                message = event => match message {
                    // The subscription's connection ended: renewals alone watch the lease now.
                    None | Some(crate::pubsub::Event::Dropped(_)) => events = None,
                    Some(crate::pubsub::Event::Message { payload: name, .. }) => {
                        if let Some(reason) = self.ended_by(&name).await {
                            break reason;
                        }
                    }
                },
            }
        };
        // A renewal refused as the channel told of the revocation: the revocation says why.
        let lost = match (lost, self.revocation()) {
            (LossReason::RenewalRefused, Some(reason)) => LossReason::Revoked(reason),
            (lost, _) => lost,
        };
        cancelled.cancel();
        let _ = tokio::time::timeout(self.client.options.cancel_grace, &mut work).await;
        observe::lost(&self.grants, &self.token, self.granted.elapsed(), &lost);
        if matches!(lost, LossReason::Revoked(_)) && !self.grants.is_set() {
            // The server ended the lease itself: there is nothing to release. (A set's other
            // members are still held: they are released below.)
            return Err(RunError::LockLost(lost));
        }
        // Best effort: a RENEW still in flight must not keep the lease for work that stopped.
        // In the background: a server that stopped answering would hold up the caller's news of
        // the loss for a whole request timeout.
        let (client, release) = (self.client.clone(), self.grants.release(&self.token));
        tokio::spawn(async move {
            let _ = client.send::<i64>(&release, Duration::ZERO).await;
        });
        Err(RunError::LockLost(lost))
    }

    /// Whether the keyspace event `name` on this lease's resource means the lease ended:
    /// `dlock.expired` says so for an exclusive lease; renewals say nothing; anything else (a
    /// DEL, a hand-over, a rename, and for a shared lease another holder's expiry or grant) is
    /// confirmed with FENCECHECK.
    async fn ended_by(&self, name: &str) -> Option<LossReason> {
        match name {
            "dlock.expired" if !self.mode.is_shared() => Some(LossReason::Ended(name.to_owned())),
            "dlock.renewed" => None,
            _ => match self.client.fence_is_live(self.resource(), self.fence()).await {
                Ok(false) => Some(LossReason::Ended(name.to_owned())),
                // Live, or unknown: renewals decide.
                Ok(true) | Err(_) => None,
            },
        }
    }
}

/// Fenced writes under one grant's fence ([`Lease::fencing`]): cheap to clone, usable while
/// [`Lease::run`] holds the lease.
#[derive(Clone)]
pub struct Fencing {
    client: Client,
    resource: String,
    fence: u64,
    /// The lease's local expiry when the handle was made: a write the server cannot have
    /// carried out is sent again until then.
    local_expiry: Instant,
}

impl std::fmt::Debug for Fencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencing")
            .field("resource", &self.resource)
            .field("fence", &self.fence)
            .finish()
    }
}

impl Fencing {
    /// The fence every write of this handle carries.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Runs `command` in the server only if this fence is still the live one (`DLOCK.FENCED`),
    /// atomically: [`FencedError::Stale`] when it is not, and nothing ran. In Redis Cluster
    /// every key of `command` must hash to the resource's slot: [`FencedError::CrossSlot`]. A
    /// write the server cannot have carried out is sent again until the lease's local expiry
    /// (as of when the handle was made).
    pub async fn fenced<T: redis::FromRedisValue>(
        &self,
        command: &redis::Cmd,
    ) -> Result<T, FencedError> {
        let inner = command.args_iter().filter_map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes),
            redis::Arg::Cursor => None,
        });
        let fenced = protocol::cmd(command::fenced(&self.resource, self.fence, inner));
        let sent = self.client.send_until(&fenced, self.local_expiry).await;
        sent.map_err(|failure| {
            let error = RedisError::from(failure);
            match protocol::class_of(&error) {
                Some(ErrorClass::Stale) => {
                    observe::stale_write_refused();
                    FencedError::Stale(error.detail().unwrap_or_default().to_owned())
                }
                Some(ErrorClass::CrossSlot) => {
                    FencedError::CrossSlot(error.detail().unwrap_or_default().to_owned())
                }
                _ => FencedError::Redis(error),
            }
        })
    }
}

/// The output of whichever of `futures` ends first; never, without any.
pub(crate) async fn first<F: Future + Unpin>(futures: impl IntoIterator<Item = F>) -> F::Output {
    let mut futures: Vec<F> = futures.into_iter().collect();
    std::future::poll_fn(|cx| {
        for future in &mut futures {
            if let Poll::Ready(output) = Pin::new(future).poll(cx) {
                return Poll::Ready(output);
            }
        }
        Poll::Pending
    })
    .await
}

/// One RENEW or RENEWALL (and WAIT, if asked): the new conservative local expiry when renewed,
/// `None` when refused; a renewal too few replicas acknowledged is an error (it could be lost in
/// a failover).
pub(crate) async fn renew_once(
    client: &Client,
    grants: &Grants,
    token: &str,
    ttl: Duration,
) -> Result<Option<Instant>, RedisError> {
    let sent = Instant::now();
    let ttl_ms = millis(ttl);
    // With the grants' fences: a late or retried RENEW never touches a later grant.
    let cmd = grants.renew(token, ttl_ms);
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
        (Err(failure), _) => Err(failure.into()),
    };
    match &renewed {
        Ok(true) => {}
        Ok(false) => observe::renewal_failed(grants, token, true),
        Err(_) => observe::renewal_failed(grants, token, false),
    }
    Ok(renewed?.then_some(sent + Duration::from_millis(ttl_ms)))
}
