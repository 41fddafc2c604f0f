//! The lease logic, as pure Rust.
//!
//! Nothing in here imports `redis_module` or reads a clock: every operation that depends on time
//! takes a [`Now`]. This is where correctness lives; the Redis glue around it stays thin.

pub mod args;
pub mod channel;
#[cfg(test)]
mod counters_tests;
pub mod decimal;
pub mod effects;
pub mod encoding;
pub mod error;
pub mod expiry;
pub mod fence;
pub mod fenced;
pub mod limits;
pub mod listeners;
pub mod lock;
pub mod mode;
#[cfg(test)]
mod model_tests;
pub mod ratelimit;
pub mod registry;
pub mod replica;
pub mod schedule;
pub mod sets;
#[cfg(test)]
mod sets_tests;
#[cfg(test)]
mod shared_index_tests;
#[cfg(test)]
mod shared_tests;
pub mod slotfloor;
pub mod stats;
pub mod step;
pub mod token;
pub mod watch;

pub use error::DlockError;
pub use lock::{Acquired, Admission, HandOver, Lease, Lock, Renewal, Rules, Waiter};
pub use mode::Mode;
pub use step::{Changes, Host, Refusal, Step, Transition};

/// Microseconds, on whichever clock the field's name says.
pub type Micros = u64;

/// Halves (or more) a map's capacity when it holds less than a quarter of it, after a removal:
/// a hash map otherwise keeps the capacity of the largest crowd it ever held. Each shrink follows
/// at least as many removals as it moves entries, so removal stays O(1) amortized.
pub fn shrink_if_sparse<K: Eq + std::hash::Hash, V>(map: &mut std::collections::HashMap<K, V>) {
    const SMALL: usize = 64;
    if map.capacity() > SMALL && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

/// One reading of both clocks, taken once per command.
///
/// `mono` decides expiry on a running server (a wall-clock step never moves a lease);
/// `wall` (Unix time) is what persistence and replication carry, and what fences are minted from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Monotonic clock, microseconds since an arbitrary origin of this process.
    pub mono: Micros,
    /// Wall clock, microseconds since the Unix epoch.
    pub wall: Micros,
}

impl Now {
    /// The monotonic instant that corresponds to an absolute wall-clock deadline.
    ///
    /// A deadline already in the past maps to a monotonic instant in the past (saturating at 0),
    /// so it still reads as expired.
    pub fn mono_from_wall(&self, wall_deadline: Micros) -> Micros {
        if wall_deadline >= self.wall {
            self.mono.saturating_add(wall_deadline - self.wall)
        } else {
            self.mono.saturating_sub(self.wall - wall_deadline)
        }
    }
}

/// Where the property tests start the clocks: as the module reads them (its monotonic clock
/// shifted to Unix time when it loads, so leases keep their times narrow), with the wall clock a
/// whole number of milliseconds inside either edge of the ±35 minutes a narrow lease allows (so
/// that wall clock steps cross it), or with a monotonic clock counting from zero (every lease
/// keeps its times beside its token). The clocks read whole milliseconds, as the tests' sweeps
/// assume.
#[cfg(test)]
pub(crate) fn test_clocks() -> impl proptest::strategy::Strategy<Value = Now> {
    use proptest::prelude::*;
    const WALL: Micros = 1_700_000_000_000_000;
    let edge = i64::from(i32::MAX) / 1_000 * 1_000 - 50_000;
    prop_oneof![Just(0), Just(edge), Just(-edge), Just(WALL as i64 - 1_000_000)]
        .prop_map(|ahead| Now { mono: WALL.wrapping_add_signed(-ahead), wall: WALL })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_deadlines_map_to_monotonic_instants_on_both_sides_of_now() {
        let now = Now { mono: 1_000, wall: 5_000_000 };
        assert_eq!(now.mono_from_wall(5_000_500), 1_500);
        assert_eq!(now.mono_from_wall(5_000_000), 1_000);
        assert_eq!(now.mono_from_wall(4_999_900), 900);
        assert_eq!(now.mono_from_wall(0), 0, "far past saturates at the origin");
        let late = Now { mono: u64::MAX - 10, wall: 5_000_000 };
        assert_eq!(late.mono_from_wall(5_000_500), u64::MAX, "far future saturates");
    }
}
