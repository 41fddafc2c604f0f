//! The core against a tiny reference model, with a virtual clock.
//!
//! A `Store` runs the same [`Step`] operations the commands and the expiry timer run (each
//! settles the lock first: an expired lease goes, the head of the queue gets the lease), then
//! performs the effects the core plans for it ([`effects::plan`]): keys deleted, index entries
//! inserted, and every replicated effect applied to a copy through the replica's own path, which
//! must hold every live lease the primary holds and nothing it ended. A sweep pops due entries. Random operation
//! sequences must agree with the model at every step, and the contract's invariants must hold:
//! at most one live lease per resource, fences strictly increasing, nothing changed by a
//! non-owner, waiters served in FIFO order, and no expired lease left behind by a full sweep.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use proptest::prelude::*;

use super::effects::{self, Effect, Place};
use super::expiry::{DueBatch, ExpiryIndex};
use super::fence::FenceCounter;
use super::lock::{Due, Renewal, Rules};
use super::mode::Mode;
use super::replica;
use super::{Acquired, Host, Lease, Lock, Now, Step, Transition, Waiter};

type Resource = u8;

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        resource: Resource,
        token: u8,
        ttl_ms: u64,
    },
    Wait {
        resource: Resource,
        token: u8,
        ttl_ms: u64,
        /// `CLAIM`: a hand-over first runs at most this long.
        claim_ms: Option<u64>,
    },
    /// `ACQUIRE … QUEUE ticket-ms`.
    Ticket {
        resource: Resource,
        token: u8,
        ttl_ms: u64,
        ticket_ms: u64,
    },
    Cancel {
        resource: Resource,
        pick: usize,
    },
    Renew {
        resource: Resource,
        token: u8,
        ttl_ms: u64,
    },
    Release {
        resource: Resource,
        token: u8,
    },
    /// `DLOCK.REVOKE resource`: the live lease ends, whoever holds it.
    Revoke {
        resource: Resource,
    },
    FenceCheck {
        resource: Resource,
        pick: usize,
    },
    /// Both clocks move on; the wall clock may also step (backwards or forwards).
    Advance {
        ms: u64,
        wall_step_ms: i64,
    },
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    let resource = 0u8..3;
    let token = 0u8..4;
    let ttl = 1u64..50;
    prop_oneof![
        3 => (resource.clone(), token.clone(), ttl.clone())
            .prop_map(|(resource, token, ttl_ms)| Op::Acquire { resource, token, ttl_ms }),
        2 => (resource.clone(), token.clone(), ttl.clone(), proptest::option::of(1u64..20))
            .prop_map(|(resource, token, ttl_ms, claim_ms)| Op::Wait { resource, token, ttl_ms, claim_ms }),
        2 => (resource.clone(), token.clone(), ttl.clone(), 1u64..40)
            .prop_map(|(resource, token, ttl_ms, ticket_ms)| Op::Ticket { resource, token, ttl_ms, ticket_ms }),
        1 => (resource.clone(), any::<usize>()).prop_map(|(resource, pick)| Op::Cancel { resource, pick }),
        2 => (resource.clone(), token.clone(), ttl)
            .prop_map(|(resource, token, ttl_ms)| Op::Renew { resource, token, ttl_ms }),
        2 => (resource.clone(), token).prop_map(|(resource, token)| Op::Release { resource, token }),
        1 => resource.clone().prop_map(|resource| Op::Revoke { resource }),
        1 => (resource, any::<usize>()).prop_map(|(resource, pick)| Op::FenceCheck { resource, pick }),
        3 => (0u64..30, prop_oneof![4 => Just(0i64), 1 => -100i64..100])
            .prop_map(|(ms, wall_step_ms)| Op::Advance { ms, wall_step_ms }),
        1 => Just(Op::Sweep),
    ]
}

/// The server around the core, without Redis: the same `Step` operations the commands and the
/// timer run, and what the glue's apply step does with a lock afterwards (delete the key once
/// vacant, index its deadline otherwise).
#[derive(Default)]
struct Store {
    keys: BTreeMap<Resource, Lock>,
    index: ExpiryIndex,
    fences: FenceCounter,
    /// The waiter registry: waiters whose client went away.
    gone: Gone,
    next_waiter: u64,
    /// Hand-overs in the order they happened: (resource, waiter id, fence).
    handed: Vec<(Resource, u64, u64)>,
    /// A replica: the replicated effects applied through the copy's own path.
    copy: Copy,
}

/// A copy of the data set that learns only what the primary's effects tell it, through the same
/// path as `DLOCK.SETLEASE`, `DLOCK.ENDLEASE` and `DEL` on a replica.
#[derive(Default)]
struct Copy {
    keys: BTreeMap<Resource, Lock>,
    last_fence: u64,
}

impl Copy {
    fn apply(&mut self, resource: Resource, effect: Effect<'_>, now: Now) {
        match effect {
            Effect::ReplicateLease(lease) => {
                // What `DLOCK.SETLEASE` carries: token, fence, deadline, history, mode, meta.
                let mut copied = self.restored(lease, now);
                copied.set_shared(lease.shared());
                let history = Some((lease.granted_wall(now), lease.renewals()));
                self.last_fence = self.last_fence.max(lease.fence);
                replica::set_lease(self.keys.entry(resource).or_default(), copied, history, now);
            }
            Effect::ReplicateRenewal(lease) => {
                // What the short `DLOCK.SETLEASE` carries: token, fence, deadline, no history.
                let copied = self.restored(lease, now);
                let lock =
                    self.keys.get_mut(&resource).expect("a renewal names a key the copy has");
                assert!(lock.lease_with_fence(lease.fence).is_some(), "the copy holds the grant");
                replica::set_lease(lock, copied, None, now);
            }
            Effect::ReplicateEnd(lease) => {
                let lock = self.keys.get_mut(&resource).expect("an end names a key the copy has");
                assert!(replica::end_lease(lock, &lease.token, lease.fence), "the copy had it");
            }
            Effect::ReplicateDel => {
                self.keys.remove(&resource);
            }
            _ => {}
        }
    }

    /// The lease as `DLOCK.SETLEASE` restores it from its token, fence and deadline.
    fn restored(&self, lease: &Lease, now: Now) -> Lease {
        Lease::restore(&lease.token, lease.fence, lease.deadline_wall(), now, self.last_fence)
            .expect("a lease the primary minted is a valid one")
    }

    /// (token, fence, shared, deadline, renewals) of every lease the copy holds for `resource`.
    fn leases(&self, resource: Resource) -> BTreeSet<(Vec<u8>, u64, bool, u64, u32)> {
        leases_of(self.keys.get(&resource).into_iter().flat_map(Lock::holders))
    }
}

fn leases_of<'a>(
    leases: impl Iterator<Item = &'a Lease>,
) -> BTreeSet<(Vec<u8>, u64, bool, u64, u32)> {
    leases
        .map(|l| (l.token.to_vec(), l.fence, l.shared(), l.deadline_wall(), l.renewals()))
        .collect()
}

#[derive(Default)]
struct Gone(BTreeSet<u64>);

impl Host for Gone {
    fn waiter_alive(&self, id: u64) -> bool {
        !self.0.contains(&id)
    }
}

impl Store {
    /// One decision on `resource` (an empty lock when it has no key), then its effects: the
    /// ones on keys and the index performed here, the replicated ones on the copy.
    fn run<T>(
        &mut self,
        resource: Resource,
        now: Now,
        op: impl FnOnce(&mut Step<'_, Gone>, &mut Lock) -> T,
    ) -> T {
        let lock = self.keys.entry(resource).or_default();
        let mut step = Step::new(now, Rules::default(), &mut self.fences, &self.gone);
        let result = op(&mut step, lock);
        let changes = step.into_changes();
        for change in &changes {
            if let Transition::HandedOver { waiter, fence, .. } = change {
                self.handed.push((resource, *waiter, *fence));
            }
        }
        let (mut delete, mut index) = (false, Vec::new());
        let place = Place::Stored { indexes: true, grants_held_until: 0 };
        let copy = &mut self.copy;
        effects::plan(lock, place, &changes, now, |effect| match effect {
            Effect::DeleteKey { propagate, .. } => {
                delete = true;
                if propagate {
                    copy.keys.remove(&resource);
                }
            }
            Effect::Index(at) => index.push(at),
            effect => copy.apply(resource, effect, now),
        });
        if delete {
            self.keys.remove(&resource);
        }
        for at in index {
            self.index.insert(at, 0, &[resource]);
        }
        result
    }

    fn acquire(&mut self, resource: Resource, token: &[u8], ttl_ms: u64, now: Now) -> Acquired {
        self.run(resource, now, |step, lock| step.acquire(lock, token, ttl_ms).expect("fences"))
    }

    /// ACQUIRE … WAIT: an immediate answer, or the id of the new waiter.
    fn wait(
        &mut self,
        resource: Resource,
        token: &[u8],
        ttl_ms: u64,
        claim_ms: Option<u64>,
        now: Now,
    ) -> Result<Acquired, u64> {
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.run(resource, now, |step, lock| {
            match step.acquire(lock, token, ttl_ms).expect("fences") {
                Acquired::Busy | Acquired::GrantsHeld => {
                    let waiter = Waiter {
                        id,
                        token: token.into(),
                        ttl_ms,
                        gives_up_at: None,
                        queued_at: now.mono,
                        claim_ms,
                        ticket_until: None,
                        set: false,
                        notify: None,
                        mode: Mode::Exclusive,
                        meta: None,
                    };
                    step.enqueue(lock, waiter);
                    Err(id)
                }
                immediate => Ok(immediate),
            }
        })
    }

    /// ACQUIRE … QUEUE: an immediate answer, or the id of the (new or refreshed) ticket.
    fn ticket(
        &mut self,
        resource: Resource,
        token: &[u8],
        ttl_ms: u64,
        ticket_ms: u64,
        now: Now,
    ) -> Result<Acquired, u64> {
        self.next_waiter += 1;
        let fresh = self.next_waiter;
        self.run(resource, now, |step, lock| {
            match step.acquire(lock, token, ttl_ms).expect("fences") {
                Acquired::Busy | Acquired::GrantsHeld => {
                    let id = lock.queued(token).map_or(fresh, |queued| queued.id);
                    let waiter = Waiter {
                        id,
                        token: token.into(),
                        ttl_ms,
                        gives_up_at: None,
                        queued_at: now.mono,
                        claim_ms: Some(ticket_ms),
                        ticket_until: Some(now.mono + ticket_ms * 1_000),
                        set: false,
                        notify: None,
                        mode: Mode::Exclusive,
                        meta: None,
                    };
                    step.enqueue_ticket(lock, waiter);
                    Err(id)
                }
                immediate => Ok(immediate),
            }
        })
    }

    /// A waiter's client goes away: the registry forgets it, the timer prunes its queue.
    fn cancel(&mut self, resource: Resource, id: u64, now: Now) {
        self.gone.0.insert(id);
        self.run(resource, now, |step, lock| step.leave(lock, &[id]));
    }

    fn renew(&mut self, resource: Resource, token: &[u8], ttl_ms: u64, now: Now) -> bool {
        self.run(resource, now, |step, lock| {
            step.renew(lock, token, ttl_ms).expect("fences") == Renewal::Renewed
        })
    }

    fn release(&mut self, resource: Resource, token: &[u8], now: Now) -> bool {
        self.run(resource, now, |step, lock| step.release(lock, token))
    }

    fn revoke(&mut self, resource: Resource, now: Now) -> usize {
        self.run(resource, now, |step, lock| step.revoke(lock, None, b"model"))
    }

    /// Drains the index in small batches, as the timer does.
    fn sweep(&mut self, now: Now) {
        let mut batch = DueBatch::default();
        while self.index.pop_due(now.mono, 3, &mut batch) > 0 {
            let due: Vec<(u64, Resource)> =
                batch.iter().map(|(deadline, _, name)| (deadline, name[0])).collect();
            batch.clear();
            for (deadline, resource) in due {
                let Some(lock) = self.keys.get(&resource) else { continue };
                match lock.on_due(deadline, now) {
                    Due::Expired | Due::Vacant => {
                        self.run(resource, now, |step, lock| step.settle_after(lock));
                    }
                    Due::Stale => {}
                    Due::Reschedule(next) => self.index.insert(next, 0, &[resource]),
                }
            }
        }
    }
}

/// A waiter in the model.
#[derive(Clone, Copy, Debug)]
struct Queued {
    id: u64,
    token: u8,
    ttl_ms: u64,
    claim_ms: Option<u64>,
    /// A ticket: lapses then unless refreshed.
    ticket_until: Option<u64>,
}

/// The reference: live leases and queues, compared by value.
#[derive(Default)]
struct Model {
    leases: BTreeMap<Resource, (u8, u64, u64)>,
    queues: BTreeMap<Resource, VecDeque<Queued>>,
    last_fence: u64,
    handed: Vec<(Resource, u64, u64)>,
}

impl Model {
    fn live(&self, resource: Resource, now: Now) -> Option<(u8, u64, u64)> {
        self.leases.get(&resource).copied().filter(|(_, _, deadline)| *deadline > now.mono)
    }

    fn mint(&mut self, now: Now) -> u64 {
        self.last_fence = (self.last_fence + 1).max(now.wall);
        self.last_fence
    }

    /// Expired lease out, head of the queue in. Within one sweep the store may serve resources
    /// in another order than the model, so a hand-over takes the fence the store minted for that
    /// very waiter (the store's fences are checked to increase separately).
    fn settle(&mut self, resource: Resource, now: Now, minted: &[(Resource, u64, u64)]) {
        if let Some(queue) = self.queues.get_mut(&resource) {
            queue.retain(|w| w.ticket_until.is_none_or(|until| until > now.mono));
        }
        if self.live(resource, now).is_some() {
            return;
        }
        self.leases.remove(&resource);
        if let Some(waiter) = self.queues.get_mut(&resource).and_then(VecDeque::pop_front) {
            let ttl_ms = waiter.claim_ms.map_or(waiter.ttl_ms, |claim| claim.min(waiter.ttl_ms));
            let fence = minted
                .iter()
                .find(|(r, id, _)| *r == resource && *id == waiter.id)
                .map_or(0, |(_, _, fence)| *fence);
            self.last_fence = self.last_fence.max(fence);
            self.leases.insert(resource, (waiter.token, fence, now.mono + ttl_ms * 1_000));
            self.handed.push((resource, waiter.id, fence));
        }
    }

    /// When `resource` next needs settling: its lease's deadline or its first ticket's lapse.
    fn next_wake(&self, resource: Resource) -> Option<u64> {
        let lease = self.leases.get(&resource).map(|(_, _, deadline)| *deadline);
        let ticket =
            self.queues.get(&resource).and_then(|q| q.iter().filter_map(|w| w.ticket_until).min());
        match (lease, ticket) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn acquire(
        &mut self,
        resource: Resource,
        token: u8,
        ttl_ms: u64,
        now: Now,
        minted: &[(Resource, u64, u64)],
    ) -> Acquired {
        self.settle(resource, now, minted);
        let deadline = now.mono + ttl_ms * 1_000;
        match self.live(resource, now) {
            Some((owner, fence, _)) if owner == token => {
                self.leases.insert(resource, (token, fence, deadline));
                Acquired::Reacquired { fence }
            }
            Some(_) => Acquired::Busy,
            None => {
                let fence = self.mint(now);
                self.leases.insert(resource, (token, fence, deadline));
                Acquired::Granted { fence, replaced_expired: false }
            }
        }
    }
}

/// Compares outcomes, ignoring `replaced_expired`, which only the store can know.
fn same(got: Acquired, want: Acquired) -> bool {
    match (got, want) {
        (Acquired::Granted { fence: a, .. }, Acquired::Granted { fence: b, .. }) => a == b,
        (got, want) => got == want,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_core_agrees_with_the_model_and_keeps_every_invariant(
        ops in proptest::collection::vec(op(), 1..150),
        start in crate::core::test_clocks(),
    ) {
        let mut now = start;
        let (mut store, mut model) = (Store::default(), Model::default());

        for op in ops {
            match op {
                Op::Acquire { resource, token, ttl_ms } => {
                    let got = store.acquire(resource, &[token], ttl_ms, now);
                    let want = model.acquire(resource, token, ttl_ms, now, &store.handed);
                    prop_assert!(same(got, want), "{:?} vs {:?}", got, want);
                }
                Op::Wait { resource, token, ttl_ms, claim_ms } => {
                    // The model queues a token at most once, as clients do.
                    let queued = model.queues.get(&resource).is_some_and(|q| q.iter().any(|w| w.token == token));
                    if queued {
                        continue;
                    }
                    match store.wait(resource, &[token], ttl_ms, claim_ms, now) {
                        Ok(got) => {
                            let want = model.acquire(resource, token, ttl_ms, now, &store.handed);
                            prop_assert!(same(got, want), "{:?} vs {:?}", got, want);
                        }
                        Err(id) => {
                            model.settle(resource, now, &store.handed);
                            prop_assert!(model.live(resource, now).is_some_and(|(owner, ..)| owner != token)
                                || model.queues.get(&resource).is_some_and(|q| !q.is_empty()));
                            let waiter = Queued { id, token, ttl_ms, claim_ms, ticket_until: None };
                            model.queues.entry(resource).or_default().push_back(waiter);
                        }
                    }
                }
                Op::Ticket { resource, token, ttl_ms, ticket_ms } => {
                    // A token waits in one way at a time, as clients do.
                    let blocked = model.queues.get(&resource).is_some_and(|q| q.iter().any(|w| w.token == token && w.ticket_until.is_none()));
                    if blocked {
                        continue;
                    }
                    match store.ticket(resource, &[token], ttl_ms, ticket_ms, now) {
                        Ok(got) => {
                            let want = model.acquire(resource, token, ttl_ms, now, &store.handed);
                            prop_assert!(same(got, want), "{:?} vs {:?}", got, want);
                        }
                        Err(id) => {
                            model.settle(resource, now, &store.handed);
                            prop_assert!(model.live(resource, now).is_some_and(|(owner, ..)| owner != token));
                            let queue = model.queues.entry(resource).or_default();
                            let ticket = Queued { id, token, ttl_ms, claim_ms: Some(ticket_ms), ticket_until: Some(now.mono + ticket_ms * 1_000) };
                            match queue.iter_mut().find(|w| w.token == token) {
                                Some(place) => {
                                    prop_assert_eq!(place.id, id, "a refreshed ticket keeps its id");
                                    *place = ticket;
                                }
                                None => queue.push_back(ticket),
                            }
                        }
                    }
                }
                Op::Cancel { resource, pick } => {
                    // Blocked clients go away; tickets simply stop being refreshed.
                    let Some(queue) = model.queues.get_mut(&resource) else { continue };
                    let blocked: Vec<usize> = (0..queue.len()).filter(|&i| queue[i].ticket_until.is_none()).collect();
                    if blocked.is_empty() {
                        continue;
                    }
                    let id = queue.remove(blocked[pick % blocked.len()]).expect("in range").id;
                    store.cancel(resource, id, now);
                    model.settle(resource, now, &store.handed);
                }
                Op::Renew { resource, token, ttl_ms } => {
                    let got = store.renew(resource, &[token], ttl_ms, now);
                    model.settle(resource, now, &store.handed);
                    let want = model.live(resource, now).is_some_and(|(owner, ..)| owner == token);
                    if want {
                        model.leases.get_mut(&resource).expect("live").2 = now.mono + ttl_ms * 1_000;
                    }
                    prop_assert_eq!(got, want);
                }
                Op::Revoke { resource } => {
                    let got = store.revoke(resource, now);
                    model.settle(resource, now, &store.handed);
                    let want = usize::from(model.live(resource, now).is_some());
                    if want == 1 {
                        model.leases.remove(&resource);
                        model.settle(resource, now, &store.handed);
                    }
                    prop_assert_eq!(got, want);
                }
                Op::Release { resource, token } => {
                    let got = store.release(resource, &[token], now);
                    model.settle(resource, now, &store.handed);
                    let want = model.live(resource, now).is_some_and(|(owner, ..)| owner == token);
                    if want {
                        model.leases.remove(&resource);
                        model.settle(resource, now, &store.handed);
                    } else if let Some(queue) = model.queues.get_mut(&resource) {
                        // A token that only holds a ticket gives it up.
                        queue.retain(|w| w.token != token || w.ticket_until.is_none());
                        model.settle(resource, now, &store.handed);
                    }
                    prop_assert_eq!(got, want);
                }
                Op::FenceCheck { resource, pick } => {
                    let candidates: Vec<u64> = store.handed.iter().map(|h| h.2).chain([1, model.last_fence]).collect();
                    let fence = candidates[pick % candidates.len()];
                    let want = model.live(resource, now).is_some_and(|(_, live, _)| live == fence);
                    let got = store.keys.get(&resource).is_some_and(|lock| lock.fence_check(fence, now));
                    prop_assert_eq!(got, want);
                }
                Op::Advance { ms, wall_step_ms } => {
                    now.mono += ms * 1_000;
                    now.wall = now.wall.saturating_add_signed((ms as i64 + wall_step_ms) * 1_000);
                }
                Op::Sweep => {
                    store.sweep(now);
                    // The sweep meets expired leases and lapsed tickets in time order; the model
                    // follows suit.
                    let mut expired: Vec<(u64, Resource)> = (0..3)
                        .filter_map(|resource| Some((model.next_wake(resource)?, resource)))
                        .filter(|(wake, _)| *wake <= now.mono)
                        .collect();
                    expired.sort();
                    for (_, resource) in expired {
                        model.settle(resource, now, &store.handed);
                    }
                    for (resource, lock) in &store.keys {
                        prop_assert!(lock.live_lease(now).is_some(), "swept key {} still expired", resource);
                    }
                }
            }
            for resource in 0..3 {
                let of = |handed: &[(Resource, u64, u64)]| -> Vec<(u64, u64)> {
                    handed.iter().filter(|h| h.0 == resource).map(|h| (h.1, h.2)).collect()
                };
                prop_assert_eq!(of(&store.handed), of(&model.handed), "FIFO hand-overs on {}", resource);
            }
            prop_assert!(store.handed.windows(2).all(|w| w[1].2 > w[0].2), "hand-over fences increase");
            prop_assert_eq!(store.fences.last(), model.last_fence, "fences strictly increase server-wide");
            // After every step, every live state is exactly the model's.
            for resource in 0..3 {
                let got = store.keys.get(&resource).and_then(|lock| lock.live_lease(now)).map(|lease| {
                    (lease.token[0], lease.fence, lease.deadline_mono())
                });
                prop_assert_eq!(got, model.live(resource, now));
                let queue: Vec<u64> = store.keys.get(&resource).map(|l| l.waiters().map(|w| w.id).collect()).unwrap_or_default();
                let want: Vec<u64> = model.queues.get(&resource).map(|q| q.iter().map(|w| w.id).collect()).unwrap_or_default();
                prop_assert_eq!(queue, want);
                // The copy holds every live lease as the primary does, and nothing the primary
                // ended (it may still hold a lease that expired on both and was not yet ended).
                let copied = store.copy.leases(resource);
                let primary = store.keys.get(&resource);
                let live = leases_of(primary.into_iter().flat_map(|lock| lock.live_holders(now)));
                prop_assert!(live.is_subset(&copied), "live {:?} not all on the copy {:?}", live, copied);
                let held: BTreeSet<(Vec<u8>, u64)> = primary.into_iter().flat_map(Lock::holders).map(|l| (l.token.to_vec(), l.fence)).collect();
                for (token, fence, ..) in &copied {
                    prop_assert!(held.contains(&(token.clone(), *fence)), "the copy keeps an ended lease {:?}", (token, fence));
                }
            }
        }
        // With the clock far past every deadline and the queues drained, one sweep leaves nothing.
        for _ in 0..10 {
            now.mono += 1_000_000_000;
            store.sweep(now);
        }
        prop_assert!(store.keys.is_empty(), "free locks cost no memory");
        prop_assert!(store.copy.keys.is_empty(), "the copy deleted every key too");
        prop_assert!(store.index.is_empty());
    }
}
