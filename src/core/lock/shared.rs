//! The shared leases of one lock.

use std::collections::{BTreeMap, BTreeSet};

use super::super::{Micros, Now};
use super::Lease;

/// The shared leases of one lock, indexed so that every operation on one of them costs
/// O(log n) in the number of holders: by fence (grant order), by token, and by deadline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct SharedLeases {
    /// The leases by fence: grant order.
    pub(super) by_fence: BTreeMap<u64, Lease>,
    /// Each holder's fence, by its token: a token holds at most one shared lease. A B-tree, like
    /// every index here: it grows and shrinks a node at a time, where a hash map would rehash
    /// every entry in one step (15 ms for the 57,344th of a crowd's grants).
    fence_of_token: BTreeMap<Box<[u8]>, u64>,
    /// Each lease's deadline (monotonic), then fence: the first to end comes first.
    deadlines: BTreeSet<(Micros, u64)>,
}

impl SharedLeases {
    pub(super) fn is_empty(&self) -> bool {
        self.by_fence.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.by_fence.len()
    }

    /// The lease with `fence`, live or not.
    pub(super) fn get(&self, fence: u64) -> Option<&Lease> {
        self.by_fence.get(&fence)
    }

    /// The lease of `token`, live or not.
    pub(super) fn of_token(&self, token: &[u8]) -> Option<&Lease> {
        self.by_fence.get(self.fence_of_token.get(token)?)
    }

    /// Changes the lease of `token` with `change` (which must keep its token and fence), and
    /// moves its deadline entry along.
    pub(super) fn update<R>(
        &mut self,
        token: &[u8],
        change: impl FnOnce(&mut Lease) -> R,
    ) -> Option<R> {
        let fence = *self.fence_of_token.get(token)?;
        let lease = self.by_fence.get_mut(&fence)?;
        let before = lease.deadline_mono();
        let result = change(lease);
        debug_assert!(lease.fence == fence && *lease.token == *token, "token and fence stay");
        if lease.deadline_mono() != before {
            self.deadlines.remove(&(before, fence));
            self.deadlines.insert((lease.deadline_mono(), fence));
        }
        Some(result)
    }

    /// Adds `lease`; a lease of the same token (or, never the case, with the same fence) goes.
    /// Returns whether one went.
    pub(super) fn insert(&mut self, lease: Lease) -> bool {
        let mut replaced = false;
        if let Some(&fence) = self.fence_of_token.get(&*lease.token) {
            replaced |= self.remove(fence).is_some();
        }
        replaced |= self.remove(lease.fence).is_some();
        self.fence_of_token.insert((*lease.token).into(), lease.fence);
        self.deadlines.insert((lease.deadline_mono(), lease.fence));
        self.by_fence.insert(lease.fence, lease);
        replaced
    }

    /// Takes out the lease with `fence`.
    pub(super) fn remove(&mut self, fence: u64) -> Option<Lease> {
        let lease = self.by_fence.remove(&fence)?;
        if self.fence_of_token.get(&*lease.token) == Some(&fence) {
            self.fence_of_token.remove(&*lease.token);
        }
        self.deadlines.remove(&(lease.deadline_mono(), fence));
        Some(lease)
    }

    /// Takes out at most `max` of the leases that have expired at `now` (the earliest
    /// deadlines first), in grant order: O(k log n) for k of them.
    pub(super) fn expire(&mut self, now: Now, max: usize) -> Vec<Lease> {
        let mut expired = Vec::new();
        while let Some(&(deadline, fence)) = self
            .deadlines
            .first()
            .filter(|(deadline, _)| *deadline <= now.mono && expired.len() < max)
        {
            match self.remove(fence) {
                Some(lease) => expired.push(lease),
                // Never the case (an entry goes with its lease), but never a loop.
                None => {
                    self.deadlines.remove(&(deadline, fence));
                }
            }
        }
        expired.sort_unstable_by_key(|lease| lease.fence);
        expired
    }

    /// Takes out every lease, in grant order.
    pub(super) fn take_all(&mut self) -> Vec<Lease> {
        self.fence_of_token.clear();
        self.deadlines.clear();
        std::mem::take(&mut self.by_fence).into_values().collect()
    }

    /// How many leases live at `now`: all but those whose deadline has passed (none, once the
    /// lock has settled), so O(log n + expired ones).
    pub(super) fn live(&self, now: Now) -> usize {
        let ended = self.deadlines.range(..=(now.mono, u64::MAX)).count();
        self.len().saturating_sub(ended)
    }

    /// Whether any lease lives at `now`: the latest deadline is still ahead.
    pub(super) fn any_live(&self, now: Now) -> bool {
        self.deadlines.last().is_some_and(|(deadline, _)| *deadline > now.mono)
    }

    /// The newest lease live at `now` (expired ones not yet removed are stepped over).
    pub(super) fn newest_live(&self, now: Now) -> Option<&Lease> {
        self.by_fence.values().rev().find(|lease| lease.is_live(now))
    }

    /// The earliest deadline.
    pub(super) fn first_deadline(&self) -> Option<Micros> {
        self.deadlines.first().map(|(deadline, _)| *deadline)
    }

    /// Whether the indexes agree with the leases (for tests).
    #[cfg(test)]
    pub(super) fn is_consistent(&self) -> bool {
        self.fence_of_token.len() == self.by_fence.len()
            && self.deadlines.len() == self.by_fence.len()
            && self.by_fence.iter().all(|(&fence, lease)| {
                lease.fence == fence
                    && self.fence_of_token.get(&*lease.token) == Some(&fence)
                    && self.deadlines.contains(&(lease.deadline_mono(), fence))
            })
    }
}
