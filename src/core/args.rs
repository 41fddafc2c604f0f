//! Argument parsing for every command: bytes in, typed requests or a [`DlockError`] out.
//!
//! The rules of docs/design.md: durations are integers in `1..=max_ttl_ms` (`0` allowed for the
//! WAIT timeout), fences are positive integers, tokens are `1..=512` opaque bytes, keywords are
//! case-insensitive. Integers are read the way Redis reads them: optional `-`, decimal digits, no
//! `+`, no spaces, no leading zeros.

use super::DlockError;
pub use super::limits::{
    MAX_LIMIT, MAX_LIST_COUNT, MAX_META_LEN, MAX_REASON_LEN, MAX_SET_SIZE, MAX_TOKEN_LEN,
    MAX_TOP_COUNT,
};
use super::mode::Mode;

/// Default of `dlock.max-ttl-ms`, the upper bound of `ttl-ms` and `timeout-ms`: one day.
pub const DEFAULT_MAX_TTL_MS: u64 = 86_400_000;

/// `DLOCK.ACQUIRE resource token ttl-ms [SHARED [LIMIT n]] [WAIT timeout-ms | QUEUE ticket-ms]
/// [CLAIM claim-ms] [META value]`, minus the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    /// The would-be owner's token.
    pub token: &'a [u8],
    /// Lease length in milliseconds.
    pub ttl_ms: u64,
    /// `WAIT timeout-ms`, when given (`Some(0)`: wait without limit).
    pub wait_ms: Option<u64>,
    /// `CLAIM claim-ms`: a lease handed over while the caller waits first runs at most this long.
    pub claim_ms: Option<u64>,
    /// `QUEUE ticket-ms`: not granted at once, the token takes (or keeps) a place in line that
    /// stands this long unless the same ACQUIRE is sent again.
    pub queue_ms: Option<u64>,
    /// Exclusive, or `SHARED [LIMIT n]`.
    pub mode: Mode,
    /// `META value`: the holder's metadata.
    pub meta: Option<&'a [u8]>,
    /// `NOTIFY request` (with `QUEUE` only): the ticket's grant is told on its own channel,
    /// naming this number (the latest the ticket was refreshed with).
    pub notify: Option<u64>,
}

/// The bounds of `NOTIFY request`, as its error states them.
pub const NOTIFY_RANGE: &str = "an integer between 0 and 9223372036854775807";

/// `DLOCK.RENEW resource token ttl-ms [FENCE fence]`, minus the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewArgs<'a> {
    /// The owner's token.
    pub token: &'a [u8],
    /// New lease length in milliseconds, counted from now.
    pub ttl_ms: u64,
    /// `FENCE fence`: only the grant with this fence is renewed.
    pub fence: Option<u64>,
}

/// `DLOCK.RELEASE resource token [FENCE fence]`, minus the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReleaseArgs<'a> {
    /// The owner's token.
    pub token: &'a [u8],
    /// `FENCE fence`: only the grant with this fence is released.
    pub fence: Option<u64>,
}

/// Parses the arguments of ACQUIRE after the resource: `token ttl-ms [WAIT timeout-ms]`.
pub fn acquire<'a>(args: &[&'a [u8]], max_ttl_ms: u64) -> Result<AcquireArgs<'a>, DlockError> {
    acquire_as("dlock.acquire", args, max_ttl_ms)
}

/// The arguments of ACQUIREALL after its resources: ACQUIRE's, without `WAIT` and `CLAIM` (a
/// set waits with `QUEUE` tickets, and is never handed over: its holder takes it).
pub fn acquire_all<'a>(args: &[&'a [u8]], max_ttl_ms: u64) -> Result<AcquireArgs<'a>, DlockError> {
    const COMMAND: &str = "dlock.acquireall";
    let request = acquire_as(COMMAND, args, max_ttl_ms)?;
    let waits = [
        ("WAIT", request.wait_ms.is_some()),
        ("CLAIM", request.claim_ms.is_some()),
        ("NOTIFY", request.notify.is_some()),
    ];
    match waits.into_iter().find(|(_, given)| *given) {
        Some((option, _)) => Err(DlockError::NotForSets(option, COMMAND)),
        None => Ok(request),
    }
}

fn acquire_as<'a>(
    command: &'static str,
    args: &[&'a [u8]],
    max_ttl_ms: u64,
) -> Result<AcquireArgs<'a>, DlockError> {
    let [token, ttl, options @ ..] = args else {
        return Err(DlockError::WrongArity(command));
    };
    let token = parse_token(token)?;
    let ttl_ms = parse_ttl(ttl, max_ttl_ms)?;
    let (mut wait_ms, mut claim_ms, mut queue_ms) = (None, None, None);
    let (mut shared, mut limit, mut meta, mut notify) = (false, None, None, None);
    let mut rest = options.iter();
    while let Some(option) = rest.next() {
        if option.eq_ignore_ascii_case(b"SHARED") {
            if shared {
                return Err(DlockError::RepeatedOption("SHARED"));
            }
            shared = true;
            continue;
        }
        if option.eq_ignore_ascii_case(b"LIMIT") {
            if limit.is_some() {
                return Err(DlockError::RepeatedOption("LIMIT"));
            }
            let n = rest.next().ok_or(DlockError::OptionWithoutValue("LIMIT", "number"))?;
            limit = Some(parse_limit(n)?);
            continue;
        }
        if option.eq_ignore_ascii_case(b"META") {
            if meta.is_some() {
                return Err(DlockError::RepeatedOption("META"));
            }
            let value = rest.next().ok_or(DlockError::OptionWithoutValue("META", "value"))?;
            meta = Some(parse_meta(value)?);
            continue;
        }
        if option.eq_ignore_ascii_case(b"WAIT") && wait_ms.is_none() {
            let timeout = rest.next().ok_or(DlockError::WaitWithoutTimeout)?;
            wait_ms = Some(parse_timeout(timeout, max_ttl_ms)?);
        } else if option.eq_ignore_ascii_case(b"QUEUE") {
            if queue_ms.is_some() {
                return Err(DlockError::RepeatedOption("QUEUE"));
            }
            let ticket = rest.next().ok_or(DlockError::OptionWithoutValue("QUEUE", "ticket-ms"))?;
            queue_ms = Some(parse_ticket(ticket, max_ttl_ms)?);
        } else if option.eq_ignore_ascii_case(b"NOTIFY") {
            if notify.is_some() {
                return Err(DlockError::RepeatedOption("NOTIFY"));
            }
            let request = rest.next().ok_or(DlockError::OptionWithoutValue("NOTIFY", "request"))?;
            notify = Some(parse_request(request)?);
        } else if option.eq_ignore_ascii_case(b"CLAIM") {
            if claim_ms.is_some() {
                return Err(DlockError::RepeatedOption("CLAIM"));
            }
            let claim = rest.next().ok_or(DlockError::OptionWithoutValue("CLAIM", "claim-ms"))?;
            claim_ms = Some(parse_claim(claim, max_ttl_ms)?);
        } else {
            return Err(DlockError::UnknownOption(printable(option)));
        }
    }
    if wait_ms.is_some() && queue_ms.is_some() {
        return Err(DlockError::ConflictingOptions("WAIT", "QUEUE"));
    }
    if limit.is_some() && !shared {
        return Err(DlockError::OptionNeeds("LIMIT", "SHARED"));
    }
    if notify.is_some() && queue_ms.is_none() {
        return Err(DlockError::OptionNeeds("NOTIFY", "QUEUE"));
    }
    let mode = if shared { Mode::Shared { limit } } else { Mode::Exclusive };
    Ok(AcquireArgs { token, ttl_ms, wait_ms, claim_ms, queue_ms, mode, meta, notify })
}

/// A semaphore's size: an integer in `1..=MAX_LIMIT`.
pub fn parse_limit(bytes: &[u8]) -> Result<u32, DlockError> {
    parse_int(bytes)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| (1..=MAX_LIMIT).contains(n))
        .ok_or(DlockError::BadLimit { max: MAX_LIMIT })
}

/// Holder metadata: any bytes, 1 to [`MAX_META_LEN`] of them.
pub fn parse_meta(bytes: &[u8]) -> Result<&[u8], DlockError> {
    if (1..=MAX_META_LEN).contains(&bytes.len()) {
        Ok(bytes)
    } else {
        Err(DlockError::BadMeta { max: MAX_META_LEN })
    }
}

/// Parses the arguments of RENEW after the resource: `token ttl-ms [FENCE fence]`.
pub fn renew<'a>(args: &[&'a [u8]], max_ttl_ms: u64) -> Result<RenewArgs<'a>, DlockError> {
    let [token, ttl, options @ ..] = args else {
        return Err(DlockError::WrongArity("dlock.renew"));
    };
    let token = parse_token(token)?;
    let ttl_ms = parse_ttl(ttl, max_ttl_ms)?;
    Ok(RenewArgs { token, ttl_ms, fence: fence_option(options, "dlock.renew")? })
}

/// Parses the arguments of RELEASE after the resource: `token [FENCE fence]`.
pub fn release<'a>(args: &[&'a [u8]]) -> Result<ReleaseArgs<'a>, DlockError> {
    let [token, options @ ..] = args else {
        return Err(DlockError::WrongArity("dlock.release"));
    };
    let token = parse_token(token)?;
    Ok(ReleaseArgs { token, fence: fence_option(options, "dlock.release")? })
}

/// The options of RENEW and RELEASE: `[FENCE fence]`. Anything else where the first option
/// would be is the arity error these commands always gave.
fn fence_option(options: &[&[u8]], command: &'static str) -> Result<Option<u64>, DlockError> {
    let mut fence = None;
    let mut rest = options.iter();
    while let Some(option) = rest.next() {
        if !option.eq_ignore_ascii_case(b"FENCE") {
            return Err(if fence.is_none() {
                DlockError::WrongArity(command)
            } else {
                DlockError::UnknownOption(printable(option))
            });
        }
        if fence.is_some() {
            return Err(DlockError::RepeatedOption("FENCE"));
        }
        let value = rest.next().ok_or(DlockError::OptionWithoutValue("FENCE", "fence"))?;
        fence = Some(parse_fence(value)?);
    }
    Ok(fence)
}

/// A set's `numkeys`: 1 to [`MAX_SET_SIZE`], and no more than the `available` arguments after it.
pub fn numkeys(bytes: &[u8], available: usize) -> Result<usize, DlockError> {
    parse_int(bytes)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=MAX_SET_SIZE.min(available)).contains(n))
        .ok_or(DlockError::BadNumKeys { max: MAX_SET_SIZE })
}

/// The arguments of RENEWALL and RELEASEALL after the resources: the token, the ttl (RENEWALL),
/// and `[FENCES fence …]` with one fence per resource, in the resources' order.
#[derive(Debug, PartialEq, Eq)]
pub struct SetArgs<'a> {
    /// The token holding every member.
    pub token: &'a [u8],
    /// The new ttl (RENEWALL; 0 for RELEASEALL).
    pub ttl_ms: u64,
    /// Each member's fence, when given.
    pub fences: Option<Vec<u64>>,
}

impl SetArgs<'_> {
    /// The fence given for member `index`, if any.
    pub fn fence(&self, index: usize) -> Option<u64> {
        self.fences.as_ref().and_then(|fences| fences.get(index).copied())
    }
}

/// Parses RENEWALL's `token ttl-ms [FENCES fence …]` for a set of `count` resources.
pub fn renew_all<'a>(
    args: &[&'a [u8]],
    count: usize,
    max_ttl_ms: u64,
) -> Result<SetArgs<'a>, DlockError> {
    let [token, ttl, options @ ..] = args else {
        return Err(DlockError::WrongArity("dlock.renewall"));
    };
    let token = parse_token(token)?;
    let ttl_ms = parse_ttl(ttl, max_ttl_ms)?;
    Ok(SetArgs { token, ttl_ms, fences: fences_option(options, count)? })
}

/// Parses RELEASEALL's `token [FENCES fence …]` for a set of `count` resources.
pub fn release_all<'a>(args: &[&'a [u8]], count: usize) -> Result<SetArgs<'a>, DlockError> {
    let [token, options @ ..] = args else {
        return Err(DlockError::WrongArity("dlock.releaseall"));
    };
    let token = parse_token(token)?;
    Ok(SetArgs { token, ttl_ms: 0, fences: fences_option(options, count)? })
}

/// `[FENCES fence …]`: exactly `count` fences after the keyword.
fn fences_option(options: &[&[u8]], count: usize) -> Result<Option<Vec<u64>>, DlockError> {
    let Some((keyword, fences)) = options.split_first() else {
        return Ok(None);
    };
    if !keyword.eq_ignore_ascii_case(b"FENCES") {
        return Err(DlockError::UnknownOption(printable(keyword)));
    }
    if fences.len() != count {
        return Err(DlockError::FencesPerResource { count });
    }
    fences.iter().map(|fence| parse_fence(fence)).collect::<Result<Vec<_>, _>>().map(Some)
}

/// The arguments of REVOKE after the resource.
#[derive(Debug, PartialEq, Eq)]
pub struct RevokeArgs<'a> {
    /// `FENCE fence`: only the live lease with this fence is revoked.
    pub fence: Option<u64>,
    /// `REASON reason`: told to the channel and the log (empty when not given).
    pub reason: &'a [u8],
}

/// Parses the arguments of REVOKE after the resource: `[FENCE fence] [REASON reason]`, in any
/// order, each at most once.
pub fn revoke<'a>(args: &[&'a [u8]]) -> Result<RevokeArgs<'a>, DlockError> {
    let mut revoke = RevokeArgs { fence: None, reason: &[] };
    let (mut fence_seen, mut reason_seen) = (false, false);
    let mut rest = args.iter();
    while let Some(option) = rest.next() {
        if option.eq_ignore_ascii_case(b"FENCE") {
            if std::mem::replace(&mut fence_seen, true) {
                return Err(DlockError::RepeatedOption("FENCE"));
            }
            let value = rest.next().ok_or(DlockError::OptionWithoutValue("FENCE", "fence"))?;
            revoke.fence = Some(parse_fence(value)?);
        } else if option.eq_ignore_ascii_case(b"REASON") {
            if std::mem::replace(&mut reason_seen, true) {
                return Err(DlockError::RepeatedOption("REASON"));
            }
            let value = rest.next().ok_or(DlockError::OptionWithoutValue("REASON", "reason"))?;
            if !(1..=MAX_REASON_LEN).contains(&value.len()) {
                return Err(DlockError::BadReason { max: MAX_REASON_LEN });
            }
            revoke.reason = value;
        } else {
            return Err(DlockError::UnknownOption(printable(option)));
        }
    }
    Ok(revoke)
}

/// Which locks `DLOCK.LIST` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListFilter {
    /// Every lock.
    All,
    /// Locks with a live lease.
    Held,
    /// Locks with someone in line (blocked clients or tickets).
    Waiting,
}

/// The arguments of LIST after the cursor.
#[derive(Debug, PartialEq, Eq)]
pub struct ListArgs<'a> {
    /// `MATCH pattern`, as SCAN takes it.
    pub pattern: Option<&'a [u8]>,
    /// `COUNT count`: how much of the keyspace one call looks at (SCAN's hint), 1 to
    /// [`MAX_LIST_COUNT`]; 10 when not given.
    pub count: usize,
    /// `HELD` or `WAITING`.
    pub filter: ListFilter,
}

/// Parses the arguments of LIST after the cursor: `[MATCH pattern] [COUNT count]
/// [HELD | WAITING]`, in any order, each at most once.
pub fn list<'a>(args: &[&'a [u8]]) -> Result<ListArgs<'a>, DlockError> {
    let mut list = ListArgs { pattern: None, count: 10, filter: ListFilter::All };
    let (mut count_seen, mut filter_seen) = (false, false);
    let mut rest = args.iter();
    while let Some(option) = rest.next() {
        if option.eq_ignore_ascii_case(b"MATCH") {
            if list.pattern.is_some() {
                return Err(DlockError::RepeatedOption("MATCH"));
            }
            let value = rest.next().ok_or(DlockError::OptionWithoutValue("MATCH", "pattern"))?;
            list.pattern = Some(value);
        } else if option.eq_ignore_ascii_case(b"COUNT") {
            if std::mem::replace(&mut count_seen, true) {
                return Err(DlockError::RepeatedOption("COUNT"));
            }
            list.count = parse_count(rest.next(), MAX_LIST_COUNT)?;
        } else if option.eq_ignore_ascii_case(b"HELD") || option.eq_ignore_ascii_case(b"WAITING") {
            let held = option.eq_ignore_ascii_case(b"HELD");
            let filter = if held { ListFilter::Held } else { ListFilter::Waiting };
            if std::mem::replace(&mut filter_seen, true) {
                return Err(if list.filter == filter {
                    DlockError::RepeatedOption(if held { "HELD" } else { "WAITING" })
                } else {
                    DlockError::ConflictingOptions("HELD", "WAITING")
                });
            }
            list.filter = filter;
        } else {
            return Err(DlockError::UnknownOption(printable(option)));
        }
    }
    Ok(list)
}

/// The value of `COUNT` (`None`: the option was the last argument): an integer from 1 to `max`.
fn parse_count(value: Option<&&[u8]>, max: usize) -> Result<usize, DlockError> {
    let value = value.ok_or(DlockError::OptionWithoutValue("COUNT", "count"))?;
    parse_int(value)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=max).contains(n))
        .ok_or(DlockError::BadCount { max })
}

/// What `DLOCK.TOP` orders the watched locks by, largest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopOrder {
    /// Requests in line now (blocked clients and tickets).
    Waiters,
    /// How long the current lease has been held.
    HeldMs,
    /// Leases handed to a waiting request since the lock was first watched.
    Handovers,
}

/// The arguments of TOP: `[BY waiters | held-ms | handovers] [COUNT n]`, in any order, each at
/// most once; by waiters, 10 locks when not given.
#[derive(Debug, PartialEq, Eq)]
pub struct TopArgs {
    /// `BY`.
    pub order: TopOrder,
    /// `COUNT`: at most this many locks, 1 to [`MAX_TOP_COUNT`].
    pub count: usize,
}

/// Parses the arguments of TOP.
pub fn top(args: &[&[u8]]) -> Result<TopArgs, DlockError> {
    let mut top = TopArgs { order: TopOrder::Waiters, count: 10 };
    let (mut by_seen, mut count_seen) = (false, false);
    let mut rest = args.iter();
    while let Some(option) = rest.next() {
        if option.eq_ignore_ascii_case(b"BY") {
            if std::mem::replace(&mut by_seen, true) {
                return Err(DlockError::RepeatedOption("BY"));
            }
            let value = rest.next().ok_or(DlockError::OptionWithoutValue("BY", "measure"))?;
            top.order = if value.eq_ignore_ascii_case(b"waiters") {
                TopOrder::Waiters
            } else if value.eq_ignore_ascii_case(b"held-ms") {
                TopOrder::HeldMs
            } else if value.eq_ignore_ascii_case(b"handovers") {
                TopOrder::Handovers
            } else {
                return Err(DlockError::BadChoice("BY", "waiters, held-ms or handovers"));
            };
        } else if option.eq_ignore_ascii_case(b"COUNT") {
            if std::mem::replace(&mut count_seen, true) {
                return Err(DlockError::RepeatedOption("COUNT"));
            }
            top.count = parse_count(rest.next(), MAX_TOP_COUNT)?;
        } else {
            return Err(DlockError::UnknownOption(printable(option)));
        }
    }
    Ok(top)
}

/// Parses the arguments of FENCECHECK after the resource: `fence`.
pub fn fencecheck(args: &[&[u8]]) -> Result<u64, DlockError> {
    let [fence] = args else {
        return Err(DlockError::WrongArity("dlock.fencecheck"));
    };
    parse_fence(fence)
}

/// A token: any bytes, 1 to [`MAX_TOKEN_LEN`] of them.
pub fn parse_token(bytes: &[u8]) -> Result<&[u8], DlockError> {
    if (1..=MAX_TOKEN_LEN).contains(&bytes.len()) { Ok(bytes) } else { Err(DlockError::BadToken) }
}

/// A lease length: an integer in `1..=max_ttl_ms`.
pub fn parse_ttl(bytes: &[u8], max_ttl_ms: u64) -> Result<u64, DlockError> {
    parse_int(bytes)
        .and_then(|n| u64::try_from(n).ok())
        .filter(|n| (1..=max_ttl_ms).contains(n))
        .ok_or(DlockError::BadTtl { max: max_ttl_ms })
}

/// A claim window: an integer in `1..=max_ttl_ms`.
pub fn parse_claim(bytes: &[u8], max_ttl_ms: u64) -> Result<u64, DlockError> {
    parse_ttl(bytes, max_ttl_ms).map_err(|_| DlockError::BadClaim { max: max_ttl_ms })
}

/// A `NOTIFY` request number: an integer in `0..=i64::MAX`.
pub fn parse_request(bytes: &[u8]) -> Result<u64, DlockError> {
    parse_int(bytes)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or(DlockError::BadChoice("NOTIFY", NOTIFY_RANGE))
}

/// A ticket's life: an integer in `1..=max_ttl_ms`.
pub fn parse_ticket(bytes: &[u8], max_ttl_ms: u64) -> Result<u64, DlockError> {
    parse_ttl(bytes, max_ttl_ms).map_err(|_| DlockError::BadTicket { max: max_ttl_ms })
}

/// A WAIT timeout: an integer in `0..=max_ttl_ms`, `0` meaning no limit.
pub fn parse_timeout(bytes: &[u8], max_ttl_ms: u64) -> Result<u64, DlockError> {
    parse_int(bytes)
        .and_then(|n| u64::try_from(n).ok())
        .filter(|n| *n <= max_ttl_ms)
        .ok_or(DlockError::BadTimeout { max: max_ttl_ms })
}

/// A fence: a positive integer that fits a signed 64-bit reply.
pub fn parse_fence(bytes: &[u8]) -> Result<u64, DlockError> {
    parse_int(bytes)
        .and_then(|n| u64::try_from(n).ok())
        .filter(|n| *n >= 1)
        .ok_or(DlockError::BadFence)
}

/// Reads a signed 64-bit integer in Redis's strict form, or `None`.
pub fn parse_int(bytes: &[u8]) -> Option<i64> {
    let (negative, digits) = match bytes {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, bytes),
    };
    let canonical = match digits {
        [] => false,
        [b'0'] => !negative,
        [b'0', ..] => false,
        _ => true,
    };
    if !canonical {
        return None;
    }
    // Up to 18 digits cannot overflow: one pass, no checked arithmetic (every ttl a client
    // sends).
    if digits.len() <= 18 {
        let mut value = 0i64;
        for &digit in digits {
            let digit = digit.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            value = value * 10 + i64::from(digit);
        }
        return Some(if negative { -value } else { value });
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Accumulate negatively so that i64::MIN parses too.
    let mut value: i64 = 0;
    for digit in digits {
        value = value.checked_mul(10)?.checked_sub(i64::from(digit - b'0'))?;
    }
    if negative { Some(value) } else { value.checked_neg() }
}

/// A short rendering of a client's argument for an error reply: printable ASCII only, every other
/// byte (and the quote) shown as `?`, so an error reply never carries NUL, CR/LF or non-ASCII.
pub fn printable(bytes: &[u8]) -> String {
    const SHOWN: usize = 32;
    let mut text: String =
        bytes[..bytes.len().min(SHOWN)]
            .iter()
            .map(|&b| {
                if (b.is_ascii_graphic() && b != b'\'') || b == b' ' { char::from(b) } else { '?' }
            })
            .collect();
    if bytes.len() > SHOWN {
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {

    #[test]
    fn top_takes_by_and_count_in_any_order_once_each() {
        use super::{MAX_TOP_COUNT, TopArgs, TopOrder, top};
        assert_eq!(top(&[]), Ok(TopArgs { order: TopOrder::Waiters, count: 10 }));
        assert_eq!(
            top(&[b"count", b"3", b"by", b"HELD-MS"]),
            Ok(TopArgs { order: TopOrder::HeldMs, count: 3 })
        );
        assert_eq!(
            top(&[b"BY", b"handovers"]),
            Ok(TopArgs { order: TopOrder::Handovers, count: 10 })
        );
        assert_eq!(
            top(&[b"BY", b"fences"]),
            Err(DlockError::BadChoice("BY", "waiters, held-ms or handovers"))
        );
        assert_eq!(top(&[b"BY"]), Err(DlockError::OptionWithoutValue("BY", "measure")));
        assert_eq!(
            top(&[b"BY", b"waiters", b"BY", b"waiters"]),
            Err(DlockError::RepeatedOption("BY"))
        );
        for count in [&b"0"[..], b"1001", b"-1", b"x"] {
            assert_eq!(top(&[b"COUNT", count]), Err(DlockError::BadCount { max: MAX_TOP_COUNT }));
        }
        assert_eq!(top(&[b"COUNT", b"1000"]).map(|t| t.count), Ok(1_000));
        assert_eq!(top(&[b"HELD"]), Err(DlockError::UnknownOption("HELD".into())));
    }
    use super::*;
    use proptest::prelude::*;

    const MAX: u64 = DEFAULT_MAX_TTL_MS;

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        for (text, value) in [
            ("0", Some(0)),
            ("1", Some(1)),
            ("-1", Some(-1)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775808", None),
            ("-0", None),
            ("+1", None),
            ("01", None),
            (" 1", None),
            ("1 ", None),
            ("1.5", None),
            ("1e3", None),
            ("", None),
            ("-", None),
            ("abc", None),
        ] {
            assert_eq!(parse_int(text.as_bytes()), value, "{text:?}");
        }
    }

    #[test]
    fn ttl_must_lie_between_one_and_the_maximum() {
        assert_eq!(parse_ttl(b"1", MAX), Ok(1));
        assert_eq!(parse_ttl(b"86400000", MAX), Ok(MAX));
        for bad in ["0", "-5", "86400001", "1.5", "x", "", "99999999999999999999"] {
            assert_eq!(
                parse_ttl(bad.as_bytes(), MAX),
                Err(DlockError::BadTtl { max: MAX }),
                "{bad}"
            );
        }
    }

    #[test]
    fn timeout_allows_zero_meaning_forever() {
        assert_eq!(parse_timeout(b"0", MAX), Ok(0));
        assert_eq!(parse_timeout(b"-1", MAX), Err(DlockError::BadTimeout { max: MAX }));
        assert_eq!(parse_timeout(b"86400001", MAX), Err(DlockError::BadTimeout { max: MAX }));
    }

    #[test]
    fn fences_are_positive_integers() {
        assert_eq!(parse_fence(b"1"), Ok(1));
        assert_eq!(parse_fence(b"9223372036854775807"), Ok(i64::MAX as u64));
        for bad in ["0", "-1", "1.0", "abc", "", "18446744073709551615"] {
            assert_eq!(parse_fence(bad.as_bytes()), Err(DlockError::BadFence), "{bad}");
        }
    }

    #[test]
    fn tokens_are_one_to_512_opaque_bytes() {
        assert_eq!(parse_token(b"\0\xff"), Ok(&b"\0\xff"[..]));
        assert_eq!(parse_token(&[7u8; 512]), Ok(&[7u8; 512][..]));
        assert_eq!(parse_token(b""), Err(DlockError::BadToken));
        assert_eq!(parse_token(&[7u8; 513]), Err(DlockError::BadToken));
    }

    #[test]
    fn acquire_reads_token_ttl_and_an_optional_case_insensitive_wait() {
        assert_eq!(
            acquire(&[b"w1", b"30000"], MAX),
            Ok(AcquireArgs {
                token: b"w1",
                ttl_ms: 30_000,
                wait_ms: None,
                claim_ms: None,
                queue_ms: None,
                mode: Mode::Exclusive,
                meta: None,
                notify: None,
            })
        );
        assert_eq!(
            acquire(&[b"w1", b"30000", b"wAiT", b"0"], MAX),
            Ok(AcquireArgs {
                token: b"w1",
                ttl_ms: 30_000,
                wait_ms: Some(0),
                claim_ms: None,
                queue_ms: None,
                mode: Mode::Exclusive,
                meta: None,
                notify: None,
            })
        );
        assert_eq!(acquire(&[b"w1", b"30000", b"WAIT"], MAX), Err(DlockError::WaitWithoutTimeout));
        assert_eq!(
            acquire(&[b"w1", b"30000", b"WAIT", b"1", b"WAIT", b"2"], MAX),
            Err(DlockError::UnknownOption("WAIT".into()))
        );
        assert_eq!(
            acquire(&[b"w1", b"30000", b"NX"], MAX),
            Err(DlockError::UnknownOption("NX".into()))
        );
        assert_eq!(acquire(&[b"w1"], MAX), Err(DlockError::WrongArity("dlock.acquire")));
        // The first bad argument, in order, is the one reported.
        assert_eq!(acquire(&[b"", b"0"], MAX), Err(DlockError::BadToken));
    }

    #[test]
    fn acquire_takes_shared_with_a_limit_and_metadata_in_any_order_once() {
        type Parsed<'a> = (Mode, Option<&'a [u8]>, Option<u64>);
        fn parsed<'a>(args: &[&'a [u8]]) -> Result<Parsed<'a>, DlockError> {
            acquire(args, MAX).map(|a| (a.mode, a.meta, a.wait_ms))
        }
        assert_eq!(
            parsed(&[b"w", b"100", b"shared"]),
            Ok((Mode::Shared { limit: None }, None, None))
        );
        assert_eq!(
            parsed(&[b"w", b"100", b"LIMIT", b"3", b"WAIT", b"5", b"SHARED", b"META", b"h=a"]),
            Ok((Mode::Shared { limit: Some(3) }, Some(&b"h=a"[..]), Some(5)))
        );
        assert_eq!(
            parsed(&[b"w", b"100", b"META", b"x"]),
            Ok((Mode::Exclusive, Some(&b"x"[..]), None))
        );
        for (args, error) in [
            (&[&b"LIMIT"[..], b"3"][..], DlockError::OptionNeeds("LIMIT", "SHARED")),
            (&[b"SHARED", b"SHARED"], DlockError::RepeatedOption("SHARED")),
            (&[b"SHARED", b"LIMIT", b"1", b"LIMIT", b"2"], DlockError::RepeatedOption("LIMIT")),
            (&[b"SHARED", b"LIMIT"], DlockError::OptionWithoutValue("LIMIT", "number")),
            (&[b"SHARED", b"LIMIT", b"0"], DlockError::BadLimit { max: MAX_LIMIT }),
            (&[b"SHARED", b"LIMIT", b"1000001"], DlockError::BadLimit { max: MAX_LIMIT }),
            (&[b"SHARED", b"LIMIT", b"-1"], DlockError::BadLimit { max: MAX_LIMIT }),
            (&[b"META"], DlockError::OptionWithoutValue("META", "value")),
            (&[b"META", b""], DlockError::BadMeta { max: MAX_META_LEN }),
            (&[b"META", b"a", b"META", b"b"], DlockError::RepeatedOption("META")),
        ] {
            let mut all: Vec<&[u8]> = vec![b"w", b"100"];
            all.extend_from_slice(args);
            assert_eq!(acquire(&all, MAX), Err(error), "{args:?}");
        }
        let long = [b'm'; MAX_META_LEN + 1];
        assert_eq!(
            acquire(&[b"w", b"100", b"META", &long], MAX),
            Err(DlockError::BadMeta { max: MAX_META_LEN })
        );
        assert_eq!(
            parsed(&[b"w", b"100", b"META", &long[1..]]).map(|p| p.1.map(<[u8]>::len)),
            Ok(Some(MAX_META_LEN))
        );
    }

    #[test]
    fn acquire_takes_a_claim_window_in_any_order_once() {
        let args = |claim| AcquireArgs {
            token: b"w",
            ttl_ms: 30_000,
            wait_ms: Some(5),
            claim_ms: claim,
            queue_ms: None,
            mode: Mode::Exclusive,
            meta: None,
            notify: None,
        };
        assert_eq!(
            acquire(&[b"w", b"30000", b"CLAIM", b"500", b"WAIT", b"5"], MAX),
            Ok(args(Some(500)))
        );
        assert_eq!(
            acquire(&[b"w", b"30000", b"wait", b"5", b"claim", b"500"], MAX),
            Ok(args(Some(500)))
        );
        assert_eq!(
            acquire(&[b"w", b"30000", b"CLAIM"], MAX),
            Err(DlockError::OptionWithoutValue("CLAIM", "claim-ms"))
        );
        assert_eq!(
            acquire(&[b"w", b"30000", b"CLAIM", b"0"], MAX),
            Err(DlockError::BadClaim { max: MAX })
        );
        assert_eq!(
            acquire(&[b"w", b"30000", b"CLAIM", b"5", b"CLAIM", b"5"], MAX),
            Err(DlockError::RepeatedOption("CLAIM"))
        );
    }

    #[test]
    fn notify_numbers_a_tickets_request_and_needs_queue() {
        let notify = |args: &[&[u8]]| acquire(args, MAX).map(|a| a.notify);
        assert_eq!(notify(&[b"w", b"1000", b"QUEUE", b"5000", b"notify", b"0"]), Ok(Some(0)));
        assert_eq!(
            notify(&[b"w", b"1000", b"NOTIFY", b"9223372036854775807", b"QUEUE", b"5000"]),
            Ok(Some(i64::MAX as u64))
        );
        assert_eq!(notify(&[b"w", b"1000", b"QUEUE", b"5000"]), Ok(None));
        let bad = Err(DlockError::BadChoice("NOTIFY", NOTIFY_RANGE));
        for value in [&b"-1"[..], b"01", b"x", b"9223372036854775808", b""] {
            assert_eq!(notify(&[b"w", b"1000", b"QUEUE", b"5000", b"NOTIFY", value]), bad);
        }
        assert_eq!(
            notify(&[b"w", b"1000", b"NOTIFY", b"1"]),
            Err(DlockError::OptionNeeds("NOTIFY", "QUEUE"))
        );
        assert_eq!(
            notify(&[b"w", b"1000", b"WAIT", b"5", b"NOTIFY", b"1"]),
            Err(DlockError::OptionNeeds("NOTIFY", "QUEUE"))
        );
        assert_eq!(
            notify(&[b"w", b"1000", b"QUEUE", b"5", b"NOTIFY", b"1", b"NOTIFY", b"2"]),
            Err(DlockError::RepeatedOption("NOTIFY"))
        );
        assert_eq!(
            notify(&[b"w", b"1000", b"QUEUE", b"5", b"NOTIFY"]),
            Err(DlockError::OptionWithoutValue("NOTIFY", "request"))
        );
        assert_eq!(
            acquire_all(&[b"w", b"1000", b"QUEUE", b"5", b"NOTIFY", b"1"], MAX),
            Err(DlockError::NotForSets("NOTIFY", "dlock.acquireall"))
        );
        let message = DlockError::BadChoice("NOTIFY", NOTIFY_RANGE).to_string();
        assert_eq!(message, "ERR NOTIFY must be an integer between 0 and 9223372036854775807");
        assert_eq!(dlock_proto::error::upper_bound(&message), Some(i64::MAX as u64));
    }

    #[test]
    fn acquire_takes_a_ticket_but_never_with_wait() {
        assert_eq!(
            acquire(&[b"w", b"30000", b"queue", b"5000"], MAX).map(|a| (a.queue_ms, a.wait_ms)),
            Ok((Some(5_000), None))
        );
        assert_eq!(
            acquire(&[b"w", b"30000", b"QUEUE", b"5000", b"WAIT", b"1"], MAX),
            Err(DlockError::ConflictingOptions("WAIT", "QUEUE"))
        );
        assert_eq!(
            acquire(&[b"w", b"30000", b"QUEUE", b"0"], MAX),
            Err(DlockError::BadTicket { max: MAX })
        );
        assert_eq!(
            acquire(&[b"w", b"30000", b"QUEUE"], MAX),
            Err(DlockError::OptionWithoutValue("QUEUE", "ticket-ms"))
        );
    }

    #[test]
    fn renew_and_release_take_an_optional_case_insensitive_fence() {
        let max = DEFAULT_MAX_TTL_MS;
        assert_eq!(
            renew(&[b"w", b"1000"], max),
            Ok(RenewArgs { token: b"w", ttl_ms: 1_000, fence: None })
        );
        assert_eq!(
            renew(&[b"w", b"1000", b"fence", b"42"], max),
            Ok(RenewArgs { token: b"w", ttl_ms: 1_000, fence: Some(42) })
        );
        assert_eq!(release(&[b"w"]), Ok(ReleaseArgs { token: b"w", fence: None }));
        assert_eq!(
            release(&[b"w", b"FENCE", b"7"]),
            Ok(ReleaseArgs { token: b"w", fence: Some(7) })
        );
        assert_eq!(
            release(&[b"w", b"FENCE"]),
            Err(DlockError::OptionWithoutValue("FENCE", "fence"))
        );
        assert_eq!(release(&[b"w", b"FENCE", b"0"]), Err(DlockError::BadFence));
        assert_eq!(
            release(&[b"w", b"FENCE", b"7", b"FENCE", b"7"]),
            Err(DlockError::RepeatedOption("FENCE"))
        );
        assert_eq!(
            renew(&[b"w", b"1000", b"WAIT", b"7"], max),
            Err(DlockError::WrongArity("dlock.renew")),
            "as before FENCE existed"
        );
        assert_eq!(
            release(&[b"w", b"FENCE", b"7", b"x"]),
            Err(DlockError::UnknownOption("x".into()))
        );
        assert_eq!(release(&[]), Err(DlockError::WrongArity("dlock.release")));
    }

    #[test]
    fn unknown_arguments_are_shown_printable_and_short() {
        assert_eq!(printable(b"a\r\nb'"), "a??b?");
        assert_eq!(printable("\u{100}x\0".as_bytes()), "??x?", "non-ASCII and NUL never pass");
        assert_eq!(printable(&[b'x'; 40]), format!("{}...", "x".repeat(32)));
    }

    proptest! {
        #[test]
        fn parse_int_agrees_with_the_canonical_rendering(n in any::<i64>()) {
            prop_assert_eq!(parse_int(n.to_string().as_bytes()), Some(n));
        }

        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = parse_int(&bytes);
            let _ = parse_ttl(&bytes, MAX);
            let _ = parse_fence(&bytes);
            prop_assert!(printable(&bytes).bytes().all(|b| (0x20..0x7f).contains(&b)));
        }
    }
}
