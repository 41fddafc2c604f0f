//! Arbitrary sequences of operations on one lock with a moving clock: no panic, never an exclusive
//! lease beside another live lease, fences strictly increasing, a waiter handed the lease is the
//! queue's first live one; exclusive and shared requests (with limits), waiters with claim
//! windows and tickets among them.
#![no_main]

use dlock::core::fence::FenceCounter;
use dlock::core::{Acquired, Host, Lock, Mode, Now, Rules, Step, Transition, Waiter};
use libfuzzer_sys::fuzz_target;

/// Every fifth waiter is gone by the time its turn comes.
struct SomeGone;

impl Host for SomeGone {
    fn waiter_alive(&self, id: u64) -> bool {
        id % 5 != 0
    }
}

fuzz_target!(|ops: Vec<(u8, u8, u16)>| {
    let mut lock = Lock::default();
    let mut fences = FenceCounter::default();
    // As the module reads its clocks: the monotonic one shifted to Unix time when it loads.
    let mut now = Now { mono: 1_700_000_000_000_000, wall: 1_700_000_000_000_000 };
    let mut last_fence = 0;
    let mut next_waiter = 0;
    for (op, token, amount) in ops.into_iter().take(500) {
        let token = [token % 4];
        let ttl = u64::from(amount % 100) + 1;
        let rules =
            Rules { new_grants_held: op & 0x40 != 0, max_hold_ms: u64::from(amount % 7) * 50 };
        let mode = match (op >> 3) & 3 {
            0 | 1 => Mode::Exclusive,
            2 => Mode::Shared { limit: None },
            _ => Mode::Shared { limit: Some(u32::from(amount % 4) + 1) },
        };
        let mut step = Step::new(now, rules, &mut fences, &SomeGone);
        match op % 7 {
            0 => {
                if let Ok(Acquired::Granted { fence, .. }) =
                    step.acquire_as(&mut lock, &token, ttl, mode, None)
                {
                    assert!(lock.fence_check(fence, now) || mode.is_shared());
                }
            }
            1 => {
                let _ = step.renew(&mut lock, &token, ttl);
            }
            2 => {
                let _ = step.release(&mut lock, &token);
            }
            3 => {
                next_waiter += 1;
                let gives_up_at = (amount % 3 == 0).then(|| now.mono + u64::from(amount) * 10);
                let ticket_until = (op & 0x80 != 0).then(|| now.mono + u64::from(amount) * 100);
                let waiter = Waiter {
                    id: next_waiter,
                    token: token.into(),
                    ttl_ms: ttl,
                    gives_up_at,
                    queued_at: now.mono,
                    claim_ms: (amount % 5 == 0).then_some(u64::from(amount % 50) + 1),
                    ticket_until,
                    mode,
                    meta: None,
                    set: false,
                    // A ticket told of its turn on its own channel, naming its request.
                    notify: ticket_until.and(Some(u64::from(amount))).filter(|_| op & 0x40 != 0),
                };
                if ticket_until.is_some() {
                    step.enqueue_ticket(&mut lock, waiter);
                } else {
                    step.enqueue(&mut lock, waiter);
                }
            }
            4 => {
                // A settle: expired leases end a slice at a time, hand-overs only once none is
                // left, at most a bounded crowd per settle.
                let _ = step.settle(&mut lock);
            }
            5 => {
                let _ = lock.fence_check(u64::from(amount), now);
                let _ = lock.on_due(now.mono, now);
            }
            _ => {
                now.mono += u64::from(amount) * 100;
                now.wall = now
                    .wall
                    .wrapping_add(u64::from(amount) * 100)
                    .wrapping_sub(u64::from(op & 3) * 1_000);
            }
        }
        // Every fence minted in this step, in the order it was.
        for change in step.into_changes() {
            if let Transition::Granted { fence } | Transition::HandedOver { fence, .. } = change {
                assert!(fence > last_fence);
                last_fence = fence;
            }
        }
        assert!(fences.last() >= last_fence);
        let live: Vec<bool> = lock.live_holders(now).map(|lease| lease.shared()).collect();
        assert!(live.len() <= 1 || live.iter().all(|shared| *shared), "{live:?}");
    }
});
