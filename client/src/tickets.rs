//! Waiting with `QUEUE` tickets: the waiters of one client share its multiplexed connection for
//! their ACQUIREs and one subscriber connection (opened when the first waiter comes) for the
//! resources' channels, whose messages wake the waiters of that resource. In Redis Cluster there
//! is one such subscriber per primary (`SSUBSCRIBE` on the node serving the channels' slots),
//! and a waiter whose resource's slot moved to another primary joins that primary's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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
    /// Joins the waiters of `resource`'s channel on the subscriber of the node serving it.
    pub(crate) async fn join(&self, client: &crate::Client, resource: &str) -> Waiter {
        let address = client.node_address(resource).await;
        let hub = lock(&self.hubs)
            .entry(address.clone())
            .or_insert_with(|| Arc::new(Hub { node: address, ..Hub::default() }))
            .clone();
        hub.join(client, &channel_of(resource)).await
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
            return self.join(client, resource).await;
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
    /// Per channel: its waiters and the counter of messages that wakes them. Read by the
    /// connection's reader task, so a plain mutex, never held across an await.
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The subscriber connection; held while (un)subscribing, so that the connection's set of
    /// channels follows `channels`.
    link: tokio::sync::Mutex<Link>,
}

struct Channel {
    waiters: usize,
    messages: watch::Sender<u64>,
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

/// One waiter's place among its channel's waiters: wakes on the channel's messages, and leaves
/// when dropped (the last one out unsubscribes).
pub(crate) struct Waiter {
    hub: Arc<Hub>,
    channel: String,
    messages: watch::Receiver<u64>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Hub {
    /// Joins the waiters of `channel`, subscribing to it first if this is its first waiter, so
    /// that no message sent after this returns is missed (if the subscription failed, the
    /// waiter still wakes at its refresh interval, and a later [`Hub::ensure`] subscribes).
    pub(crate) async fn join(self: &Arc<Self>, client: &crate::Client, channel: &str) -> Waiter {
        let mut link = self.link.lock().await;
        let (messages, first) = {
            let mut channels = lock(&self.channels);
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel { waiters: 0, messages: watch::channel(0).0 });
            entry.waiters += 1;
            (entry.messages.subscribe(), entry.waiters == 1)
        };
        let waiter = Waiter { hub: self.clone(), channel: channel.to_owned(), messages };
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
            channel.messages.send_modify(|count| *count = count.wrapping_add(1));
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
    }

    /// Waits for a message on the channel since the last [`Waiter::seen`] (forever if the
    /// channel can no longer deliver any: the caller bounds it with its refresh interval).
    pub(crate) async fn woken(&mut self) {
        if self.messages.changed().await.is_err() {
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
            Event::Message { channel, .. } => {
                if let Some(channel) = lock(&channels).get(&channel) {
                    channel.messages.send_modify(|count| *count = count.wrapping_add(1));
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
        channel.messages.send_modify(|count| *count = count.wrapping_add(1));
    }
}
