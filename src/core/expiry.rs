//! The deadline index behind active expiry: which key's lease may end next.
//!
//! Entries are hints, never truth. Every entry is checked against the key's lease when it comes
//! due ([`super::Lock::on_due`]), so an entry left behind by a renewal, a release, a DEL or a
//! FLUSHALL costs one lookup and is dropped. The invariant that matters is the other direction:
//! every live lease has an entry at or before its deadline's millisecond, under its current key
//! name.
//!
//! Entries are grouped in one-millisecond buckets and come due at the end of their millisecond,
//! the timer's resolution (so at most 1 ms after the lease's deadline; reads and writes of the key
//! see the exact deadline). An insert appends to its bucket, and a storm of leases that end in
//! the same second is a few hundred buckets drained in order, not a million rebalancing tree
//! operations. Within a bucket, order does not matter. Each bucket (one per millisecond and
//! database) is a byte arena holding its key names back to back, each followed by its length:
//! a lock costs its key name plus one byte here (two past 127 bytes), and the sweep reads names
//! sequentially.

use std::collections::BTreeMap;

use super::Micros;

/// Most bytes a name's length takes after it (a `u64` in base-128 digits).
const MAX_LENGTH_BYTES: usize = 10;

/// How many of a bucket's newest entries a release looks through for its own (about as many
/// clients as grant in one millisecond on one server).
pub const FORGET_WINDOW: usize = 64;

/// How many of a bucket's newest entries a release always looks through, even in a bucket that
/// gave up ([`FORGET_GIVE_UP`]): a release right after its grant finds its entry there.
pub const FORGET_ALWAYS: usize = 4;

/// After this many releases in a row that did not find their entry, a bucket looks only
/// through its [`FORGET_ALWAYS`] newest entries (and through the whole window every 16th
/// release), until one finds it again. Leases released in the order they were granted, long
/// after, are all out of the window: looking through it would cost each release 64 reads for
/// nothing.
pub const FORGET_GIVE_UP: u8 = 8;

/// The latest deadline due at `now_mono`: an entry inserted with it comes due in the sweep
/// running now, after every entry due before it (the start of the current millisecond).
pub fn due_now(now_mono: Micros) -> Micros {
    now_mono - now_mono % 1_000
}

/// The millisecond at whose end an entry inserted with `deadline` comes due: its bucket.
pub fn due_ms(deadline: Micros) -> u64 {
    deadline.div_ceil(1_000)
}

/// When an entry inserted with `deadline` comes due: the end of its millisecond.
pub fn comes_due(deadline: Micros) -> Micros {
    ExpiryIndex::due_at(due_ms(deadline))
}

/// Appends `value` as base-128 digits, most significant first, so that it reads back from the
/// end: the last byte holds the lowest 7 bits, and every byte but the first carries 0x80.
fn push_backward_varint(bytes: &mut Vec<u8>, value: u64) {
    let mut digits = [0u8; MAX_LENGTH_BYTES];
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
#[inline]
fn read_backward_varint(bytes: &[u8], end: usize) -> Option<(u64, usize)> {
    // Names shorter than 128 bytes, almost all of them, take one byte.
    let last = end.checked_sub(1)?;
    match bytes.get(last) {
        Some(&digit) if digit & 0x80 == 0 => return Some((u64::from(digit), last)),
        None => return None,
        Some(_) => {}
    }
    read_backward_varint_long(bytes, end)
}

/// [`read_backward_varint`] for a value of more than one byte.
fn read_backward_varint_long(bytes: &[u8], end: usize) -> Option<(u64, usize)> {
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

/// The key names of one bucket, each followed by its length.
#[derive(Clone, Debug, Default)]
struct Bucket {
    bytes: Vec<u8>,
    /// Its spare capacity was given back once, when inserts moved on to another bucket.
    trimmed: bool,
    /// Releases since one last found its entry here ([`FORGET_GIVE_UP`]), wrapping back to
    /// [`FORGET_GIVE_UP`] past 255.
    misses: u8,
}

impl Bucket {
    fn push(&mut self, name: &[u8]) {
        // Grow by a quarter, not double: a bucket fills within its millisecond and is then only
        // drained, so doubling would leave up to half of it empty for the leases' whole life.
        let needed = name.len() + MAX_LENGTH_BYTES;
        if self.bytes.capacity() - self.bytes.len() < needed {
            self.bytes.reserve_exact((self.bytes.capacity() / 4).max(needed).max(64));
        }
        self.bytes.extend_from_slice(name);
        push_backward_varint(&mut self.bytes, name.len() as u64);
    }

    /// The last name: where it starts and ends. `None` when the bucket is empty.
    fn last(&self) -> Option<(usize, usize)> {
        let (len, end) = read_backward_varint(&self.bytes, self.bytes.len())?;
        let start = end.checked_sub(usize::try_from(len).ok()?)?;
        Some((start, end))
    }

    /// Where the entry for `name` starts and ends (its length included), among the last
    /// `window` entries; the newest such entry if there are several.
    fn find_recent(&self, name: &[u8], window: usize) -> Option<(usize, usize)> {
        let bytes = self.bytes.as_slice();
        let last = name.last().copied();
        let mut end = bytes.len();
        for _ in 0..window {
            let length_at = end.checked_sub(1)?;
            let digit = *bytes.get(length_at)?;
            // Most names are shorter than 128 bytes: their length is the one byte before `end`.
            let (len, name_end) = if digit & 0x80 == 0 {
                (usize::from(digit), length_at)
            } else {
                let (len, name_end) = read_backward_varint_long(bytes, end)?;
                (usize::try_from(len).ok()?, name_end)
            };
            let start = name_end.checked_sub(len)?;
            // Names of one application mostly differ at the end (`order:41`, `order:42`): the
            // length and the last byte turn most of them away before a full comparison.
            if len == name.len()
                && (len == 0 || bytes.get(name_end - 1).copied() == last)
                && bytes.get(start..name_end) == Some(name)
            {
                return Some((start, end));
            }
            end = start;
        }
        None
    }

    /// Every name, last first.
    fn names(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut end = self.bytes.len();
        std::iter::from_fn(move || {
            let (len, name_end) = read_backward_varint(&self.bytes, end)?;
            let start = name_end.checked_sub(usize::try_from(len).ok()?)?;
            end = start;
            self.bytes.get(start..name_end)
        })
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

    /// The entries: when each came due (the end of its bucket), database, key name.
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

/// Entries `(deadline, database, key name)` in buckets keyed by millisecond and database.
#[derive(Clone, Debug, Default)]
pub struct ExpiryIndex {
    buckets: BTreeMap<(u64, i32), Bucket>,
    len: usize,
    /// The bucket of the latest insert.
    filling: Option<(u64, i32)>,
}

impl ExpiryIndex {
    /// The bucket that holds `deadline`: the millisecond at whose end it falls due.
    fn bucket_of(deadline: Micros) -> u64 {
        due_ms(deadline)
    }

    /// When the entries of bucket `number` come due.
    fn due_at(number: u64) -> Micros {
        number.saturating_mul(1_000)
    }

    /// Adds an entry for key `name` of database `db`, due at the end of `deadline`'s millisecond.
    pub fn insert(&mut self, deadline: Micros, db: i32, name: &[u8]) {
        let key = (Self::bucket_of(deadline), db);
        if let Some(previous) = self.filling.filter(|previous| *previous != key) {
            // Leases of one ttl fill one bucket after another: when inserts move on, the last
            // bucket is most likely complete, so its spare capacity goes back (once per bucket,
            // so that inserts alternating between buckets never copy them over and over).
            if let Some(bucket) = self.buckets.get_mut(&previous).filter(|b| !b.trimmed) {
                bucket.bytes.shrink_to_fit();
                bucket.trimmed = true;
            }
        }
        self.filling = Some(key);
        // Leases of one ttl land in the newest bucket: reach it along the tree's right edge.
        match self.buckets.last_entry() {
            Some(mut last) if *last.key() == key => last.get_mut().push(name),
            _ => self.buckets.entry(key).or_default().push(name),
        }
        self.len += 1;
    }

    /// Drops the entry for `name` of `db` at `deadline` if it is among the last
    /// [`FORGET_WINDOW`] entries of its bucket (a lease released soon after its grant, while
    /// other clients' grants filled the same millisecond), so a released lock does not hold index
    /// memory until its old deadline; in a bucket whose releases keep missing, among the last
    /// [`FORGET_ALWAYS`] ([`FORGET_GIVE_UP`]). The bytes after it move down, at most a window's
    /// worth. Older entries stay: they are dropped when due. Returns whether it dropped one.
    pub fn forget_recent(&mut self, deadline: Micros, db: i32, name: &[u8]) -> bool {
        let key = (Self::bucket_of(deadline), db);
        let Some(bucket) = self.buckets.get_mut(&key) else { return false };
        let window = if bucket.misses < FORGET_GIVE_UP || bucket.misses % 16 == 0 {
            FORGET_WINDOW
        } else {
            FORGET_ALWAYS
        };
        let Some((start, end)) = bucket.find_recent(name, window) else {
            bucket.misses = bucket.misses.checked_add(1).unwrap_or(FORGET_GIVE_UP);
            return false;
        };
        bucket.misses = 0;
        bucket.bytes.drain(start..end);
        if bucket.bytes.is_empty() {
            self.buckets.remove(&key);
        }
        self.len -= 1;
        true
    }

    /// When to look next: the end of the first non-empty bucket's millisecond.
    pub fn next_deadline(&self) -> Option<Micros> {
        self.buckets.first_key_value().map(|((number, _), _)| Self::due_at(*number))
    }

    /// Moves up to `max` entries due at `now_mono` into `out`, earliest bucket first; each comes
    /// with the end of its bucket as its deadline. Returns how many it moved.
    pub fn pop_due(&mut self, now_mono: Micros, max: usize, out: &mut DueBatch) -> usize {
        let mut moved = 0;
        while moved < max {
            let Some(mut first) = self.buckets.first_entry() else { break };
            let (number, db) = *first.key();
            let due_at = Self::due_at(number);
            if due_at > now_mono {
                break;
            }
            let bucket = first.get_mut();
            // Take from the end: each name taken shortens the arena.
            while moved < max {
                let Some((start, end)) = bucket.last() else { break };
                out.push(due_at, db, bucket.bytes.get(start..end).unwrap_or_default());
                bucket.bytes.truncate(start);
                moved += 1;
            }
            if bucket.bytes.is_empty() {
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
        let mut rewritten: BTreeMap<(u64, i32), Bucket> = BTreeMap::new();
        let mut len = 0;
        for ((number, db), bucket) in std::mem::take(&mut self.buckets) {
            let mut names: Vec<&[u8]> = bucket.names().filter(|name| keep(db, name)).collect();
            if names.is_empty() {
                continue;
            }
            names.reverse(); // keep the arena's order
            let kept = rewritten.entry((number, rename_db(db))).or_default();
            for name in names {
                kept.push(name);
                len += 1;
            }
        }
        self.buckets = rewritten;
        self.len = len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_entry_due_now_comes_due_in_the_sweep_running_now_after_earlier_ones() {
        let mut index = ExpiryIndex::default();
        let now = 20_000_700;
        index.insert(19_998_100, 0, b"earlier");
        index.insert(20_000_900, 0, b"later");
        index.insert(due_now(now), 0, b"crowd");
        let mut out = DueBatch::default();
        assert_eq!(index.pop_due(now, 10, &mut out), 2);
        let names: Vec<&[u8]> = out.iter().map(|(_, _, name)| name).collect();
        assert_eq!(names, [&b"earlier"[..], b"crowd"]);
        assert_eq!(due_now(20_000_000), 20_000_000);
    }

    #[test]
    fn a_released_grant_gives_its_entry_back_when_it_is_recent() {
        let mut index = ExpiryIndex::default();
        index.insert(20_000_500, 0, b"a");
        index.insert(20_000_700, 0, b"bb");
        index.insert(20_000_900, 0, &[b'c'; 200]);
        assert!(!index.forget_recent(20_000_700, 1, b"bb"), "another database");
        assert!(!index.forget_recent(21_000_700, 0, b"bb"), "another bucket");
        assert!(index.forget_recent(20_000_500, 0, b"a"), "the oldest of three");
        assert!(!index.forget_recent(20_000_500, 0, b"a"), "once");
        assert_eq!(pop(&mut index.clone(), 30_000_000, 10).len(), 2, "the others intact");
        assert!(index.forget_recent(20_000_700, 0, b"bb"));
        assert!(index.forget_recent(20_000_900, 0, &[b'c'; 200]));
        assert!(index.is_empty());
        assert_eq!(index.next_deadline(), None, "the empty bucket is gone");
    }

    #[test]
    fn a_release_looks_back_only_a_window_of_entries() {
        let mut index = ExpiryIndex::default();
        for i in 0..=FORGET_WINDOW {
            index.insert(5_000, 0, format!("k{i}").as_bytes());
        }
        assert!(!index.forget_recent(5_000, 0, b"k0"), "past the window: left for the sweep");
        assert!(index.forget_recent(5_000, 0, b"k1"), "the window's oldest");
        assert_eq!(index.len(), FORGET_WINDOW);
        let left: Vec<Vec<u8>> = pop(&mut index, 10_000, 1_000).into_iter().map(|e| e.2).collect();
        assert!(left.contains(&b"k0".to_vec()) && !left.contains(&b"k1".to_vec()));
        assert_eq!(left.len(), FORGET_WINDOW);
    }

    #[test]
    fn a_bucket_whose_releases_keep_missing_looks_only_at_its_newest_entries() {
        let mut index = ExpiryIndex::default();
        for i in 0..200 {
            index.insert(5_000, 0, format!("k{i}").as_bytes());
        }
        // Released in grant order: every entry is past the window.
        for i in 0..usize::from(FORGET_GIVE_UP) {
            assert!(!index.forget_recent(5_000, 0, format!("k{i}").as_bytes()));
        }
        let fifth_newest = b"k195";
        assert!(!index.forget_recent(5_000, 0, fifth_newest), "past the newest four: not looked");
        assert!(index.forget_recent(5_000, 0, b"k199"), "the newest is always looked at");
        assert!(index.forget_recent(5_000, 0, fifth_newest), "a find looks through the window");
        for i in 8..(8 + 15) {
            assert!(!index.forget_recent(5_000, 0, format!("k{i}").as_bytes()));
        }
        assert!(!index.forget_recent(5_000, 0, b"k190"), "given up again (the 15th miss)");
        assert!(index.forget_recent(5_000, 0, b"k190"), "every 16th release looks through");
        assert_eq!(index.len(), 197);
        let mut index = ExpiryIndex::default();
        index.insert(5_000, 0, b"k");
        for _ in 0..1_000 {
            assert!(!index.forget_recent(5_000, 0, b"other"));
        }
        assert!(index.forget_recent(5_000, 0, b"k"), "the count wraps, never stops looking");
    }

    /// Pops one batch of at most `max` entries due at `now`, as `(deadline, db, name)`.
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
    fn entries_come_due_at_the_end_of_their_millisecond_in_bucket_order() {
        let mut index = ExpiryIndex::default();
        index.insert(300, 0, b"c");
        index.insert(100, 0, b"a");
        index.insert(1_000, 0, b"b");
        index.insert(100, 0, b"a");
        assert_eq!(index.len(), 4, "duplicates are kept; the sweep drops them");
        assert_eq!(index.next_deadline(), Some(1_000), "the end of the first millisecond");
        assert_eq!(pop(&mut index, 999, 10), [], "not before the end of the millisecond");
        let mut due = pop(&mut index, 1_000, 10);
        due.sort();
        assert_eq!(
            due,
            [
                entry(1_000, 0, "a"),
                entry(1_000, 0, "a"),
                entry(1_000, 0, "b"),
                entry(1_000, 0, "c")
            ],
            "a deadline on the millisecond boundary belongs to the millisecond it ends"
        );
        index.insert(1_500, 3, b"z");
        index.insert(5_500, 0, b"late");
        assert_eq!(index.next_deadline(), Some(2_000));
        index.rewrite(|_, _| true, |db| if db == 3 { 4 } else { db });
        assert_eq!(pop(&mut index, 5_000, 10), [entry(2_000, 4, "z")]);
        assert_eq!(pop(&mut index, 5_000, 10), [], "the next bucket is not due yet");
        assert_eq!(index.next_deadline(), Some(6_000));
        assert_eq!(pop(&mut index, 6_000, 10), [entry(6_000, 0, "late")]);
        index.insert(7_000, 0, b"c");
        index.insert(7_000, 1, b"d");
        index.rewrite(|_, name| name != b"c", |db| db);
        assert_eq!(index.len(), 1);
        index.rewrite(|db, _| db != 1, |db| db);
        assert!(index.is_empty());
        assert_eq!(index.next_deadline(), None);
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
        assert_eq!(pop(&mut index, 0, 10), [entry(0, 0, "")], "bucket 0 is due at 0");
        assert_eq!(pop(&mut index, 1_000, 10), [(1_000, 15, b"\x80\xff\x00".to_vec())]);
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
        /// The index against a plain list: every entry out exactly once, never before the end
        /// of its millisecond, and nothing due left behind by a batch that was not full.
        #[test]
        fn the_index_pops_exactly_what_a_plain_list_says_is_due(
            ops in prop::collection::vec(
                prop_oneof![
                    (0u64..5_000, 0i32..3, prop::collection::vec(any::<u8>(), 0..200))
                        .prop_map(|(d, db, name)| (0u8, d, db, name)),
                    (0u64..6_000, 1i32..40).prop_map(|(now, max)| (1u8, now, max, Vec::new())),
                    (0i32..3).prop_map(|db| (2u8, 0, db, Vec::new())),
                    (0i32..3).prop_map(|db| (3u8, 0, db, Vec::new())),
                    (0u64..5_000, 0i32..3, prop::collection::vec(any::<u8>(), 0..200))
                        .prop_map(|(d, db, name)| (4u8, d, db, name)),
                    (0u64..5_000, 0i32..3, prop::collection::vec(any::<u8>(), 0..200))
                        .prop_map(|(d, db, name)| (5u8, d, db, name)),
                ],
                1..80,
            )
        ) {
            let mut index = ExpiryIndex::default();
            // (end of the entry's millisecond, db, name)
            let mut model: Vec<(Micros, i32, Vec<u8>)> = Vec::new();
            for (op, a, b, name) in ops {
                match op {
                    0 => {
                        index.insert(a, b, &name);
                        model.push((a.div_ceil(1_000) * 1_000, b, name));
                    }
                    1 => {
                        let popped = pop(&mut index, a, b as usize);
                        prop_assert!(popped.len() <= b as usize);
                        for entry in &popped {
                            prop_assert!(entry.0 <= a, "popped before it was due");
                            let at = model.iter().position(|m| m == entry);
                            prop_assert!(at.is_some(), "popped what was not inserted");
                            model.swap_remove(at.unwrap_or_default());
                        }
                        if popped.len() < b as usize {
                            prop_assert!(!model.iter().any(|m| m.0 <= a), "a due entry was left");
                        }
                    }
                    2 => {
                        index.rewrite(|db, _| db != b, |db| db);
                        model.retain(|m| m.1 != b);
                    }
                    4 | 5 => {
                        // 5: a release right after its grant always finds its entry.
                        if op == 5 {
                            index.insert(a, b, &name);
                            model.push((a.div_ceil(1_000) * 1_000, b, name.clone()));
                        }
                        let entry = (a.div_ceil(1_000) * 1_000, b, name.clone());
                        let forgot = index.forget_recent(a, b, &name);
                        prop_assert!(forgot || op == 4, "the newest entry was not found");
                        if forgot {
                            let at = model.iter().position(|m| *m == entry);
                            prop_assert!(at.is_some(), "forgot what was not inserted");
                            model.remove(at.unwrap_or_default());
                        }
                    }
                    _ => {
                        // SWAPDB of b and b + 1.
                        let swap = |db: i32| if db == b { b + 1 } else if db == b + 1 { b } else { db };
                        index.rewrite(|_, _| true, swap);
                        for m in &mut model {
                            m.1 = swap(m.1);
                        }
                    }
                }
                prop_assert_eq!(index.len(), model.len());
                prop_assert_eq!(index.next_deadline(), model.iter().map(|m| m.0).min());
            }
            let mut rest = pop(&mut index, Micros::MAX, usize::MAX);
            rest.sort();
            model.sort();
            prop_assert_eq!(rest, model);
        }
    }
}
