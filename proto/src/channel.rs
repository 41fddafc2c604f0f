//! The channel where the server publishes a resource's ownership changes, and the messages on
//! it, so that a client holding a ticket (or watching a lock) learns of its turn without polling.
//!
//! The name hashes to the resource's own Cluster slot and belongs to that resource alone: a
//! resource without braces is wrapped in a hash tag (`dlock:{invoice:123}`); any other keeps its
//! bytes, and its own tag, behind `dlock:key:` (`dlock:key:invoice:{123}`). The two forms differ
//! in the byte after `dlock:` (`{` or `k`), so `app:x` and `{app:x}` never share a channel. A
//! name with braces but no usable tag has no channel in its own slot (on a single server, or
//! with `SUBSCRIBE`, that makes no difference).

use crate::decimal::{MAX_DIGITS, append};

/// What every channel name starts with.
pub const PREFIX: &[u8] = b"dlock:";
/// What follows [`PREFIX`] for a resource with braces of its own.
pub const KEEPS_ITS_BRACES: &[u8] = b"key:";

/// The channel of `resource`.
pub fn name(resource: &[u8]) -> Vec<u8> {
    let mut channel = Vec::with_capacity(PREFIX.len() + KEEPS_ITS_BRACES.len() + resource.len());
    write_name(resource, &mut channel);
    channel
}

/// The channel of a resource given as text (clients name resources by strings).
pub fn name_of(resource: &str) -> String {
    // Only ASCII bytes are added around the resource's own, so the name stays valid UTF-8.
    String::from_utf8_lossy(&name(resource.as_bytes())).into_owned()
}

/// Appends the channel of `resource` to `out` (the publishing path reuses one buffer).
pub fn write_name(resource: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(PREFIX);
    if resource.contains(&b'}') || resource.contains(&b'{') {
        out.extend_from_slice(KEEPS_ITS_BRACES);
        out.extend_from_slice(resource);
    } else {
        out.push(b'{');
        out.extend_from_slice(resource);
        out.push(b'}');
    }
}

/// The events a message names, as the server writes them.
pub mod event {
    /// A lease granted to a request that was answered at once.
    pub const ACQUIRED: &str = "acquired";
    /// A lease renewed.
    pub const RENEWED: &str = "renewed";
    /// A lease released.
    pub const RELEASED: &str = "released";
    /// A lease ended by its deadline.
    pub const EXPIRED: &str = "expired";
    /// A lease passed to a waiter or a ticket; the message names the new holder's [`tag`](super::tag).
    pub const HANDOFF: &str = "handoff";
    /// A lease ended by `DLOCK.REVOKE`; the message ends with the revocation's reason, if any
    /// (`revoked 1796207757444058 stuck since 03:00`).
    pub const REVOKED: &str = "revoked";
    /// A ticket's own lease handed over, on the ticket's own channel
    /// ([`write_granted`](super::write_granted)).
    pub const GRANTED: &str = "granted";
}

/// The fence and the reason of a `revoked` message (the reason is empty when none was given),
/// or `None` for any other message.
pub fn revoked(payload: &str) -> Option<(u64, &str)> {
    let rest = payload.strip_prefix(event::REVOKED)?.strip_prefix(' ')?;
    let (fence, reason) = rest.split_once(' ').unwrap_or((rest, ""));
    Some((fence.parse().ok()?, reason))
}

/// Room for any message: an event word of up to 12 bytes, a space, a `u64` (20 digits), and
/// for a hand-over a space and the new holder's [`tag`] (8 hex digits).
pub const MAX_MESSAGE: usize = 12 + 1 + MAX_DIGITS + 1 + TAG_LEN;

/// The length of a [`tag`] in the message: 8 lowercase hex digits.
pub const TAG_LEN: usize = 8;

/// A short, non-secret digest of a token, named in a `handoff` message so that each waiting
/// client can tell whether the lease went to its own token without the token being published:
/// 32-bit FNV-1a of the token's bytes (offset basis `0x811c9dc5`; per byte, xor it in, then
/// multiply by the prime `0x01000193`, wrapping), written as 8 lowercase hex digits. It reveals
/// 32 bits of a hash of the token to every subscriber, so a token must be random enough that
/// they do not help guess it (the clients' random tokens are).
pub fn tag(token: &[u8]) -> u32 {
    token
        .iter()
        .fold(0x811c_9dc5_u32, |hash, &byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193))
}

/// The [`tag`] of `token` as it appears in a message: 8 lowercase hex digits.
pub fn tag_hex(token: &[u8]) -> String {
    let mut digits = [0; TAG_LEN];
    write_tag(tag(token), &mut digits);
    String::from_utf8_lossy(&digits).into_owned()
}

/// `tag` as 8 lowercase hex digits.
fn write_tag(tag: u32, out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, digit) in out.iter_mut().take(TAG_LEN).enumerate() {
        *digit = HEX[((tag >> (28 - 4 * i)) & 0xf) as usize];
    }
}

/// The message for one ownership change: the event's name and the fence of the lease it
/// concerns, e.g. `released 1796207757444058`, and for a hand-over the new holder's [`tag`]
/// (`holder`: its token), e.g. `handoff 1796207757444059 9e4f1a2b`.
pub fn message(event: &str, fence: u64, holder: Option<&[u8]>) -> Vec<u8> {
    let mut buffer = [0; MAX_MESSAGE];
    write_message(event, fence, holder, &mut buffer).to_vec()
}

/// [`message`] written into `buffer`, with no allocation (it runs on every grant). An event
/// word longer than 12 bytes is cut there (ours are at most 8).
pub fn write_message<'a>(
    event: &str,
    fence: u64,
    holder: Option<&[u8]>,
    buffer: &'a mut [u8; MAX_MESSAGE],
) -> &'a [u8] {
    let word = &event.as_bytes()[..event.len().min(12)];
    buffer[..word.len()].copy_from_slice(word);
    let mut end = append(fence, Some(b' '), buffer, word.len());
    if let Some(token) = holder {
        buffer[end] = b' ';
        write_tag(tag(token), &mut buffer[end + 1..]);
        end += 1 + TAG_LEN;
    }
    &buffer[..end]
}

/// The length of a [`wide_tag`] in a channel name: 16 lowercase hex digits.
pub const WIDE_TAG_LEN: usize = 16;

/// A 64-bit digest of a token, naming the channel where only that token's ticket hears of its
/// grant ([`write_ticket_name`]): 64-bit FNV-1a of the token's bytes (offset basis
/// `0xcbf29ce484222325`; per byte, xor it in, then multiply by the prime `0x100000001b3`,
/// wrapping). Wide enough that two random tokens waiting at once never share a channel (about
/// one pair in 2⁶⁴), which matters because a grantee starts on that channel's message alone.
pub fn wide_tag(token: &[u8]) -> u64 {
    token.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The channel where the ticket of `token` on `resource` hears of its own grant: the resource's
/// channel, `:` and the token's [`wide_tag`] as 16 lowercase hex digits, e.g.
/// `dlock:{invoice:123}:af63dc4c8601ec8c` (token `a`). It hashes to the resource's slot (the
/// resource channel's hash tag comes first).
pub fn ticket_name(resource: &[u8], token: &[u8]) -> Vec<u8> {
    let mut channel = Vec::with_capacity(PREFIX.len() + resource.len() + 8 + WIDE_TAG_LEN);
    write_ticket_name(resource, token, &mut channel);
    channel
}

/// [`ticket_name`] for a resource and a token given as text.
pub fn ticket_name_of(resource: &str, token: &str) -> String {
    String::from_utf8_lossy(&ticket_name(resource.as_bytes(), token.as_bytes())).into_owned()
}

/// Appends [`ticket_name`] to `out`.
pub fn write_ticket_name(resource: &[u8], token: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    write_name(resource, out);
    out.push(b':');
    let tag = wide_tag(token);
    out.extend((0..WIDE_TAG_LEN).map(|i| HEX[((tag >> (60 - 4 * i)) & 0xf) as usize]));
}

/// Room for a [`write_granted`] message: `granted`, three `u64`s and their spaces.
pub const MAX_GRANTED: usize = event::GRANTED.len() + 3 * (1 + MAX_DIGITS);

/// The message on a ticket's own channel ([`ticket_name`]) when its lease is handed over:
/// `granted <fence> <request> <window-ms>`: the fence, the `NOTIFY` number of the last ACQUIRE
/// of the ticket the server read before the hand-over, and how long the lease runs unless
/// claimed (from the hand-over, in milliseconds).
pub fn write_granted(
    fence: u64,
    request: u64,
    window_ms: u64,
    buffer: &mut [u8; MAX_GRANTED],
) -> &[u8] {
    let word = event::GRANTED.as_bytes();
    buffer[..word.len()].copy_from_slice(word);
    let end = [fence, request, window_ms]
        .into_iter()
        .fold(word.len(), |end, part| append(part, Some(b' '), buffer, end));
    &buffer[..end]
}

/// What a ticket's own channel said: its lease was handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The lease's fence.
    pub fence: u64,
    /// The `NOTIFY` number of the last ACQUIRE of the ticket the server read before the
    /// hand-over: that request was sent before the lease began.
    pub request: u64,
    /// How long the lease runs from the hand-over unless claimed, in milliseconds.
    pub window_ms: u64,
}

/// The [`Granted`] of a `granted <fence> <request> <window-ms>` message, or `None` for any
/// other text.
pub fn granted(payload: &str) -> Option<Granted> {
    let rest = payload.strip_prefix(event::GRANTED)?.strip_prefix(' ')?;
    let mut numbers = rest.split(' ').map(|word| {
        (!word.is_empty() && word.bytes().all(|b| b.is_ascii_digit()))
            .then(|| word.parse::<u64>().ok())
            .flatten()
    });
    match (numbers.next(), numbers.next(), numbers.next(), numbers.next()) {
        (Some(Some(fence)), Some(Some(request)), Some(Some(window_ms)), None) => {
            Some(Granted { fence, request, window_ms })
        }
        _ => None,
    }
}

/// The earliest the lease a `granted` message announces may end, on the client's clock: the
/// send time of the request the message names plus the window, which is never after the
/// server's deadline (that request reached the server before the hand-over). `sent_at` gives a
/// request's send time (`None`: not one of the attempt's, and then no expiry), `plus_ms` adds
/// milliseconds to a time (the clock is the caller's: this crate has none).
pub fn granted_expiry<T>(
    granted: &Granted,
    sent_at: impl FnOnce(u64) -> Option<T>,
    plus_ms: impl FnOnce(T, u64) -> T,
) -> Option<T> {
    sent_at(granted.request).map(|sent| plus_ms(sent, granted.window_ms))
}

/// Which ticket waiters a channel message concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woken<'a> {
    /// None: `acquired`, `renewed`, `released`, `expired` (a release with a line behind it
    /// always hands over, so a `released` frees nobody who waits).
    Nobody,
    /// The waiters whose token has this tag: a `handoff` to it.
    Tag(&'a str),
    /// Every waiter: a `handoff` without a tag (an older server, which names nobody), or a
    /// message this version does not understand.
    Everyone,
}

/// Which ticket waiters the channel message `payload` wakes (to send their ACQUIRE again).
pub fn woken(payload: &str) -> Woken<'_> {
    let mut words = payload.split(' ');
    match (words.next(), words.next(), words.next(), words.next()) {
        (
            Some(event::ACQUIRED | event::RENEWED | event::RELEASED | event::EXPIRED),
            Some(_),
            None,
            None,
        ) => Woken::Nobody,
        (Some(event::HANDOFF), Some(_), Some(tag), None) => Woken::Tag(tag),
        _ => Woken::Everyone,
    }
}

/// Whether `payload` wakes a waiter whose token has the tag `mine` (8 hex digits); an observer
/// (`None`: no token of its own) is woken by every message.
pub fn wakes(payload: &str, mine: Option<&str>) -> bool {
    match (woken(payload), mine) {
        (_, None) | (Woken::Everyone, _) => true,
        (Woken::Nobody, Some(_)) => false,
        (Woken::Tag(tag), Some(mine)) => tag == mine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::key_slot;

    #[test]
    fn a_revoked_message_gives_its_fence_and_reason() {
        assert_eq!(revoked("revoked 8 stuck since 03:00"), Some((8, "stuck since 03:00")));
        assert_eq!(revoked("revoked 8"), Some((8, "")));
        assert_eq!(revoked("revoked x y"), None);
        assert_eq!(revoked("released 8"), None);
        assert_eq!(revoked("revokedx 8"), None);
    }

    #[test]
    fn a_channel_hashes_to_its_resources_slot() {
        for resource in [&b"invoice:123"[..], b"invoice:{123}", b"{a}b{c}", b"x", b"a{b}c"] {
            let channel = name(resource);
            assert_eq!(
                key_slot(&channel),
                key_slot(resource),
                "{:?}",
                String::from_utf8_lossy(&channel)
            );
        }
        assert_eq!(name(b"invoice:123"), b"dlock:{invoice:123}");
        assert_eq!(name_of("invoice:{123}"), "dlock:key:invoice:{123}");
        assert_eq!(name(b"odd}name"), b"dlock:key:odd}name", "no tag possible: plain name");
        assert_eq!(message("handoff", 42, None), b"handoff 42");
        assert_eq!(message("released", 0, None), b"released 0");
        assert_eq!(
            message("acquired", u64::MAX, None),
            format!("acquired {}", u64::MAX).as_bytes()
        );
        assert_eq!(message("a-word-longer-than-twelve", 7, None), b"a-word-longe 7");
    }

    /// Whether Redis Cluster hashes `key` by a tag.
    fn has_hash_tag(key: &[u8]) -> bool {
        key.iter().position(|&b| b == b'{').is_some_and(|open| {
            key[open + 1..].iter().position(|&b| b == b'}').is_some_and(|len| len > 0)
        })
    }

    proptest::proptest! {
        /// No two resources share a channel, and a channel lives in its resource's slot whenever
        /// the resource has no braces or a usable tag.
        #[test]
        fn channels_are_one_to_one_and_in_the_resources_slot(
            a in proptest::collection::vec(proptest::sample::select(&b"ab:{}x"[..]), 0..8),
            b in proptest::collection::vec(proptest::sample::select(&b"ab:{}x"[..]), 0..8),
        ) {
            if a != b {
                proptest::prop_assert_ne!(name(&a), name(&b));
            }
            let plain = !a.contains(&b'{') && !a.contains(&b'}');
            if (plain && !a.is_empty()) || has_hash_tag(&a) {
                proptest::prop_assert_eq!(key_slot(&name(&a)), key_slot(&a));
            }
        }
    }

    #[test]
    fn the_tag_is_fnv1a_32_of_the_token_in_hex() {
        // Known FNV-1a 32-bit vectors.
        assert_eq!(tag(b""), 0x811c_9dc5);
        assert_eq!(tag(b"a"), 0xe40c_292c);
        assert_eq!(tag_hex(b"foobar"), "bf9cf968");
        assert_eq!(message("handoff", 42, Some(b"a")), b"handoff 42 e40c292c");
        assert_eq!(message("handoff", 7, Some(b"")), b"handoff 7 811c9dc5");
        let longest = message("a-word-longer-than-twelve", u64::MAX, Some(b"foobar"));
        assert_eq!(longest.len(), MAX_MESSAGE, "the longest message fits exactly");
        assert!(longest.ends_with(b" bf9cf968"));
    }

    #[test]
    fn a_tickets_own_channel_is_the_resources_and_fnv1a_64_of_the_token() {
        assert_eq!(wide_tag(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(wide_tag(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(wide_tag(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(ticket_name_of("invoice:123", "a"), "dlock:{invoice:123}:af63dc4c8601ec8c");
        assert_eq!(ticket_name_of("x{7}", ""), "dlock:key:x{7}:cbf29ce484222325");
        for resource in [&b"invoice:123"[..], b"invoice:{123}", b"{a}b{c}", b"a{b}c"] {
            assert_eq!(key_slot(&ticket_name(resource, b"t")), key_slot(resource));
        }
    }

    #[test]
    fn a_granted_message_names_fence_request_and_window() {
        let mut buffer = [0; MAX_GRANTED];
        let written = write_granted(u64::MAX, u64::MAX, u64::MAX, &mut buffer).to_vec();
        assert_eq!(written.len(), MAX_GRANTED, "the longest message fits exactly");
        assert_eq!(write_granted(42, 3, 6000, &mut buffer), b"granted 42 3 6000");
        let parsed = granted("granted 42 3 6000");
        assert_eq!(parsed, Some(Granted { fence: 42, request: 3, window_ms: 6000 }));
        let max = String::from_utf8(written).expect("text");
        assert_eq!(granted(&max).map(|g| g.window_ms), Some(u64::MAX));
        for other in [
            "granted 42 3",
            "granted 42 3 6000 1",
            "granted 42 -3 6000",
            "granted 42 +3 6000",
            "granted  42 3 6000",
            "grantedx 42 3 6000",
            "handoff 42 e40c292c",
            "granted 42 3 18446744073709551616",
        ] {
            assert_eq!(granted(other), None, "{other}");
        }
        let sent = |request: u64| (request == 3).then_some(10_000_u64);
        let plus = |at: u64, ms: u64| at + ms;
        let expiry = parsed.and_then(|g| granted_expiry(&g, sent, plus));
        assert_eq!(expiry, Some(16_000));
        let unknown = Granted { fence: 42, request: 4, window_ms: 6000 };
        assert_eq!(granted_expiry(&unknown, sent, plus), None);
    }

    #[test]
    fn a_waiter_wakes_for_its_own_hand_over_or_one_it_cannot_place() {
        let mine = tag_hex(b"mine");
        for quiet in ["acquired 5", "released 5", "expired 5", "renewed 5"] {
            assert!(!wakes(quiet, Some(&mine)), "{quiet}");
            assert!(wakes(quiet, None), "an observer wakes for {quiet}");
        }
        assert!(!wakes(&format!("handoff 6 {}", tag_hex(b"other")), Some(&mine)));
        assert!(wakes(&format!("handoff 6 {mine}"), Some(&mine)));
        assert!(wakes("handoff 7", Some(&mine)), "an older server's hand-over names nobody");
        assert!(wakes("something new", Some(&mine)));
    }
}
