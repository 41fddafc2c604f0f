//! An async client for dlock: leases with fencing tokens, held in a Redis (or Valkey) server with
//! the dlock module, whose renewal lives and dies with the work they protect.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! let client = dlock_client::Client::connect("redis://127.0.0.1:6379/").await?;
//! let lease = client.acquire("invoice:123", Duration::from_secs(30)).await?;
//! let fence = lease.fence(); // send it with every write the lease protects
//! let total = lease
//!     .run(|cancelled| async move {
//!         // The work: check `cancelled.is_cancelled()` between steps; if the lease is lost the
//!         // future is cancelled (and dropped if it does not stop by itself).
//!         fence * 2
//!     })
//!     .await?;
//! # let _ = total;
//! # Ok(())
//! # }
//! ```
//!
//! What the API guarantees:
//! - A token is made (UUID v4) before the first send, and an ambiguous ACQUIRE (a timeout, a
//!   dropped connection) is retried with the *same* token until the caller's deadline, so one
//!   grant never gets two fences; if the outcome stays unknown, the client releases that token
//!   from a connection of its own (bounded in time) before returning [`AcquireError::Unknown`],
//!   which carries the token and whether a grant was found and released. An attempt the caller
//!   drops (its own timeout, a cancelled task) is released the same way in the background.
//! - A wait ([`Client::acquire_waiting`]) sends `CLAIM` (twice
//!   [`ClientOptions::request_timeout`], at least 1 s, at most the ttl) and claims the grant with
//!   the same ACQUIRE without `WAIT`: a hand-over this client never reads lapses after that window.
//!   Such a wait holds a connection of its own; with [`WaitStrategy::Tickets`] waiters take a
//!   place in line with `QUEUE` on the shared connection instead and wake on the resource's
//!   channel (one subscriber connection per client), so any number of them cost two
//!   connections; one that gives up or is dropped leaves the line and releases its token.
//! - [`Lease::run`] renews every third of the ttl only while the work runs, in the same task (the
//!   renewal cannot outlive `run`); a refused renewal, the lease's conservative local expiry
//!   without an answered renewal ([`LossReason::Unreachable`] when the last renewal sent got no
//!   answer, [`LossReason::Stalled`] when the task did not run in time to send it: a blocked
//!   executor thread, a stopped process; a renewal due after the local expiry is not sent), or
//!   the server announcing the lease's end ([`ClientOptions::watch_events`]) cancel the work and
//!   return [`RunError::LockLost`]; when the work ends, an owner-checked RELEASE is sent with a
//!   bounded timeout and a failed release is reported, not swallowed. Only a RELEASE whose
//!   outcome is unknown counts as a release failure: one answered 0 is the loss `ended`, and
//!   the best-effort RELEASE after a loss counts as neither.
//! - An operator's `DLOCK.REVOKE` ends the work at once: from its grant on, a lease listens on
//!   its resource's channel (on the client's one subscriber connection per server, shared with
//!   the ticket waiters; the subscription is made in the background, so the grant is not
//!   delayed), and a `revoked` message with its fence cancels the work and returns
//!   [`LossReason::Revoked`] with the operator's reason, with no RELEASE after it. The lease
//!   leaves the channel when it ends. A revocation the channel did not carry (it raced the
//!   subscription, or the subscriber was down) is found by the next renewal, as
//!   [`LossReason::RenewalRefused`].
//! - Connecting is bounded by [`ClientOptions::connect_timeout`] and fails as
//!   [`ConnectError::Unreachable`] when nothing listens, nothing answers or the connection is
//!   cut. A request is never sent on a connection the server already closed: it opens a new one
//!   first, so an ACQUIRE that could not reach a dead server is [`AcquireError::Unreachable`]
//!   (nothing granted), and [`AcquireError::Unknown`] is kept for requests that may have arrived.
//! - The local expiry is conservative: counted from *before* the ACQUIRE or RENEW was sent, so it
//!   is never later than the server's deadline (unless the server caps the ttl with
//!   `dlock.max-hold-ms`).
//! - With [`ClientOptions::replicas`], a grant or renewal counts only once that many replicas
//!   acknowledged it (`WAIT`); a grant they did not acknowledge is released and reported as
//!   [`AcquireError::NotReplicated`], a renewal they did not acknowledge counts as failed.
//! - Read-write locks and semaphores: [`Client::read`], [`Client::write`] and
//!   [`Client::semaphore`] (or [`Client::acquire_with`] and a [`Mode`]) give the same [`Lease`],
//!   with the same lifecycle; each shared holder has its own token, fence and deadline.
//! - Sets of resources: [`Client::acquire_all`] grants every resource of a set to one token, or
//!   none (`DLOCK.ACQUIREALL`), each member with its own fence; the [`SetLease`] lives as one
//!   lease (renewed whole, lost whole when any member is, released whole). A set that waits
//!   takes a ticket in every member's line and holds nothing meanwhile.
//! - Leader election: [`Client::campaign`] waits until it leads and gives a [`Leadership`]
//!   (the lease, its address as `META`, its fence as the term's epoch); [`Client::observe`] is a
//!   stream of leader changes, `None` when nobody leads, that never misses a change that lasts.
//! - Fenced writes: [`Lease::fenced`] for data in the same Redis (`DLOCK.FENCED`), [`sql`] for
//!   rows elsewhere; a stale worker's refused write is its own error, never a silent no-op.
//! - Redis Cluster: [`Client::connect_cluster`] gives the same client, every command sent to the
//!   primary of its resource's slot (following `MOVED` and `ASK`), the resources' channels
//!   subscribed with `SSUBSCRIBE` on their primary (one ticket subscriber per primary); a fenced
//!   command with a key of another slot is [`FencedError::CrossSlot`]. A fenced write or a release
//!   the server cannot have carried out (no connection to a killed primary, `TRYAGAIN` while its
//!   slot migrates, `CLUSTERDOWN`, `READONLY` …) is sent again until the lease's local expiry.
//! - Figures go through the `metrics` facade and ownership transitions are `tracing` events
//!   ([`observe`] lists them).

use std::time::Duration;

pub use tokio_util::sync::CancellationToken;

mod acquire;
mod cluster;
mod connection;
mod election;
mod error;
mod lease;
pub mod observe;
mod protocol;
mod pubsub;
mod set;
pub mod sql;
mod tickets;

pub use acquire::{AcquireOptions, Mode, WaitStrategy};
pub use connection::Client;
pub use election::{Leader, LeaderChanges, Leadership, channel_of};
pub use error::{AcquireError, ConnectError, FencedError, LossReason, RunError};
pub use lease::{Fencing, Lease};
pub use set::SetLease;

/// This client's version (its crate's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Settings of a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long opening a connection (TCP or Unix socket, and the handshake) may take before the
    /// server counts as unreachable: [`Client::connect`] fails with
    /// [`ConnectError::Unreachable`], and a request that needed a new connection was never sent.
    pub connect_timeout: Duration,
    /// How long one request may take before its outcome counts as unknown (a WAIT adds its own
    /// timeout to this). Twice this (at least 1 s) is the claim window of a wait.
    pub request_timeout: Duration,
    /// How long an ACQUIRE keeps retrying an unknown outcome with the same token.
    pub acquire_deadline: Duration,
    /// How long `run` lets cancelled work finish before dropping it.
    pub cancel_grace: Duration,
    /// Durability: count a grant or renewal only once this many replicas acknowledged it.
    /// Each such request uses a connection of its own (WAIT blocks the connection it runs on).
    pub replicas: Option<Replicas>,
    /// While [`Lease::run`] works, subscribe to the resource's keyspace channel and cancel the
    /// work as soon as the server announces the lease's end (`dlock.expired`; a deletion is
    /// confirmed with FENCECHECK first). Needs `notify-keyspace-events` with `K` and `d` on the
    /// server, and one more connection per running lease. Off by default; renewals alone still
    /// detect the loss within a third of the ttl. A [`SetLease`] is watched by its renewals
    /// alone.
    pub watch_events: bool,
    /// How acquires wait when their [`AcquireOptions`] do not say
    /// ([`AcquireOptions::strategy`]): [`WaitStrategy::Blocking`] (`WAIT`, a connection per
    /// waiter) by default, or [`WaitStrategy::Tickets`] (`QUEUE`, two connections per client
    /// however many wait).
    pub wait_strategy: WaitStrategy,
}

/// How many replicas must acknowledge a grant or renewal, and how long to wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replicas {
    /// Replicas that must acknowledge (`WAIT numreplicas`).
    pub count: u32,
    /// How long to wait for them (`WAIT timeout`).
    pub timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(2),
            acquire_deadline: Duration::from_secs(10),
            cancel_grace: Duration::from_millis(100),
            replicas: None,
            watch_events: false,
            wait_strategy: WaitStrategy::Blocking,
        }
    }
}
