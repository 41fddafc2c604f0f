//! The resources' channels of one client: waiting with `QUEUE` tickets, and hearing that a held
//! lease was revoked. The waiters of one client share its multiplexed connection for their
//! ACQUIREs and one subscriber connection (opened when the first waiter or holder comes) for the
//! resources' channels, which the holders of its leases share too.
//!
//! A `handoff <fence> <tag>` message wakes only the waiters whose token has that tag (the lease
//! is theirs: their next ACQUIRE claims it); one without a tag (an older server) wakes every
//! waiter of the resource, and the other messages (`acquired`, `released`, `expired`) wake none:
//! a release with a line always hands over, and says so. In Redis Cluster there is one such
//! subscriber per primary (`SSUBSCRIBE` on the node serving the channels' slots), and a waiter
//! whose resource's slot moved to another primary joins that primary's.
//!
//! A holder joins its resource's channel when the lease is granted, without waiting for the
//! subscription (a [`Holder`]: a task of its own subscribes, so the grant returns at once), and
//! leaves it with the lease. A `revoked <fence> <reason>` message whose fence is a holder's
//! tells that holder (an operator's `DLOCK.REVOKE`); a revocation that comes before the
//! subscription is confirmed, or while the subscriber is down, is caught by the next renewal.

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
        self.join_tagged(client, resource, Some(tag(token))).await
    }

    /// Joins the ticket channel of `token` on `resource` (`dlock_proto::channel::ticket_name`),
    /// where the server tells that ticket alone of its grant (`granted <fence> <request>
    /// <window-ms>`, for a ticket sent with `NOTIFY`): woken by every message there, with the
    /// last `granted` one kept ([`Waiter::granted`]).
    pub(crate) async fn join_own(
        &self,
        client: &crate::Client,
        resource: &str,
        token: &str,
    ) -> Waiter {
        let address = client.node_address(resource).await;
        let own = channel::ticket_name_of(resource, token);
        self.hub(address).join(client, &own, None).await
    }

    /// Joins the waiters of `resource`'s channel as a waiter woken by every message there: a
    /// set's ticket, which no `handoff` ever names (the set's next ACQUIREALL takes the
    /// members itself), waits for any change of any member.
    pub(crate) async fn join_every(&self, client: &crate::Client, resource: &str) -> Waiter {
        self.join_tagged(client, resource, None).await
    }

    async fn join_tagged(
        &self,
        client: &crate::Client,
        resource: &str,
        tag: Option<String>,
    ) -> Waiter {
        let address = client.node_address(resource).await;
        self.hub(address).join(client, &channel_of(resource), tag).await
    }

    /// The subscriber of the node at `address`, made if new.
    fn hub(&self, address: String) -> Arc<Hub> {
        lock(&self.hubs)
            .entry(address.clone())
            .or_insert_with(|| Arc::new(Hub { node: address, ..Hub::default() }))
            .clone()
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
            return self.hub(address).join(client, &waiter.channel, tag).await;
        }
        waiter.hub.ensure(client).await;
        waiter
    }

    /// Joins the holders of `resource`'s channel on the subscriber of the node at `address`
    /// (the one that granted the lease of `fence`), at once: the subscription is made in the
    /// background.
    pub(crate) fn hold(
        &self,
        client: &crate::Client,
        address: String,
        resource: &str,
        fence: u64,
    ) -> Holder {
        self.hub(address).hold(client, channel_of(resource), fence)
    }
}

/// The subscriber of one server: which channels have waiters or holders, and the connection
/// subscribed to them.
#[derive(Default)]
pub(crate) struct Hub {
    /// The node's address (empty outside a cluster).
    node: String,
    /// Per channel: its members and what tells them of its messages. Read by the connection's
    /// reader task, so a plain mutex, never held across an await.
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The subscriber connection; held while (un)subscribing, so that the connection's set of
    /// channels follows `channels`.
    link: tokio::sync::Mutex<Link>,
}

struct Channel {
    /// Its ticket waiters and holders.
    members: usize,
    /// Whether the current connection is subscribed to it (read and written with the link
    /// held).
    subscribed: bool,
    /// Wakes every waiter of the channel (a new connection, a lost one, an untagged `handoff`).
    messages: watch::Sender<u64>,
    /// Wakes the waiters that wake on every message (a set's tickets).
    every: watch::Sender<u64>,
    /// Per tag of the waiters' tokens: how many wait with it, and what wakes them (a `handoff`
    /// naming it).
    tags: HashMap<String, (usize, watch::Sender<u64>)>,
    /// Per fence of the leases held on the channel's resource: how many holders have it, and
    /// what tells them of its revocation (the reason given, empty if none).
    fences: HashMap<u64, (usize, watch::Sender<Option<String>>)>,
    /// On a ticket's own channel: the last `granted` message heard.
    granted: watch::Sender<Option<channel::Granted>>,
}

impl Channel {
    fn new() -> Self {
        Self {
            members: 0,
            subscribed: false,
            messages: watch::channel(0).0,
            every: watch::channel(0).0,
            tags: HashMap::new(),
            fences: HashMap::new(),
            granted: watch::channel(None).0,
        }
    }

    /// Tells the holder and wakes the waiters that `payload` concerns.
    fn deliver(&self, payload: &str) {
        // Kept before the waiters wake, so that a woken waiter reads it.
        if let Some(granted) = channel::granted(payload) {
            self.granted.send_replace(Some(granted));
        }
        bump(&self.every);
        if let Some((fence, reason)) = channel::revoked(payload)
            && let Some((_, revoked)) = self.fences.get(&fence)
        {
            revoked.send_replace(Some(reason.to_owned()));
        }
        match channel::woken(payload) {
            Woken::Nobody => {}
            Woken::Tag(tag) => {
                if let Some((_, wake)) = self.tags.get(tag) {
                    bump(wake);
                }
            }
            // A `handoff` without a tag (an older server), or a message not understood (a
            // `revoked`: the lock may have passed to a waiter).
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
/// it, and leaves when dropped (the last member out unsubscribes).
pub(crate) struct Waiter {
    hub: Arc<Hub>,
    channel: String,
    /// The tag of the waiter's token; `None` for a waiter woken by every message.
    tag: Option<String>,
    /// What wakes every waiter of the channel.
    messages: watch::Receiver<u64>,
    /// What wakes the waiters with this tag (or, without a tag, every message).
    mine: watch::Receiver<u64>,
    /// The last `granted` message on the channel (a ticket's own).
    granted: watch::Receiver<Option<channel::Granted>>,
}

/// A held lease's place among its channel's holders: told of the lease's revocation, and
/// leaves when dropped (the last member out unsubscribes).
pub(crate) struct Holder {
    hub: Arc<Hub>,
    channel: String,
    fence: u64,
    /// The reason of the lease's revocation, once the channel said so.
    revoked: watch::Receiver<Option<String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Hub {
    /// Counts a new member of `channel` (making its entry if it has none) and lets `join`
    /// register it there.
    fn enter<R>(&self, channel: &str, join: impl FnOnce(&mut Channel) -> R) -> R {
        let mut channels = lock(&self.channels);
        let entry = channels.entry(channel.to_owned()).or_insert_with(Channel::new);
        entry.members += 1;
        join(entry)
    }

    /// Counts a member of `channel` out, after `leave` took it off; the last one out removes
    /// the entry and unsubscribes (in the background).
    fn leave(self: &Arc<Self>, channel: &mut String, leave: impl FnOnce(&mut Channel)) {
        let idle = {
            let mut channels = lock(&self.channels);
            match channels.get_mut(channel.as_str()) {
                Some(entry) if entry.members > 1 => {
                    entry.members -= 1;
                    leave(entry);
                    false
                }
                Some(_) => {
                    channels.remove(channel.as_str());
                    true
                }
                None => false,
            }
        };
        if !idle {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (hub, channel) = (self.clone(), std::mem::take(channel));
        runtime.spawn(hub.unsubscribe_if_idle(channel, UNSUBSCRIBE_WITHIN));
    }

    /// Joins the waiters of `channel` (woken by the hand-overs to `tag`, or without one by every
    /// message), subscribing to it first if the connection is not yet, so that no message sent
    /// after this returns is missed (if the subscription failed, the waiter still wakes at its
    /// refresh interval, and a later [`Hub::ensure`] subscribes).
    pub(crate) async fn join(
        self: &Arc<Self>,
        client: &crate::Client,
        channel: &str,
        tag: Option<String>,
    ) -> Waiter {
        let mut link = self.link.lock().await;
        let (messages, mine, granted) = self.enter(channel, |entry| {
            let mine = match &tag {
                Some(tag) => {
                    let tagged =
                        entry.tags.entry(tag.clone()).or_insert_with(|| (0, watch::channel(0).0));
                    tagged.0 += 1;
                    tagged.1.subscribe()
                }
                None => entry.every.subscribe(),
            };
            (entry.messages.subscribe(), mine, entry.granted.subscribe())
        });
        let channel_name = channel.to_owned();
        let waiter =
            Waiter { hub: self.clone(), channel: channel_name, tag, messages, mine, granted };
        self.subscribe_to(&mut link, client, channel).await;
        waiter
    }

    /// Joins the holders of `channel` as the lease of `fence`, at once; a task subscribes to
    /// the channel if the connection is not yet.
    fn hold(self: &Arc<Self>, client: &crate::Client, channel: String, fence: u64) -> Holder {
        let revoked = self.enter(&channel, |entry| {
            let held = entry.fences.entry(fence).or_insert_with(|| (0, watch::channel(None).0));
            held.0 += 1;
            held.1.subscribe()
        });
        self.subscribe_soon(client, channel.clone());
        Holder { hub: self.clone(), channel, fence, revoked }
    }

    /// Subscribes to `channel` in a task of its own (connecting first), unless the connection
    /// already is.
    fn subscribe_soon(self: &Arc<Self>, client: &crate::Client, channel: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (hub, client) = (self.clone(), client.clone());
        runtime.spawn(async move {
            let mut link = hub.link.lock().await;
            hub.subscribe_to(&mut link, &client, &channel).await;
        });
    }

    /// Subscribes the connection (connected first) to `channel` if it still has members and
    /// the connection is not subscribed to it yet.
    async fn subscribe_to(
        self: &Arc<Self>,
        link: &mut Link,
        client: &crate::Client,
        channel: &str,
    ) {
        if !self.connected(link, client).await {
            return;
        }
        let wanted = lock(&self.channels).get(channel).is_some_and(|entry| !entry.subscribed);
        let Some(sink) = link.sink.as_mut().filter(|_| wanted) else { return };
        match subscribe(sink, channel, client.options.request_timeout).await {
            Ok(()) => {
                if let Some(entry) = lock(&self.channels).get_mut(channel) {
                    entry.subscribed = true;
                }
            }
            Err(error) => {
                tracing::debug!(channel, %error, "dlock: cannot subscribe to a resource's channel");
                client.note_failure(&error).await;
                // A slot served elsewhere now: the waiter moves on its next round, the holder
                // after its next renewal.
                if error.redirect_node().is_none() {
                    link.drop_connection();
                }
            }
        }
    }

    /// Reconnects the subscriber if its connection ended (and no failure is too recent),
    /// subscribing again to every channel with members; the waiters are all woken, since
    /// messages may have been lost meanwhile.
    pub(crate) async fn ensure(self: &Arc<Self>, client: &crate::Client) {
        let mut link = self.link.lock().await;
        self.connected(&mut link, client).await;
    }

    /// Whether the subscriber is connected, connecting it (and subscribing to every channel
    /// with members) if it is not.
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
                tracing::debug!(%error, "dlock: cannot open the channels' subscriber");
                link.retry_at = Some(Instant::now() + RESUBSCRIBE_AFTER);
                return false;
            }
        };
        let wanted: Vec<String> = {
            let mut channels = lock(&self.channels);
            for entry in channels.values_mut() {
                entry.subscribed = false; // on the connection that ended
            }
            channels.keys().cloned().collect()
        };
        for channel in &wanted {
            if let Err(error) = subscribe(&mut sink, channel, limit).await {
                tracing::debug!(channel, %error, "dlock: cannot subscribe to a resource's channel");
                if error.redirect_node().is_some() {
                    // Its slot is served elsewhere now: its members move on their next round.
                    client.note_failure(&error).await;
                    continue;
                }
                link.retry_at = Some(Instant::now() + RESUBSCRIBE_AFTER);
                return false;
            }
            if let Some(entry) = lock(&self.channels).get_mut(channel) {
                entry.subscribed = true;
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

    /// Unsubscribes from `channel` if nobody waits or holds on it any more.
    async fn unsubscribe_if_idle(self: Arc<Self>, channel: String, limit: Duration) {
        let mut link = self.link.lock().await;
        if lock(&self.channels).contains_key(&channel) {
            return; // a new member came
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

    /// The last `granted` message heard on this waiter's channel (a ticket's own channel).
    pub(crate) fn granted(&self) -> Option<channel::Granted> {
        *self.granted.borrow()
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
        let Some(tag) = self.tag.take() else {
            return self.hub.clone().leave(&mut self.channel, |_| {});
        };
        self.hub.clone().leave(&mut self.channel, |entry| {
            if let Some(tagged) = entry.tags.get_mut(&tag) {
                tagged.0 -= 1;
                if tagged.0 == 0 {
                    entry.tags.remove(&tag);
                }
            }
        });
    }
}

impl Holder {
    /// The reason given for the lease's revocation (empty if none), once the channel said so:
    /// at once if it already did, else never resolves.
    pub(crate) async fn revoked(&mut self) -> String {
        // The borrow ends here: the future stays `Send`.
        let heard = self.revoked.wait_for(Option::is_some).await.map(|reason| reason.clone());
        match heard {
            Ok(reason) => reason.unwrap_or_default(),
            // The hub is gone with its client: no message can come.
            Err(_) => std::future::pending().await,
        }
    }

    /// The reason given for the lease's revocation, if the channel said so already.
    pub(crate) fn heard(&self) -> Option<String> {
        self.revoked.borrow().clone()
    }

    /// Keeps the holder listening (after a renewal): on the subscriber of the node at
    /// `address`, the one serving the resource now (joining it if the slot moved), and
    /// subscribed again (in the background) if that subscriber's connection ended.
    pub(crate) fn keep(&mut self, hubs: &Hubs, client: &crate::Client, address: String) {
        if self.heard().is_some() {
            return; // revoked: the lease is over
        }
        if !address.is_empty() && address != self.hub.node {
            tracing::debug!(
                channel = self.channel,
                node = address,
                "dlock: the lease's slot moved"
            );
            *self = hubs.hub(address).hold(client, self.channel.clone(), self.fence);
        } else {
            self.hub.subscribe_soon(client, self.channel.clone());
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let fence = self.fence;
        self.hub.clone().leave(&mut self.channel, |entry| {
            if let Some(held) = entry.fences.get_mut(&fence) {
                held.0 -= 1;
                if held.0 == 0 {
                    entry.fences.remove(&fence);
                }
            }
        });
    }
}

async fn subscribe(sink: &mut Sink, channel: &str, limit: Duration) -> Result<(), RedisError> {
    tokio::time::timeout(limit, sink.subscribe(channel)).await.unwrap_or_else(|_| Err(timed_out()))
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "subscribing timed out"))
}

/// Fans the subscriber's messages out to the members of their channel; when the connection
/// ends, or the server drops a channel that still has members (a cluster node no longer serving
/// its slot), wakes every waiter (their next refresh reconnects, or moves) and says so.
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
                    tracing::debug!(channel, "dlock: the server dropped a channel's subscription");
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
        let mut channel = Channel::new();
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

    #[test]
    fn a_sets_waiter_wakes_on_every_message() {
        let channel = Channel::new();
        let mut every = channel.every.subscribe();
        for message in ["acquired 5", "released 5", "expired 5", "renewed 5", "handoff 6 c87d8df5"]
        {
            channel.deliver(message);
            assert!(every.has_changed().expect("open"), "{message}");
            every.borrow_and_update();
        }
    }

    #[test]
    fn a_revocation_tells_the_holder_of_its_fence_only() {
        let mut channel = Channel::new();
        channel.fences.insert(8, (1, watch::channel(None).0));
        channel.fences.insert(9, (1, watch::channel(None).0));
        let mut eight = channel.fences[&8].1.subscribe();
        let mut nine = channel.fences[&9].1.subscribe();
        for other in
            ["released 8", "expired 8", "handoff 8 c87d8df5", "revoked 10 x", "revoked x y"]
        {
            channel.deliver(other);
        }
        assert!(!eight.has_changed().expect("open") && !nine.has_changed().expect("open"));
        channel.deliver("revoked 8 stuck since 03:00");
        assert_eq!(eight.borrow_and_update().as_deref(), Some("stuck since 03:00"));
        assert!(!nine.has_changed().expect("open"), "another holder's fence");
        channel.deliver("revoked 9");
        assert_eq!(nine.borrow_and_update().as_deref(), Some(""), "no reason given");
    }
}
