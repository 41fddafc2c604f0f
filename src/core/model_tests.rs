//! The core against a tiny reference model, with a virtual clock.
//!
//! A `Store` drives `Lock`s and the `ExpiryIndex` exactly as the Redis glue does (keys deleted
//! once vacant, index entries inserted on every deadline change, a sweep that pops due entries).
//! Random operation sequences must agree with the model at every step, and the invariants of
//! DESIGN.md must hold: at most one live lease per resource, fences strictly increasing, nothing
//! changed by a non-owner, and no expired lease left behind by a full sweep.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::expiry::ExpiryIndex;
use super::fence::FenceCounter;
use super::lock::Due;
use super::{Acquired, Lock, Now};

type Resource = u8;

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        resource: Resource,
        token: u8,
        ttl_ms: u64,
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
    let token = 0u8..3;
    let ttl = 1u64..50;
    prop_oneof![
        3 => (resource.clone(), token.clone(), ttl.clone())
            .prop_map(|(resource, token, ttl_ms)| Op::Acquire { resource, token, ttl_ms }),
        2 => (resource.clone(), token.clone(), ttl)
            .prop_map(|(resource, token, ttl_ms)| Op::Renew { resource, token, ttl_ms }),
        2 => (resource.clone(), token).prop_map(|(resource, token)| Op::Release { resource, token }),
        1 => (resource, any::<usize>()).prop_map(|(resource, pick)| Op::FenceCheck { resource, pick }),
        3 => (0u64..30, prop_oneof![4 => Just(0i64), 1 => -100i64..100])
            .prop_map(|(ms, wall_step_ms)| Op::Advance { ms, wall_step_ms }),
        1 => Just(Op::Sweep),
    ]
}

/// What the glue does around the core, without Redis.
#[derive(Default)]
struct Store {
    keys: BTreeMap<Resource, Lock>,
    index: ExpiryIndex<Resource>,
    fences: FenceCounter,
}

impl Store {
    fn reindex(&mut self, resource: Resource, now: Now) {
        if let Some(deadline) =
            self.keys.get_mut(&resource).and_then(|lock| lock.needs_index_entry(now))
        {
            self.index.insert(deadline, resource);
        }
    }

    fn drop_if_vacant(&mut self, resource: Resource, now: Now) {
        if self.keys.get(&resource).is_some_and(|lock| lock.is_vacant(now)) {
            self.keys.remove(&resource);
        }
    }

    fn acquire(&mut self, resource: Resource, token: &[u8], ttl_ms: u64, now: Now) -> Acquired {
        let lock = self.keys.entry(resource).or_default();
        let outcome = lock.acquire(token, ttl_ms, now, &mut self.fences).expect("fences left");
        self.reindex(resource, now);
        outcome
    }

    fn renew(&mut self, resource: Resource, token: &[u8], ttl_ms: u64, now: Now) -> bool {
        let renewed =
            self.keys.get_mut(&resource).is_some_and(|lock| lock.renew(token, ttl_ms, now));
        self.reindex(resource, now);
        self.drop_if_vacant(resource, now);
        renewed
    }

    fn release(&mut self, resource: Resource, token: &[u8], now: Now) -> bool {
        let released = self.keys.get_mut(&resource).is_some_and(|lock| lock.release(token, now));
        self.drop_if_vacant(resource, now);
        released
    }

    fn sweep(&mut self, now: Now) {
        while let Some((deadline, resource)) = self.index.pop_due(now.mono) {
            let Some(lock) = self.keys.get_mut(&resource) else { continue };
            match lock.on_due(deadline, now) {
                Due::Expired | Due::Vacant => {
                    lock.expire(now);
                    self.keys.remove(&resource);
                }
                Due::Stale => {}
                Due::Reschedule(next) => self.index.insert(next, resource),
            }
        }
    }
}

/// The reference: a map of live leases, compared by value.
#[derive(Default)]
struct Model {
    leases: BTreeMap<Resource, (u8, u64, u64)>,
    last_fence: u64,
}

impl Model {
    fn live(&self, resource: Resource, now: Now) -> Option<(u8, u64, u64)> {
        self.leases.get(&resource).copied().filter(|(_, _, deadline)| *deadline > now.mono)
    }

    fn acquire(&mut self, resource: Resource, token: u8, ttl_ms: u64, now: Now) -> Acquired {
        let deadline = now.mono + ttl_ms * 1_000;
        match self.live(resource, now) {
            Some((owner, fence, _)) if owner == token => {
                self.leases.insert(resource, (token, fence, deadline));
                Acquired::Reacquired { fence }
            }
            Some(_) => Acquired::Busy,
            None => {
                let fence = (self.last_fence + 1).max(now.wall);
                self.last_fence = fence;
                let replaced_expired =
                    self.leases.insert(resource, (token, fence, deadline)).is_some();
                Acquired::Granted { fence, replaced_expired }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_core_agrees_with_the_model_and_keeps_every_invariant(
        ops in proptest::collection::vec(op(), 1..120)
    ) {
        let mut now = Now { mono: 1_000_000, wall: 1_700_000_000_000_000 };
        let (mut store, mut model) = (Store::default(), Model::default());
        let mut granted: BTreeMap<Resource, Vec<u64>> = BTreeMap::new();
        let mut last_minted = 0;

        for op in ops {
            match op {
                Op::Acquire { resource, token, ttl_ms } => {
                    let got = store.acquire(resource, &[token], ttl_ms, now);
                    // The store may still hold an expired lease the model forgot: compare the
                    // outcome without the `replaced_expired` detail, which only the store knows.
                    let want = model.acquire(resource, token, ttl_ms, now);
                    match (got, want) {
                        (Acquired::Granted { fence: a, .. }, Acquired::Granted { fence: b, .. }) => {
                            prop_assert_eq!(a, b);
                            prop_assert!(a > last_minted, "fences strictly increase server-wide");
                            last_minted = a;
                            let history = granted.entry(resource).or_default();
                            prop_assert!(history.last().is_none_or(|prev| a > *prev));
                            history.push(a);
                        }
                        (got, want) => prop_assert_eq!(got, want),
                    }
                }
                Op::Renew { resource, token, ttl_ms } => {
                    let want = model.live(resource, now).is_some_and(|(owner, ..)| owner == token);
                    if want {
                        let entry = model.leases.get_mut(&resource).expect("live");
                        entry.2 = now.mono + ttl_ms * 1_000;
                    }
                    prop_assert_eq!(store.renew(resource, &[token], ttl_ms, now), want);
                }
                Op::Release { resource, token } => {
                    let want = model.live(resource, now).is_some_and(|(owner, ..)| owner == token);
                    if want {
                        model.leases.remove(&resource);
                    }
                    prop_assert_eq!(store.release(resource, &[token], now), want);
                }
                Op::FenceCheck { resource, pick } => {
                    let candidates: Vec<u64> = granted.values().flatten().copied().chain([1]).collect();
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
                    for (resource, lock) in &store.keys {
                        prop_assert!(lock.live_lease(now).is_some(), "swept key {} still expired", resource);
                    }
                }
            }
            // After every step, the live state is exactly the model's.
            for resource in 0..3 {
                let got = store.keys.get(&resource).and_then(|lock| lock.live_lease(now)).map(|lease| {
                    (lease.token[0], lease.fence, lease.deadline_mono)
                });
                prop_assert_eq!(got, model.live(resource, now));
            }
        }
        // With the clock far past every deadline, one sweep leaves no key at all.
        now.mono += 1_000_000_000;
        store.sweep(now);
        prop_assert!(store.keys.is_empty(), "free locks cost no memory");
        prop_assert!(store.index.is_empty());
    }
}
