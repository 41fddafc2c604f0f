//! The transport: connecting, the shared connection (and its replacement after a request timed
//! out), connections of their own for requests that block, and `WAIT` for replicas.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::RedisError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubStream};

use crate::ClientOptions;

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
    pub(crate) options: ClientOptions,
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "request timed out"))
}

/// A duration as the server is told it, in whole milliseconds (at least 1).
pub(crate) fn millis(duration: Duration) -> u64 {
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
    pub(crate) async fn send<T: redis::FromRedisValue>(
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
    pub(crate) async fn send_write<T: redis::FromRedisValue>(
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

    /// The keyspace-event stream of `resource`, or `None` if it cannot be subscribed to (then
    /// renewals alone watch the lease).
    pub(crate) async fn subscribe(&self, resource: &str) -> Option<PubSubStream> {
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
