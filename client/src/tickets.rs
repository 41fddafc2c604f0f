//! Waiting with `QUEUE` tickets: the waiters of one client share its multiplexed connection for
//! their ACQUIREs and one subscriber connection (opened when the first waiter comes) for the
//! resources' channels. A `handoff <fence> <tag>` message wakes only the waiters whose token has
//! that tag (the lease is theirs: their next ACQUIRE claims it); one without a tag (an older
//! server) wakes every waiter of the resource, and the other messages (`acquired`, `released`,
//! `expired`) wake none: a release with a line always hands over, and says so. In Redis Cluster there
//! is one such subscriber per primary (`SSUBSCRIBE` on the node serving the channels' slots),
//! and a waiter whose resource's slot moved to another primary joins that primary's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_proto::channel::{self, Woken};
use redis::RedisError;
use tokio::sync::watch;

use crate::election::channel_of;
use crate::pubsub::{Event, Messages, Sink};

/// How long after a failed subscription the next waiter tries again (a server that cannot be
/// reached must not be asked once per waiter).
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// How long an UNSUBSCRIBE may take before the subscriber connection counts as silent.
const UNSUBSCRIBE_WITHIN: Duration = Duration::from_secs(2);

/// The subscribers of one [`Client`](crate::Client) (shared by its clones), one per server:
/// keyed by the node's address in a cluster, a single one (`""`) otherwise.
#[derive(Default)]
pub(crate) struct Hubs {
    hubs: Mutex<HashMap<String, Arc<Hub>>>,
}

impl Hubs {
    /// Joins the waiters of `resource`'s channel on the subscriber of the node serving it, as
    /// the waiter of `token` (woken by the hand-overs to it).
    pub(crate) async fn join(&self, client: &crate::Client, resource: &str, token: &str) -> Waiter {
        self.join_tagged(client, resource, tag(token)).await
    }

    async fn join_tagged(&self, client: &crate::Client, resource: &str, tag: String) -> Waiter {
        let address = client.node_address(resource).await;
        let hub = lock(&self.hubs)
            .entry(address.clone())
            .or_insert_with(|| Arc::new(Hub { node: address, ..Hub::default() }))
            .clone();
        hub.join(client, &channel_of(resource), tag).await
    }

    /// Keeps `waiter` subscribed: on the subscriber of the node that serves `resource` now
    /// (joining it if the slot moved), reconnected if its connection ended.
    pub(crate) async fn keep(
        &self,
        client: &crate::Client,
        resource: &str,
        waiter: Waiter,
    ) -> Waiter {
        let address = client.node_address(resource).await;
        if !address.is_empty() && address != waiter.hub.node {
            tracing::debug!(resource, node = address, "dlock: the ticket's slot moved");
            let tag = waiter.tag.clone();
            return self.join_tagged(client, resource, tag).await;
        }
        waiter.hub.ensure(client).await;
        waiter
    }
}

/// The subscriber of one server: which channels have waiters, and the connection subscribed to
/// them.
#[derive(Default)]
pub(crate) struct Hub {
    /// The node's address (empty outside a cluster).
    node: String,
    /// Per channel: its waiters and the counters of messages that wake them. Read by the
    /// connection's reader task, so a plain mutex, never held across an await.
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The subscriber connection; held while (un)subscribing, so that the connection's set of
    /// channels follows `channels`.
    link: tokio::sync::Mutex<Link>,
}

struct Channel {
    waiters: usize,
    /// Wakes every waiter of the channel (a new connection, a lost one, an untagged `handoff`).
    messages: watch::Sender<u64>,
    /// Per tag of the waiters' tokens: how many wait with it, and what wakes them (a `handoff`
    /// naming it).
    tags: HashMap<String, (usize, watch::Sender<u64>)>,
}

impl Channel {
    /// Wakes the waiters that `payload` concerns.
    fn deliver(&self, payload: &str) {
        match channel::woken(payload) {
            Woken::Nobody => {}
            Woken::Tag(tag) => {
                if let Some((_, wake)) = self.tags.get(tag) {
                    bump(wake);
                }
            }
            // A `handoff` without a tag (an older server), or a message not understood.
            Woken::Everyone => bump(&self.messages),
        }
    }
}

fn bump(wake: &watch::Sender<u64>) {
    wake.send_modify(|count| *count = count.wrapping_add(1));
}

/// The tag a `handoff` message names a token by (`dlock_proto::channel::tag_hex`).
pub(crate) fn tag(token: &str) -> String {
    channel::tag_hex(token.as_bytes())
}

#[derive(Default)]
struct Link {
    sink: Option<Sink>,
    /// Bumped with every new connection: a reader task of an older one that ends leaves the
    /// current one alone.
    generation: u64,
    /// The latest generation whose connection ended, set by its reader task.
    ended: Arc<AtomicU64>,
    /// The reader task of the current connection: aborted with it, so that a replaced
    /// connection does not live on.
    reader: Option<tokio::task::JoinHandle<()>>,
    /// No new connection before this (after a failure).
    retry_at: Option<Instant>,
}

impl Link {
    /// Closes the connection (its reader task ends with it); the next waiter opens a new one.
    fn drop_connection(&mut self) {
        self.sink = None;
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // The client is gone: so is its subscriber connection.
        self.drop_connection();
    }
}

/// One waiter's place among its channel's waiters: wakes on the channel's messages that concern
/// it, and leaves when dropped (the last one out unsubscribes).
pub(crate) struct Waiter {
    hub: Arc<Hub>,
    channel: String,
    /// The tag of the waiter's token.
    tag: String,
    /// What wakes every waiter of the channel.
    messages: watch::Receiver<u64>,
    /// What wakes the waiters with this tag.
    mine: watch::Receiver<u64>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Hub {
    /// Joins the waiters of `channel`, subscribing to it first if this is its first waiter, so
    /// that no message sent after this returns is missed (if the subscription failed, the
    /// waiter still wakes at its refresh interval, and a later [`Hub::ensure`] subscribes).
    pub(crate) async fn join(
        self: &Arc<Self>,
        client: &crate::Client,
        channel: &str,
        tag: String,
    ) -> Waiter {
        let mut link = self.link.lock().await;
        let (messages, mine, first) = {
            let mut channels = lock(&self.channels);
            let entry = channels.entry(channel.to_owned()).or_insert_with(|| Channel {
                waiters: 0,
                messages: watch::channel(0).0,
                tags: HashMap::new(),
            });
            entry.waiters += 1;
            let tagged = entry.tags.entry(tag.clone()).or_insert_with(|| (0, watch::channel(0).0));
            tagged.0 += 1;
            (entry.messages.subscribe(), tagged.1.subscribe(), entry.waiters == 1)
        };
        let waiter = Waiter { hub: self.clone(), channel: channel.to_owned(), tag, messages, mine };
        if self.connected(&mut link, client).await && first {
            let subscribed = match link.sink.as_mut() {
                Some(sink) => subscribe(sink, channel, client.options.request_timeout).await,
                None => Ok(()),
            };
            if let Err(error) = subscribed {
                tracing::debug!(channel, %error, "dlock: cannot subscribe for tickets");
                client.note_failure(&error).await;
                // A slot served elsewhere now: the waiter moves on its next round.
                if error.redirect_node().is_none() {
                    link.drop_connection();
                }
            }
        }
        waiter
    }

    /// Reconnects the subscriber if its connection ended (and no failure is too recent),
    /// subscribing again to every channel with waiters; they are all woken, since messages may
    /// have been lost meanwhile.
    pub(crate) async fn ensure(self: &Arc<Self>, client: &crate::Client) {
        let mut link = self.link.lock().await;
        self.connected(&mut link, client).await;
    }

    /// Whether the subscriber is connected, connecting it (and subscribing to every channel
    /// with waiters) if it is not.
    async fn connected(self: &Arc<Self>, link: &mut Link, client: &crate::Client) -> bool {
        let ended = link.ended.load(Ordering::SeqCst) >= link.generation;
        if link.sink.is_some() && !ended {
            return true;
        }
        if link.retry_at.is_some_and(|at| Instant::now() < at) {
            return false;
        }
        link.drop_connection();
        let limit = client.options.request_timeout;
        let opened = client.subscriber_at(&self.node).await;
        let (mut sink, stream) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                tracing::debug!(%error, "dlock: cannot open the ticket subscriber");
                link.retry_at = Some(Instant::now() + RESUBSCRIBE_AFTER);
                return false;
            }
        };
        let wanted: Vec<String> = lock(&self.channels).keys().cloned().collect();
        for channel in &wanted {
            if let Err(error) = subscribe(&mut sink, channel, limit).await {
                tracing::debug!(channel, %error, "dlock: cannot subscribe for tickets");
                if error.redirect_node().is_some() {
                    // Its slot is served elsewhere now: its waiters move on their next round.
                    client.note_failure(&error).await;
                    continue;
                }
                link.retry_at = Some(Instant::now() + RESUBSCRIBE_AFTER);
                return false;
            }
        }
        link.generation += 1;
        link.retry_at = None;
        link.sink = Some(sink);
        let reader = read(stream, self.channels.clone(), link.ended.clone(), link.generation);
        link.reader = Some(tokio::spawn(reader));
        // Messages may have been missed while no connection was subscribed.
        for channel in lock(&self.channels).values() {
            bump(&channel.messages);
        }
        true
    }

    /// Unsubscribes from `channel` if nobody waits on it any more.
    async fn unsubscribe_if_idle(self: Arc<Self>, channel: String, limit: Duration) {
        let mut link = self.link.lock().await;
        if lock(&self.channels).contains_key(&channel) {
            return; // a new waiter came
        }
        if let Some(sink) = link.sink.as_mut() {
            let unsubscribed = tokio::time::timeout(limit, sink.unsubscribe(&channel)).await;
            if !matches!(unsubscribed, Ok(Ok(()))) {
                link.drop_connection(); // a connection that does not answer is opened anew
            }
        }
    }
}

impl Waiter {
    /// Marks every message so far as seen: call it before sending an ACQUIRE, so that a message
    /// published after that send wakes [`Waiter::woken`].
    pub(crate) fn seen(&mut self) {
        self.messages.borrow_and_update();
        self.mine.borrow_and_update();
    }

    /// Waits for a message that concerns this waiter since the last [`Waiter::seen`] (forever
    /// if the channel can no longer deliver any: the caller bounds it with its refresh
    /// interval).
    pub(crate) async fn woken(&mut self) {
        let woken = tokio::select! {
            changed = self.messages.changed() => changed,
            changed = self.mine.changed() => changed,
        };
        if woken.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let idle = {
            let mut channels = lock(&self.hub.channels);
            match channels.get_mut(&self.channel) {
                Some(entry) if entry.waiters > 1 => {
                    entry.waiters -= 1;
                    if let Some(tagged) = entry.tags.get_mut(&self.tag) {
                        tagged.0 -= 1;
                        if tagged.0 == 0 {
                            entry.tags.remove(&self.tag);
                        }
                    }
                    false
                }
                Some(_) => {
                    channels.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if !idle {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (hub, channel) = (self.hub.clone(), std::mem::take(&mut self.channel));
        runtime.spawn(hub.unsubscribe_if_idle(channel, UNSUBSCRIBE_WITHIN));
    }
}

async fn subscribe(sink: &mut Sink, channel: &str, limit: Duration) -> Result<(), RedisError> {
    tokio::time::timeout(limit, sink.subscribe(channel)).await.unwrap_or_else(|_| Err(timed_out()))
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "subscribing timed out"))
}

/// Fans the subscriber's messages out to the waiters of their channel; when the connection
/// ends, or the server drops a channel that still has waiters (a cluster node no longer serving
/// its slot), wakes everyone (their next refresh reconnects, or moves) and says so.
async fn read(
    mut stream: Messages,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    ended: Arc<AtomicU64>,
    generation: u64,
) {
    while let Some(event) = stream.next().await {
        match event {
            Event::Message { channel, payload } => {
                if let Some(channel) = lock(&channels).get(&channel) {
                    channel.deliver(&payload);
                }
            }
            Event::Dropped(channel) => {
                if lock(&channels).contains_key(&channel) {
                    tracing::debug!(channel, "dlock: the server dropped a ticket subscription");
                    break;
                }
            }
        }
    }
    ended.fetch_max(generation, Ordering::SeqCst);
    for channel in lock(&channels).values() {
        bump(&channel.messages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_handoff_to_the_waiters_tag_or_an_untagged_one_wakes_it() {
        let mut channel =
            Channel { waiters: 1, messages: watch::channel(0).0, tags: HashMap::new() };
        channel.tags.insert(tag("mine"), (1, watch::channel(0).0));
        let mut all = channel.messages.subscribe();
        let mut mine = channel.tags[&tag("mine")].1.subscribe();
        let woken = |all: &mut watch::Receiver<u64>, mine: &mut watch::Receiver<u64>| {
            (all.has_changed().unwrap_or(false) && *all.borrow_and_update() > 0)
                | (mine.has_changed().unwrap_or(false) && *mine.borrow_and_update() > 0)
        };
        for quiet in ["acquired 5", "released 5", "expired 5", "renewed 5"] {
            channel.deliver(quiet);
            assert!(!woken(&mut all, &mut mine), "{quiet}");
        }
        channel.deliver(&format!("handoff 6 {}", tag("other")));
        assert!(!woken(&mut all, &mut mine), "another's hand-over");
        channel.deliver(&format!("handoff 6 {}", tag("mine")));
        assert!(woken(&mut all, &mut mine), "its own hand-over");
        channel.deliver("handoff 7");
        assert!(woken(&mut all, &mut mine), "an older server's hand-over");
    }
}
