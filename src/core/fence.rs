//! Fence minting: `fence = max(last_fence + 1, now in Unix microseconds)`.
//!
//! `last_fence` is one counter per server, never per key, so deleting a key resets nothing. Taking
//! the wall clock as a floor makes fences outlive the counter itself: after a restart without
//! persistence, or on a promoted replica that missed the last grants, the clock has already passed
//! every fence minted before, as long as it did not step backwards.
//!
//! A server that starts, or is promoted, first puts its counter a *lead* ahead of its clock
//! ([`FenceCounter::lead`], `dlock.fence-lead-ms`). A primary that was deposed without knowing it
//! (paused past a failover, partitioned, not yet told) mints from its own clock, so every fence it
//! mints within the lead of its successor's promotion stays below every fence the successor
//! mints. The same lead at start-up keeps a restart without persistence above the fences its
//! previous run minted ahead of the clock.

use super::error::MAX_FENCE;
use super::{DlockError, Micros};

/// The server-wide fence counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FenceCounter {
    last: u64,
}

impl FenceCounter {
    /// A counter whose last minted (or observed) fence is `last`.
    pub fn new(last: u64) -> Self {
        Self { last }
    }

    /// The largest fence minted or observed so far (0 when none).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Mints the next fence: larger than every fence before it and at least `now_wall`.
    pub fn mint(&mut self, now_wall: Micros) -> Result<u64, DlockError> {
        let fence = next_fence(self.last, now_wall)?;
        self.last = fence;
        Ok(fence)
    }

    /// Puts the counter at least `lead_us` ahead of `now_wall` (start-up, promotion): the next
    /// fence is above every fence a deposed primary mints before `now_wall + lead_us` by its
    /// clock. Never lowers the counter; saturates at [`MAX_FENCE`].
    pub fn lead(&mut self, now_wall: Micros, lead_us: u64) {
        self.observe(now_wall.saturating_add(lead_us).min(MAX_FENCE));
    }

    /// Raises the counter to a fence that exists elsewhere (a loaded key, a replicated grant, a
    /// saved counter), so that no later mint can repeat it.
    pub fn observe(&mut self, fence: u64) {
        self.last = self.last.max(fence);
    }
}

/// The fence rule (docs/design.md) as a pure function: the fence after `last` at `now_wall`.
pub fn next_fence(last: u64, now_wall: Micros) -> Result<u64, DlockError> {
    let fence = last.saturating_add(1).max(now_wall);
    if fence > MAX_FENCE { Err(DlockError::FencesExhausted) } else { Ok(fence) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fences_follow_the_wall_clock_when_it_is_ahead() {
        let mut counter = FenceCounter::default();
        assert_eq!(counter.mint(1_700_000_000_000_000), Ok(1_700_000_000_000_000));
        assert_eq!(counter.mint(1_700_000_000_000_500), Ok(1_700_000_000_000_500));
    }

    #[test]
    fn fences_keep_increasing_when_the_clock_stands_still_or_steps_back() {
        let mut counter = FenceCounter::new(1_000);
        assert_eq!(counter.mint(1_000), Ok(1_001));
        assert_eq!(counter.mint(1_000), Ok(1_002));
        assert_eq!(counter.mint(5), Ok(1_003));
    }

    #[test]
    fn observing_a_larger_fence_raises_the_floor_and_a_smaller_one_does_nothing() {
        let mut counter = FenceCounter::new(10);
        counter.observe(50);
        counter.observe(20);
        assert_eq!(counter.last(), 50);
        assert_eq!(counter.mint(0), Ok(51));
    }

    #[test]
    fn the_counter_refuses_to_mint_past_the_signed_range() {
        let mut counter = FenceCounter::new(MAX_FENCE);
        assert_eq!(counter.mint(0), Err(DlockError::FencesExhausted));
        assert_eq!(counter.last(), MAX_FENCE, "a refused mint changes nothing");
        assert_eq!(next_fence(MAX_FENCE - 1, 0), Ok(MAX_FENCE));
        assert_eq!(next_fence(0, u64::MAX), Err(DlockError::FencesExhausted));
    }

    #[test]
    fn a_lead_puts_the_counter_ahead_of_the_clock_and_never_lowers_it() {
        let mut counter = FenceCounter::new(1_000);
        counter.lead(5_000, 2_000);
        assert_eq!(counter.last(), 7_000);
        assert_eq!(
            counter.mint(5_001),
            Ok(7_001),
            "counts up from the lead until the clock passes it"
        );
        counter.lead(100, 2_000);
        assert_eq!(counter.last(), 7_001, "a lead below the counter changes nothing");
        counter.lead(u64::MAX - 1, u64::MAX);
        assert_eq!(counter.last(), MAX_FENCE);
    }

    proptest! {
        /// The promotion rule: a deposed primary minting from its own clock (same clock here; a
        /// difference between hosts comes off the lead) stays below its successor as long as it
        /// mints before the successor's promotion plus the lead, whatever either minted before.
        #[test]
        fn a_deposed_primary_stays_below_its_successor_within_the_lead(
            start in 1u64 << 50..1 << 51,
            replicated_behind in 0u64..10_000_000,
            lead in 1_000u64..60_000_000,
            old_before in proptest::collection::vec(0u64..5_000_000, 0..10),
            old_after in proptest::collection::vec(0u64..60_000_000, 1..10),
            new_after in proptest::collection::vec(0u64..120_000_000, 1..10),
        ) {
            let mut old = FenceCounter::new(start);
            let mut promoted_at = start;
            for gap in old_before {
                promoted_at += gap;
                old.mint(promoted_at).unwrap();
            }
            // The successor replicated all but the last `replicated_behind` of the counter.
            let mut new = FenceCounter::new(old.last().saturating_sub(replicated_behind));
            new.lead(promoted_at, lead);
            let mut new_fences = Vec::new();
            let mut now = promoted_at;
            for gap in new_after {
                now += gap;
                new_fences.push(new.mint(now).unwrap());
            }
            // Each mint past the clock adds a microsecond: a millisecond of margin covers them.
            for delay in old_after.into_iter().filter(|delay| *delay + 1_000 < lead) {
                let stale = old.mint(promoted_at + delay).unwrap();
                prop_assert!(new_fences.iter().all(|fence| stale < *fence), "{stale} {new_fences:?}");
            }
        }

        #[test]
        fn minted_fences_strictly_increase_whatever_the_clock_does(
            start in 0u64..1 << 60,
            clocks in proptest::collection::vec(0u64..1 << 60, 1..50),
        ) {
            let mut counter = FenceCounter::new(start);
            let mut previous = start;
            for now in clocks {
                let fence = counter.mint(now).unwrap();
                prop_assert!(fence > previous);
                prop_assert!(fence >= now);
                previous = fence;
            }
        }
    }
}
