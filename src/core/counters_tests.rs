//! Every wait and every ticket ends in exactly one counter, the core driven by random sequences.
//!
//! A `Server` runs the real [`Step`] operations on a few resources and performs the counters and
//! answers of the effects the core plans for them ([`effects::plan`]), as `apply` does; around them it does what the glue does on
//! its own, as `waiters.rs` and `apply::value_freed` do: a registry of blocked clients (the
//! [`Host`]) whose waits end by their own time-out, `CLIENT UNBLOCK`, a disconnection or a lost
//! reply, each counted once there and pruned from its line on the timer's next turn; keys
//! renamed (`Step::displace` under the new name, a lock already there freed), and values freed
//! (`DEL`, `FLUSHALL`, an overwrite, a reload) with [`Stats::record_freed`]. After every step both
//! identities of docs/operations.md must hold:
//!
//! - `waits_started = waits_granted + waits_timed_out + waits_abandoned + waiters`,
//! - `tickets_queued = tickets_granted + tickets_lapsed + tickets_withdrawn + tickets_dismissed
//!   + tickets`,
//!
//! with `waiters` the registrations still waiting and `tickets` the tickets standing in lines.
//! Tokens wait, queue, re-queue and wait again in any order, including a ticket's token that
//! sends a WAIT, a blocked token that takes a ticket, and a newer wait of a token whose client
//! already left.

use std::cell::RefCell;
use std::collections::BTreeMap;

use proptest::prelude::*;

use super::effects::{self, Effect, Place};
use super::fence::FenceCounter;
use super::lock::Rules;
use super::mode::Mode;
use super::stats::Stats;
use super::{Acquired, Host, Lock, Micros, Now, Step, Transition, Waiter};

type Resource = u8;

const RESOURCES: Resource = 3;

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        resource: Resource,
        token: u8,
        ttl_ms: u64,
    },
    /// `ACQUIRE … WAIT timeout-ms` (`None`: `WAIT 0`), possibly `SHARED`.
    Wait {
        resource: Resource,
        token: u8,
        ttl_ms: u64,
        timeout_ms: Option<u64>,
        shared: bool,
    },
    /// `ACQUIRE … QUEUE ticket-ms`.
    Ticket {
        resource: Resource,
        token: u8,
        ttl_ms: u64,
        ticket_ms: u64,
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
    /// A blocked client disconnects or is killed.
    Disconnect {
        pick: usize,
    },
    /// `CLIENT UNBLOCK` of a blocked client.
    Unblock {
        pick: usize,
    },
    /// A hand-over's reply never reaches its client.
    LoseReply {
        pick: usize,
    },
    /// Every hand-over's reply so far reaches its client.
    Deliver,
    /// `RENAME from to` (or `MOVE`: the value arrives under a name of its own).
    Rename {
        from: Resource,
        to: Resource,
    },
    /// `DEL`, `FLUSHALL`, an overwrite or a reload frees the value.
    Free {
        resource: Resource,
    },
    /// `SWAPDB`: every blocked client is answered nil.
    Swap,
    /// A turn of the timer: time-outs, prunes, undone grants, the sweep.
    Timer,
    Advance {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let resource = 0..RESOURCES;
    let token = 0u8..4;
    let ttl = 1u64..50;
    prop_oneof![
        3 => (resource.clone(), token.clone(), ttl.clone())
            .prop_map(|(resource, token, ttl_ms)| Op::Acquire { resource, token, ttl_ms }),
        4 => (
            (resource.clone(), token.clone(), ttl.clone()),
            (proptest::option::of(1u64..40), any::<bool>()),
        )
            .prop_map(|((resource, token, ttl_ms), (timeout_ms, shared))| {
                Op::Wait { resource, token, ttl_ms, timeout_ms, shared }
            }),
        4 => (resource.clone(), token.clone(), ttl.clone(), 1u64..40).prop_map(
            |(resource, token, ttl_ms, ticket_ms)| Op::Ticket { resource, token, ttl_ms, ticket_ms }
        ),
        2 => (resource.clone(), token.clone(), ttl)
            .prop_map(|(resource, token, ttl_ms)| Op::Renew { resource, token, ttl_ms }),
        2 => (resource.clone(), token)
            .prop_map(|(resource, token)| Op::Release { resource, token }),
        1 => any::<usize>().prop_map(|pick| Op::Disconnect { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Unblock { pick }),
        1 => any::<usize>().prop_map(|pick| Op::LoseReply { pick }),
        1 => Just(Op::Deliver),
        1 => (resource.clone(), 0..RESOURCES + 1).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => resource.prop_map(|resource| Op::Free { resource }),
        1 => Just(Op::Swap),
        3 => Just(Op::Timer),
        3 => (0u64..30).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// The blocked clients still waiting, as `waiters.rs` keeps them: each one's resource and the
/// moment it gives up.
#[derive(Default)]
struct Registry {
    waiting: RefCell<BTreeMap<u64, (Resource, Option<Micros>)>>,
}

impl Host for Registry {
    fn waiter_alive(&self, id: u64) -> bool {
        self.waiting.borrow().contains_key(&id)
    }
}

impl Registry {
    /// Answers a waiting client; whether it was still waiting.
    fn answer(&self, id: u64) -> bool {
        self.waiting.borrow_mut().remove(&id).is_some()
    }
}

#[derive(Default)]
struct Server {
    keys: BTreeMap<Resource, Lock>,
    fences: FenceCounter,
    registry: Registry,
    next_id: u64,
    stats: Stats,
    /// Hand-overs answered whose reply has not reached its client yet: resource, token, fence.
    answered: Vec<(Resource, Box<[u8]>, u64)>,
    /// Waiters whose wait ended outside a decision, to leave their line on the timer's turn.
    to_prune: Vec<(Resource, u64)>,
    /// Lost grants to take back on the timer's turn.
    to_release: Vec<(Resource, Box<[u8]>, u64)>,
}

impl Server {
    /// One decision on `resource` (an empty lock when it has no key), then the effects the core
    /// plans for it, counters and answers performed here; the key goes when they say so.
    fn run<T>(
        &mut self,
        resource: Resource,
        now: Now,
        op: impl FnOnce(&mut Step<'_, Registry>, &mut Lock, &mut u64, &Registry) -> T,
    ) -> T {
        let mut lock = self.keys.remove(&resource).unwrap_or_default();
        let mut step = Step::new(now, Rules::default(), &mut self.fences, &self.registry);
        let result = op(&mut step, &mut lock, &mut self.next_id, &self.registry);
        let changes = step.into_changes();
        let place = Place::Stored { indexes: false, grants_held_until: 0 };
        if !self.apply(resource, &lock, place, &changes, now) {
            self.keys.insert(resource, lock);
        }
        result
    }

    /// Performs the counters and answers of the planned effects; whether the key is deleted.
    fn apply(
        &mut self,
        resource: Resource,
        lock: &Lock,
        place: Place,
        changes: &[Transition],
        now: Now,
    ) -> bool {
        let mut deleted = false;
        effects::plan(lock, place, changes, now, |effect| match effect {
            Effect::Count(change) => self.stats.record(change, now.mono),
            Effect::Answer { waiter, grant } => {
                let answered = self.registry.answer(waiter);
                if let Some(lease) = grant.filter(|_| answered) {
                    self.answered.push((resource, lease.token.to_vec().into(), lease.fence));
                }
            }
            Effect::DeleteKey { .. } => deleted = true,
            _ => {}
        });
        deleted
    }

    /// `apply::value_freed`: the freed value's blocked clients are answered nil, its tickets go.
    fn free(&mut self, lock: Lock) {
        let mut answered = 0;
        for waiter in lock.waiters().filter(|waiter| waiter.ticket_until.is_none()) {
            answered += u64::from(self.registry.answer(waiter.id));
        }
        self.stats.record_freed(answered, lock.tickets() as u64);
    }

    /// A wait ends in the registry (`waiters.rs`): counted there, pruned on the timer's turn.
    fn end_wait(&mut self, pick: usize, counter: fn(&mut Stats) -> &mut u64) {
        let waiting: Vec<(u64, Resource)> = self
            .registry
            .waiting
            .borrow()
            .iter()
            .map(|(&id, &(resource, _))| (id, resource))
            .collect();
        if waiting.is_empty() {
            return;
        }
        let (id, resource) = waiting[pick % waiting.len()];
        self.registry.answer(id);
        *counter(&mut self.stats) += 1;
        self.to_prune.push((resource, id));
    }

    /// `waiters::time_out`, then the timer's clean-ups and sweep, each through a decision.
    fn timer(&mut self, now: Now) {
        let due: Vec<(u64, Resource)> = self
            .registry
            .waiting
            .borrow()
            .iter()
            .filter(|(_, (_, gives_up_at))| gives_up_at.is_some_and(|at| at <= now.mono))
            .map(|(&id, &(resource, _))| (id, resource))
            .collect();
        self.stats.waits_timed_out += due.len() as u64;
        for (id, resource) in due {
            self.registry.answer(id);
            self.to_prune.push((resource, id));
        }
        for (resource, id) in std::mem::take(&mut self.to_prune) {
            if self.keys.contains_key(&resource) {
                self.run(resource, now, |step, lock, _, _| step.leave(lock, &[id]));
            }
        }
        for (resource, token, fence) in std::mem::take(&mut self.to_release) {
            if self.keys.contains_key(&resource) {
                self.run(resource, now, |step, lock, _, _| step.undo_grant(lock, &token, fence));
            }
        }
        let resources: Vec<Resource> = self.keys.keys().copied().collect();
        for resource in resources {
            self.run(resource, now, |step, lock, _, _| step.settle_after(lock));
        }
    }

    /// Both identities and the tickets gauge, or which one fails.
    fn counters_add_up(&self) -> Result<(), String> {
        let s = &self.stats;
        let waiting = self.registry.waiting.borrow().len() as u64;
        let tickets: u64 = self.keys.values().map(|lock| lock.tickets() as u64).sum();
        let ended = s.waits_granted + s.waits_timed_out + s.waits_abandoned + waiting;
        if s.waits_started != ended {
            return Err(format!(
                "waits_started {} != granted {} + timed out {} + abandoned {} + waiting {}",
                s.waits_started, s.waits_granted, s.waits_timed_out, s.waits_abandoned, waiting
            ));
        }
        let left = s.tickets_granted
            + s.tickets_lapsed
            + s.tickets_withdrawn
            + s.tickets_dismissed
            + tickets;
        if s.tickets_queued != left {
            return Err(format!(
                "tickets_queued {} != granted {} + lapsed {} + withdrawn {} + dismissed {} + standing {}",
                s.tickets_queued,
                s.tickets_granted,
                s.tickets_lapsed,
                s.tickets_withdrawn,
                s.tickets_dismissed,
                tickets
            ));
        }
        if s.tickets_in_line != tickets {
            return Err(format!(
                "the tickets gauge {} != {tickets} standing in lines",
                s.tickets_in_line
            ));
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_wait_and_every_ticket_ends_in_exactly_one_counter(
        ops in proptest::collection::vec(op(), 1..150),
        start in crate::core::test_clocks(),
    ) {
        let mut now = start;
        let mut server = Server::default();
        for (at, op) in ops.iter().enumerate() {
            match op.clone() {
                Op::Acquire { resource, token, ttl_ms } => {
                    server.run(resource, now, |step, lock, _, _| {
                        // A holder asking in another mode is answered an error.
                        let Ok(outcome) = step.acquire(lock, &[token], ttl_ms) else { return };
                        if matches!(outcome, Acquired::Busy | Acquired::GrantsHeld) {
                            step.contended();
                        }
                    });
                }
                Op::Wait { resource, token, ttl_ms, timeout_ms, shared } => {
                    let mode = if shared { Mode::Shared { limit: None } } else { Mode::Exclusive };
                    let gives_up_at = timeout_ms.map(|ms| now.mono + ms * 1_000);
                    server.run(resource, now, |step, lock, next_id, registry| {
                        let Ok(outcome) = step.acquire_as(lock, &[token], ttl_ms, mode, None)
                        else {
                            return;
                        };
                        if matches!(outcome, Acquired::Busy | Acquired::GrantsHeld) {
                            *next_id += 1;
                            registry.waiting.borrow_mut().insert(*next_id, (resource, gives_up_at));
                            let waiter = Waiter {
                                id: *next_id,
                                token: [token].into(),
                                ttl_ms,
                                gives_up_at,
                                queued_at: now.mono,
                                claim_ms: None,
                                ticket_until: None,
                                set: false,
                                notify: None,
                                mode,
                                meta: None,
                            };
                            step.enqueue(lock, waiter);
                        }
                    });
                }
                Op::Ticket { resource, token, ttl_ms, ticket_ms } => {
                    server.run(resource, now, |step, lock, next_id, _| {
                        let Ok(outcome) = step.acquire(lock, &[token], ttl_ms) else { return };
                        if !matches!(outcome, Acquired::Busy | Acquired::GrantsHeld) {
                            return;
                        }
                        // As `commands/acquire.rs` queues: a ticket keeps its id when refreshed.
                        let (id, queued_at) = match lock.queued(&[token]) {
                            Some(waiter) if waiter.ticket_until.is_some() => {
                                (waiter.id, waiter.queued_at)
                            }
                            _ => {
                                *next_id += 1;
                                (*next_id, now.mono)
                            }
                        };
                        let waiter = Waiter {
                            id,
                            token: [token].into(),
                            ttl_ms,
                            gives_up_at: None,
                            queued_at,
                            claim_ms: Some(ticket_ms),
                            ticket_until: Some(now.mono + ticket_ms * 1_000),
                            set: false,
                            notify: None,
                            mode: Mode::Exclusive,
                            meta: None,
                        };
                        step.enqueue_ticket(lock, waiter);
                    });
                }
                Op::Renew { resource, token, ttl_ms } => {
                    server.run(resource, now, |step, lock, _, _| {
                        step.renew(lock, &[token], ttl_ms).expect("fences");
                    });
                }
                Op::Release { resource, token } => {
                    server.run(resource, now, |step, lock, _, _| step.release(lock, &[token]));
                }
                Op::Disconnect { pick } => server.end_wait(pick, |s| &mut s.waits_abandoned),
                Op::Unblock { pick } => server.end_wait(pick, |s| &mut s.waits_timed_out),
                Op::LoseReply { pick } => {
                    if !server.answered.is_empty() {
                        let lost = server.answered.remove(pick % server.answered.len());
                        // Counted when it was handed over; only the lease is taken back.
                        server.to_release.push(lost);
                    }
                }
                Op::Deliver => server.answered.clear(),
                Op::Rename { from, to } => {
                    if from == to {
                        continue; // Redis answers OK and moves nothing
                    }
                    let Some(mut lock) = server.keys.remove(&from) else { continue };
                    if let Some(overwritten) = server.keys.remove(&to) {
                        server.free(overwritten);
                    }
                    let (fences, registry) = (&mut server.fences, &server.registry);
                    let mut step = Step::new(now, Rules::default(), fences, registry);
                    step.displace(&mut lock);
                    let changes = step.into_changes();
                    server.apply(to, &lock, Place::Notified, &changes, now);
                    // A vacant value stays until the timer's next look (`RESOURCES` is a name
                    // no command uses).
                    server.keys.insert(to, lock);
                }
                Op::Free { resource } => {
                    if let Some(lock) = server.keys.remove(&resource) {
                        server.free(lock);
                    }
                }
                Op::Swap => {
                    let waiting = server.registry.waiting.borrow();
                    let all: Vec<(u64, Resource)> =
                        waiting.iter().map(|(&id, &(resource, _))| (id, resource)).collect();
                    drop(waiting);
                    for (id, resource) in all {
                        server.registry.answer(id);
                        server.stats.waits_timed_out += 1;
                        server.to_prune.push((resource, id));
                    }
                }
                Op::Timer => server.timer(now),
                Op::Advance { ms } => {
                    now.mono += ms * 1_000;
                    now.wall += ms * 1_000;
                }
            }
            if let Err(why) = server.counters_add_up() {
                prop_assert!(false, "after op {} {:?}: {}", at, op, why);
            }
        }
        // Every client leaves, time passes: nothing waits, every ticket has ended, and every
        // wait and ticket that started ended in exactly one counter.
        while !server.registry.waiting.borrow().is_empty() {
            server.end_wait(0, |s| &mut s.waits_abandoned);
        }
        for _ in 0..3 {
            now.mono += 1_000_000_000;
            now.wall += 1_000_000_000;
            server.timer(now);
        }
        prop_assert!(server.keys.is_empty(), "every key went once vacant");
        prop_assert!(server.registry.waiting.borrow().is_empty());
        prop_assert_eq!(server.counters_add_up(), Ok(()));
    }
}
