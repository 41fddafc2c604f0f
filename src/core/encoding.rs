//! The persisted form of a lock (RDB files and `DUMP` payloads), as a sequence of fields.
//!
//! Encoding version 3: `count: unsigned`, then `count` leases, each `flags: unsigned` (bit 0:
//! shared; bit 1: metadata follows; other bits must be 0), `token: string`, `fence: unsigned`,
//! `deadline: unsigned` (absolute Unix µs), `held: unsigned` (µs from the grant to the deadline),
//! `renewals: unsigned`, and `meta: string` when bit 1 is set. Either one exclusive lease or any
//! number of shared ones, each token once.
//!
//! Still loaded: version 2, `flags: unsigned` (bit 0: a lease follows; other bits must be 0),
//! then, when bit 0 is set, one exclusive lease's `token`, `fence`, `deadline`, `held` and
//! `renewals`; version 1, the same without `held` and `renewals`.
//!
//! One decoder serves every version and every source of fields: Redis's RDB reader in the module,
//! a byte cursor in tests and the fuzzer. Whatever it accepts is a valid lock.

use super::limits::MAX_META_LEN;
use super::lock::{Lease, Lock};
use super::{Micros, Now};

/// The encoding version this build writes: shared leases and metadata.
pub const ENCODING_VERSION: i32 = 3;
/// One exclusive lease with its hold history; still loaded.
pub const ENCODING_V2: i32 = 2;
/// The first encoding, without hold history; still loaded.
pub const ENCODING_V1: i32 = 1;
/// Version 1 and 2, bit 0 of the leading flags: a lease follows.
const HAS_LEASE: u64 = 1;
/// Version 3, bit 0 of a lease's flags: it is shared.
const SHARED: u64 = 1;
/// Version 3, bit 1 of a lease's flags: the holder's metadata follows.
const HAS_META: u64 = 2;

/// Where persisted fields come from, in order. `None` ends decoding: the source is short,
/// corrupted, or failed.
pub trait FieldSource {
    /// The next unsigned integer field.
    fn unsigned(&mut self) -> Option<u64>;
    /// The next string field.
    fn bytes(&mut self) -> Option<Vec<u8>>;
}

/// Where persisted fields go, in order.
pub trait FieldSink {
    /// Writes an unsigned integer field.
    fn unsigned(&mut self, value: u64);
    /// Writes a string field.
    fn bytes(&mut self, value: &[u8]);
}

/// Whether this build loads values written with `encver`.
pub fn is_known_version(encver: i32) -> bool {
    (ENCODING_V1..=ENCODING_VERSION).contains(&encver)
}

/// Decodes one lock written with `encver`, with deadlines mapped onto `now`'s monotonic clock.
/// `None` for an unknown version, a short source, an unknown flag or an invalid lease.
pub fn decode_lock(
    source: &mut impl FieldSource,
    encver: i32,
    now: Now,
    last_fence: u64,
) -> Option<Lock> {
    if !is_known_version(encver) {
        return None;
    }
    if encver >= ENCODING_VERSION {
        return decode_leases(source, now, last_fence);
    }
    let flags = source.unsigned()?;
    if flags & !HAS_LEASE != 0 {
        return None;
    }
    if flags & HAS_LEASE == 0 {
        return Some(Lock::default());
    }
    let token = source.bytes()?;
    let fence = source.unsigned()?;
    let deadline_wall = source.unsigned()?;
    let mut lease = Lease::restore(&token, fence, deadline_wall, now, last_fence).ok()?;
    if encver >= ENCODING_V2 {
        restore_history(source, &mut lease)?;
    }
    Some(Lock::with_lease(lease))
}

/// Version 3: a count, then each lease; one exclusive lease or distinct shared ones.
fn decode_leases(source: &mut impl FieldSource, now: Now, last_fence: u64) -> Option<Lock> {
    let count = source.unsigned()?;
    let mut lock = Lock::default();
    for _ in 0..count {
        let flags = source.unsigned()?;
        if flags & !(SHARED | HAS_META) != 0 {
            return None;
        }
        let token = source.bytes()?;
        let fence = source.unsigned()?;
        let deadline_wall = source.unsigned()?;
        let mut lease = Lease::restore(&token, fence, deadline_wall, now, last_fence).ok()?;
        restore_history(source, &mut lease)?;
        lease.set_shared(flags & SHARED != 0);
        if flags & HAS_META != 0 {
            let meta = source.bytes().filter(|meta| (1..=MAX_META_LEN).contains(&meta.len()))?;
            lease.token = lease.token.with_meta(Some(&meta));
        }
        // Nothing a server could not hold: a second holder beside an exclusive lease, a token
        // twice, or a fence twice (every grant mints its own).
        if lock.clashes_with(&lease) || (!lease.shared() && lock.has_record()) {
            return None;
        }
        lock.put(lease);
    }
    Some(lock)
}

/// `held` and `renewals`: the grant's history.
fn restore_history(source: &mut impl FieldSource, lease: &mut Lease) -> Option<()> {
    let held: Micros = source.unsigned()?;
    lease.set_renewals(u32::try_from(source.unsigned()?).unwrap_or(u32::MAX));
    lease.set_granted_mono(lease.deadline_mono().saturating_sub(held));
    Some(())
}

/// Encodes `lock` in [`ENCODING_VERSION`]. Waiters are not written: they belong to connections.
pub fn encode_lock(sink: &mut impl FieldSink, lock: &Lock) {
    sink.unsigned(lock.holders().count() as u64);
    for lease in lock.holders() {
        let meta = lease.token.meta();
        sink.unsigned(
            if lease.shared() { SHARED } else { 0 } | if meta.is_some() { HAS_META } else { 0 },
        );
        sink.bytes(&lease.token);
        sink.unsigned(lease.fence);
        sink.unsigned(lease.deadline_wall());
        sink.unsigned(lease.deadline_mono().saturating_sub(lease.granted_mono()));
        sink.unsigned(u64::from(lease.renewals()));
        if let Some(meta) = meta {
            sink.bytes(meta);
        }
    }
}

/// Fields laid out in a byte slice: an unsigned is 8 bytes little-endian; a string is its length
/// as an unsigned, then its bytes. For tests and the fuzzer; Redis has its own layout.
#[derive(Debug)]
pub struct ByteFields<'a> {
    rest: &'a [u8],
}

impl<'a> ByteFields<'a> {
    /// A cursor at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.rest.split_at_checked(len)?;
        self.rest = rest;
        Some(taken)
    }
}

impl FieldSource for ByteFields<'_> {
    fn unsigned(&mut self) -> Option<u64> {
        let bytes = self.take(8)?.try_into().ok()?;
        Some(u64::from_le_bytes(bytes))
    }

    fn bytes(&mut self) -> Option<Vec<u8>> {
        let len = usize::try_from(self.unsigned()?).ok()?;
        self.take(len).map(<[u8]>::to_vec)
    }
}

/// Writes fields in the layout [`ByteFields`] reads.
impl FieldSink for Vec<u8> {
    fn unsigned(&mut self, value: u64) {
        self.extend_from_slice(&value.to_le_bytes());
    }

    fn bytes(&mut self, value: &[u8]) {
        FieldSink::unsigned(self, value.len() as u64);
        self.extend_from_slice(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::error::MAX_FENCE;

    const NOW: Now = Now { mono: 50_000_000, wall: 1_700_000_000_000_000 };

    /// The fields of a lease as version 1 or 2 writes them.
    fn fields(
        version: i32,
        token: &[u8],
        fence: u64,
        deadline: u64,
        held: u64,
        renewals: u64,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        FieldSink::unsigned(&mut out, HAS_LEASE);
        FieldSink::bytes(&mut out, token);
        FieldSink::unsigned(&mut out, fence);
        FieldSink::unsigned(&mut out, deadline);
        if version >= 2 {
            FieldSink::unsigned(&mut out, held);
            FieldSink::unsigned(&mut out, renewals);
        }
        out
    }

    fn first(lock: &Lock) -> Option<&Lease> {
        lock.holders().next()
    }

    fn decode(bytes: &[u8], encver: i32) -> Option<Lock> {
        decode_lock(&mut ByteFields::new(bytes), encver, NOW, 0)
    }

    #[test]
    fn version_2_restores_hold_time_and_renewals() {
        let deadline = NOW.wall + 30_000_000;
        let lock = decode(&fields(2, b"worker", 77, deadline, 12_000_000, 3), 2).expect("valid");
        let lease = first(&lock).expect("a lease");
        assert_eq!((&*lease.token, lease.fence, lease.renewals()), (&b"worker"[..], 77, 3));
        assert_eq!(lease.deadline_wall(), deadline);
        assert_eq!(lease.deadline_mono(), NOW.mono + 30_000_000);
        assert_eq!(lease.granted_mono(), NOW.mono + 18_000_000, "deadline minus held");
        assert_eq!(lock.waiters().len(), 0);
    }

    #[test]
    fn version_1_counts_the_hold_from_the_load() {
        let deadline = NOW.wall + 30_000_000;
        let lock = decode(&fields(1, b"worker", 77, deadline, 0, 0), 1).expect("valid");
        let lease = first(&lock).expect("a lease");
        assert_eq!((lease.granted_mono(), lease.renewals()), (NOW.mono, 0));
        assert_eq!(lease.deadline_mono(), NOW.mono + 30_000_000);
    }

    #[test]
    fn a_version_1_payload_read_as_version_2_is_short() {
        assert!(decode(&fields(1, b"w", 1, NOW.wall, 0, 0), 2).is_none());
    }

    #[test]
    fn unknown_versions_are_refused_before_anything_is_read() {
        let valid = fields(2, b"w", 1, NOW.wall, 0, 0);
        for encver in [0, 4, -1, i32::MAX] {
            let mut source = ByteFields::new(&valid);
            assert!(decode_lock(&mut source, encver, NOW, 0).is_none(), "{encver}");
            assert_eq!(source.rest().len(), valid.len(), "{encver}: nothing read");
        }
    }

    #[test]
    fn a_lock_without_a_lease_decodes_empty_and_unknown_flags_are_refused() {
        for encver in [1, 2, 3] {
            assert_eq!(decode(&0u64.to_le_bytes(), encver), Some(Lock::default()));
            if encver == 3 {
                continue; // a count, not flags
            }
            for flags in [2u64, 3, 1 << 63, u64::MAX] {
                assert!(decode(&flags.to_le_bytes(), encver).is_none(), "{flags:#x}");
            }
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let deadline = NOW.wall + 1_000_000;
        for encver in [1, 2] {
            let full = fields(encver, b"worker", 5, deadline, 10, 1);
            assert!(decode(&full, encver).is_some());
            for len in 0..full.len() {
                assert!(decode(&full[..len], encver).is_none(), "v{encver} cut at {len}");
            }
        }
    }

    #[test]
    fn invalid_leases_are_refused_in_both_versions() {
        let long = vec![b'x'; 513];
        let max_token = vec![b'x'; 512];
        let year = 365 * 86_400_000_000;
        let cases: [(&[u8], u64, u64, bool); 10] = [
            (b"", 1, NOW.wall, false),
            (&long, 1, NOW.wall, false),
            (&max_token, 1, NOW.wall, true),
            (b"w", 0, NOW.wall, false),
            (b"w", NOW.wall + 3_600_000_000, NOW.wall, true),
            (b"w", MAX_FENCE, NOW.wall, false),
            (b"w", MAX_FENCE + 1, NOW.wall, false),
            (b"w", 1, NOW.wall + year, true),
            (b"w", 1, i64::MAX as u64, false),
            (b"w", 1, i64::MAX as u64 + 1, false),
        ];
        for encver in [1, 2] {
            for (token, fence, deadline, valid) in cases {
                let decoded = decode(&fields(encver, token, fence, deadline, 0, 0), encver);
                assert_eq!(decoded.is_some(), valid, "v{encver} len {} fence {fence}", token.len());
            }
        }
    }

    #[test]
    fn a_string_longer_than_what_is_left_is_refused_without_allocating_it() {
        let mut out = Vec::new();
        FieldSink::unsigned(&mut out, HAS_LEASE);
        FieldSink::unsigned(&mut out, u64::MAX);
        out.extend_from_slice(b"w");
        assert!(decode(&out, 2).is_none());
    }

    #[test]
    fn an_expired_deadline_loads_as_an_expired_lease() {
        let lock = decode(&fields(2, b"w", 9, NOW.wall - 5_000_000, 1_000, 0), 2).expect("valid");
        assert!(lock.live_lease(NOW).is_none());
        let lease = first(&lock).expect("kept until the key is touched");
        assert_eq!(lease.deadline_mono(), NOW.mono - 5_000_000);
        assert!(!lock.fence_check(9, NOW));
    }

    #[test]
    fn a_hold_longer_than_the_clock_saturates_at_its_origin() {
        let lock = decode(&fields(2, b"w", 9, NOW.wall + 1_000, u64::MAX, 0), 2).expect("valid");
        assert_eq!(first(&lock).map(|lease| lease.granted_mono()), Some(0));
    }

    #[test]
    fn encoding_then_decoding_gives_back_the_same_lease() {
        let mut lease = Lease::new(b"worker", 1_700_000_000_123_456, 30_000, NOW);
        lease.set_renewals(4);
        lease.set_granted_mono(NOW.mono - 7_000_000);
        let lock = Lock::with_lease(lease.clone());
        let mut out = Vec::new();
        encode_lock(&mut out, &lock);
        let decoded = decode(&out, ENCODING_VERSION).expect("valid");
        assert_eq!(first(&decoded), Some(&lease));
        let mut empty = Vec::new();
        encode_lock(&mut empty, &Lock::default());
        assert_eq!(empty, 0u64.to_le_bytes());
    }

    /// A lock of shared leases, one of them with metadata, as version 3 writes it.
    fn shared_lock() -> Lock {
        let mut lock = Lock::default();
        for (i, token) in [&b"reader-1"[..], b"reader-2", b"reader-3"].into_iter().enumerate() {
            let mut lease = Lease::new(token, 1_700_000_000_000_000 + i as u64, 30_000, NOW);
            lease.set_shared(true);
            lease.set_renewals(i as u32);
            if i == 1 {
                lease.token = lease.token.with_meta(Some(b"host=b pid=9"));
            }
            lock.put(lease);
        }
        lock
    }

    #[test]
    fn version_3_gives_back_every_shared_lease_with_its_metadata() {
        let lock = shared_lock();
        let mut out = Vec::new();
        encode_lock(&mut out, &lock);
        let decoded = decode(&out, ENCODING_VERSION).expect("valid");
        assert_eq!(decoded.holders().collect::<Vec<_>>(), lock.holders().collect::<Vec<_>>());
        let metas: Vec<_> = decoded.holders().map(|lease| lease.token.meta()).collect();
        assert_eq!(metas, [None, Some(&b"host=b pid=9"[..]), None]);
        for len in 0..out.len() {
            assert!(decode(&out[..len], ENCODING_VERSION).is_none(), "cut at {len}");
        }
    }

    #[test]
    fn version_3_refuses_what_no_server_could_hold() {
        let lease = |flags: u64, token: &[u8], fence: u64| {
            let mut out = Vec::new();
            FieldSink::unsigned(&mut out, flags);
            FieldSink::bytes(&mut out, token);
            for value in [fence, NOW.wall + 1_000_000, 0, 0] {
                FieldSink::unsigned(&mut out, value);
            }
            out
        };
        let lock = |count: u64, leases: &[Vec<u8>]| {
            let mut out = count.to_le_bytes().to_vec();
            leases.iter().for_each(|lease| out.extend_from_slice(lease));
            decode(&out, ENCODING_VERSION)
        };
        assert!(lock(2, &[lease(SHARED, b"a", 1), lease(SHARED, b"b", 2)]).is_some());
        assert!(lock(2, &[lease(0, b"a", 1), lease(SHARED, b"b", 2)]).is_none(), "mixed");
        assert!(lock(2, &[lease(SHARED, b"a", 1), lease(0, b"b", 2)]).is_none(), "mixed");
        assert!(lock(2, &[lease(0, b"a", 1), lease(0, b"b", 2)]).is_none(), "two exclusive");
        assert!(lock(2, &[lease(SHARED, b"a", 1), lease(SHARED, b"a", 2)]).is_none(), "twice");
        // Found by the rdb_decode fuzzer: two holders under one fence, which FENCECHECK could
        // not tell apart and a save and reload put in another order.
        assert!(lock(2, &[lease(SHARED, b"a", 7), lease(SHARED, b"b", 7)]).is_none(), "one fence");
        assert!(lock(1, &[lease(4, b"a", 1)]).is_none(), "unknown flag");
        assert!(lock(3, &[lease(SHARED, b"a", 1), lease(SHARED, b"b", 2)]).is_none(), "short");
        let mut empty_meta = lease(HAS_META, b"a", 1);
        FieldSink::bytes(&mut empty_meta, b"");
        assert!(lock(1, &[empty_meta]).is_none(), "empty metadata");
        let mut long_meta = lease(HAS_META, b"a", 1);
        FieldSink::bytes(&mut long_meta, &[b'm'; MAX_META_LEN + 1]);
        assert!(lock(1, &[long_meta]).is_none(), "metadata too long");
    }
}
