//! The deadline index behind active expiry: which key's lease may end next.
//!
//! Entries are hints, never truth. Every entry is checked against the key's lease when it comes
//! due ([`super::Lock::on_due`]), so an entry left behind by a renewal, a release, a DEL or a
//! FLUSHALL costs one lookup and is dropped. The invariant that matters is the other direction:
//! every live lease has an entry at or before its deadline, under its current key name.

use std::collections::BTreeSet;

use super::Micros;

/// Deadline-ordered entries `(deadline, key)`.
#[derive(Clone, Debug)]
pub struct ExpiryIndex<K: Ord> {
    entries: BTreeSet<(Micros, K)>,
}

impl<K: Ord> Default for ExpiryIndex<K> {
    fn default() -> Self {
        Self { entries: BTreeSet::new() }
    }
}

impl<K: Ord> ExpiryIndex<K> {
    /// Adds an entry; an identical one is kept once.
    pub fn insert(&mut self, deadline: Micros, key: K) {
        self.entries.insert((deadline, key));
    }

    /// The earliest deadline in the index.
    pub fn next_deadline(&self) -> Option<Micros> {
        self.entries.first().map(|(deadline, _)| *deadline)
    }

    /// Removes and returns the earliest entry if it is due at `now_mono`.
    pub fn pop_due(&mut self, now_mono: Micros) -> Option<(Micros, K)> {
        if self.next_deadline()? <= now_mono { self.entries.pop_first() } else { None }
    }

    /// Number of entries (live, renewed or stale alike).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the index has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops every entry (a replica keeps no index: it never expires on its own).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Keeps the entries whose key satisfies `keep`.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.entries.retain(|(_, key)| keep(key));
    }

    /// Renames keys in place (e.g. when two databases swap), keeping every deadline.
    pub fn rename_keys(&mut self, mut rename: impl FnMut(K) -> K) {
        let entries = std::mem::take(&mut self.entries);
        self.entries = entries.into_iter().map(|(deadline, key)| (deadline, rename(key))).collect();
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
        assert_eq!(index.len(), 3, "a duplicate entry is kept once");
        assert_eq!(index.next_deadline(), Some(100));
        assert_eq!(index.pop_due(99), None);
        assert_eq!(index.pop_due(250), Some((100, "a")));
        assert_eq!(index.pop_due(250), Some((200, "b")));
        assert_eq!(index.pop_due(250), None);
        assert_eq!(index.len(), 1);
        index.insert(50, "z");
        index.rename_keys(|key| if key == "z" { "y" } else { key });
        assert_eq!(index.pop_due(60), Some((50, "y")));
        index.retain(|key| *key != "c");
        assert!(index.is_empty());
        index.insert(1, "a");
        index.clear();
        assert!(index.is_empty());
        assert_eq!(index.next_deadline(), None);
    }
}
