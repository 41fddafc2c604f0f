//! Shared and exclusive leases on one resource, the core against a reference model.
//!
//! Random sequences of exclusive and shared requests (with and without `LIMIT`), waits, gone
//! waiters, renewals, releases and time passing run through the real [`Step`] operations and
//! through a plain model of the rules: a request is admitted when nobody stands in line before
//! it and its mode fits the live leases; the line is strictly FIFO across modes; every grant
//! mints the next fence; each lease expires on its own. After every operation the live leases
//! and the line must be the model's, and the invariants must hold: never an exclusive lease
//! beside another lease, never more than `n` shared leases admitted under a request with
//! `LIMIT n`, fences increasing in grant order, and an expiry touching no other lease.

use std::collections::{BTreeSet, HashMap, VecDeque};

use proptest::prelude::*;

use super::fence::FenceCounter;
use super::lock::{Renewal, Rules};
use super::mode::Mode;
use super::{Acquired, DlockError, Host, Lock, Now, Step, Transition, Waiter};

#[derive(Clone, Debug)]
enum Op {
    Acquire { token: u8, ttl_ms: u64, mode: Mode },
    Wait { token: u8, ttl_ms: u64, mode: Mode },
    Cancel { pick: usize },
    Renew { token: u8, ttl_ms: u64 },
    Release { token: u8 },
    Advance { ms: u64 },
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![
        2 => Just(Mode::Exclusive),
        2 => Just(Mode::Shared { limit: None }),
        2 => (1u32..4).prop_map(|n| Mode::Shared { limit: Some(n) }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let token = 0u8..6;
    let ttl = 1u64..40;
    prop_oneof![
        3 => (token.clone(), ttl.clone(), mode())
            .prop_map(|(token, ttl_ms, mode)| Op::Acquire { token, ttl_ms, mode }),
        3 => (token.clone(), ttl.clone(), mode())
            .prop_map(|(token, ttl_ms, mode)| Op::Wait { token, ttl_ms, mode }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        2 => (token.clone(), ttl).prop_map(|(token, ttl_ms)| Op::Renew { token, ttl_ms }),
        2 => token.prop_map(|token| Op::Release { token }),
        3 => (0u64..25).prop_map(|ms| Op::Advance { ms }),
    ]
}

#[derive(Default)]
struct Gone(BTreeSet<u64>);

impl Host for Gone {
    fn waiter_alive(&self, id: u64) -> bool {
        !self.0.contains(&id)
    }
}

/// A live lease as both sides show it: token, fence, deadline, shared.
type Held = (u8, u64, u64, bool);

#[derive(Clone, Copy, Debug)]
struct Queued {
    id: u64,
    token: u8,
    ttl_ms: u64,
    mode: Mode,
}

/// The rules, written as plainly as possible.
#[derive(Default)]
struct Model {
    leases: Vec<Held>,
    line: VecDeque<Queued>,
    last_fence: u64,
}

impl Model {
    fn mint(&mut self, now: Now) -> u64 {
        self.last_fence = (self.last_fence + 1).max(now.wall);
        self.last_fence
    }

    fn admits(&self, mode: Mode) -> bool {
        match mode {
            Mode::Exclusive => self.leases.is_empty(),
            Mode::Shared { limit } => {
                let exclusive = self.leases.iter().any(|lease| !lease.3);
                !exclusive && limit.is_none_or(|n| self.leases.len() < n as usize)
            }
        }
    }

    fn settle(&mut self, now: Now, gone: &Gone) {
        self.leases.retain(|lease| lease.2 > now.mono);
        while let Some(head) = self.line.front().copied() {
            if !gone.waiter_alive(head.id) {
                self.line.pop_front();
                continue;
            }
            if !self.admits(head.mode) {
                break;
            }
            self.line.pop_front();
            let fence = self.mint(now);
            let deadline = now.mono + head.ttl_ms * 1_000;
            self.leases.push((head.token, fence, deadline, head.mode.is_shared()));
        }
    }

    fn acquire(&mut self, token: u8, ttl_ms: u64, mode: Mode, now: Now, gone: &Gone) -> Outcome {
        self.settle(now, gone);
        let deadline = now.mono + ttl_ms * 1_000;
        if let Some(lease) = self.leases.iter_mut().find(|lease| lease.0 == token) {
            if lease.3 != mode.is_shared() {
                return Outcome::Conflict;
            }
            lease.2 = deadline;
            return Outcome::Fence(lease.1);
        }
        if !self.line.is_empty() || !self.admits(mode) {
            return Outcome::Busy;
        }
        let fence = self.mint(now);
        self.leases.push((token, fence, deadline, mode.is_shared()));
        Outcome::Fence(fence)
    }

    fn wait(&mut self, queued: Queued, now: Now, gone: &Gone) -> Outcome {
        let outcome = self.acquire(queued.token, queued.ttl_ms, queued.mode, now, gone);
        if outcome == Outcome::Busy {
            // A token waits once: a second wait takes the first one's place.
            match self.line.iter_mut().find(|waiting| waiting.token == queued.token) {
                Some(place) => *place = queued,
                None => self.line.push_back(queued),
            }
        }
        outcome
    }

    fn renew(&mut self, token: u8, ttl_ms: u64, now: Now, gone: &Gone) -> bool {
        self.settle(now, gone);
        let lease = self.leases.iter_mut().find(|lease| lease.0 == token);
        lease.map(|lease| lease.2 = now.mono + ttl_ms * 1_000).is_some()
    }

    fn release(&mut self, token: u8, now: Now, gone: &Gone) -> bool {
        self.settle(now, gone);
        let before = self.leases.len();
        self.leases.retain(|lease| lease.0 != token);
        let released = self.leases.len() < before;
        self.settle(now, gone);
        released
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Fence(u64),
    Busy,
    Conflict,
}

fn outcome(result: Result<Acquired, DlockError>) -> Outcome {
    match result {
        Ok(Acquired::Granted { fence, .. } | Acquired::Reacquired { fence }) => {
            Outcome::Fence(fence)
        }
        Ok(Acquired::Busy | Acquired::GrantsHeld) => Outcome::Busy,
        Err(DlockError::ModeConflict { .. }) => Outcome::Conflict,
        Err(other) => panic!("unexpected error {other}"),
    }
}

fn live(lock: &Lock, now: Now) -> Vec<Held> {
    let mut held: Vec<Held> = lock
        .live_holders(now)
        .map(|lease| (lease.token[0], lease.fence, lease.deadline_mono(), lease.shared()))
        .collect();
    held.sort_by_key(|lease| lease.1);
    held
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn shared_and_exclusive_leases_follow_the_model(
        ops in proptest::collection::vec(op(), 1..80),
        start in crate::core::test_clocks(),
    ) {
        let mut now = start;
        let mut lock = Lock::default();
        let (mut fences, mut gone) = (FenceCounter::default(), Gone::default());
        let mut model = Model::default();
        let mut next_id = 0;
        // The mode each waiter asked for, and the limit of each shared grant of this step.
        let mut asked: HashMap<u64, Mode> = HashMap::new();
        let mut admitted_under: Vec<(u64, Option<u32>)> = Vec::new();
        let mut last_granted = 0;
        for op in ops {
            let cancelled = match op {
                Op::Cancel { pick } => {
                    let ids: Vec<u64> = lock.waiters().map(|waiter| waiter.id).collect();
                    let id = (!ids.is_empty()).then(|| ids[pick % ids.len()]);
                    gone.0.extend(id);
                    id
                }
                Op::Advance { ms } => {
                    now.mono += ms * 1_000;
                    now.wall += ms * 1_000;
                    None
                }
                _ => None,
            };
            // What ACQUIREALL and RENEWALL ask first, on a copy: it must be what the real
            // request then does.
            let (mut probe, mut probe_fences) = (lock.clone(), fences);
            let mut probe_step = Step::new(now, Rules::default(), &mut probe_fences, &gone);
            let predicted = match op {
                Op::Acquire { token, mode, .. } => {
                    Some(probe_step.admission(&mut probe, &[token], mode).map(|a| a.grants()))
                }
                _ => None,
            };
            let predicted_renewal = match op {
                Op::Renew { token, ttl_ms } => {
                    Some(probe_step.renewal(&mut probe, &[token], None, ttl_ms).expect("no mint"))
                }
                _ => None,
            };
            let mut step = Step::new(now, Rules::default(), &mut fences, &gone);
            let mut asked_now = None;
            match op {
                Op::Acquire { token, ttl_ms, mode } => {
                    asked_now = Some(mode);
                    let got = outcome(step.acquire_as(&mut lock, &[token], ttl_ms, mode, None));
                    let said = match predicted.expect("asked") {
                        Ok(true) => "grant",
                        Ok(false) => "busy",
                        Err(_) => "conflict",
                    };
                    let did = match got {
                        Outcome::Fence(_) => "grant",
                        Outcome::Busy => "busy",
                        Outcome::Conflict => "conflict",
                    };
                    prop_assert_eq!(said, did, "the admission answers what ACQUIRE does");
                    prop_assert_eq!(got, model.acquire(token, ttl_ms, mode, now, &gone));
                }
                Op::Wait { token, ttl_ms, mode } => {
                    asked_now = Some(mode);
                    next_id += 1;
                    let got = outcome(step.acquire_as(&mut lock, &[token], ttl_ms, mode, None));
                    if got == Outcome::Busy {
                        asked.insert(next_id, mode);
                        step.enqueue(&mut lock, Waiter {
                            id: next_id,
                            token: vec![token].into(),
                            ttl_ms,
                            gives_up_at: None,
                            queued_at: now.mono,
                            claim_ms: None,
                            ticket_until: None,
                            set: false,
                            notify: None,
                            mode,
                            meta: None,
                        });
                    }
                    let queued = Queued { id: next_id, token, ttl_ms, mode };
                    prop_assert_eq!(got, model.wait(queued, now, &gone));
                }
                Op::Cancel { .. } => {
                    step.leave(&mut lock, cancelled.as_slice());
                    model.line.retain(|queued| Some(queued.id) != cancelled);
                    model.settle(now, &gone);
                }
                Op::Renew { token, ttl_ms } => {
                    let renewed = step.renew(&mut lock, &[token], ttl_ms).expect("no mint refused");
                    prop_assert_eq!(Some(renewed), predicted_renewal, "the renewal answers what RENEW does");
                    prop_assert_eq!(renewed == Renewal::Renewed, model.renew(token, ttl_ms, now, &gone));
                }
                Op::Release { token } => {
                    let released = step.release(&mut lock, &[token]);
                    prop_assert_eq!(released, model.release(token, now, &gone));
                }
                Op::Advance { .. } => {
                    step.settle(&mut lock).expect("no mint refused");
                    model.settle(now, &gone);
                }
            }
            for change in step.into_changes() {
                let (fence, mode) = match change {
                    Transition::Granted { fence } => (fence, asked_now),
                    Transition::HandedOver { fence, waiter, .. } => (fence, asked.get(&waiter).copied()),
                    Transition::Expired(ended) => {
                        // Each lease expires on its own deadline, and only then.
                        prop_assert!(ended.deadline_mono() <= now.mono);
                        continue;
                    }
                    _ => continue,
                };
                // Fences increase in grant order.
                prop_assert!(fence > last_granted, "fence {} after {}", fence, last_granted);
                last_granted = fence;
                if let Some(Mode::Shared { limit }) = mode {
                    admitted_under.push((fence, limit));
                }
            }
            let mut expected = model.leases.clone();
            expected.sort_by_key(|lease| lease.1);
            let held = live(&lock, now);
            prop_assert_eq!(&held, &expected);
            let line: Vec<u8> = lock.waiters().map(|waiter| waiter.token[0]).collect();
            let model_line: Vec<u8> = model.line.iter().map(|queued| queued.token).collect();
            prop_assert_eq!(line, model_line);
            // Never an exclusive lease beside another lease.
            prop_assert!(held.iter().all(|lease| lease.3) || held.len() <= 1, "{:?}", held);
            // A request with LIMIT n is admitted only beside fewer than n shared leases: with
            // it, at most n lived (those granted before it, or with it in this step).
            for (fence, limit) in admitted_under.drain(..) {
                let beside = held.iter().filter(|lease| lease.1 <= fence).count();
                if let Some(n) = limit {
                    prop_assert!(beside <= n as usize, "{} leases under LIMIT {}", beside, n);
                }
            }
        }
    }
}
