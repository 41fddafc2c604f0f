//! The shared leases' indexes (by fence, by token, by deadline) against the leases themselves.
//!
//! Random sequences of grants, re-acquires, renewals and releases (with and without `FENCE`),
//! hand-overs, expiries, leases put in place and ended by replication, and displacements run on
//! one [`Lock`]. After every operation the indexes must agree with the leases, and every query
//! answered through them (a token's lease, a fence's, the live count, the earliest deadline,
//! the newest live lease, vacancy) must equal the same query answered by scanning every lease.

use proptest::prelude::*;

use super::fence::FenceCounter;
use super::lock::{Lease, Rules};
use super::mode::Mode;
use super::{Lock, Waiter};

#[derive(Clone, Debug)]
enum Op {
    Acquire { token: u8, ttl_ms: u64, mode: Mode },
    Renew { token: u8, ttl_ms: u64, fenced: bool },
    Release { token: u8, fenced: bool },
    Wait { token: u8, ttl_ms: u64, mode: Mode },
    HandOver,
    Expire,
    Put { token: u8, ttl_ms: u64, shared: bool },
    Drop { token: u8 },
    Displace,
    Advance { ms: u64 },
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![
        1 => Just(Mode::Exclusive),
        4 => Just(Mode::Shared { limit: None }),
        2 => (1u32..6).prop_map(|n| Mode::Shared { limit: Some(n) }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let token = 0u8..10;
    let ttl = 1u64..40;
    prop_oneof![
        6 => (token.clone(), ttl.clone(), mode())
            .prop_map(|(token, ttl_ms, mode)| Op::Acquire { token, ttl_ms, mode }),
        3 => (token.clone(), ttl.clone(), any::<bool>())
            .prop_map(|(token, ttl_ms, fenced)| Op::Renew { token, ttl_ms, fenced }),
        3 => (token.clone(), any::<bool>()).prop_map(|(token, fenced)| Op::Release { token, fenced }),
        1 => (token.clone(), ttl.clone(), mode())
            .prop_map(|(token, ttl_ms, mode)| Op::Wait { token, ttl_ms, mode }),
        1 => Just(Op::HandOver),
        2 => Just(Op::Expire),
        2 => (token.clone(), ttl, prop::bool::weighted(0.8))
            .prop_map(|(token, ttl_ms, shared)| Op::Put { token, ttl_ms, shared }),
        1 => token.prop_map(|token| Op::Drop { token }),
        1 => Just(Op::Displace),
        3 => (0u64..25).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// The fence `token` holds, live or not, found by scanning.
fn fence_of(lock: &Lock, token: u8) -> Option<u64> {
    lock.holders().find(|lease| *lease.token == [token]).map(|lease| lease.fence)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_indexes_agree_with_the_leases_after_any_sequence(
        ops in proptest::collection::vec(op(), 1..120),
        start in crate::core::test_clocks(),
    ) {
        let mut now = start;
        let mut lock = Lock::default();
        let mut fences = FenceCounter::default();
        let rules = Rules::default();
        let mut next_id = 0;
        for op in ops {
            match op {
                Op::Acquire { token, ttl_ms, mode } => {
                    let _ = lock.acquire_as(&[token], ttl_ms, mode, None, now, &mut fences, rules);
                }
                Op::Renew { token, ttl_ms, fenced } => {
                    let fence = fenced.then(|| fence_of(&lock, token)).flatten();
                    lock.renew_grant(&[token], fence, ttl_ms, now, rules);
                }
                Op::Release { token, fenced } => {
                    let fence = fenced.then(|| fence_of(&lock, token)).flatten();
                    lock.release_grant(&[token], fence, now);
                }
                Op::Wait { token, ttl_ms, mode } => {
                    next_id += 1;
                    lock.enqueue(Waiter {
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
                Op::HandOver => {
                    while lock.hand_over(now, &mut fences, rules, |_| true).expect("mint").is_some() {}
                }
                Op::Expire => {
                    let expired = lock.expire(now, usize::MAX);
                    prop_assert!(expired.iter().all(|lease| !lease.is_live(now)));
                    prop_assert!(expired.windows(2).all(|pair| pair[0].fence < pair[1].fence));
                    prop_assert!(lock.holders().all(|lease| lease.is_live(now)));
                }
                Op::Put { token, ttl_ms, shared } => {
                    let fence = fences.mint(now.wall).expect("mint");
                    let mut lease = Lease::new(&[token], fence, ttl_ms, now);
                    lease.set_shared(shared);
                    lock.put(lease);
                }
                Op::Drop { token } => {
                    if let Some(fence) = fence_of(&lock, token) {
                        prop_assert!(lock.drop_holder(&[token], fence).is_some());
                        prop_assert_eq!(fence_of(&lock, token), None);
                    }
                }
                Op::Displace => {
                    let before: Vec<u64> = lock.holders().map(|lease| lease.fence).collect();
                    let (leases, _) = lock.displace();
                    let after: Vec<u64> = leases.iter().map(|lease| lease.fence).collect();
                    prop_assert_eq!(before, after);
                }
                Op::Advance { ms } => {
                    now.mono += ms * 1_000;
                    now.wall += ms * 1_000;
                }
            }
            prop_assert!(lock.indexes_agree());
            let all: Vec<&Lease> = lock.holders().collect();
            // Grant order: the exclusive lease, then shared ones by fence ascending.
            let shared: Vec<u64> = all.iter().filter(|l| l.shared()).map(|l| l.fence).collect();
            prop_assert!(shared.windows(2).all(|pair| pair[0] < pair[1]));
            prop_assert!(all.iter().skip(1).all(|lease| lease.shared()));
            // Never an exclusive lease beside another, never a token twice.
            prop_assert!(all.iter().all(|lease| lease.shared()) || all.len() <= 1);
            let live: Vec<&Lease> = all.iter().copied().filter(|l| l.is_live(now)).collect();
            for token in 0..10u8 {
                let scanned = live.iter().find(|lease| *lease.token == [token]).copied();
                prop_assert_eq!(lock.holder(&[token], now), scanned);
                prop_assert!(all.iter().filter(|lease| *lease.token == [token]).count() <= 1);
            }
            for lease in &all {
                prop_assert_eq!(lock.lease_with_fence(lease.fence), Some(*lease));
                prop_assert_eq!(lock.fence_check(lease.fence, now), lease.is_live(now));
            }
            prop_assert_eq!(lock.lease_with_fence(fences.last() + 1), None);
            let newest = live.iter().copied().max_by_key(|lease| (!lease.shared(), lease.fence));
            prop_assert_eq!(lock.live_lease(now), newest);
            let mode = live.first().map(|first| (first.mode(), live.len()));
            prop_assert_eq!(lock.live_mode(now), mode);
            prop_assert_eq!(lock.has_live(now), !live.is_empty());
            prop_assert_eq!(lock.is_vacant(now), all.is_empty() && lock.waiters().len() == 0);
            prop_assert_eq!(lock.has_record(), !all.is_empty());
            let first = all.iter().map(|lease| lease.deadline_mono()).min();
            let ticket = None::<u64>;
            prop_assert_eq!(lock.next_wake(), first.or(ticket));
        }
    }
}
