//! The deadline index behind active expiry: which key's lease may end next.
//!
//! Entries are hints, never truth. Every entry is checked against the key's lease when it comes
//! due ([`super::Lock::on_due`]), so an entry left behind by a renewal, a release, a DEL or a
//! FLUSHALL costs one lookup and is dropped. The invariant that matters is the other direction:
//! every live lease has an entry at or before its deadline, under its current key name.
//!
//! Entries are grouped in one-millisecond buckets: an insert appends to its bucket, and a storm of
//! leases that end in the same second is a few hundred buckets drained in order, not a million
//! rebalancing tree operations. Within a bucket, order does not matter: everything in it is due by
//! the end of that millisecond. Each bucket is one byte arena holding its entries back to back,
//! `name | name length | database | deadline offset`, the last three read from the end:
//! a lock costs its key name plus about 4 bytes here, and the sweep reads names sequentially.

use std::collections::BTreeMap;

use super::Micros;

/// Microseconds in a bucket.
const BUCKET_US: u128 = 1_000;
/// The deadline offset of an entry taken out of the middle of a bucket (offsets are < 1000).
const TAKEN: u16 = u16::MAX;

/// One bucket: its entries, encoded back to back, and how many of them are not taken.
#[derive(Clone, Debug, Default)]
struct Bucket {
    bytes: Vec<u8>,
    live: usize,
}

/// One entry of a bucket as read back from the arena.
struct Record {
    /// Where the entry starts (its name's first byte).
    start: usize,
    /// Where the name ends.
    name_end: usize,
    db: i32,
    /// Microseconds between the deadline and the end of the bucket, or [`TAKEN`].
    offset: u16,
    /// Where the offset is stored.
    offset_at: usize,
}

/// Appends `value` as base-128 digits, most significant first, so that it reads back from the
/// end: the last byte holds the lowest 7 bits, and every byte but the first carries 0x80.
fn push_backward_varint(bytes: &mut Vec<u8>, value: u64) {
    let mut digits = [0u8; 10];
    let mut n = 0;
    let mut rest = value;
    loop {
        digits[n] = (rest & 0x7f) as u8;
        rest >>= 7;
        n += 1;
        if rest == 0 {
            break;
        }
    }
    for i in (0..n).rev() {
        bytes.push(if i + 1 == n { digits[i] } else { digits[i] | 0x80 });
    }
}

/// Reads a value written by [`push_backward_varint`] that ends at `end`; returns it and where it
/// starts. `None` on a malformed arena (never written by this module).
fn read_backward_varint(bytes: &[u8], end: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    let mut at = end;
    for shift in (0..70).step_by(7) {
        at = at.checked_sub(1)?;
        let digit = *bytes.get(at)?;
        value |= u64::from(digit & 0x7f).checked_shl(shift)?;
        if digit & 0x80 == 0 {
            return Some((value, at));
        }
    }
    None
}

impl Bucket {
    fn push(&mut self, offset: u16, db: i32, name: &[u8]) {
        self.bytes.extend_from_slice(name);
        push_backward_varint(&mut self.bytes, name.len() as u64);
        push_backward_varint(&mut self.bytes, u64::from(db as u32));
        self.bytes.extend_from_slice(&offset.to_le_bytes());
        self.live += 1;
    }

    /// The entry that ends at `end`.
    fn record_ending_at(&self, end: usize) -> Option<Record> {
        let offset_at = end.checked_sub(2)?;
        let offset = u16::from_le_bytes([*self.bytes.get(offset_at)?, *self.bytes.get(end - 1)?]);
        let (db, db_at) = read_backward_varint(&self.bytes, offset_at)?;
        let (len, name_end) = read_backward_varint(&self.bytes, db_at)?;
        let start = name_end.checked_sub(usize::try_from(len).ok()?)?;
        Some(Record { start, name_end, db: db as u32 as i32, offset, offset_at })
    }

    /// Every entry, last first.
    fn records(&self) -> impl Iterator<Item = Record> + '_ {
        let mut end = self.bytes.len();
        std::iter::from_fn(move || {
            let record = self.record_ending_at(end)?;
            end = record.start;
            Some(record)
        })
    }

    /// Drops taken entries at the end of the arena.
    fn trim(&mut self) {
        while let Some(record) = self.record_ending_at(self.bytes.len()) {
            if record.offset != TAKEN {
                break;
            }
            self.bytes.truncate(record.start);
        }
    }
}

/// Due entries taken out of the index, with their names in one buffer (reused between batches).
#[derive(Clone, Debug, Default)]
pub struct DueBatch {
    names: Vec<u8>,
    entries: Vec<(Micros, i32, usize, usize)>,
}

impl DueBatch {
    fn push(&mut self, deadline: Micros, db: i32, name: &[u8]) {
        let start = self.names.len();
        self.names.extend_from_slice(name);
        self.entries.push((deadline, db, start, self.names.len()));
    }

    /// The entries: deadline, database, key name.
    pub fn iter(&self) -> impl Iterator<Item = (Micros, i32, &[u8])> + '_ {
        self.entries.iter().map(|&(deadline, db, start, end)| {
            (deadline, db, self.names.get(start..end).unwrap_or_default())
        })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets every entry, keeping the buffers.
    pub fn clear(&mut self) {
        self.names.clear();
        self.entries.clear();
    }
}

/// Entries `(deadline, database, key name)` in one-millisecond buckets.
#[derive(Clone, Debug, Default)]
pub struct ExpiryIndex {
    buckets: BTreeMap<u64, Bucket>,
    len: usize,
}

impl ExpiryIndex {
    /// The bucket that holds `deadline`: the millisecond at whose end it falls due.
    fn bucket_of(deadline: Micros) -> u64 {
        deadline.div_ceil(1_000)
    }

    /// The deadline an entry of `bucket` stored with `offset` stands for.
    fn deadline_of(bucket: u64, offset: u16) -> Micros {
        let end = u128::from(bucket) * BUCKET_US;
        u64::try_from(end.saturating_sub(u128::from(offset))).unwrap_or(Micros::MAX)
    }

    /// Adds an entry for key `name` of database `db`.
    pub fn insert(&mut self, deadline: Micros, db: i32, name: &[u8]) {
        let bucket = Self::bucket_of(deadline);
        let end = u128::from(bucket) * BUCKET_US;
        // Less than 1000 by the choice of bucket.
        let offset = u16::try_from(end - u128::from(deadline)).unwrap_or(0);
        self.buckets.entry(bucket).or_default().push(offset, db, name);
        self.len += 1;
    }

    /// When to look next: the end of the first non-empty bucket's millisecond, when everything
    /// in it is due (entries come due at most 1 ms after their deadline, the timer's resolution).
    pub fn next_deadline(&self) -> Option<Micros> {
        self.buckets.first_key_value().map(|(bucket, _)| bucket.saturating_mul(1_000))
    }

    /// Moves up to `max` entries due at `now_mono` into `out`, earliest bucket first.
    /// Returns how many it moved.
    pub fn pop_due(&mut self, now_mono: Micros, max: usize, out: &mut DueBatch) -> usize {
        let mut moved = 0;
        while moved < max {
            let Some(mut first) = self.buckets.first_entry() else { break };
            let number = *first.key();
            let bucket = first.get_mut();
            let all_due = Self::deadline_of(number, 0) <= now_mono;
            if all_due {
                // Take from the end: each entry taken shortens the arena.
                while moved < max {
                    let Some(record) = bucket.record_ending_at(bucket.bytes.len()) else { break };
                    if record.offset != TAKEN {
                        let deadline = Self::deadline_of(number, record.offset);
                        let name = bucket.bytes.get(record.start..record.name_end);
                        out.push(deadline, record.db, name.unwrap_or_default());
                        bucket.live -= 1;
                        moved += 1;
                    }
                    bucket.bytes.truncate(record.start);
                }
            } else {
                // Only part of the bucket is due: mark what is taken, trim the end.
                let mut taken = Vec::new();
                for record in bucket.records() {
                    if moved + taken.len() >= max {
                        break;
                    }
                    if record.offset == TAKEN {
                        continue;
                    }
                    let deadline = Self::deadline_of(number, record.offset);
                    if deadline <= now_mono {
                        taken.push((deadline, record));
                    }
                }
                if taken.is_empty() {
                    break;
                }
                for (deadline, record) in &taken {
                    let name = bucket.bytes.get(record.start..record.name_end);
                    out.push(*deadline, record.db, name.unwrap_or_default());
                    if let Some(slot) = bucket.bytes.get_mut(record.offset_at..record.offset_at + 2)
                    {
                        slot.copy_from_slice(&TAKEN.to_le_bytes());
                    }
                }
                bucket.live -= taken.len();
                moved += taken.len();
                bucket.trim();
                if bucket.live > 0 {
                    break; // what is left of the first bucket is not due yet
                }
            }
            if bucket.live == 0 {
                first.remove();
            }
        }
        self.len -= moved;
        moved
    }

    /// Number of entries (live, renewed or stale alike).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index has no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every entry (a replica keeps no index: it never expires on its own).
    pub fn clear(&mut self) {
        self.buckets.clear();
        self.len = 0;
    }

    /// Keeps the entries for which `keep(db, name)` holds, with `rename_db` applied to the
    /// database of each kept entry (e.g. when two databases swap). Every deadline is kept.
    pub fn rewrite(
        &mut self,
        mut keep: impl FnMut(i32, &[u8]) -> bool,
        mut rename_db: impl FnMut(i32) -> i32,
    ) {
        for bucket in self.buckets.values_mut() {
            let mut kept = Bucket::default();
            let mut records: Vec<Record> = bucket.records().collect();
            records.reverse(); // keep the arena's order
            for record in records {
                let name = bucket.bytes.get(record.start..record.name_end).unwrap_or_default();
                if record.offset != TAKEN && keep(record.db, name) {
                    kept.push(record.offset, rename_db(record.db), name);
                }
            }
            *bucket = kept;
        }
        self.buckets.retain(|_, bucket| bucket.live > 0);
        self.len = self.buckets.values().map(|bucket| bucket.live).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pops everything due at `now`, one batch of at most `max`, as `(deadline, db, name)`.
    fn pop(index: &mut ExpiryIndex, now: Micros, max: usize) -> Vec<(Micros, i32, Vec<u8>)> {
        let mut batch = DueBatch::default();
        let moved = index.pop_due(now, max, &mut batch);
        assert_eq!(moved, batch.len());
        batch.iter().map(|(deadline, db, name)| (deadline, db, name.to_vec())).collect()
    }

    fn entry(deadline: Micros, db: i32, name: &str) -> (Micros, i32, Vec<u8>) {
        (deadline, db, name.as_bytes().to_vec())
    }

    #[test]
    fn entries_come_due_in_bucket_order_and_only_once_due() {
        let mut index = ExpiryIndex::default();
        index.insert(300, 0, b"c");
        index.insert(100, 0, b"a");
        index.insert(200, 0, b"b");
        index.insert(100, 0, b"a");
        assert_eq!(index.len(), 4, "duplicates are kept; the sweep drops them");
        assert_eq!(index.next_deadline(), Some(1_000), "the end of the first millisecond");
        assert_eq!(pop(&mut index, 99, 10), []);
        let mut due = pop(&mut index, 250, 10);
        due.sort();
        assert_eq!(due, [entry(100, 0, "a"), entry(100, 0, "a"), entry(200, 0, "b")]);
        assert_eq!(pop(&mut index, 250, 10), []);
        assert_eq!(index.len(), 1);
        index.insert(50, 3, b"z");
        index.insert(5_500, 0, b"late");
        assert_eq!(index.next_deadline(), Some(1_000));
        index.rewrite(|_, _| true, |db| if db == 3 { 4 } else { db });
        assert_eq!(pop(&mut index, 60, 10), [entry(50, 4, "z")]);
        assert_eq!(pop(&mut index, 5_000, 10), [entry(300, 0, "c")]);
        assert_eq!(pop(&mut index, 5_000, 10), [], "the next bucket is not due yet");
        assert_eq!(index.next_deadline(), Some(6_000));
        assert_eq!(pop(&mut index, 6_000, 10), [entry(5_500, 0, "late")]);
        index.insert(7_000, 0, b"c");
        index.rewrite(|_, name| name != b"c", |db| db);
        assert!(index.is_empty());
        index.insert(1, 0, b"a");
        index.clear();
        assert!(index.is_empty());
        assert_eq!(index.next_deadline(), None);
    }

    #[test]
    fn names_of_any_length_and_extreme_deadlines_and_databases_round_trip() {
        let mut index = ExpiryIndex::default();
        let long = vec![7u8; 70_000];
        index.insert(Micros::MAX, i32::MAX, &long);
        index.insert(0, 0, b"");
        index.insert(999, 15, b"\x80\xff\x00");
        assert_eq!(
            pop(&mut index, 1_000, 10),
            [entry(0, 0, ""), (999, 15, b"\x80\xff\x00".to_vec())],
            "bucket 0, then bucket 1"
        );
        assert_eq!(pop(&mut index, Micros::MAX, 10), [(Micros::MAX, i32::MAX, long)]);
        assert!(index.is_empty());
    }

    #[test]
    fn a_batch_stops_at_its_size_and_the_rest_stays() {
        let mut index = ExpiryIndex::default();
        for i in 0..10u8 {
            index.insert(500, 0, &[i]);
        }
        assert_eq!(pop(&mut index, 1_000, 4).len(), 4);
        assert_eq!(index.len(), 6);
        assert_eq!(pop(&mut index, 1_000, 100).len(), 6);
        assert!(index.is_empty());
    }

    proptest! {
        /// The index against a plain list: same entries out, each exactly once, only when due.
        #[test]
        fn the_index_pops_exactly_what_a_plain_list_says_is_due(
            ops in prop::collection::vec(
                prop_oneof![
                    (0u64..5_000, 0i32..3, prop::collection::vec(any::<u8>(), 0..4))
                        .prop_map(|(d, db, name)| (0u8, d, db, name)),
                    (0u64..6_000, 1i32..40).prop_map(|(now, max)| (1u8, now, max, Vec::new())),
                    (0i32..3).prop_map(|db| (2u8, 0, db, Vec::new())),
                ],
                1..80,
            )
        ) {
            let mut index = ExpiryIndex::default();
            let mut model: Vec<(Micros, i32, Vec<u8>)> = Vec::new();
            for (op, a, b, name) in ops {
                match op {
                    0 => {
                        index.insert(a, b, &name);
                        model.push((a, b, name));
                    }
                    1 => {
                        let popped = pop(&mut index, a, b as usize);
                        prop_assert!(popped.len() <= b as usize);
                        for entry in &popped {
                            prop_assert!(entry.0 <= a, "popped before its deadline");
                            let at = model.iter().position(|m| m == entry);
                            prop_assert!(at.is_some(), "popped what was not inserted");
                            model.swap_remove(at.unwrap_or_default());
                        }
                        // Whatever stays due is in a later bucket than everything popped, or
                        // the batch was full.
                        if popped.len() < b as usize {
                            let first_left = model.iter().map(|m| m.0.div_ceil(1_000)).min();
                            let next = index.next_deadline().map(|d| d / 1_000);
                            prop_assert_eq!(first_left, next);
                            if let Some(first) = first_left {
                                prop_assert!(
                                    !model.iter().any(|m| m.0.div_ceil(1_000) == first && m.0 <= a),
                                    "a due entry of the first bucket was left"
                                );
                            }
                        }
                    }
                    _ => {
                        index.rewrite(|db, _| db != b, |db| db);
                        model.retain(|m| m.1 != b);
                    }
                }
                prop_assert_eq!(index.len(), model.len());
            }
            let mut rest = pop(&mut index, Micros::MAX, usize::MAX);
            rest.sort();
            model.sort();
            prop_assert_eq!(rest, model);
        }
    }
}
