//! The errors of the client, one type per operation, so that callers match on what they can act on.

use redis::RedisError;

/// Why [`Client::connect`](crate::Client::connect) gave no client.
#[derive(Debug)]
pub enum ConnectError {
    /// The URL cannot be used: malformed, or a scheme this client does not speak (TLS).
    Config(RedisError),
    /// No connection within [`ClientOptions::connect_timeout`](crate::ClientOptions::connect_timeout):
    /// refused (nothing listens), timed out (no answer), reset or closed during the handshake, or
    /// the host name did not resolve.
    Unreachable(RedisError),
    /// The server answered the handshake with an error (a wrong password, a database it lacks).
    Server(RedisError),
}

impl ConnectError {
    /// Classifies an error met while opening a connection: any I/O error means the server was
    /// not reached.
    pub(crate) fn classify(error: RedisError) -> Self {
        if error.is_io_error() {
            Self::Unreachable(error)
        } else if error.kind() == redis::ErrorKind::InvalidClientConfig {
            Self::Config(error)
        } else {
            Self::Server(error)
        }
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Config(e) => write!(f, "cannot connect with this URL: {e}"),
            Self::Unreachable(e) => write!(f, "dlock server unreachable: {e}"),
            Self::Server(e) => write!(f, "dlock server refused the connection: {e}"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(e) | Self::Unreachable(e) | Self::Server(e) => Some(e),
        }
    }
}

/// Why an ACQUIRE did not give a lease.
#[derive(Debug)]
pub enum AcquireError {
    /// Another token holds the lock (after the wait, if one was asked for).
    Held,
    /// The server could not be reached; nothing was granted: every attempt failed before the
    /// request left (refused, timed out connecting, the connection already closed by the server).
    Unreachable(RedisError),
    /// The outcome is unknown: the request may have reached the server, and its answer never
    /// came back (lost, cut off, or too late for [`ClientOptions::request_timeout`](crate::ClientOptions::request_timeout)),
    /// until [`ClientOptions::acquire_deadline`](crate::ClientOptions::acquire_deadline). The
    /// client has already released whatever grant `token` may have, from a connection of its
    /// own (`released`: one was found and released). If that RELEASE failed too, a grant may
    /// remain until its ttl: [`Client::release`](crate::Client::release) it when the server is
    /// back, or let it expire; never retry with another token.
    Unknown {
        /// The token the unknown grant would belong to.
        token: String,
        /// The last error seen.
        source: RedisError,
        /// Whether a grant under `token` was found and released: `false` when there was none,
        /// or when the RELEASE could not reach the server either.
        released: bool,
    },
    /// The lock was granted, but fewer replicas than
    /// [`ClientOptions::replicas`](crate::ClientOptions::replicas) acknowledged it in time, so a
    /// failover could forget it. The grant was released again (`released`), or, if that failed
    /// too, expires by itself under `token`.
    NotReplicated {
        /// The token of the grant.
        token: String,
        /// Replicas that acknowledged the grant.
        acked: u64,
        /// Replicas asked for.
        wanted: u32,
        /// Whether the grant was released again.
        released: bool,
    },
    /// The server answered with an error (bad argument, wrong type, not the primary …).
    Server(RedisError),
}

impl AcquireError {
    /// A short label for metrics and logs: `held`, `unreachable`, `unknown`, `not_replicated`,
    /// `server`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Unreachable(_) => "unreachable",
            Self::Unknown { .. } => "unknown",
            Self::NotReplicated { .. } => "not_replicated",
            Self::Server(_) => "server",
        }
    }
}

impl std::fmt::Display for AcquireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Held => write!(f, "the lock is held by another owner"),
            Self::Unreachable(e) => write!(f, "dlock server unreachable: {e}"),
            Self::Unknown { token, source, released } => write!(
                f,
                "acquire outcome unknown for token {token} (a grant found and released: {released}): {source}"
            ),
            Self::NotReplicated { acked, wanted, released, .. } => write!(
                f,
                "granted but acknowledged by {acked} of {wanted} replicas (released again: {released})"
            ),
            Self::Server(e) => write!(f, "dlock server refused the acquire: {e}"),
        }
    }
}

impl std::error::Error for AcquireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unreachable(e) | Self::Server(e) | Self::Unknown { source: e, .. } => Some(e),
            Self::Held | Self::NotReplicated { .. } => None,
        }
    }
}

/// Why [`Lease::run`](crate::Lease::run) did not end cleanly.
#[derive(Debug)]
pub enum RunError<T> {
    /// The lease was lost while the work ran; the work was cancelled.
    LockLost(LossReason),
    /// The work finished (`output`), but the lease could not be released: it will expire by itself.
    NotReleased {
        /// What the work returned.
        output: T,
        /// Why the RELEASE failed (or answered 0: the lease was already gone).
        reason: String,
    },
}

impl<T: std::fmt::Debug> std::fmt::Display for RunError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::LockLost(reason) => write!(f, "lock lost while working: {reason}"),
            Self::NotReleased { reason, .. } => write!(f, "work done but not released: {reason}"),
        }
    }
}

impl<T: std::fmt::Debug> std::error::Error for RunError<T> {}

/// How a lease was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// The server refused a renewal: the lease had expired or belongs to someone else (of a
    /// [`SetLease`](crate::SetLease): some member had).
    RenewalRefused,
    /// The lease's conservative local expiry passed while the last renewal sent had no answer:
    /// it failed, timed out, or was still outstanding.
    Unreachable(String),
    /// The lease's conservative local expiry passed with no renewal waiting for an answer: the
    /// process did not run in time to send the due renewal (a stopped process, a blocked
    /// executor thread, a long pause), while the server, as far as the client knows, was
    /// reachable. A renewal found due after the local expiry is not sent.
    Stalled,
    /// The server announced the lease's end (a `dlock.expired` keyspace event, or a deletion
    /// confirmed by FENCECHECK) before a renewal noticed.
    Ended(String),
    /// An operator revoked the lease (`DLOCK.REVOKE`): the resource's channel said
    /// `revoked <fence> <reason>` with this lease's fence. Holds the reason the operator gave
    /// (empty when none was). Reported at once, without waiting for a renewal; no RELEASE
    /// follows (the server already ended the lease; of a [`SetLease`](crate::SetLease), one
    /// member's revocation loses the set, and the members still held are released).
    Revoked(String),
}

impl LossReason {
    /// A short label for metrics and logs: `renewal_refused`, `unreachable`, `stalled`,
    /// `ended`, `revoked`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::RenewalRefused => "renewal_refused",
            Self::Unreachable(_) => "unreachable",
            Self::Stalled => "stalled",
            Self::Ended(_) => "ended",
            Self::Revoked(_) => "revoked",
        }
    }
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::RenewalRefused => write!(f, "the server refused the renewal"),
            Self::Unreachable(detail) => write!(f, "no renewal before the local expiry: {detail}"),
            Self::Stalled => {
                write!(f, "the process did not run in time to renew before the local expiry")
            }
            Self::Ended(event) => write!(f, "the server ended the lease ({event})"),
            Self::Revoked(reason) if reason.is_empty() => {
                write!(f, "an operator revoked the lease")
            }
            Self::Revoked(reason) => write!(f, "an operator revoked the lease: {reason}"),
        }
    }
}

/// Why a fenced write did not happen.
#[derive(Debug)]
pub enum FencedError {
    /// The fence is no longer the live lease's: the write was refused and nothing changed.
    Stale(String),
    /// Redis Cluster: a key of the inner command does not hash to the resource's slot, so the
    /// server refused to run it (the server's message names the key). Name the lock and its
    /// data with one hash tag (`invoice:{123}`, `invoice:{123}:data`).
    CrossSlot(String),
    /// Any other error (the inner command's own, or the connection's).
    Redis(RedisError),
}

impl std::fmt::Display for FencedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stale(detail) => write!(f, "stale fence, write refused: {detail}"),
            Self::CrossSlot(detail) => {
                write!(f, "fenced command outside the resource's cluster slot: {detail}")
            }
            Self::Redis(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for FencedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Redis(e) => Some(e),
            Self::Stale(_) | Self::CrossSlot(_) => None,
        }
    }
}
