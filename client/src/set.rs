//! Sets of resources: one token over several resources, granted whole or not at all
//! (`DLOCK.ACQUIREALL`), each member with a fence of its own, then held as one lease: renewed
//! with `DLOCK.RENEWALL` and released with `DLOCK.RELEASEALL`, by the very lifecycle of a
//! [`Lease`] (a set inside it), lost whole when any member is.
//!
//! A set that cannot be granted at once waits with a `QUEUE` ticket in the line of every member
//! (first come, first served, singles and sets alike) and holds nothing meanwhile: subscribed to
//! every member's channel before its first call, it calls again on any message there and at
//! least every third of its ticket, and withdraws its tickets (`DLOCK.RELEASEALL` without
//! fences) when the wait ends without a grant.

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, Instant};

use redis::RedisError;

use crate::acquire::{Attempt, is_ambiguous, is_failing_over};
use crate::connection::millis;
use crate::lease::{Grants, first};
use crate::{
    AcquireError, AcquireOptions, CancellationToken, Client, Fencing, Lease, Mode, RunError,
    observe,
};

/// The commands of sets, whose first resource comes after `numkeys`.
pub(crate) const COMMANDS: [&str; 3] = ["DLOCK.ACQUIREALL", "DLOCK.RENEWALL", "DLOCK.RELEASEALL"];

/// The most resources one set may have (the server's bound on `numkeys`).
pub(crate) const MAX_RESOURCES: usize = 64;

/// A set's ticket stands at least this long without a refresh (its wait, when longer) …
const TICKET_AT_LEAST: Duration = Duration::from_secs(1);

/// … and at most this long: a waiter that vanished keeps the members' lines no longer.
const TICKET_AT_MOST: Duration = Duration::from_secs(30);

/// How long a request that failed on the way waits before it is sent again.
const RETRY_AFTER: Duration = Duration::from_millis(50);

/// Leases on every resource of a set, granted whole by [`Client::acquire_all`] to one token,
/// each with a fence of its own. It lives as one lease: [`SetLease::run`] renews all of it
/// (`DLOCK.RENEWALL`) while the work runs, the loss of any member is the loss of the set (a
/// refused renewal, a member's revocation, the local expiry), and the end releases all of it
/// (`DLOCK.RELEASEALL`).
pub struct SetLease {
    lease: Lease,
}

impl std::fmt::Debug for SetLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetLease")
            .field("resources", &self.resources())
            .field("token", &self.token())
            .field("fences", &self.fences())
            .field("ttl", &self.lease.ttl)
            .field("mode", &self.lease.mode)
            .finish()
    }
}

impl SetLease {
    /// The set's resources, in the order they were asked for.
    pub fn resources(&self) -> &[String] {
        self.lease.grants.resources()
    }

    /// The token that owns every member.
    pub fn token(&self) -> &str {
        self.lease.token()
    }

    /// The members' fences, in the order of [`SetLease::resources`]: send a member's with every
    /// write that member's lease protects.
    pub fn fences(&self) -> &[u64] {
        self.lease.grants.fences()
    }

    /// The fence of the member `resource`; `None` if it is not one.
    pub fn fence(&self, resource: &str) -> Option<u64> {
        self.index_of(resource).map(|index| self.fences()[index])
    }

    /// The members' mode: exclusive, shared or a semaphore's permit.
    pub fn mode(&self) -> Mode {
        self.lease.mode()
    }

    /// A conservative end of every member's lease on this machine's clock: never after the
    /// server's deadlines.
    pub fn local_expiry(&self) -> Instant {
        self.lease.local_expiry()
    }

    /// The reason an operator gave when revoking a member (`DLOCK.REVOKE`), once its channel said
    /// so, as [`Lease::revocation`]; [`SetLease::run`] reports it as
    /// [`LossReason::Revoked`](crate::LossReason::Revoked).
    pub fn revocation(&self) -> Option<String> {
        self.lease.revocation()
    }

    /// Renews every member for another ttl, or none (`DLOCK.RENEWALL` with the fences):
    /// `Ok(true)` renewed, `Ok(false)` refused (some member is gone: the set is lost), `Err`
    /// when the server did not answer.
    pub async fn renew(&mut self) -> Result<bool, RedisError> {
        self.lease.renew().await
    }

    /// A handle for fenced writes under the fence of the member `resource` ([`Lease::fencing`]),
    /// to move into the work of [`SetLease::run`]; `None` if `resource` is not a member.
    pub fn fencing(&self, resource: &str) -> Option<Fencing> {
        self.index_of(resource).map(|index| self.lease.fencing_of(index))
    }

    /// Releases every member (`DLOCK.RELEASEALL` with the fences): `Ok(true)` when all of them
    /// were still held and are released, `Ok(false)` when some had ended before (the others are
    /// released; counted and logged as the loss `ended`), `Err` when the outcome is unknown (a
    /// release failure), as [`Lease::release`].
    pub async fn release(self) -> Result<bool, RedisError> {
        self.lease.release().await
    }

    /// Runs `work` while keeping the set, as [`Lease::run`] keeps a lease: `DLOCK.RENEWALL`
    /// every third of the ttl, in this task, only while `work` runs; the set is lost, and
    /// `work` cancelled, when a renewal is refused (some member expired, was deleted, released
    /// or revoked), at the local expiry without an answered renewal
    /// ([`LossReason::Unreachable`](crate::LossReason::Unreachable) or
    /// [`LossReason::Stalled`](crate::LossReason::Stalled)), and at once when a member's
    /// channel says an operator revoked it
    /// ([`LossReason::Revoked`](crate::LossReason::Revoked)); the members still held are then
    /// released in the background. When `work` ends, `DLOCK.RELEASEALL` releases the set; one
    /// that finds a member already gone is [`RunError::NotReleased`] (the loss `ended`). Keyspace
    /// events ([`ClientOptions::watch_events`](crate::ClientOptions::watch_events)) are not
    /// watched for a set.
    pub async fn run<F, Fut, T>(self, work: F) -> Result<T, RunError<T>>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lease.run(work).await
    }

    fn index_of(&self, resource: &str) -> Option<usize> {
        self.resources().iter().position(|member| member == resource)
    }
}

impl Client {
    /// Acquires every resource of `resources` for `ttl` with one token, or none of them
    /// (`DLOCK.ACQUIREALL`): the way to lock several things at once without ever holding part
    /// of the set, and without the deadlock of two callers locking them in different orders.
    /// With `wait`, a set that cannot be granted at once waits in line on every member (first
    /// come, first served) for at most `wait`, holding nothing meanwhile; without it, a set
    /// with a held member is [`AcquireError::Held`] at once. An exclusive lease on each member:
    /// [`Client::acquire_all_with`] for the other modes and metadata.
    ///
    /// 1 to 64 resources, each once (checked before sending: [`AcquireError::Server`] with a
    /// client error); in Redis Cluster they must share one slot (a common hash tag,
    /// `{order:7}:items` and `{order:7}:payment`), or the server answers `CROSSSLOT`.
    ///
    /// ```no_run
    /// # async fn example(client: dlock_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// let accounts = ["{acct}:alice", "{acct}:bob"];
    /// let set = client.acquire_all(&accounts, Duration::from_secs(30), None).await?;
    /// let (alice, bob) = (set.fencing("{acct}:alice"), set.fencing("{acct}:bob"));
    /// set.run(|_cancelled| async move {
    ///     // The transfer: each write fenced by its own member's fence.
    ///     let _ = (alice, bob);
    /// })
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_all(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<SetLease, AcquireError> {
        self.acquire_all_with(resources, ttl, &AcquireOptions { wait, ..AcquireOptions::default() })
            .await
    }

    /// Acquires every resource of `resources` for `ttl`, or none, as `options` ask: the mode of
    /// every member ([`Mode::Shared`], [`Mode::Permit`]), its metadata, and the wait. A set
    /// always waits with `QUEUE` tickets (its [`AcquireOptions::strategy`] is not read): the
    /// ticket stands for the wait (at least 1 s, at most 30 s) and is refreshed on any message
    /// of a member's channel and every third of its length; when the wait ends without a
    /// grant, the tickets are withdrawn. The token is made before the first send and an
    /// ambiguous call (a timeout, a dropped connection) is sent again with it until
    /// [`ClientOptions::acquire_deadline`](crate::ClientOptions::acquire_deadline) after the
    /// wait: a retry of a granted set answers the same fences. If the outcome stays unknown, or
    /// this future is dropped before it answers, the token's members are released from a
    /// connection of its own ([`AcquireError::Unknown`]).
    pub async fn acquire_all_with(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
        options: &AcquireOptions,
    ) -> Result<SetLease, AcquireError> {
        observe::acquire_attempt();
        let started = Instant::now();
        let resources: Vec<String> =
            resources.iter().map(|resource| resource.as_ref().to_owned()).collect();
        let acquired = match check(&resources) {
            Ok(()) => self.try_acquire_all(resources, ttl, options, started).await,
            Err(error) => Err(error),
        };
        match &acquired {
            Ok(set) => observe::acquired(&set.lease, started.elapsed()),
            Err(error) => observe::acquire_failed(error.kind()),
        }
        acquired
    }

    async fn try_acquire_all(
        &self,
        resources: Vec<String>,
        ttl: Duration,
        options: &AcquireOptions,
        started: Instant,
    ) -> Result<SetLease, AcquireError> {
        let token = uuid::Uuid::new_v4().to_string();
        // Without fences: withdraws the set's tickets, and releases a grant whose reply was lost.
        let withdraw = release_all(&resources, &token, None);
        // Dropped before the attempt has an answer, it withdraws in the background.
        let mut attempt = Attempt { client: self, release: &withdraw, armed: true };
        let answer = self.set_attempts(resources, ttl, options, started, &token, &withdraw).await;
        attempt.armed = false;
        answer
    }

    async fn set_attempts(
        &self,
        resources: Vec<String>,
        ttl: Duration,
        options: &AcquireOptions,
        started: Instant,
        token: &str,
        withdraw: &redis::Cmd,
    ) -> Result<SetLease, AcquireError> {
        let wait_ends = options.wait.map(|wait| started + wait);
        let deadline = started + options.wait.unwrap_or_default() + self.options.acquire_deadline;
        let ticket = options.wait.map(|wait| wait.clamp(TICKET_AT_LEAST, TICKET_AT_MOST));
        let refresh = ticket.map(|ticket| (ticket / 3).max(Duration::from_millis(1)));
        // Subscribed to every member's channel before the first call: no change after it is
        // missed. Any message there may be the one that frees the set (no `handoff` names a
        // set's ticket), so every message wakes it.
        let mut waiters = Vec::new();
        if ticket.is_some() {
            for resource in &resources {
                waiters.push(self.channels.join_every(self, resource).await);
            }
        }
        let acquire = acquire_all(
            &resources,
            token,
            millis(ttl),
            options.mode,
            ticket.map(millis),
            options.meta.as_deref(),
        );
        let mut reached_server = false;
        loop {
            for waiter in &mut waiters {
                waiter.seen();
            }
            let mut sent = Instant::now();
            let reply = match self.send::<Option<Vec<u64>>>(&acquire, Duration::ZERO).await {
                // Granted. With replicas to wait for, the same call once more (it answers the
                // same fences and renews) on a connection that can WAIT after it.
                Ok(Some(_)) if self.options.replicas.is_some() => {
                    sent = Instant::now();
                    self.send_write::<Option<Vec<u64>>>(&acquire, Duration::ZERO).await
                }
                reply => reply.map(|fences| (fences, None)),
            };
            match reply {
                Ok((Some(fences), acked)) if fences.len() == resources.len() => {
                    return self
                        .granted_all(resources, token, ttl, options.mode, fences, acked, sent)
                        .await;
                }
                Ok((Some(fences), _)) => {
                    let released = self.withdraw(withdraw).await;
                    let source = RedisError::from((
                        redis::ErrorKind::ParseError,
                        "DLOCK.ACQUIREALL answered another number of fences",
                        format!("{} for {} resources", fences.len(), resources.len()),
                    ));
                    return Err(AcquireError::Unknown {
                        token: token.to_owned(),
                        source,
                        released,
                    });
                }
                // Not granted: in line on every member with a ticket, or held.
                Ok((None, _)) => reached_server = true,
                Err(failure) if is_failing_over(failure.error()) && Instant::now() < deadline => {
                    tokio::time::sleep(RETRY_AFTER).await;
                    continue;
                }
                Err(failure) if is_ambiguous(failure.error()) => {
                    reached_server |= failure.was_sent();
                    let source = RedisError::from(failure);
                    if Instant::now() >= deadline {
                        return Err(if reached_server {
                            let released = self.withdraw(withdraw).await;
                            AcquireError::Unknown { token: token.to_owned(), source, released }
                        } else {
                            AcquireError::Unreachable(source)
                        });
                    }
                    // Again with the same token: a granted set answers the same fences.
                    tokio::time::sleep(RETRY_AFTER).await;
                    continue;
                }
                Err(failure) if reached_server => {
                    let released = self.withdraw(withdraw).await;
                    let source = failure.into();
                    return Err(AcquireError::Unknown {
                        token: token.to_owned(),
                        source,
                        released,
                    });
                }
                Err(failure) => return Err(AcquireError::Server(failure.into())),
            }
            let (Some(wait_ends), Some(refresh)) = (wait_ends, refresh) else {
                return Err(AcquireError::Held);
            };
            let now = Instant::now();
            if now >= wait_ends {
                // Out of every line (and a grant whose reply was lost, released).
                self.withdraw(withdraw).await;
                return Err(AcquireError::Held);
            }
            let nap = refresh.min(wait_ends - now);
            tokio::select! {
                () = first(waiters.iter_mut().map(|waiter| Box::pin(waiter.woken()))) => {}
                () = tokio::time::sleep(nap) => {}
            }
            // Still subscribed (again, after a lost connection; on another node, after the
            // slot moved).
            let mut kept = Vec::with_capacity(waiters.len());
            for (resource, waiter) in resources.iter().zip(waiters) {
                kept.push(self.channels.keep(self, resource, waiter).await);
            }
            waiters = kept;
        }
    }

    /// The set of a grant, listening for its members' revocations; or, if too few replicas
    /// acknowledged it, its release and [`AcquireError::NotReplicated`].
    #[allow(clippy::too_many_arguments)]
    async fn granted_all(
        &self,
        resources: Vec<String>,
        token: &str,
        ttl: Duration,
        mode: Mode,
        fences: Vec<u64>,
        acked: Option<u64>,
        sent: Instant,
    ) -> Result<SetLease, AcquireError> {
        let lease = Lease {
            client: self.clone(),
            grants: Grants::set(resources, fences),
            token: token.to_owned(),
            ttl,
            mode,
            local_expiry: sent + Duration::from_millis(millis(ttl)),
            granted: Instant::now(),
            revocations: Vec::new(),
            claim: None,
        };
        if let (Some(replicas), Some(acked)) = (self.options.replicas, acked)
            && acked < u64::from(replicas.count)
        {
            // Never reported as granted: released without a hold to record.
            let release = lease.grants.release(token);
            let released =
                matches!(self.send::<i64>(&release, Duration::ZERO).await, Ok(n) if n > 0);
            let token = token.to_owned();
            return Err(AcquireError::NotReplicated {
                token,
                acked,
                wanted: replicas.count,
                released,
            });
        }
        // Listens for every member's revocation from now on, on the node that granted the set
        // (its members share one slot), without waiting for the subscriptions.
        let address = self.node_address(&lease.grants.resources()[0]).await;
        let revocations = (lease.grants.resources().iter().zip(lease.grants.fences()))
            .map(|(resource, &fence)| self.channels.hold(self, address.clone(), resource, fence))
            .collect();
        Ok(SetLease { lease: Lease { revocations, ..lease } })
    }
}

/// A set the server would refuse, refused before sending: 1 to 64 resources, each once.
fn check(resources: &[String]) -> Result<(), AcquireError> {
    let refused = |detail: String| {
        Err(AcquireError::Server(RedisError::from((
            redis::ErrorKind::ClientError,
            "not a set of resources",
            detail,
        ))))
    };
    if resources.is_empty() || resources.len() > MAX_RESOURCES {
        return refused(format!(
            "a set has 1 to {MAX_RESOURCES} resources, not {}",
            resources.len()
        ));
    }
    let mut seen = HashSet::with_capacity(resources.len());
    if let Some(twice) = resources.iter().find(|resource| !seen.insert(resource.as_str())) {
        return refused(format!("resource '{twice}' appears twice in the set"));
    }
    Ok(())
}

/// `name numkeys resource … token`, the start of every command of sets.
fn set_command(name: &str, resources: &[String], token: &str) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    cmd.arg(resources.len());
    for resource in resources {
        cmd.arg(resource.as_str());
    }
    cmd.arg(token);
    cmd
}

/// `DLOCK.ACQUIREALL numkeys resource … token ttl-ms [SHARED [LIMIT n]] [QUEUE ticket-ms]
/// [META value]`.
fn acquire_all(
    resources: &[String],
    token: &str,
    ttl_ms: u64,
    mode: Mode,
    ticket_ms: Option<u64>,
    meta: Option<&str>,
) -> redis::Cmd {
    let mut cmd = set_command(COMMANDS[0], resources, token);
    cmd.arg(ttl_ms);
    match mode {
        Mode::Exclusive => {}
        Mode::Shared => {
            cmd.arg("SHARED");
        }
        Mode::Permit(n) => {
            cmd.arg("SHARED").arg("LIMIT").arg(n);
        }
    }
    if let Some(ticket_ms) = ticket_ms {
        cmd.arg("QUEUE").arg(ticket_ms);
    }
    if let Some(meta) = meta {
        cmd.arg("META").arg(meta);
    }
    cmd
}

/// `DLOCK.RENEWALL numkeys resource … token ttl-ms FENCES fence …`.
pub(crate) fn renew_all(
    resources: &[String],
    token: &str,
    ttl_ms: u64,
    fences: &[u64],
) -> redis::Cmd {
    let mut cmd = set_command(COMMANDS[1], resources, token);
    cmd.arg(ttl_ms).arg("FENCES");
    for fence in fences {
        cmd.arg(*fence);
    }
    cmd
}

/// `DLOCK.RELEASEALL numkeys resource … token [FENCES fence …]`: with the grant's fences, or
/// without (an attempt's: its tickets, and a grant whose reply was lost).
pub(crate) fn release_all(resources: &[String], token: &str, fences: Option<&[u64]>) -> redis::Cmd {
    let mut cmd = set_command(COMMANDS[2], resources, token);
    if let Some(fences) = fences {
        cmd.arg("FENCES");
        for fence in fences {
            cmd.arg(*fence);
        }
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                redis::Arg::Cursor => "<cursor>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn the_commands_of_sets_name_every_member_in_order_then_the_token() {
        let set = vec!["{o}:b".to_owned(), "{o}:a".to_owned()];
        let acquire = acquire_all(&set, "t", 3000, Mode::Permit(2), Some(1000), Some("host"));
        assert_eq!(
            args(&acquire),
            [
                "DLOCK.ACQUIREALL",
                "2",
                "{o}:b",
                "{o}:a",
                "t",
                "3000",
                "SHARED",
                "LIMIT",
                "2",
                "QUEUE",
                "1000",
                "META",
                "host"
            ]
        );
        let renew = renew_all(&set, "t", 3000, &[7, 8]);
        assert_eq!(
            args(&renew),
            ["DLOCK.RENEWALL", "2", "{o}:b", "{o}:a", "t", "3000", "FENCES", "7", "8"]
        );
        let release = release_all(&set, "t", Some(&[7, 8]));
        assert_eq!(
            args(&release),
            ["DLOCK.RELEASEALL", "2", "{o}:b", "{o}:a", "t", "FENCES", "7", "8"]
        );
        assert_eq!(
            args(&release_all(&set, "t", None)),
            ["DLOCK.RELEASEALL", "2", "{o}:b", "{o}:a", "t"]
        );
    }

    #[test]
    fn a_set_the_server_would_refuse_is_refused_before_sending() {
        let set = |names: &[&str]| names.iter().map(|name| (*name).to_owned()).collect::<Vec<_>>();
        assert!(check(&set(&["a"])).is_ok());
        assert!(check(&set(&[])).is_err());
        assert!(check(&set(&["a", "b", "a"])).is_err());
        let most: Vec<String> = (0..MAX_RESOURCES).map(|i| format!("r{i}")).collect();
        assert!(check(&most).is_ok());
        let more: Vec<String> = (0..=MAX_RESOURCES).map(|i| format!("r{i}")).collect();
        assert!(check(&more).is_err());
    }
}
