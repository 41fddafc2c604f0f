//! The deadline index behind active expiry: which key's lease may end next.
//!
//! Entries are hints, never truth. Every entry is checked against the key's lease when it comes
//! due ([`super::Lock::on_due`]), so an entry left behind by a renewal, a release, a DEL or a
//! FLUSHALL costs one lookup and is dropped. The invariant that matters is the other direction:
//! every live lease has an entry at or before its deadline, under its current key name.

use std::collections::BTreeMap;

use super::Micros;

/// Entries `(deadline, key)` grouped in one-millisecond buckets: an insert is a push onto its
/// bucket, and a storm of leases that end in the same second is a few hundred buckets drained in
/// order, not a million rebalancing tree operations. Within a bucket, order does not matter:
/// everything in it is due by the end of that millisecond.
#[derive(Clone, Debug)]
pub struct ExpiryIndex<K> {
    buckets: BTreeMap<u64, Vec<(Micros, K)>>,
    len: usize,
}

impl<K> Default for ExpiryIndex<K> {
    fn default() -> Self {
        Self { buckets: BTreeMap::new(), len: 0 }
    }
}

impl<K> ExpiryIndex<K> {
    /// The bucket that holds `deadline`: the millisecond at whose end it falls due.
    fn bucket_of(deadline: Micros) -> u64 {
        deadline.div_ceil(1_000)
    }

    /// Adds an entry.
    pub fn insert(&mut self, deadline: Micros, key: K) {
        self.buckets.entry(Self::bucket_of(deadline)).or_default().push((deadline, key));
        self.len += 1;
    }

    /// When to look next: the end of the first non-empty bucket's millisecond, when everything
    /// in it is due (entries come due at most 1 ms after their deadline, the timer's resolution).
    pub fn next_deadline(&self) -> Option<Micros> {
        self.buckets.first_key_value().map(|(bucket, _)| bucket.saturating_mul(1_000))
    }

    /// Removes and returns an entry due at `now_mono`, earliest bucket first.
    pub fn pop_due(&mut self, now_mono: Micros) -> Option<(Micros, K)> {
        let mut first = self.buckets.first_entry()?;
        let entries = first.get_mut();
        let at = entries.iter().position(|(deadline, _)| *deadline <= now_mono)?;
        let entry = entries.swap_remove(at);
        if entries.is_empty() {
            first.remove();
        }
        self.len -= 1;
        Some(entry)
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

    /// Keeps the entries whose key satisfies `keep`.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        for entries in self.buckets.values_mut() {
            entries.retain(|(_, key)| keep(key));
        }
        self.buckets.retain(|_, entries| !entries.is_empty());
        self.len = self.buckets.values().map(Vec::len).sum();
    }

    /// Renames keys in place (e.g. when two databases swap), keeping every deadline.
    pub fn rename_keys(&mut self, mut rename: impl FnMut(K) -> K) {
        for entries in self.buckets.values_mut() {
            *entries =
                std::mem::take(entries).into_iter().map(|(d, key)| (d, rename(key))).collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_due_in_deadline_order_and_only_once_due() {
        let mut index = ExpiryIndex::default();
        index.insert(300, "c");
        index.insert(100, "a");
        index.insert(200, "b");
        index.insert(100, "a");
        assert_eq!(index.len(), 4, "duplicates are kept; the sweep drops them");
        assert_eq!(index.next_deadline(), Some(1_000), "the end of the first millisecond");
        assert_eq!(index.pop_due(99), None);
        assert_eq!(index.pop_due(250), Some((100, "a")));
        assert_eq!(index.pop_due(250), Some((100, "a")));
        assert_eq!(index.pop_due(250), Some((200, "b")));
        assert_eq!(index.pop_due(250), None);
        assert_eq!(index.len(), 1);
        index.insert(50, "z");
        index.insert(5_500, "late");
        assert_eq!(index.next_deadline(), Some(1_000));
        index.rename_keys(|key| if key == "z" { "y" } else { key });
        assert_eq!(index.pop_due(60), Some((50, "y")));
        assert_eq!(index.pop_due(5_000), Some((300, "c")));
        assert_eq!(index.pop_due(5_000), None, "the next bucket is not due yet");
        assert_eq!(index.next_deadline(), Some(6_000));
        assert_eq!(index.pop_due(6_000), Some((5_500, "late")));
        index.insert(7_000, "c");
        index.retain(|key| *key != "c");
        assert!(index.is_empty());
        index.insert(1, "a");
        index.clear();
        assert!(index.is_empty());
        assert_eq!(index.next_deadline(), None);
    }
}
