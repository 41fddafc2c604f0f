//! The line of requests for a lock (blocked waiters and tickets), with the lock's shared
//! leases: only locks that more than one client uses at once have either.

use std::collections::{BTreeMap, BTreeSet};

use super::super::mode::Mode;
use super::super::{Micros, Now};
use super::Lease;
use super::shared::SharedLeases;

/// A client blocked in `ACQUIRE … WAIT`, in line for the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// Identifies the blocked client to the glue that can answer it.
    pub id: u64,
    /// The token it will hold.
    pub token: Box<[u8]>,
    /// Lease length it asked for, applied from the moment of hand-over.
    pub ttl_ms: u64,
    /// When its wait ends (monotonic), `None` for `WAIT 0`.
    pub gives_up_at: Option<Micros>,
    /// When it joined the queue (monotonic), for the wait-time histogram.
    pub queued_at: Micros,
    /// `CLAIM claim-ms`: a lease handed to it first runs at most this long, until claimed.
    pub claim_ms: Option<u64>,
    /// A ticket (`QUEUE`), not a blocked client: it lapses at this instant unless refreshed.
    pub ticket_until: Option<Micros>,
    /// Exclusive or shared, as it asked.
    pub mode: Mode,
    /// `META`: the metadata its lease will carry.
    pub meta: Option<Box<[u8]>>,
    /// A set's ticket (`DLOCK.ACQUIREALL … QUEUE`): never handed the lease alone. At the head
    /// of the line it keeps everyone behind waiting, and its token's `ACQUIREALL` is granted the
    /// lock once the ticket heads the line of every member of its set.
    pub set: bool,
    /// A ticket's `NOTIFY request`: its grant is published on the ticket's own channel, naming
    /// this number (the latest it was refreshed with).
    pub notify: Option<u64>,
}

/// The line of waiters, in the order they joined: each join, leave or time-out is O(log n).
/// The shared leases live here too: like waiters, only locks that more than one client uses at
/// once have them; each grant, lookup, renewal, release or expiry of one is O(log n) too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Line {
    /// The place the next waiter takes; places only grow, so their order is the line's.
    next_place: u64,
    /// Waiters by place.
    places: BTreeMap<u64, Waiter>,
    /// Each waiter's place, by its id.
    pub(super) place_of_id: BTreeMap<u64, u64>,
    /// Each queued token's place: a token waits at most once.
    pub(super) place_of_token: BTreeMap<Box<[u8]>, u64>,
    /// Tickets by when they lapse, then place.
    tickets: BTreeSet<(Micros, u64)>,
    /// The shared leases.
    pub(super) shared: SharedLeases,
}

impl Line {
    /// Takes the waiter at `place` out of every index.
    pub(super) fn take(&mut self, place: u64) -> Option<Waiter> {
        let waiter = self.places.remove(&place)?;
        self.place_of_id.remove(&waiter.id);
        if self.place_of_token.get(&waiter.token) == Some(&place) {
            self.place_of_token.remove(&waiter.token);
        }
        if let Some(until) = waiter.ticket_until {
            self.tickets.remove(&(until, place));
        }
        Some(waiter)
    }

    /// Puts `waiter` at `place` in every index.
    pub(super) fn put(&mut self, place: u64, waiter: Waiter) {
        self.place_of_id.insert(waiter.id, place);
        self.place_of_token.insert(waiter.token.clone(), place);
        if let Some(until) = waiter.ticket_until {
            self.tickets.insert((until, place));
        }
        self.places.insert(place, waiter);
    }
}

/// A FIFO queue of waiters, and the shared leases, that costs one pointer while empty, as almost
/// every lock's is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Queue(pub(super) Option<Box<Line>>);

impl Queue {
    /// The shared leases, if there are any.
    pub(super) fn shared(&self) -> Option<&SharedLeases> {
        self.0.as_ref().map(|line| &line.shared).filter(|shared| !shared.is_empty())
    }

    /// The shared leases, in grant order.
    pub(super) fn shared_leases(&self) -> impl Iterator<Item = &Lease> + use<'_> {
        self.0.as_ref().into_iter().flat_map(|line| line.shared.by_fence.values())
    }

    /// Changes the shared lease of `token` (live or not), if it has one.
    pub(super) fn update_shared<R>(
        &mut self,
        token: &[u8],
        change: impl FnOnce(&mut Lease) -> R,
    ) -> Option<R> {
        self.0.as_mut()?.shared.update(token, change)
    }

    /// Adds a shared lease; one of the same token goes. Returns whether one went.
    pub(super) fn add_shared(&mut self, lease: Lease) -> bool {
        self.0.get_or_insert_with(Box::default).shared.insert(lease)
    }

    /// Takes out the shared lease with `fence`.
    pub(super) fn remove_shared(&mut self, fence: u64) -> Option<Lease> {
        let lease = self.0.as_mut()?.shared.remove(fence);
        self.shrink();
        lease
    }

    /// Takes out at most `max` of the shared leases that have expired at `now`, in grant order.
    pub(super) fn expire_shared(&mut self, now: Now, max: usize) -> Vec<Lease> {
        let Some(line) = self.0.as_mut() else { return Vec::new() };
        let expired = line.shared.expire(now, max);
        self.shrink();
        expired
    }

    /// Takes out every shared lease, in grant order.
    pub(super) fn take_shared(&mut self) -> Vec<Lease> {
        let Some(line) = self.0.as_mut() else { return Vec::new() };
        let taken = line.shared.take_all();
        self.shrink();
        taken
    }

    pub(super) fn iter(&self) -> impl ExactSizeIterator<Item = &Waiter> + use<'_> {
        static EMPTY: BTreeMap<u64, Waiter> = BTreeMap::new();
        self.0.as_ref().map_or(&EMPTY, |line| &line.places).values()
    }

    pub(super) fn front(&self) -> Option<&Waiter> {
        self.0.as_ref()?.places.first_key_value().map(|(_, waiter)| waiter)
    }

    /// The waiter of `token`, if it is in line.
    pub(super) fn of_token(&self, token: &[u8]) -> Option<&Waiter> {
        let line = self.0.as_ref()?;
        line.places.get(line.place_of_token.get(token)?)
    }

    /// Puts `waiter` at the back, or in the place of a waiter with the same token, which is
    /// returned.
    pub(super) fn join(&mut self, waiter: Waiter) -> Option<Waiter> {
        let line = self.0.get_or_insert_with(Box::default);
        if let Some(&place) = line.place_of_token.get(&waiter.token) {
            let old = line.take(place)?;
            line.put(place, waiter);
            return Some(old);
        }
        let place = line.next_place;
        line.next_place += 1;
        line.put(place, waiter);
        None
    }

    pub(super) fn pop_front(&mut self) -> Option<Waiter> {
        let line = self.0.as_mut()?;
        let place = *line.places.first_key_value()?.0;
        let waiter = line.take(place);
        self.shrink();
        waiter
    }

    /// Takes `token`'s ticket out of line, if it holds one (a blocked waiter stays).
    pub(super) fn withdraw_ticket(&mut self, token: &[u8]) -> Option<Waiter> {
        let line = self.0.as_mut()?;
        let &place = line.place_of_token.get(token)?;
        line.places.get(&place)?.ticket_until?;
        let waiter = line.take(place);
        self.shrink();
        waiter
    }

    /// Takes waiter `id` out of line; whether it was there.
    pub(super) fn remove(&mut self, id: u64) -> bool {
        let Some(line) = self.0.as_mut() else { return false };
        let Some(&place) = line.place_of_id.get(&id) else { return false };
        line.take(place);
        self.shrink();
        true
    }

    /// Takes out the tickets that lapsed by `now_mono`.
    pub(super) fn lapsed_tickets(&mut self, now_mono: Micros) -> Vec<Waiter> {
        let Some(line) = self.0.as_mut() else { return Vec::new() };
        let mut lapsed = Vec::new();
        while let Some(&(until, place)) =
            line.tickets.first().filter(|(until, _)| *until <= now_mono)
        {
            match line.take(place) {
                Some(waiter) => lapsed.push(waiter),
                // Never the case (a ticket's entry goes with its waiter), but never a loop.
                None => {
                    line.tickets.remove(&(until, place));
                }
            }
        }
        self.shrink();
        lapsed
    }

    /// When the first standing ticket lapses.
    pub(super) fn first_ticket_lapse(&self) -> Option<Micros> {
        self.0.as_ref()?.tickets.first().map(|(until, _)| *until)
    }

    /// How many tickets stand in line.
    pub(super) fn tickets(&self) -> usize {
        self.0.as_ref().map_or(0, |line| line.tickets.len())
    }

    #[cfg(test)]
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Waiter) -> bool) {
        let gone: Vec<u64> = self.iter().filter(|waiter| !keep(waiter)).map(|w| w.id).collect();
        for id in gone {
            self.remove(id);
        }
    }

    /// How many stand in line.
    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |line| line.places.len())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the line holds on the heap (for `MEMORY USAGE`), estimated from what each entry
    /// costs: a waiter in the line's tree (nodes are about half full, so twice its size), its
    /// entries in the id and token maps, its token twice and its metadata (allocations round up
    /// to 8 bytes), and a ticket's entry in the lapse order; each shared lease in the fence
    /// tree and its entry in the deadline tree (grants append, which leaves nodes about half
    /// full: twice their size), its token map entry and token copy, and its own token.
    pub(super) fn heap_bytes(&self) -> usize {
        let alloc = |len: usize| len.next_multiple_of(8);
        self.0.as_ref().map_or(0, |line| {
            std::mem::size_of::<Line>()
                + line
                    .places
                    .values()
                    .map(|waiter| {
                        2 * std::mem::size_of::<Waiter>()
                            + 96
                            + 2 * alloc(waiter.token.len())
                            + waiter.meta.as_ref().map_or(0, |meta| alloc(meta.len()))
                    })
                    .sum::<usize>()
                + line.tickets.len() * 32
                + line
                    .shared
                    .by_fence
                    .values()
                    .map(|lease| {
                        2 * (8 + std::mem::size_of::<Lease>())
                            + 2 * 16
                            + 32
                            + alloc(lease.token.len())
                            + lease.token.heap_bytes()
                    })
                    .sum::<usize>()
        })
    }

    /// Gives the memory back once nobody waits and no shared lease is left.
    pub(super) fn shrink(&mut self) {
        if self.0.as_ref().is_some_and(|line| line.places.is_empty() && line.shared.is_empty()) {
            self.0 = None;
        }
    }
}
