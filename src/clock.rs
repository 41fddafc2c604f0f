//! Reads both clocks from the server, once per command.
//!
//! The monotonic clock is shifted to read as Unix time at the first reading (when the module
//! loads): a lease then keeps its wall-clock deadline as a small offset from its monotonic one
//! (how far the wall clock has moved since), which fits in 32 bits unless it moved by more than
//! 35 minutes. The shift is fixed for the life of the process, so the clock stays monotonic.

use std::sync::OnceLock;

use redis_module::raw;

use crate::core::Now;

/// The server's monotonic and wall clocks now, in microseconds.
pub fn now() -> Now {
    // SAFETY: the function pointers are filled in by the module API at load and only read here;
    // both calls take no arguments and have no preconditions.
    let (mono, wall) = unsafe {
        (
            raw::RedisModule_MonotonicMicroseconds.map(|f| f()),
            raw::RedisModule_Microseconds.map(|f| f()),
        )
    };
    let mono = mono.unwrap_or_else(fallback_mono);
    let wall = wall.map(|w| w.max(0) as u64).unwrap_or_else(fallback_wall);
    static SHIFT: OnceLock<u64> = OnceLock::new();
    Now { mono: mono.saturating_add(*SHIFT.get_or_init(|| wall.saturating_sub(mono))), wall }
}

fn fallback_mono() -> u64 {
    use std::time::Instant;
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// The wall clock where the server has no `RedisModule_Microseconds` (before Redis 7.2): read
/// directly, as the server's own `ustime` does (`SystemTime` arithmetic costs a reading about 77
/// instructions more).
fn fallback_wall() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` only writes the timespec it is given, which lives on this stack.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) } != 0 {
        return 0;
    }
    (now.tv_sec.max(0) as u64) * 1_000_000 + (now.tv_nsec.max(0) as u64) / 1_000
}
