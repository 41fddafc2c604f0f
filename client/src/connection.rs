//! The transport: connecting within a deadline, the shared connection (opened anew once the
//! server closed it, an I/O error broke it or a request on it timed out), connections of their
//! own for requests that block, and `WAIT` for replicas. Every failure says whether the request
//! left this machine, so that an ACQUIRE that never did is not mistaken for an unknown grant.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSubSink, PubSubStream};
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisError};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::{ClientOptions, ConnectError};

/// A connection to a dlock server that reconnects by itself. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    /// The shared connection, for requests that do not block. It is not used again once the
    /// server closed it, an I/O error broke it, or a request on it timed out (a half-open socket
    /// never errors, it only goes silent); the next request opens a new one.
    shared: Arc<tokio::sync::Mutex<Option<Arc<Link>>>>,
    /// For blocking waits, WAIT and subscriptions, which must not hold up other requests on the
    /// shared connection.
    redis: redis::Client,
    pub(crate) options: ClientOptions,
    /// The server refused `CLAIM` (it is older than claim windows): waits go without it.
    pub(crate) claim_refused: Arc<AtomicBool>,
    /// The subscriber that wakes the waiters holding tickets (`QUEUE`), shared by the clones.
    pub(crate) tickets: Arc<crate::tickets::Hub>,
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
        let link =
            Link::open(&redis, options.connect_timeout).await.map_err(ConnectError::classify)?;
        let shared = Arc::new(tokio::sync::Mutex::new(Some(Arc::new(link))));
        Ok(Self { shared, redis, options, claim_refused: Arc::default(), tickets: Arc::default() })
    }

    /// The shared connection, opened anew if the last one broke.
    async fn shared(&self) -> Result<Arc<Link>, RedisError> {
        // Held while opening, so that requests queued behind a broken link open one link, not
        // one each.
        let mut shared = self.shared.lock().await;
        if let Some(link) = shared.as_ref().filter(|link| !link.is_broken()) {
            return Ok(link.clone());
        }
        let link = Arc::new(Link::open(&self.redis, self.options.connect_timeout).await?);
        if shared.is_some() {
            tracing::debug!("dlock: opened a new shared connection");
        }
        *shared = Some(link.clone());
        Ok(link)
    }

    /// A connection of this request's own, opened within [`ClientOptions::connect_timeout`].
    async fn own_connection(&self) -> Result<MultiplexedConnection, RedisError> {
        let config =
            AsyncConnectionConfig::new().set_connection_timeout(self.options.connect_timeout);
        self.redis.get_multiplexed_async_connection_with_config(&config).await
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
        if extra.is_zero() {
            let link = self.shared().await.map_err(Failure::NotSent)?;
            let mut connection = link.connection.clone();
            let reply = tokio::time::timeout(limit, cmd.query_async(&mut connection)).await;
            match &reply {
                Ok(Ok(_)) => {}
                // An error reply leaves the connection as it was.
                Ok(Err(error)) if !error.is_io_error() => {}
                // Timed out (perhaps half-open) or broken: the next request opens a new one.
                _ => link.mark_broken(),
            }
            reply.unwrap_or_else(|_| Err(timed_out())).map_err(Failure::Sent)
        } else {
            self.send_on_own(cmd, limit).await
        }
    }

    /// Sends one command on a connection opened for it (not the shared one, which may be the
    /// one that just failed), within [`ClientOptions::request_timeout`] once connected.
    pub(crate) async fn send_alone<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, Failure> {
        self.send_on_own(cmd, self.options.request_timeout).await
    }

    async fn send_on_own<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        limit: Duration,
    ) -> Result<T, Failure> {
        let mut connection = self.own_connection().await.map_err(Failure::NotSent)?;
        let reply = tokio::time::timeout(limit, cmd.query_async(&mut connection)).await;
        reply.unwrap_or_else(|_| Err(timed_out())).map_err(Failure::Sent)
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
        let mut connection = self.own_connection().await.map_err(Failure::NotSent)?;
        let reply = tokio::time::timeout(limit, async {
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone());
            pipe.cmd("WAIT").arg(replicas.count).arg(millis(replicas.timeout));
            let (reply, acked): (T, u64) = pipe.query_async(&mut connection).await?;
            Ok((reply, Some(acked)))
        })
        .await;
        reply.unwrap_or_else(|_| Err(timed_out())).map_err(Failure::Sent)
    }
}

impl Client {
    /// The keyspace-event stream of `resource`, or `None` if it cannot be subscribed to (then
    /// renewals alone watch the lease).
    pub(crate) async fn subscribe(&self, resource: &str) -> Option<PubSubStream> {
        let db = self.redis.get_connection_info().redis.db;
        let channel = format!("__keyspace@{db}__:{resource}");
        match self.subscribe_to(&channel).await {
            Ok((_, stream)) => Some(stream),
            Err(error) => {
                tracing::debug!(resource, %error, "dlock: cannot watch keyspace events");
                None
            }
        }
    }

    /// A new subscriber connection (not yet subscribed to anything).
    pub(crate) async fn pubsub(&self) -> Result<redis::aio::PubSub, RedisError> {
        self.redis.get_async_pubsub().await
    }

    /// A subscription to `channel` on a connection of its own, within
    /// [`ClientOptions::request_timeout`]: the sink (to subscribe again, which checks that the
    /// connection still answers) and the messages, which end when the connection does.
    pub(crate) async fn subscribe_to(
        &self,
        channel: &str,
    ) -> Result<(PubSubSink, PubSubStream), RedisError> {
        let subscribed = tokio::time::timeout(self.options.request_timeout, async {
            let mut pubsub = self.redis.get_async_pubsub().await?;
            pubsub.subscribe(channel).await?;
            Ok::<_, RedisError>(pubsub.split())
        })
        .await;
        subscribed.unwrap_or_else(|_| Err(timed_out()))
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
