//! Leader election on a lease: a candidate campaigns by waiting for an exclusive lease on the
//! election's name, with its address as the lease's `META`; it leads while the lease lives
//! (renewed like any lease, only while its work runs), and the term's fence is its epoch.
//! Observers follow the leader through the resource's channel and `DLOCK.INFO`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use redis::RedisError;

use crate::pubsub::{Event, Messages, Sink};

use crate::{AcquireError, AcquireOptions, CancellationToken, Client, Lease, RunError};

/// How long one round of a campaign waits in the server's queue; then it joins the line again
/// (a wait that long on a connection that went silent would otherwise never end).
const CAMPAIGN_ROUND: Duration = Duration::from_secs(30);

/// How often an observer checks its subscription (subscribing again answers on a live
/// connection) and re-reads `DLOCK.INFO` without a message: a silent connection delivers none.
const RESYNC_EVERY: Duration = Duration::from_secs(5);

/// The first pause after a failed subscription or read, doubled up to [`RETRY_AT_MOST`].
const RETRY_FIRST: Duration = Duration::from_millis(50);

/// The longest pause between attempts to subscribe or read again.
const RETRY_AT_MOST: Duration = Duration::from_secs(2);

/// The leader of an election, as `DLOCK.INFO` shows it.
pub use dlock_proto::reply::Leader;

/// Leadership won by [`Client::campaign`]: an exclusive lease on the election's name whose
/// `META` is the leader's address. The leader leads while [`Leadership::lead`]'s work runs.
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
    address: String,
}

impl Leadership {
    /// The election's name (the lease's resource).
    pub fn name(&self) -> &str {
        self.lease.resource()
    }

    /// The address this leader campaigned with.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// This term's fence: larger than every earlier term's, so followers and storage can refuse
    /// an older leader's requests (send it with every write the leader makes).
    pub fn fence(&self) -> u64 {
        self.lease.fence()
    }

    /// The lease behind the leadership (for [`Lease::fenced`] writes and its local expiry).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Leads while `work` runs: [`Lease::run`] on the leadership's lease, renewed every third of
    /// the ttl. If leadership is lost, `work`'s token is cancelled and `lead` returns
    /// [`RunError::LockLost`]; when `work` ends, the leader resigns (the lease is released).
    pub async fn lead<F, Fut, T>(self, work: F) -> Result<T, RunError<T>>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lease.run(work).await
    }

    /// Resigns without leading (or leading no more): releases the lease, so the next candidate
    /// in line leads at once. `Ok(false)` when the lease had already ended.
    pub async fn resign(self) -> Result<bool, RedisError> {
        self.lease.release().await
    }
}

impl Client {
    /// Campaigns for leadership of the election `name`: waits in the server's queue, first in,
    /// first out, for an exclusive lease of `ttl` on `name` with `address` as its `META`, for as
    /// long as it takes. A leader that stops renewing (it crashed, its work ended without a
    /// release reaching the server) is replaced within `ttl`; one that resigns, at once. Errors
    /// other than a held lease end the campaign ([`AcquireError`]); dropping the future leaves
    /// the line (and releases a grant that may have been on its way).
    pub async fn campaign(
        &self,
        name: &str,
        address: &str,
        ttl: Duration,
    ) -> Result<Leadership, AcquireError> {
        let options = AcquireOptions {
            wait: Some(CAMPAIGN_ROUND),
            meta: Some(address.to_owned()),
            ..AcquireOptions::default()
        };
        loop {
            match self.acquire_with(name, ttl, &options).await {
                Ok(lease) => return Ok(Leadership { lease, address: address.to_owned() }),
                Err(AcquireError::Held) => {} // the round ended with another leader: join again
                Err(error) => return Err(error),
            }
        }
    }

    /// The leader of the election `name` now (`DLOCK.INFO`): `None` when nobody leads.
    pub async fn leader(&self, name: &str) -> Result<Option<Leader>, RedisError> {
        let info: redis::Value = self
            .send(&crate::protocol::cmd(dlock_proto::command::info(name)), Duration::ZERO)
            .await?;
        Ok(leader_in(&info))
    }

    /// The leader changes of the election `name`: the leader now, then every change (another
    /// leader, or none: `None`), in order, as long as the stream is polled. Driven by the
    /// election's channel (`dlock:{name}`): every message, and every (re)subscription, re-reads
    /// `DLOCK.INFO`, so a change that lasts is never missed, even across a lost connection; a
    /// change undone before the read (a leader gone and replaced at once) may be skipped. Every
    /// few seconds the subscription is checked and `DLOCK.INFO` read again, so a connection that
    /// went silent delays a change by seconds, not forever. A server that cannot be reached is
    /// retried without end (logged at debug level).
    pub fn observe(&self, name: &str) -> LeaderChanges {
        let watch = Watch {
            client: self.clone(),
            name: name.to_owned(),
            channel: channel_of(name),
            subscription: None,
            stale: true,
            last: None,
            retry: RETRY_FIRST,
        };
        let changes = futures_util::stream::unfold(watch, |mut watch| async move {
            let change = watch.next_change().await;
            Some((change, watch))
        });
        LeaderChanges { changes: Box::pin(changes) }
    }
}

/// The stream [`Client::observe`] returns: each item is the election's leader after a change
/// (`None`: nobody leads). It never ends.
pub struct LeaderChanges {
    changes: Pin<Box<dyn Stream<Item = Option<Leader>> + Send>>,
}

impl LeaderChanges {
    /// The next change: the leader now, `None` when nobody leads.
    pub async fn changed(&mut self) -> Option<Leader> {
        loop {
            if let Some(change) = self.changes.next().await {
                return change;
            }
        }
    }
}

impl Stream for LeaderChanges {
    type Item = Option<Leader>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.changes.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for LeaderChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderChanges").finish_non_exhaustive()
    }
}

/// An observer's state: its subscription, whether `DLOCK.INFO` must be read again, and the
/// last leader it reported.
struct Watch {
    client: Client,
    name: String,
    channel: String,
    /// The node subscribed on (its address in a cluster), the sink and the messages.
    subscription: Option<(String, Sink, Messages)>,
    /// A message came, or the subscription is new: the leader may have changed.
    stale: bool,
    /// What was reported last (`None` before the first report).
    last: Option<Option<Leader>>,
    retry: Duration,
}

impl Watch {
    /// Waits for the next change and returns the leader after it.
    async fn next_change(&mut self) -> Option<Leader> {
        loop {
            let Some((node, sink, messages)) = self.subscription.as_mut() else {
                // Subscribed before reading, so nothing between the read and the subscription
                // is missed.
                match self.client.subscribe_to(&self.channel).await {
                    Ok(subscription) => {
                        self.subscription = Some(subscription);
                        self.stale = true;
                    }
                    Err(error) => self.pause("cannot subscribe", &error).await,
                }
                continue;
            };
            if self.stale {
                match self.client.leader(&self.name).await {
                    Ok(now) => {
                        self.stale = false;
                        self.retry = RETRY_FIRST;
                        if self.last.as_ref() != Some(&now) {
                            self.last = Some(now.clone());
                            return now;
                        }
                    }
                    Err(error) => self.pause("cannot read the leader", &error).await,
                }
                continue;
            }
            tokio::select! {
                message = messages.next() => match message {
                    Some(Event::Message { .. }) => self.stale = true,
                    // The server dropped the subscription (its slot moved), or the connection
                    // ended: subscribe again, then read again.
                    Some(Event::Dropped(_)) | None => self.subscription = None,
                },
                _ = tokio::time::sleep(RESYNC_EVERY) => {
                    if self.client.node_address(&self.channel).await != *node {
                        // In a cluster, the channel's slot is served by another primary now.
                        self.subscription = None;
                        continue;
                    }
                    let limit = self.client.options.request_timeout;
                    match tokio::time::timeout(limit, sink.subscribe(&self.channel)).await {
                        Ok(Ok(())) => self.stale = true,
                        // Silent or broken: a new subscription (and a read) replaces it.
                        _ => self.subscription = None,
                    }
                }
            }
        }
    }

    /// Waits before trying again after `error`, longer each time up to [`RETRY_AT_MOST`].
    async fn pause(&mut self, what: &str, error: &RedisError) {
        tracing::debug!(election = self.name, %error, "dlock: {what}; trying again");
        tokio::time::sleep(self.retry).await;
        self.retry = (self.retry * 2).min(RETRY_AT_MOST);
    }
}

/// The channel the server publishes `resource`'s ownership changes on: `dlock:{resource}`, or
/// `dlock:key:resource` when the name has braces of its own (`dlock_proto::channel::name_of`;
/// `protocol/vectors/channels.json` has examples).
pub fn channel_of(resource: &str) -> String {
    dlock_proto::channel::name_of(resource)
}

/// The leader a `DLOCK.INFO` reply shows: the holder of a live exclusive lease
/// (`dlock_proto::reply::leader`).
pub(crate) fn leader_in(info: &redis::Value) -> Option<Leader> {
    dlock_proto::reply::leader(&crate::protocol::reply_of(info))
}
