//! Every error a dlock command can answer with, and the one place that spells its reply text.

use std::fmt;

use dlock_proto::error::{CROSSSLOT, LOCKMODE, STALE, UNEXPECTED_ARGUMENT};

pub use super::limits::MAX_FENCE;

/// What went wrong with a command. `Display` gives the exact error reply, code first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DlockError {
    /// Too few or too many arguments for the named command.
    WrongArity(&'static str),
    /// `ttl-ms` missing its bounds or not an integer.
    BadTtl { max: u64 },
    /// `timeout-ms` of `WAIT` out of bounds or not an integer.
    BadTimeout { max: u64 },
    /// `claim-ms` of `CLAIM` out of bounds or not an integer.
    BadClaim { max: u64 },
    /// `ticket-ms` of `QUEUE` out of bounds or not an integer.
    BadTicket { max: u64 },
    /// Two options (named) that cannot be given together.
    ConflictingOptions(&'static str, &'static str),
    /// Token empty or longer than [`crate::core::limits::MAX_TOKEN_LEN`].
    BadToken,
    /// Fence not a positive integer.
    BadFence,
    /// An argument where none is expected, or an unknown keyword; carries a printable rendering.
    UnknownOption(String),
    /// `WAIT` given without its timeout.
    WaitWithoutTimeout,
    /// An option (named) given more than once.
    RepeatedOption(&'static str),
    /// An option (named) given without its value (named).
    OptionWithoutValue(&'static str, &'static str),
    /// The fence counter reached [`MAX_FENCE`]; no further grant is possible.
    FencesExhausted,
    /// A lease decision asked of a (writable) replica.
    NotPrimary,
    /// DLOCK.FENCED with a fence that is not the live lease's; `current` when a lease lives.
    Stale { fence: u64, resource: String, current: Option<u64> },
    /// DLOCK.FENCED with an inner command that cannot run under a fence.
    FencedRefused { command: String, reason: &'static str },
    /// DLOCK.FENCED in cluster mode with an inner key outside the resource's slot.
    CrossSlot { key: String, resource: String },
    /// An inner command of DLOCK.FENCED that the server could not run (unknown, bad arity, …).
    InnerCommand(String),
    /// The key holds a value of another type.
    WrongType,
    /// An internal replication command sent by a client rather than the primary or the AOF.
    InternalCommand(&'static str),
    /// A replicated or persisted lease that does not describe a valid lease.
    BadReplicatedLease(&'static str),
    /// `LIMIT n` out of bounds or not an integer.
    BadLimit { max: u32 },
    /// `META value` empty or too long.
    BadMeta { max: usize },
    /// An option (first) that only makes sense with another (second).
    OptionNeeds(&'static str, &'static str),
    /// A grant of a key-less resource whose slot this node is taking, before the old owner's
    /// fence counter arrived (`core::slotfloor`).
    SlotMoving,
    /// The token holds a lease of the other mode (`held`: "shared" or "exclusive").
    ModeConflict { held: &'static str, asked: &'static str },
    /// A `REASON` of `DLOCK.REVOKE` that is empty or longer than `max` bytes.
    BadReason { max: usize },
    /// A `COUNT` of `DLOCK.LIST` or `DLOCK.TOP` outside 1 to `max`.
    BadCount { max: usize },
    /// An option (named) whose value is none of the choices (listed).
    BadChoice(&'static str, &'static str),
    /// A set's `numkeys` outside 1 to `max`, or more than the arguments that follow.
    BadNumKeys { max: usize },
    /// A resource named twice in one set.
    RepeatedResource(String),
    /// An option (named) that a set command (named) does not take.
    NotForSets(&'static str, &'static str),
    /// `FENCES` without one fence per resource (`count`).
    FencesPerResource { count: usize },
}

impl fmt::Display for DlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WrongArity(command) => {
                write!(f, "ERR wrong number of arguments for '{command}' command")
            }
            Self::BadTtl { max } => {
                write!(f, "ERR ttl-ms must be an integer between 1 and {max}")
            }
            Self::BadTimeout { max } => {
                write!(f, "ERR timeout-ms must be an integer between 0 and {max}")
            }
            Self::BadClaim { max } => {
                write!(f, "ERR claim-ms must be an integer between 1 and {max}")
            }
            Self::BadTicket { max } => {
                write!(f, "ERR ticket-ms must be an integer between 1 and {max}")
            }
            Self::ConflictingOptions(a, b) => {
                write!(f, "ERR syntax error: {a} and {b} cannot be combined")
            }
            Self::BadToken => write!(
                f,
                "ERR token must be between 1 and {} bytes long",
                super::limits::MAX_TOKEN_LEN
            ),
            Self::BadFence => write!(f, "ERR fence must be a positive integer"),
            Self::UnknownOption(arg) => write!(f, "{UNEXPECTED_ARGUMENT}{arg}'"),
            Self::WaitWithoutTimeout => write!(f, "ERR WAIT needs a timeout-ms argument"),
            Self::RepeatedOption(option) => {
                write!(f, "ERR syntax error: {option} given more than once")
            }
            Self::OptionWithoutValue(option, value) => {
                write!(f, "ERR {option} needs a {value} argument")
            }
            Self::NotPrimary => {
                write!(f, "READONLY dlock grants, renews and releases leases only on the primary")
            }
            Self::Stale { fence, resource, current: Some(current) } => {
                write!(
                    f,
                    "{STALE} fence {fence} does not hold {resource} (current fence {current})"
                )
            }
            Self::Stale { fence, resource, current: None } => {
                write!(f, "{STALE} fence {fence} does not hold {resource} (no live lease)")
            }
            Self::FencedRefused { command, reason } => {
                write!(f, "ERR DLOCK.FENCED refuses '{command}': {reason}")
            }
            Self::CrossSlot { key, resource } => write!(
                f,
                "{CROSSSLOT} key '{key}' of the fenced command does not hash to the slot of '{resource}'"
            ),
            Self::InnerCommand(message) => write!(f, "{message}"),
            Self::WrongType => {
                write!(f, "WRONGTYPE Operation against a key holding the wrong kind of value")
            }
            Self::FencesExhausted => write!(f, "ERR fence counter exhausted; no grant possible"),
            Self::BadLimit { max } => {
                write!(f, "ERR LIMIT must be an integer between 1 and {max}")
            }
            Self::BadCount { max } => {
                write!(f, "ERR COUNT must be an integer between 1 and {max}")
            }
            Self::BadChoice(option, choices) => write!(f, "ERR {option} must be {choices}"),
            Self::BadNumKeys { max } => write!(
                f,
                "ERR numkeys must be an integer between 1 and {max} (the number of resources that follow)"
            ),
            Self::RepeatedResource(resource) => {
                write!(f, "ERR resource '{resource}' appears twice in the set")
            }
            Self::NotForSets(option, command) => {
                write!(f, "ERR syntax error: {command} does not take {option}")
            }
            Self::FencesPerResource { count } => {
                write!(f, "ERR FENCES needs one fence per resource ({count})")
            }
            Self::BadReason { max } => {
                write!(f, "ERR REASON must be between 1 and {max} bytes long")
            }
            Self::BadMeta { max } => {
                write!(f, "ERR META must be between 1 and {max} bytes long")
            }
            Self::OptionNeeds(option, needed) => {
                write!(f, "ERR syntax error: {option} needs {needed}")
            }
            Self::ModeConflict { held, asked } => {
                let article = |mode: &str| if mode.starts_with('e') { "an" } else { "a" };
                write!(
                    f,
                    "{LOCKMODE} the token holds {} {held} lease on this resource and asked for {} \
                     {asked} one; release it first",
                    article(held),
                    article(asked)
                )
            }
            Self::SlotMoving => write!(
                f,
                "TRYAGAIN this node is taking the resource's slot and waits for the fence counter \
                 of its previous owner; retry"
            ),
            Self::InternalCommand(name) => write!(
                f,
                "ERR {name} is internal: only the primary's replication stream and the AOF may send it"
            ),
            Self::BadReplicatedLease(what) => write!(f, "ERR invalid replicated lease: {what}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_reply_starts_with_an_error_code_and_names_its_argument() {
        let cases = [
            (DlockError::WrongArity("dlock.renew"), "dlock.renew"),
            (DlockError::BadTtl { max: 86_400_000 }, "ttl-ms"),
            (DlockError::BadTimeout { max: 86_400_000 }, "timeout-ms"),
            (DlockError::BadClaim { max: 86_400_000 }, "claim-ms"),
            (DlockError::BadTicket { max: 86_400_000 }, "ticket-ms"),
            (DlockError::ConflictingOptions("WAIT", "QUEUE"), "WAIT and QUEUE"),
            (DlockError::BadToken, "token"),
            (DlockError::BadFence, "fence"),
            (DlockError::UnknownOption("FOO".into()), "FOO"),
            (DlockError::WaitWithoutTimeout, "WAIT"),
            (DlockError::RepeatedOption("FENCE"), "FENCE"),
            (DlockError::OptionWithoutValue("FENCE", "fence"), "FENCE needs a fence"),
            (DlockError::FencesExhausted, "fence"),
            (DlockError::InternalCommand("DLOCK.SETLEASE"), "DLOCK.SETLEASE"),
            (DlockError::BadReplicatedLease("deadline"), "deadline"),
            (DlockError::BadLimit { max: 1_000_000 }, "LIMIT"),
            (DlockError::BadMeta { max: 1_024 }, "META"),
            (DlockError::BadReason { max: 256 }, "REASON"),
            (DlockError::BadCount { max: 10_000 }, "COUNT"),
            (DlockError::BadChoice("BY", "waiters, held-ms or handovers"), "BY must be waiters"),
            (DlockError::OptionNeeds("LIMIT", "SHARED"), "LIMIT needs SHARED"),
        ];
        assert_eq!(
            DlockError::ModeConflict { held: "shared", asked: "exclusive" }.to_string(),
            "LOCKMODE the token holds a shared lease on this resource and asked for an exclusive \
             one; release it first"
        );
        assert!(DlockError::NotPrimary.to_string().starts_with("READONLY "));
        assert_eq!(
            DlockError::Stale { fence: 5, resource: "invoice:1".into(), current: Some(7) }
                .to_string(),
            "STALE fence 5 does not hold invoice:1 (current fence 7)"
        );
        assert!(
            DlockError::CrossSlot { key: "a".into(), resource: "b".into() }
                .to_string()
                .starts_with("CROSSSLOT ")
        );
        assert!(DlockError::WrongType.to_string().starts_with("WRONGTYPE "));
        assert!(DlockError::SlotMoving.to_string().starts_with("TRYAGAIN "));
        for (error, names) in cases {
            let text = error.to_string();
            assert!(text.starts_with("ERR "), "{text}");
            assert!(!text.contains('\n') && !text.contains('\r'), "{text}");
            assert!(text.contains(names), "{text} should name {names}");
        }
        assert_eq!(
            DlockError::BadTtl { max: 86_400_000 }.to_string(),
            "ERR ttl-ms must be an integer between 1 and 86400000"
        );
    }

    #[test]
    fn every_error_reply_is_a_shared_vector_with_the_class_clients_give_it() {
        let vectors = dlock_testkit::vectors::load("errors.json");
        let class_of = |reply: &str| {
            vectors
                .as_array()
                .expect("a list")
                .iter()
                .find(|v| v["reply"] == reply)
                .map(|v| dlock_testkit::vectors::text(v, "class").to_owned())
        };
        let max = crate::core::args::DEFAULT_MAX_TTL_MS;
        let every = [
            DlockError::WrongArity("dlock.acquire"),
            DlockError::BadTtl { max },
            DlockError::BadTimeout { max },
            DlockError::BadClaim { max },
            DlockError::BadTicket { max },
            DlockError::ConflictingOptions("WAIT", "QUEUE"),
            DlockError::BadToken,
            DlockError::BadFence,
            DlockError::UnknownOption("FOO".into()),
            DlockError::UnknownOption("CLAIM".into()),
            DlockError::WaitWithoutTimeout,
            DlockError::RepeatedOption("FENCE"),
            DlockError::OptionWithoutValue("FENCE", "fence"),
            DlockError::FencesExhausted,
            DlockError::NotPrimary,
            DlockError::Stale { fence: 5, resource: "invoice:1".into(), current: Some(7) },
            DlockError::Stale { fence: 5, resource: "invoice:1".into(), current: None },
            DlockError::FencedRefused {
                command: "blpop".into(),
                reason: "blocking commands cannot run under a fence",
            },
            DlockError::CrossSlot { key: "other".into(), resource: "invoice:{1}".into() },
            DlockError::InnerCommand("ERR unknown command 'NOSUCH'".into()),
            DlockError::WrongType,
            DlockError::InternalCommand("DLOCK.SETLEASE"),
            DlockError::BadReplicatedLease("deadline"),
            DlockError::BadLimit { max: super::super::limits::MAX_LIMIT },
            DlockError::BadMeta { max: super::super::limits::MAX_META_LEN },
            DlockError::BadReason { max: super::super::limits::MAX_REASON_LEN },
            DlockError::BadCount { max: super::super::limits::MAX_LIST_COUNT },
            DlockError::BadCount { max: super::super::limits::MAX_TOP_COUNT },
            DlockError::BadChoice("BY", "waiters, held-ms or handovers"),
            DlockError::OptionNeeds("LIMIT", "SHARED"),
            DlockError::SlotMoving,
            DlockError::ModeConflict { held: "shared", asked: "exclusive" },
            DlockError::ModeConflict { held: "exclusive", asked: "shared" },
            DlockError::BadNumKeys { max: super::super::limits::MAX_SET_SIZE },
            DlockError::RepeatedResource("invoice:{1}".into()),
            DlockError::NotForSets("WAIT", "dlock.acquireall"),
            DlockError::FencesPerResource { count: 2 },
        ];
        for error in every {
            // A new variant must be added above, and its reply to the vectors.
            match &error {
                DlockError::WrongArity(_)
                | DlockError::BadTtl { .. }
                | DlockError::BadTimeout { .. }
                | DlockError::BadClaim { .. }
                | DlockError::BadTicket { .. }
                | DlockError::ConflictingOptions(..)
                | DlockError::BadToken
                | DlockError::BadFence
                | DlockError::UnknownOption(_)
                | DlockError::WaitWithoutTimeout
                | DlockError::RepeatedOption(_)
                | DlockError::OptionWithoutValue(..)
                | DlockError::FencesExhausted
                | DlockError::NotPrimary
                | DlockError::Stale { .. }
                | DlockError::FencedRefused { .. }
                | DlockError::CrossSlot { .. }
                | DlockError::InnerCommand(_)
                | DlockError::WrongType
                | DlockError::InternalCommand(_)
                | DlockError::BadReplicatedLease(_)
                | DlockError::BadLimit { .. }
                | DlockError::BadMeta { .. }
                | DlockError::BadReason { .. }
                | DlockError::BadCount { .. }
                | DlockError::BadChoice(..)
                | DlockError::OptionNeeds(..)
                | DlockError::SlotMoving
                | DlockError::ModeConflict { .. }
                | DlockError::BadNumKeys { .. }
                | DlockError::RepeatedResource(_)
                | DlockError::NotForSets(..)
                | DlockError::FencesPerResource { .. } => {}
            }
            let reply = error.to_string();
            let class = class_of(&reply).unwrap_or_else(|| panic!("{reply} is in errors.json"));
            assert_eq!(dlock_proto::error::classify(&reply).name(), class, "{reply}");
        }
    }
}
