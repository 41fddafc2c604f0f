//! The place of a lock's exclusive lease: the lease, or, when there is none, where the lock's
//! pending expiry index entry is recorded (the lease records it while there is one). A lock is
//! then one 80-byte allocation: this slot is no larger than the lease.

use std::cell::Cell;

use super::super::Micros;
use super::Lease;

/// The exclusive lease, or none: an `Option<Lease>` that also keeps when the lock's pending
/// expiry index entry comes due (0: none known) across the lease's coming and going.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    /// No exclusive lease; when the pending index entry comes due.
    Vacant(Cell<Micros>),
    /// The exclusive lease, live or not; it records the pending index entry.
    Held(Lease),
}

impl Default for Slot {
    fn default() -> Self {
        Self::Vacant(Cell::new(0))
    }
}

impl Slot {
    pub(super) fn as_ref(&self) -> Option<&Lease> {
        match self {
            Self::Held(lease) => Some(lease),
            Self::Vacant(_) => None,
        }
    }

    pub(super) fn as_mut(&mut self) -> Option<&mut Lease> {
        match self {
            Self::Held(lease) => Some(lease),
            Self::Vacant(_) => None,
        }
    }

    pub(super) fn is_some(&self) -> bool {
        matches!(self, Self::Held(_))
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Lease> + use<'_> {
        self.as_ref().into_iter()
    }

    /// Takes the lease out; the slot keeps its pending index entry.
    pub(super) fn take(&mut self) -> Option<Lease> {
        let scheduled = self.scheduled();
        match std::mem::replace(self, Self::Vacant(Cell::new(scheduled))) {
            Self::Held(lease) => Some(lease),
            Self::Vacant(_) => None,
        }
    }

    /// Takes the lease out if `pred` holds for it.
    pub(super) fn take_if(&mut self, pred: impl FnOnce(&Lease) -> bool) -> Option<Lease> {
        if self.as_ref().is_some_and(pred) { self.take() } else { None }
    }

    /// Puts `lease` in, which records the slot's pending index entry from now on; returns the
    /// lease it replaced.
    pub(super) fn replace(&mut self, lease: Lease) -> Option<Lease> {
        let scheduled = self.scheduled();
        lease.note_scheduled((scheduled > 0).then_some(scheduled));
        match std::mem::replace(self, Self::Held(lease)) {
            Self::Held(lease) => Some(lease),
            Self::Vacant(_) => None,
        }
    }

    /// When the lock's pending index entry comes due, 0 if none is known.
    pub(super) fn scheduled(&self) -> Micros {
        match self {
            Self::Vacant(scheduled) => scheduled.get(),
            Self::Held(lease) => lease.scheduled_at().unwrap_or(0),
        }
    }

    /// Records that the lock's pending index entry comes due at `due` (the end of a
    /// millisecond).
    pub(super) fn set_scheduled(&self, due: Micros) {
        match self {
            Self::Vacant(scheduled) => scheduled.set(due),
            Self::Held(lease) => lease.note_scheduled(Some(due)),
        }
    }
}
