//! Redis Cluster: which primary serves which slot (`CLUSTER SLOTS`), one [`Node`] per primary
//! (each with its own shared connection, as a standalone client has one), and the slot of a
//! resource, so that every command goes straight to the primary of its resource's slot.
//!
//! The map is read at connect time and again after a `MOVED` reply (which also points its slot
//! at the node it names at once) and after a node failed to answer (a failover may have moved
//! its slots), at most once per [`REFRESH_AT_MOST_EVERY`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, RedisConnectionInfo, RedisError, Value};

use crate::connection::Node;

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = dlock_proto::slot::SLOTS as usize;

/// The shortest time between two reads of the slot map (a failing node makes every request
/// ask for one).
const REFRESH_AT_MOST_EVERY: Duration = Duration::from_millis(100);

/// The slot `key` hashes to (`dlock_proto::slot::key_slot`).
pub(crate) use dlock_proto::slot::key_slot as slot;

/// The cluster as this client knows it.
pub(crate) struct Topology {
    /// The addresses the client was given, asked for the map when no known node answers.
    seeds: Vec<String>,
    /// Credentials and protocol for every node (database 0: a cluster has no other).
    base: RedisConnectionInfo,
    /// Per slot, the address (`host:port`) of its primary; empty before the first map.
    slots: RwLock<Vec<Arc<str>>>,
    /// One node per address, made when first needed.
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    /// When the map was last read; held while reading it.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
    /// `MOVED` and `ASK` replies this client followed.
    redirects: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn address_of(info: &ConnectionInfo) -> Result<String, RedisError> {
    match &info.addr {
        ConnectionAddr::Tcp(host, port) => Ok(format!("{host}:{port}")),
        _ => Err(RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a Redis Cluster node is reached at redis://host:port",
        ))),
    }
}

impl Topology {
    /// A topology seeded with `urls` (`redis://host:port`, with credentials if needed); the
    /// map is not read yet ([`Topology::refresh`]).
    pub(crate) fn new(urls: &[&str]) -> Result<Self, RedisError> {
        let mut seeds = Vec::new();
        let mut base = None;
        for url in urls {
            let info = redis::Client::open(*url)?.get_connection_info().clone();
            seeds.push(address_of(&info)?);
            base.get_or_insert(info.redis);
        }
        let mut base = base.ok_or_else(|| {
            RedisError::from((redis::ErrorKind::InvalidClientConfig, "no cluster node given"))
        })?;
        base.db = 0;
        Ok(Self {
            seeds,
            base,
            slots: RwLock::new(Vec::new()),
            nodes: Mutex::default(),
            refreshed: tokio::sync::Mutex::new(None),
            redirects: AtomicU64::new(0),
        })
    }

    /// The node at `address`, made if new.
    pub(crate) fn node(&self, address: &str) -> Result<Arc<Node>, RedisError> {
        let mut nodes = lock(&self.nodes);
        if let Some(node) = nodes.get(address) {
            return Ok(node.clone());
        }
        let (host, port) = address.rsplit_once(':').ok_or_else(|| bad_address(address))?;
        let port: u16 = port.parse().map_err(|_| bad_address(address))?;
        let info = ConnectionInfo {
            addr: ConnectionAddr::Tcp(host.to_owned(), port),
            redis: self.base.clone(),
        };
        let node = Arc::new(Node::new(redis::Client::open(info)?, address.to_owned()));
        nodes.insert(address.to_owned(), node.clone());
        Ok(node)
    }

    /// The address of the primary serving `slot`, as far as this client knows.
    pub(crate) fn address_of_slot(&self, slot: u16) -> Option<Arc<str>> {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        slots.get(usize::from(slot)).filter(|address| !address.is_empty()).cloned()
    }

    /// The node serving `key`'s slot, reading the map first if no node is known for it.
    pub(crate) async fn node_for(
        &self,
        key: &[u8],
        timeout: Duration,
    ) -> Result<Arc<Node>, RedisError> {
        let slot = slot(key);
        if self.address_of_slot(slot).is_none() {
            self.refresh(timeout).await?;
        }
        let address = self.address_of_slot(slot).ok_or_else(|| {
            RedisError::from((redis::ErrorKind::ClusterDown, "no node serves the slot"))
        })?;
        self.node(&address)
    }

    /// Follows a `MOVED` reply: its slot is served by the node it names from now on, and the
    /// map is read again (one moved slot often means more: a failover moves a whole shard).
    /// The `MOVED` wins over the map read after it: the node that answered the map may not know
    /// of the move yet.
    pub(crate) async fn moved(&self, slot: u16, address: &str, timeout: Duration) {
        self.redirected();
        if let Err(error) = self.refresh(timeout).await {
            tracing::debug!(%error, "dlock: cannot read the cluster's slot map");
        }
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        if slots.len() == SLOTS {
            slots[usize::from(slot)] = Arc::from(address);
        }
    }

    /// Counts a redirect followed.
    pub(crate) fn redirected(&self) {
        self.redirects.fetch_add(1, Ordering::Relaxed);
    }

    /// The redirects followed so far.
    pub(crate) fn redirects(&self) -> u64 {
        self.redirects.load(Ordering::Relaxed)
    }

    /// Reads the slot map from the first node that answers `CLUSTER SLOTS` (the known
    /// primaries, then the seeds), unless it was read less than [`REFRESH_AT_MOST_EVERY`] ago.
    pub(crate) async fn refresh(&self, timeout: Duration) -> Result<(), RedisError> {
        let mut refreshed = self.refreshed.lock().await;
        if refreshed.is_some_and(|at| at.elapsed() < REFRESH_AT_MOST_EVERY)
            && !self.slots.read().unwrap_or_else(PoisonError::into_inner).is_empty()
        {
            return Ok(());
        }
        let mut candidates: Vec<String> = {
            let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
            let mut known: Vec<String> = slots.iter().map(|a| a.to_string()).collect();
            known.sort();
            known.dedup();
            known.retain(|a| !a.is_empty());
            known
        };
        candidates.extend(self.seeds.iter().cloned());
        let mut last = None;
        for candidate in candidates {
            match self.read_map(&candidate, timeout).await {
                Ok(map) => {
                    *self.slots.write().unwrap_or_else(PoisonError::into_inner) = map;
                    *refreshed = Some(Instant::now());
                    return Ok(());
                }
                Err(error) => last = Some(error),
            }
        }
        *refreshed = Some(Instant::now());
        Err(last.unwrap_or_else(|| {
            RedisError::from((redis::ErrorKind::ClusterDown, "no cluster node answered"))
        }))
    }

    async fn read_map(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<Vec<Arc<str>>, RedisError> {
        let node = self.node(address)?;
        let reply: Value = node.query_alone(redis::cmd("CLUSTER").arg("SLOTS"), timeout).await?;
        let host_asked = address.rsplit_once(':').map_or("", |(host, _)| host);
        parse_slots(&reply, host_asked)
    }
}

fn bad_address(address: &str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "not a host:port address",
        address.to_owned(),
    ))
}

/// The map a `CLUSTER SLOTS` reply shows: per slot, its primary's `host:port` (a node that
/// does not know its own address, `""` or `?`, is named by the host that was asked).
fn parse_slots(reply: &Value, host_asked: &str) -> Result<Vec<Arc<str>>, RedisError> {
    let invalid = || RedisError::from((redis::ErrorKind::TypeError, "unexpected CLUSTER SLOTS"));
    let Value::Array(ranges) = reply else { return Err(invalid()) };
    let mut map: Vec<Arc<str>> = vec![Arc::from(""); SLOTS];
    for range in ranges {
        let Value::Array(fields) = range else { return Err(invalid()) };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return Err(invalid());
        };
        let host = match primary.first() {
            Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(Value::SimpleString(host)) => host.clone(),
            _ => String::new(),
        };
        let host = if host.is_empty() || host == "?" { host_asked.to_owned() } else { host };
        let Some(Value::Int(port)) = primary.get(1) else { return Err(invalid()) };
        let address: Arc<str> = Arc::from(format!("{host}:{port}"));
        let (start, end) = (usize::try_from(*start), usize::try_from(*end));
        let (Ok(start), Ok(end)) = (start, end) else { return Err(invalid()) };
        for entry in map.iter_mut().take(end.min(SLOTS - 1) + 1).skip(start) {
            *entry = address.clone();
        }
    }
    Ok(map)
}
