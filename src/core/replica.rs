//! The explicit path for replicated effects: how a copy (a replica, or a primary loading its
//! AOF) applies a lease change its primary decided. No rule decides anything here; the copy
//! takes the primary's word, and [`plan_replicated`](super::effects::plan_replicated) says what
//! follows for its key and index.

use super::args::{parse_fence, parse_int};
use super::decimal::{MAX_DIGITS, append};
use super::{Lease, Lock, Micros, Now};

/// A grant's history as `DLOCK.SETLEASE` carries it: when it was granted (Unix µs) and how many
/// times it was renewed. Older streams carry none.
pub type History = Option<(Micros, u32)>;

/// Room for the longest [compact effect](write_compact): four numbers and three colons.
pub const COMPACT_MAX: usize = 4 * MAX_DIGITS + 3;

/// The compact effect of a plain exclusive lease, the last argument of
/// `DLOCK.SETLEASE resource token effect`: `fence:deadline-unix-us` (a renewal: each copy keeps
/// the history it has) or `fence:deadline-unix-us:granted-unix-us:renewals` (a grant), the same
/// numbers the long form `fence deadline [GRANTED granted RENEWALS renewals]` carries. Written
/// into `out`; returns the bytes. Fences and times are clamped to `i64::MAX`, as every copy
/// reads them.
pub fn write_compact(
    fence: u64,
    deadline_wall: Micros,
    history: History,
    out: &mut [u8; COMPACT_MAX],
) -> &[u8] {
    let clamp = |n: u64| n.min(i64::MAX as u64);
    let mut len = append(clamp(fence), None, out, 0);
    len = append(clamp(deadline_wall), Some(b':'), out, len);
    if let Some((granted_wall, renewals)) = history {
        len = append(clamp(granted_wall), Some(b':'), out, len);
        len = append(u64::from(renewals), Some(b':'), out, len);
    }
    &out[..len]
}

/// Reads a [compact effect](write_compact): the fence, the deadline and the history, or the
/// name of the first part that is wrong.
pub fn parse_compact(bytes: &[u8]) -> Result<(u64, Micros, History), &'static str> {
    let mut parts = bytes.split(|b| *b == b':');
    let mut next = |what| parts.next().ok_or(what);
    let fence = parse_fence(next("fence")?).map_err(|_| "fence")?;
    let deadline = unsigned(next("deadline")?).ok_or("deadline")?;
    let history = match parts.next() {
        None => None,
        Some(granted) => {
            let granted = unsigned(granted).ok_or("granted")?;
            let renewals = parts
                .next()
                .and_then(unsigned)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or("renewals")?;
            Some((granted, renewals))
        }
    };
    match parts.next() {
        None => Ok((fence, deadline, history)),
        Some(_) => Err("effect"),
    }
}

/// A non-negative integer in Redis's strict form.
pub fn unsigned(bytes: &[u8]) -> Option<u64> {
    parse_int(bytes).and_then(|n| u64::try_from(n).ok())
}

/// Applies a lease as the primary decided it (`DLOCK.SETLEASE`): an exclusive lease replaces
/// every lease of the lock, a shared one the exclusive lease and any shared lease of its token.
/// Its history travels with it, so hold time and `dlock.max-hold-ms` count from the grant on
/// every copy; from an older stream without it, a renewal of the grant this copy has keeps the
/// history it had.
pub fn set_lease(lock: &mut Lock, mut lease: Lease, history: History, now: Now) {
    let previous = lock.lease_with_fence(lease.fence).filter(|l| *l.token == *lease.token);
    match (history, previous) {
        (Some((granted_wall, renewals)), _) => {
            lease.set_granted_mono(now.mono_from_wall(granted_wall).min(now.mono));
            lease.set_renewals(renewals);
        }
        (None, Some(previous)) => {
            let renewed = previous.deadline_wall() != lease.deadline_wall();
            lease.set_granted_mono(previous.granted_mono());
            lease.set_renewals(previous.renewals().saturating_add(u32::from(renewed)));
        }
        (None, None) => {}
    }
    lock.put(lease);
}

/// Ends one shared lease as the primary decided (`DLOCK.ENDLEASE`); whether it was there.
pub fn end_lease(lock: &mut Lock, token: &[u8], fence: u64) -> bool {
    lock.drop_holder(token, fence).is_some()
}

/// Ends every lease of the lock as the primary decided (a `DLOCK.RELEASE` replayed from its
/// stream or the AOF: the primary propagates its RELEASE only when the key went with it).
pub fn end_all(lock: &mut Lock) {
    // A copy has no waiters; whatever the lock held goes.
    let _ = lock.displace();
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Every effect the primary can write reads back as the same numbers on a copy, and
        /// bytes that read as an effect are written back as themselves.
        #[test]
        fn effects_read_back_as_written(
            fence in 1..=i64::MAX as u64,
            deadline in 0..=i64::MAX as u64,
            history in proptest::option::of((0..=i64::MAX as u64, any::<u32>())),
        ) {
            let written = compact(fence, deadline, history);
            prop_assert_eq!(parse_compact(&written), Ok((fence, deadline, history)));
        }

        #[test]
        fn any_bytes_read_as_an_effect_are_written_back_as_themselves(
            bytes in proptest::collection::vec(prop_oneof![Just(b':'), b'0'..=b'9', Just(b'-')], 0..60),
        ) {
            if let Ok((fence, deadline, history)) = parse_compact(&bytes) {
                prop_assert_eq!(compact(fence, deadline, history), bytes);
            }
        }
    }

    fn compact(fence: u64, deadline: u64, history: History) -> Vec<u8> {
        write_compact(fence, deadline, history, &mut [0; COMPACT_MAX]).to_vec()
    }

    #[test]
    fn a_grant_and_a_renewal_read_back_as_written() {
        let grant = compact(7, 1_765_000_000_123_456, Some((1_765_000_000_000_001, 0)));
        assert_eq!(grant, b"7:1765000000123456:1765000000000001:0");
        assert_eq!(
            parse_compact(&grant),
            Ok((7, 1_765_000_000_123_456, Some((1_765_000_000_000_001, 0))))
        );
        let renewal = compact(7, 1_765_000_060_000_000, None);
        assert_eq!(renewal, b"7:1765000060000000");
        assert_eq!(parse_compact(&renewal), Ok((7, 1_765_000_060_000_000, None)));
    }

    #[test]
    fn the_longest_effect_fits_and_is_clamped_as_copies_read_it() {
        let longest = compact(u64::MAX, u64::MAX, Some((u64::MAX, u32::MAX)));
        let max = i64::MAX as u64;
        assert!(longest.len() <= COMPACT_MAX);
        assert_eq!(parse_compact(&longest), Ok((max, max, Some((max, u32::MAX)))));
    }

    #[test]
    fn a_wrong_part_is_named() {
        let cases: [(&[u8], &str); 10] = [
            (b"", "fence"),
            (b"0:1", "fence"),
            (b"x:1", "fence"),
            (b"1", "deadline"),
            (b"1:-1", "deadline"),
            (b"1:01", "deadline"),
            (b"1:2:", "granted"),
            (b"1:2:3", "renewals"),
            (b"1:2:3:4294967296", "renewals"),
            (b"1:2:3:4:5", "effect"),
        ];
        for (bytes, what) in cases {
            assert_eq!(parse_compact(bytes), Err(what), "{}", String::from_utf8_lossy(bytes));
        }
    }
}
