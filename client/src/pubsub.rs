//! Subscriber connections: the `redis` crate's own (`SUBSCRIBE`, for a single server), or, in
//! Redis Cluster, a RESP3 connection to one primary whose pushes carry the messages: `SSUBSCRIBE`
//! for a resource's channel (the module publishes it to the shard of the key's slot), plain
//! `SUBSCRIBE` for keyspace events (a node publishes those of its own keys).

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use redis::aio::{MultiplexedConnection, PubSubSink, PubSubStream};
use redis::{PushInfo, PushKind, RedisError, Value};

/// The side of a subscriber connection that (un)subscribes.
pub(crate) enum Sink {
    /// A single server's subscriber connection.
    Plain(PubSubSink),
    /// A connection to one cluster node, `SSUBSCRIBE` (sharded) or `SUBSCRIBE`.
    Node { connection: MultiplexedConnection, sharded: bool },
}

/// What a subscriber connection delivers.
pub(crate) enum Event {
    /// A message on `channel`.
    Message { channel: String, payload: String },
    /// The server took the subscription to `channel` away (a cluster node does so for the
    /// channels of a slot it no longer serves), or confirmed an unsubscription.
    Dropped(String),
}

/// The messages of a subscriber connection; ends when the connection does.
pub(crate) struct Messages {
    events: Pin<Box<dyn Stream<Item = Event> + Send>>,
    /// A cluster node's connection, kept open while its messages are read even if the sink is
    /// gone (as the crate's own subscriber stream keeps its connection).
    _connection: Option<MultiplexedConnection>,
}

impl Messages {
    pub(crate) fn plain(stream: PubSubStream) -> Self {
        let events = stream.map(|message| Event::Message {
            channel: message.get_channel_name().to_owned(),
            // Read as bytes: a revocation's reason may be any bytes, and a message that is not
            // UTF-8 must not come through empty.
            payload: String::from_utf8_lossy(message.get_payload_bytes()).into_owned(),
        });
        Self { events: Box::pin(events), _connection: None }
    }

    pub(crate) fn pushes(
        pushes: tokio::sync::mpsc::UnboundedReceiver<PushInfo>,
        connection: MultiplexedConnection,
    ) -> Self {
        let events = futures_util::stream::unfold(pushes, |mut pushes| async move {
            loop {
                let push = pushes.recv().await?;
                let text = |value: Option<&Value>| match value {
                    Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                    Some(Value::SimpleString(text)) => text.clone(),
                    _ => String::new(),
                };
                let event = match push.kind {
                    PushKind::Disconnection => return None,
                    PushKind::Message | PushKind::SMessage => Event::Message {
                        channel: text(push.data.first()),
                        payload: text(push.data.get(1)),
                    },
                    PushKind::SUnsubscribe | PushKind::Unsubscribe => {
                        Event::Dropped(text(push.data.first()))
                    }
                    _ => continue,
                };
                return Some((event, pushes));
            }
        });
        Self { events: Box::pin(events), _connection: Some(connection) }
    }

    /// The next event; `None` once the connection ended.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        self.events.next().await
    }
}

impl Sink {
    pub(crate) async fn subscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        match self {
            Self::Plain(sink) => sink.subscribe(channel).await,
            Self::Node { connection, sharded } => {
                let name = if *sharded { "SSUBSCRIBE" } else { "SUBSCRIBE" };
                redis::cmd(name).arg(channel).query_async::<Value>(connection).await.map(drop)
            }
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        match self {
            Self::Plain(sink) => sink.unsubscribe(channel).await,
            Self::Node { connection, sharded } => {
                let name = if *sharded { "SUNSUBSCRIBE" } else { "UNSUBSCRIBE" };
                redis::cmd(name).arg(channel).query_async::<Value>(connection).await.map(drop)
            }
        }
    }
}
