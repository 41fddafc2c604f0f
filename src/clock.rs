//! Reads both clocks from the server, once per command.

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
    Now {
        mono: mono.unwrap_or_else(fallback_mono),
        wall: wall.map(|w| w.max(0) as u64).unwrap_or_else(fallback_wall),
    }
}

fn fallback_mono() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_micros() as u64
}

fn fallback_wall() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
