//! Fence minting: `fence = max(last_fence + 1, now in Unix microseconds)`.
//!
//! `last_fence` is one counter per server, never per key, so deleting a key resets nothing. Taking
//! the wall clock as a floor makes fences outlive the counter itself: after a restart without
//! persistence, or on a promoted replica that missed the last grants, the clock has already passed
//! every fence minted before, as long as it did not step backwards.

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

    proptest! {
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
