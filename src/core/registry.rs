//! The registry of clients blocked in `DLOCK.ACQUIRE … WAIT`, as data: which waiter is which
//! blocked client, on which key, until when, and what it was answered. `waiters.rs` keeps one
//! (in the module's state) and does the blocking API calls around it.

use std::collections::{BTreeSet, HashMap};

use super::{Micros, shrink_if_sparse};

/// A key as the glue names it: database number and key name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyRef {
    /// The database (`SELECT` number) holding the key.
    pub db: i32,
    /// The key name.
    pub name: Box<[u8]>,
}

/// A lease handed to a waiter, as needed to undo it if the reply is lost.
#[derive(Clone, Debug)]
pub struct Grant {
    /// Where the lease is.
    pub key: KeyRef,
    /// Its owner.
    pub token: Box<[u8]>,
    /// Its fence.
    pub fence: u64,
}

/// What a blocked ACQUIRE finally answers.
pub enum Outcome {
    /// The lease was handed over with this fence.
    Granted(u64),
    /// Not granted: the wait timed out, or a newer wait of the same token took its place.
    Nil,
}

/// Where a registration is: still waiting, or answered.
pub enum State {
    /// Still waiting; gives up at this instant (never: `None`).
    Waiting {
        /// When the module's timer answers nil.
        gives_up_at: Option<Micros>,
    },
    // The grant is boxed: it is rare next to a waiting entry, and every entry is as large as the
    // largest state.
    /// Answered: with this fence (nil: `None`); `grant` says where, until its reply is
    /// delivered or confirmed.
    Answered {
        /// The fence answered.
        fence: Option<u64>,
        /// The grant to undo if the reply is lost.
        grant: Option<Box<Grant>>,
        /// Whether the reply reached the client.
        delivered: bool,
    },
}

/// One registration.
pub struct Blocked {
    /// The blocked client handle (0 until blocked).
    pub handle: usize,
    /// The key it waits on.
    pub key: KeyRef,
    /// Waiting or answered.
    pub state: State,
}

/// Every registration, by id and by blocked-client handle, with the time-outs.
#[derive(Default)]
pub struct Registry {
    /// The last id given out.
    pub next_id: u64,
    /// Registrations by id.
    pub by_id: HashMap<u64, Blocked>,
    /// Ids by blocked-client handle.
    pub by_handle: HashMap<usize, u64>,
    /// When each waiting registration gives up.
    pub timeouts: BTreeSet<(Micros, u64)>,
    /// Registrations answered with a grant whose private data Redis has not freed yet, by the
    /// grant's fence: few, and only until the event loop's next turn.
    pub answered_grants: HashMap<u64, u64>,
}

impl Registry {
    /// Takes registration `id` out of both maps, and gives their memory back once they are
    /// mostly empty: a hash map keeps its largest capacity otherwise, so a crowd of waiters
    /// that left would stay allocated for the life of the server.
    pub fn remove(&mut self, id: u64) -> Option<Blocked> {
        let blocked = self.by_id.remove(&id)?;
        self.by_handle.remove(&blocked.handle);
        if let State::Answered { grant: Some(grant), .. } = &blocked.state {
            self.answered_grants.remove(&grant.fence);
        }
        shrink_if_sparse(&mut self.by_id);
        shrink_if_sparse(&mut self.by_handle);
        shrink_if_sparse(&mut self.answered_grants);
        Some(blocked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(handle: usize) -> Blocked {
        let key = KeyRef { db: 0, name: b"one".to_vec().into_boxed_slice() };
        Blocked { handle, key, state: State::Waiting { gives_up_at: None } }
    }

    #[test]
    fn a_crowd_that_left_gives_the_maps_back() {
        let mut registry = Registry::default();
        for id in 1..=2_000u64 {
            registry.by_id.insert(id, waiting(id as usize * 16));
            registry.by_handle.insert(id as usize * 16, id);
        }
        let crowd = registry.by_id.capacity();
        for id in 1..=1_990u64 {
            assert!(registry.remove(id).is_some());
        }
        assert_eq!(registry.by_id.len(), 10);
        assert_eq!(registry.by_handle.len(), 10);
        assert!(registry.by_id.capacity() <= 64, "{} of {crowd} kept", registry.by_id.capacity());
        assert!(registry.by_handle.capacity() <= 64);
        assert!(registry.by_handle.get(&(1_995 * 16)) == Some(&1_995), "the rest still found");
        assert!(registry.remove(1).is_none(), "a removed id is gone");
    }
}
