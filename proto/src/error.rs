//! Error replies: the codes dlock's own errors start with, and the class of every error reply a
//! client can meet on a dlock command, which says what the client does next. The module spells
//! its replies in `src/core/error.rs` with these codes; `protocol/vectors/errors.json` lists
//! every reply it can send with its class.

use crate::command::OPTIONS;

/// A fenced command whose fence is not the live lease's: nothing ran.
pub const STALE: &str = "STALE";
/// A fenced command with a key outside the resource's Cluster slot: nothing ran.
pub const CROSSSLOT: &str = "CROSSSLOT";
/// A token that holds a lease of one mode asking for the other.
pub const LOCKMODE: &str = "LOCKMODE";
/// The start of the reply to an argument the server does not know (an option of a newer
/// version, sent to an older server, reads as one), followed by the argument and `'`.
pub const UNEXPECTED_ARGUMENT: &str = "ERR syntax error: unexpected argument '";

/// What a client does after an error reply. The same names (snake case) in every language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// `MOVED`, `ASK`: the slot is served elsewhere; nothing ran. Follow the redirect.
    Redirect,
    /// `TRYAGAIN`, `LOADING`, `CLUSTERDOWN`, `MASTERDOWN`: the server ran nothing for now.
    /// Retry with the same token after a pause, until the attempt's deadline.
    Retry,
    /// `READONLY`: the node is (becoming) a replica; nothing ran. Retry with the same token on
    /// the new primary, until the attempt's deadline.
    Failover,
    /// `UNBLOCKED`: the server ended a wait (its primary turned into a replica, `CLIENT
    /// UNBLOCK`). A hand-over made an instant before may exist, and the server undoes it (its
    /// reply never reached the client): retry with the same token until the attempt's deadline,
    /// and count the request as having reached the server.
    Unblocked,
    /// `STALE`: a fenced command's fence is not live; nothing ran.
    Stale,
    /// `CROSSSLOT`: a fenced command's key is outside the resource's slot; nothing ran.
    CrossSlot,
    /// `LOCKMODE`: the token holds a lease of the other mode; release it first.
    ModeConflict,
    /// An option this server does not know: the module is older than the client.
    Unsupported,
    /// `NOAUTH`, `WRONGPASS`, `NOPERM`: credentials or ACL rules refuse the request.
    Auth,
    /// `WRONGTYPE`: the resource's key holds another type.
    WrongType,
    /// Any other `ERR`: an argument out of bounds, a wrong arity, an inner command that cannot
    /// run under a fence. A bug in the caller (or a setting such as `dlock.max-ttl-ms`).
    Usage,
    /// The server cannot serve the request (its fence counter is exhausted, an internal error)
    /// or answered with a code no class covers.
    Server,
}

impl ErrorClass {
    /// Every class, in the order of the contract's table.
    pub const ALL: [Self; 12] = [
        Self::Redirect,
        Self::Retry,
        Self::Failover,
        Self::Unblocked,
        Self::Stale,
        Self::CrossSlot,
        Self::ModeConflict,
        Self::Unsupported,
        Self::Auth,
        Self::WrongType,
        Self::Usage,
        Self::Server,
    ];

    /// The class's name in logs, metrics and the vectors.
    pub fn name(self) -> &'static str {
        match self {
            Self::Redirect => "redirect",
            Self::Retry => "retry",
            Self::Failover => "failover",
            Self::Unblocked => "unblocked",
            Self::Stale => "stale",
            Self::CrossSlot => "cross_slot",
            Self::ModeConflict => "mode_conflict",
            Self::Unsupported => "unsupported",
            Self::Auth => "auth",
            Self::WrongType => "wrong_type",
            Self::Usage => "usage",
            Self::Server => "server",
        }
    }

    /// Whether the server surely ran nothing, so that the same request may be sent again with
    /// the same token and cannot have been granted by this answer.
    pub fn ran_nothing(self) -> bool {
        matches!(self, Self::Redirect | Self::Retry | Self::Failover)
    }
}

/// The class of the error reply `reply` (its whole text, code first, as the server sent it).
pub fn classify(reply: &str) -> ErrorClass {
    let code = reply.split(' ').next().unwrap_or("");
    match code {
        "MOVED" | "ASK" => ErrorClass::Redirect,
        "TRYAGAIN" | "LOADING" | "CLUSTERDOWN" | "MASTERDOWN" => ErrorClass::Retry,
        "READONLY" => ErrorClass::Failover,
        "UNBLOCKED" => ErrorClass::Unblocked,
        STALE => ErrorClass::Stale,
        CROSSSLOT => ErrorClass::CrossSlot,
        LOCKMODE => ErrorClass::ModeConflict,
        "NOAUTH" | "WRONGPASS" | "NOPERM" => ErrorClass::Auth,
        "WRONGTYPE" => ErrorClass::WrongType,
        "ERR" if unsupported_option(reply).is_some() => ErrorClass::Unsupported,
        "ERR" if SERVER_TROUBLE.iter().any(|start| reply.starts_with(start)) => ErrorClass::Server,
        "ERR" => ErrorClass::Usage,
        _ => ErrorClass::Server,
    }
}

/// The starts of the `ERR` replies that are the server's trouble, not the caller's.
const SERVER_TROUBLE: [&str; 2] = ["ERR fence counter exhausted", "ERR internal error"];

/// The option keyword an older server refused as an unknown argument (`CLAIM` from a server
/// without claim windows), upper case; `None` for any other reply.
pub fn unsupported_option(reply: &str) -> Option<&'static str> {
    let named = reply.strip_prefix(UNEXPECTED_ARGUMENT)?.strip_suffix('\'')?;
    OPTIONS.into_iter().find(|option| option.eq_ignore_ascii_case(named))
}

/// The largest value a bounds error allows (`ERR timeout-ms must be an integer between 0 and
/// 86400000` → 86400000, `ERR META must be between 1 and 1024 bytes long` → 1024): a client that waits without limit can wait in slices of it.
pub fn upper_bound(reply: &str) -> Option<u64> {
    let (_, tail) = reply.rsplit_once(" between ")?;
    let (_, upper) = tail.split_once(" and ")?;
    let digits = upper.split(' ').next()?;
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_its_own_name() {
        let names: std::collections::HashSet<_> =
            ErrorClass::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), ErrorClass::ALL.len());
    }

    #[test]
    fn an_unknown_option_is_unsupported_only_when_it_is_ours() {
        assert_eq!(
            unsupported_option("ERR syntax error: unexpected argument 'CLAIM'"),
            Some("CLAIM")
        );
        assert_eq!(
            unsupported_option("ERR syntax error: unexpected argument 'claim'"),
            Some("CLAIM")
        );
        assert_eq!(classify("ERR syntax error: unexpected argument 'FOO'"), ErrorClass::Usage);
        assert_eq!(upper_bound("ERR timeout-ms must be an integer between 0 and 5000"), Some(5000));
        assert_eq!(upper_bound("ERR fence must be a positive integer"), None);
    }
}
