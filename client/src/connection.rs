//! The transport: connecting within a deadline, the shared connection (opened anew once the
//! server closed it, an I/O error broke it or a request on it timed out), connections of their
//! own for requests that block, and `WAIT` for replicas. Every failure says whether the request
//! left this machine, so that an ACQUIRE that never did is not mistaken for an unknown grant.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisError};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::cluster::Topology;
use crate::pubsub::{Messages, Sink};
use crate::{ClientOptions, ConnectError, Replicas, observe};

/// A connection to a dlock server, or to the primaries of a Redis Cluster, that reconnects by
/// itself. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    transport: Arc<Transport>,
    pub(crate) options: ClientOptions,
    /// The server refused `CLAIM` (it is older than claim windows): waits go without it.
    pub(crate) claim_refused: Arc<AtomicBool>,
    /// The server refused `NOTIFY` (it is older than tickets' own channels): tickets wait on
    /// the resource's channel and claim their turn with one more ACQUIRE.
    pub(crate) notify_refused: Arc<AtomicBool>,
    /// The subscribers of the resources' channels, which wake the waiters holding tickets
    /// (`QUEUE`) and tell holders of their leases' revocation, one per server (per
    /// primary in a cluster), shared by the clones.
    pub(crate) channels: Arc<crate::tickets::Hubs>,
}

/// Where requests go: one server, or the primary of each request's resource.
enum Transport {
    Single(Arc<Node>),
    Cluster(Box<Topology>),
}

/// One server (a single one, or a cluster's primary): its shared connection, and its address
/// for connections of their own.
pub(crate) struct Node {
    /// The shared connection, for requests that do not block. It is not used again once the
    /// server closed it, an I/O error broke it, or a request on it timed out (a half-open socket
    /// never errors, it only goes silent); the next request opens a new one.
    shared: tokio::sync::Mutex<Option<Arc<Link>>>,
    /// For blocking waits, WAIT and subscriptions, which must not hold up other requests on the
    /// shared connection.
    redis: redis::Client,
    /// `host:port` in a cluster (the key of its ticket subscriber); empty for a single server.
    address: String,
}

/// A request that failed, and whether it left this machine.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The request was never sent: no connection could be opened (refused, timed out, reset
    /// during the handshake), or the shared one was already known to be closed.
    NotSent(RedisError),
    /// The request was sent, or may have been: the server may have carried it out (an error
    /// reply aside, which it answered without doing so).
    Sent(RedisError),
}

impl Failure {
    /// The error itself.
    pub(crate) fn error(&self) -> &RedisError {
        match self {
            Self::NotSent(error) | Self::Sent(error) => error,
        }
    }

    /// Whether the request may have reached the server.
    pub(crate) fn was_sent(&self) -> bool {
        matches!(self, Self::Sent(_))
    }
}

impl From<Failure> for RedisError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::NotSent(error) | Failure::Sent(error) => error,
        }
    }
}

fn timed_out() -> RedisError {
    RedisError::from(io::Error::new(io::ErrorKind::TimedOut, "request timed out"))
}

fn connect_timed_out() -> RedisError {
    RedisError::from(io::Error::new(io::ErrorKind::TimedOut, "connecting timed out"))
}

/// A duration as the server is told it, in whole milliseconds (at least 1).
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// How many `MOVED` or `ASK` replies one request follows before its last one is the answer.
const REDIRECTS_AT_MOST: usize = 5;

/// The key a command is routed by: its first resource, the first argument of every dlock
/// command but those of sets (`DLOCK.ACQUIREALL numkeys resource …`: the second; every member of
/// a set hashes to one slot).
fn routing_key(cmd: &redis::Cmd) -> Vec<u8> {
    let mut args = cmd.args_iter();
    let set = match args.next() {
        Some(redis::Arg::Simple(name)) => {
            crate::set::COMMANDS.iter().any(|command| command.as_bytes().eq_ignore_ascii_case(name))
        }
        _ => false,
    };
    match args.nth(usize::from(set)) {
        Some(redis::Arg::Simple(key)) => key.to_vec(),
        _ => Vec::new(),
    }
}

/// `cmd` on `connection`, preceded by `ASKING` when a slot in migration sent it here.
async fn query<T: redis::FromRedisValue>(
    connection: &mut MultiplexedConnection,
    cmd: &redis::Cmd,
    asking: bool,
) -> Result<T, RedisError> {
    if !asking {
        return cmd.query_async(connection).await;
    }
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore().add_command(cmd.clone());
    let (reply,): (T,) = pipe.query_async(connection).await?;
    Ok(reply)
}

impl Node {
    pub(crate) fn new(redis: redis::Client, address: String) -> Self {
        Self { shared: tokio::sync::Mutex::new(None), redis, address }
    }

    /// The shared connection, opened anew if the last one broke.
    async fn shared(&self, timeout: Duration) -> Result<Arc<Link>, RedisError> {
        // Held while opening, so that requests queued behind a broken link open one link, not
        // one each.
        let mut shared = self.shared.lock().await;
        if let Some(link) = shared.as_ref().filter(|link| !link.is_broken()) {
            return Ok(link.clone());
        }
        let link = Arc::new(Link::open(&self.redis, timeout).await?);
        if shared.is_some() {
            tracing::debug!(node = self.address, "dlock: opened a new shared connection");
        }
        *shared = Some(link.clone());
        Ok(link)
    }

    /// A connection of a request's own, opened within `timeout`.
    async fn own_connection(&self, timeout: Duration) -> Result<MultiplexedConnection, RedisError> {
        let config = AsyncConnectionConfig::new().set_connection_timeout(timeout);
        self.redis.get_multiplexed_async_connection_with_config(&config).await
    }

    /// `cmd` on the shared connection within `limit` (connecting within `connect`).
    async fn send_shared<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        asking: bool,
        connect: Duration,
        limit: Duration,
    ) -> Result<T, Failure> {
        let link = self.shared(connect).await.map_err(Failure::NotSent)?;
        let mut connection = link.connection.clone();
        let reply = tokio::time::timeout(limit, query(&mut connection, cmd, asking)).await;
        match &reply {
            Ok(Ok(_)) => {}
            // An error reply leaves the connection as it was.
            Ok(Err(error)) if !error.is_io_error() => {}
            // Timed out (perhaps half-open) or broken: the next request opens a new one.
            _ => link.mark_broken(),
        }
        reply.unwrap_or_else(|_| Err(timed_out())).map_err(Failure::Sent)
    }

    /// `cmd` on a connection opened for it, within `limit` once connected.
    async fn send_own<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        asking: bool,
        connect: Duration,
        limit: Duration,
    ) -> Result<T, Failure> {
        let mut connection = self.own_connection(connect).await.map_err(Failure::NotSent)?;
        let reply = tokio::time::timeout(limit, query(&mut connection, cmd, asking)).await;
        reply.unwrap_or_else(|_| Err(timed_out())).map_err(Failure::Sent)
    }

    /// `cmd` and `WAIT` for `replicas` on a connection opened for them, within `limit`.
    async fn send_write<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        asking: bool,
        connect: Duration,
        limit: Duration,
        replicas: Replicas,
    ) -> Result<(T, Option<u64>), Failure> {
        let mut connection = self.own_connection(connect).await.map_err(Failure::NotSent)?;
        let reply = tokio::time::timeout(limit, async {
            let mut pipe = redis::pipe();
            if asking {
                pipe.cmd("ASKING").ignore();
            }
            pipe.add_command(cmd.clone());
            pipe.cmd("WAIT").arg(replicas.count).arg(millis(replicas.timeout));
            let (reply, acked): (T, u64) = pipe.query_async(&mut connection).await?;
            Ok((reply, Some(acked)))
        })
        .await;
        reply.unwrap_or_else(|_| Err(timed_out())).map_err(Failure::Sent)
    }

    /// `cmd` on the shared connection within `timeout`, for the client's own bookkeeping.
    pub(crate) async fn query_alone<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        timeout: Duration,
    ) -> Result<T, RedisError> {
        self.send_shared(cmd, false, timeout, timeout).await.map_err(RedisError::from)
    }

    /// A new subscriber connection: the crate's own for a single server, a RESP3 connection
    /// whose pushes carry the messages for a cluster node (`sharded`: `SSUBSCRIBE`).
    async fn subscriber(
        &self,
        cluster: bool,
        sharded: bool,
        timeout: Duration,
    ) -> Result<(Sink, Messages), RedisError> {
        let opened = async {
            if !cluster {
                let (sink, stream) = self.redis.get_async_pubsub().await?.split();
                return Ok((Sink::Plain(sink), Messages::plain(stream)));
            }
            let mut info = self.redis.get_connection_info().clone();
            info.redis.protocol = redis::ProtocolVersion::RESP3;
            let (pushes, received) = tokio::sync::mpsc::unbounded_channel();
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(timeout)
                .set_push_sender(pushes);
            let connection = redis::Client::open(info)?
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            let messages = Messages::pushes(received, connection.clone());
            Ok((Sink::Node { connection, sharded }, messages))
        };
        tokio::time::timeout(timeout, opened).await.unwrap_or_else(|_| Err(connect_timed_out()))
    }
}

impl Client {
    /// Connects to `url` (`redis://host:port/db`) with default options.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::connect_with(url, ClientOptions::default()).await
    }

    /// Connects to `url` with `options`, giving up after
    /// [`ClientOptions::connect_timeout`]: [`ConnectError::Unreachable`] when nothing listens,
    /// nothing answers in time, or the connection is cut during the handshake.
    pub async fn connect_with(url: &str, options: ClientOptions) -> Result<Self, ConnectError> {
        let redis = redis::Client::open(url).map_err(ConnectError::classify)?;
        let node = Node::new(redis, String::new());
        node.shared(options.connect_timeout).await.map_err(ConnectError::classify)?;
        Ok(Self::with_transport(Transport::Single(Arc::new(node)), options))
    }

    /// Connects to the Redis Cluster that `urls` (`redis://host:port`, one or more of its
    /// nodes) belong to, with default options.
    pub async fn connect_cluster(urls: &[&str]) -> Result<Self, ConnectError> {
        Self::connect_cluster_with(urls, ClientOptions::default()).await
    }

    /// Connects to the Redis Cluster that `urls` belong to, with `options`: reads the slot map
    /// (`CLUSTER SLOTS`) from the first node that answers. Every request then goes to the
    /// primary of its resource's slot, on that primary's own shared connection, and follows a
    /// `MOVED` or `ASK` reply (reading the map again after `MOVED`).
    pub async fn connect_cluster_with(
        urls: &[&str],
        options: ClientOptions,
    ) -> Result<Self, ConnectError> {
        let topology = Topology::new(urls).map_err(ConnectError::classify)?;
        topology.refresh(options.connect_timeout).await.map_err(ConnectError::classify)?;
        Ok(Self::with_transport(Transport::Cluster(Box::new(topology)), options))
    }

    fn with_transport(transport: Transport, options: ClientOptions) -> Self {
        Self {
            transport: Arc::new(transport),
            options,
            claim_refused: Arc::default(),
            notify_refused: Arc::default(),
            channels: Arc::default(),
        }
    }

    /// Whether this client talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(*self.transport, Transport::Cluster(_))
    }

    /// How many `MOVED` and `ASK` replies this client (and its clones) followed: 0 while its
    /// slot map is right; always 0 for a single server.
    pub fn redirects(&self) -> u64 {
        match &*self.transport {
            Transport::Single(_) => 0,
            Transport::Cluster(topology) => topology.redirects(),
        }
    }

    /// The node serving `key` (the server itself outside a cluster).
    async fn node_for(&self, key: &[u8]) -> Result<Arc<Node>, RedisError> {
        match &*self.transport {
            Transport::Single(node) => Ok(node.clone()),
            Transport::Cluster(topology) => {
                topology.node_for(key, self.options.connect_timeout).await
            }
        }
    }

    /// The address of the node serving `key` now: the key of its ticket subscriber (empty
    /// outside a cluster).
    pub(crate) async fn node_address(&self, key: &str) -> String {
        match self.node_for(key.as_bytes()).await {
            Ok(node) => node.address.clone(),
            Err(_) => String::new(),
        }
    }

    /// Runs `op` on the node of `cmd`'s resource; in a cluster, follows `MOVED` (to the node it
    /// names, after reading the slot map again) and `ASK` (once, with `ASKING`), and reads the
    /// map again in the background after a node failed to answer (a failover may be under way;
    /// the caller's retries then find the new primary).
    async fn routed<R, F, Fut>(&self, cmd: &redis::Cmd, op: F) -> Result<R, Failure>
    where
        F: Fn(Arc<Node>, bool) -> Fut,
        Fut: Future<Output = Result<R, Failure>>,
    {
        let topology = match &*self.transport {
            Transport::Single(node) => return op(node.clone(), false).await,
            Transport::Cluster(topology) => topology,
        };
        let timeout = self.options.connect_timeout;
        let key = routing_key(cmd);
        let mut asked: Option<Arc<Node>> = None;
        let mut redirects = 0;
        loop {
            let asking = asked.is_some();
            let node = match asked.take() {
                Some(node) => node,
                None => topology.node_for(&key, timeout).await.map_err(Failure::NotSent)?,
            };
            let reply = op(node, asking).await;
            let Err(failure) = &reply else { return reply };
            let error = failure.error();
            match (error.kind(), error.redirect_node()) {
                (kind, Some((address, slot))) if redirects < REDIRECTS_AT_MOST => {
                    redirects += 1;
                    observe::redirected();
                    if kind == redis::ErrorKind::Ask {
                        topology.redirected();
                        asked = Some(topology.node(address).map_err(Failure::NotSent)?);
                    } else {
                        topology.moved(slot, address, timeout).await;
                    }
                }
                _ => {
                    if error.is_io_error()
                        || matches!(error.code(), Some("CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN"))
                    {
                        let transport = self.transport.clone();
                        tokio::spawn(async move {
                            if let Transport::Cluster(topology) = &*transport {
                                let _ = topology.refresh(timeout).await;
                            }
                        });
                    }
                    return reply;
                }
            }
        }
    }

    /// Sends one command with a timeout of `request_timeout + extra`. A command that may block
    /// (`extra` > 0) gets a connection of its own: on the shared one it would hold up every other
    /// request of this client, its own lease's RELEASE included.
    pub(crate) async fn send<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        extra: Duration,
    ) -> Result<T, Failure> {
        let limit = self.options.request_timeout + extra;
        let connect = self.options.connect_timeout;
        if extra.is_zero() {
            let op = |node: Arc<Node>, asking| async move {
                node.send_shared(cmd, asking, connect, limit).await
            };
            self.routed(cmd, op).await
        } else {
            let op = |node: Arc<Node>, asking| async move {
                node.send_own(cmd, asking, connect, limit).await
            };
            self.routed(cmd, op).await
        }
    }

    /// Sends one command on a connection opened for it (not the shared one, which may be the
    /// one that just failed), within [`ClientOptions::request_timeout`] once connected.
    pub(crate) async fn send_alone<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, Failure> {
        let (connect, limit) = (self.options.connect_timeout, self.options.request_timeout);
        let op = |node: Arc<Node>, asking| async move {
            node.send_own(cmd, asking, connect, limit).await
        };
        self.routed(cmd, op).await
    }

    /// Sends a command that grants or renews, followed by `WAIT` when [`ClientOptions::replicas`]
    /// asks for it (on a connection of its own: WAIT counts the writes of its own connection and
    /// blocks it). Returns the reply and the number of replicas that acknowledged, if asked.
    pub(crate) async fn send_write<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        extra: Duration,
    ) -> Result<(T, Option<u64>), Failure> {
        let Some(replicas) = self.options.replicas else {
            return self.send(cmd, extra).await.map(|reply| (reply, None));
        };
        let limit = self.options.request_timeout + extra + replicas.timeout;
        let connect = self.options.connect_timeout;
        let op = |node: Arc<Node>, asking| async move {
            node.send_write(cmd, asking, connect, limit, replicas).await
        };
        self.routed(cmd, op).await
    }
}

impl Client {
    /// The keyspace-event stream of `resource`, or `None` if it cannot be subscribed to (then
    /// renewals alone watch the lease). In a cluster, on the resource's primary (a node
    /// publishes the events of its own keys).
    pub(crate) async fn subscribe(&self, resource: &str) -> Option<Messages> {
        let node = match self.node_for(resource.as_bytes()).await {
            Ok(node) => node,
            Err(error) => {
                tracing::debug!(resource, %error, "dlock: cannot watch keyspace events");
                return None;
            }
        };
        let db = node.redis.get_connection_info().redis.db;
        let channel = format!("__keyspace@{db}__:{resource}");
        match self.subscribe_on(&node, &channel, false).await {
            Ok((_, stream)) => Some(stream),
            Err(error) => {
                tracing::debug!(resource, %error, "dlock: cannot watch keyspace events");
                None
            }
        }
    }

    /// A new subscriber connection (not yet subscribed to anything) to the node at `address`
    /// ([`Client::node_address`]), for resources' channels: `SSUBSCRIBE` in a cluster.
    pub(crate) async fn subscriber_at(
        &self,
        address: &str,
    ) -> Result<(Sink, Messages), RedisError> {
        let timeout = self.options.request_timeout;
        match &*self.transport {
            Transport::Single(node) => node.subscriber(false, false, timeout).await,
            Transport::Cluster(topology) => {
                if address.is_empty() {
                    return Err(RedisError::from((
                        redis::ErrorKind::ClusterDown,
                        "no node known for the channel's slot",
                    )));
                }
                topology.node(address)?.subscriber(true, true, timeout).await
            }
        }
    }

    /// A subscription to a resource's `channel` on a connection of its own (on the primary of
    /// the channel's slot in a cluster, with `SSUBSCRIBE`), within
    /// [`ClientOptions::request_timeout`]: the node's address, the sink (to subscribe again,
    /// which checks that the connection still answers) and the messages, which end when the
    /// connection does.
    pub(crate) async fn subscribe_to(
        &self,
        channel: &str,
    ) -> Result<(String, Sink, Messages), RedisError> {
        let node = self.node_for(channel.as_bytes()).await?;
        let (sink, messages) = self.subscribe_on(&node, channel, true).await?;
        Ok((node.address.clone(), sink, messages))
    }

    async fn subscribe_on(
        &self,
        node: &Node,
        channel: &str,
        sharded: bool,
    ) -> Result<(Sink, Messages), RedisError> {
        let subscribed = tokio::time::timeout(self.options.request_timeout, async {
            let (mut sink, messages) =
                node.subscriber(self.is_cluster(), sharded, self.options.request_timeout).await?;
            sink.subscribe(channel).await?;
            Ok::<_, RedisError>((sink, messages))
        })
        .await;
        let subscribed = subscribed.unwrap_or_else(|_| Err(timed_out()));
        if let Err(error) = &subscribed {
            self.note_failure(error).await;
        }
        subscribed
    }

    /// After a subscription failed in a cluster: a `MOVED` (the channel's slot moved) points the
    /// slot at the node it names, an I/O error has the map read again.
    pub(crate) async fn note_failure(&self, error: &RedisError) {
        let Transport::Cluster(topology) = &*self.transport else { return };
        let timeout = self.options.connect_timeout;
        match error.redirect_node() {
            Some((address, slot)) if error.kind() == redis::ErrorKind::Moved => {
                topology.moved(slot, address, timeout).await;
            }
            _ if error.is_io_error() => {
                let _ = topology.refresh(timeout).await;
            }
            _ => {}
        }
    }
}

/// One multiplexed connection whose socket tells when the server closed it, so that a request
/// is never sent into a connection already known to be dead (it would come back as a broken
/// pipe, indistinguishable from a request lost in flight).
struct Link {
    connection: MultiplexedConnection,
    /// Set at the server's end of stream, on an I/O error, or after a request timed out.
    broken: Arc<AtomicBool>,
    /// The task that reads and writes the socket; aborted with the link, so that a silent socket
    /// with requests in flight does not live on.
    driver: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Opens a connection to `redis`'s address and runs its handshake, within `timeout`.
    async fn open(redis: &redis::Client, timeout: Duration) -> Result<Link, RedisError> {
        let info = redis.get_connection_info();
        let opening = async {
            match &info.addr {
                ConnectionAddr::Tcp(host, port) => {
                    let socket = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                    Link::handshake(socket, &info.redis).await
                }
                ConnectionAddr::Unix(path) => {
                    let socket = tokio::net::UnixStream::connect(path).await?;
                    Link::handshake(socket, &info.redis).await
                }
                _ => Err(RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "dlock-client speaks redis:// and redis+unix://, not TLS",
                ))),
            }
        };
        tokio::time::timeout(timeout, opening).await.unwrap_or_else(|_| Err(connect_timed_out()))
    }

    async fn handshake<S>(socket: S, info: &redis::RedisConnectionInfo) -> Result<Link, RedisError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let broken = Arc::new(AtomicBool::new(false));
        let socket = Watched { socket, broken: broken.clone() };
        let (connection, driver) =
            MultiplexedConnection::new_with_config(info, socket, AsyncConnectionConfig::new())
                .await?;
        Ok(Link { connection, broken, driver: tokio::spawn(driver) })
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    fn mark_broken(&self) {
        self.broken.store(true, Ordering::SeqCst);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A socket that marks its link broken at the end of stream or on an I/O error.
struct Watched<S> {
    socket: S,
    broken: Arc<AtomicBool>,
}

impl<S> Watched<S> {
    fn watch<T>(&self, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if let Poll::Ready(Err(_)) = &polled {
            self.broken.store(true, Ordering::SeqCst);
        }
        polled
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let (before, room) = (buf.filled().len(), buf.remaining() > 0);
        let polled = Pin::new(&mut self.socket).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && room && buf.filled().len() == before {
            self.broken.store(true, Ordering::SeqCst); // end of stream: the server closed it
        }
        self.watch(polled)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.socket).poll_write(cx, buf);
        self.watch(polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.socket).poll_flush(cx);
        self.watch(polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.socket).poll_shutdown(cx);
        self.watch(polled)
    }
}
