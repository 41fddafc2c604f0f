//! Module configuration, set with `CONFIG SET dlock.<name>` or as load arguments
//! (`--loadmodule libdlock.so max-ttl-ms 60000`).

use std::sync::atomic::{AtomicI64, Ordering};

use crate::core::args::DEFAULT_MAX_TTL_MS;
use crate::core::{Micros, Rules};

/// `dlock.max-ttl-ms`: the largest `ttl-ms` and `timeout-ms` a command accepts.
pub static MAX_TTL_MS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_TTL_MS as i64);
/// Upper bound of `dlock.max-ttl-ms`: one year.
pub const MAX_TTL_MS_LIMIT: i64 = 365 * 86_400_000;

/// `dlock.restart-grant-delay-ms`: after start-up or promotion, how long no new lease is granted
/// on a resource this server has no lease record for.
pub static RESTART_GRANT_DELAY_MS: AtomicI64 = AtomicI64::new(0);

/// `dlock.max-hold-ms`: no lease lasts longer than this after its grant, however often it is
/// renewed, so a stuck worker's renewal loop cannot keep a lock forever (0: no limit).
pub static MAX_HOLD_MS: AtomicI64 = AtomicI64::new(0);

/// `dlock.fence-lead-ms`: how far ahead of its wall clock a server puts its fence counter when it
/// starts or is promoted, so that a deposed primary that goes on granting for up to this long
/// (minus the clock difference between the two hosts) mints below its successor.
pub static FENCE_LEAD_MS: AtomicI64 = AtomicI64::new(DEFAULT_FENCE_LEAD_MS);
/// Default of `dlock.fence-lead-ms`: 30 seconds.
pub const DEFAULT_FENCE_LEAD_MS: i64 = 30_000;
/// Upper bound of `dlock.fence-lead-ms`: one day.
pub const FENCE_LEAD_MS_LIMIT: i64 = 86_400_000;

/// The rules grants and renewals follow at `now_mono`.
pub fn rules(now_mono: Micros) -> Rules {
    Rules {
        new_grants_held: new_grants_held(now_mono),
        max_hold_ms: MAX_HOLD_MS.load(Ordering::Acquire).max(0) as u64,
    }
}

/// The current `dlock.max-ttl-ms`.
pub fn max_ttl_ms() -> u64 {
    MAX_TTL_MS.load(Ordering::Acquire).max(1) as u64
}

/// Starts the grant delay at `now_mono` (start-up, end of loading, promotion).
pub fn hold_new_grants(now_mono: Micros) {
    let delay_ms = RESTART_GRANT_DELAY_MS.load(Ordering::Acquire).max(0) as u64;
    let until = now_mono.saturating_add(delay_ms.saturating_mul(1_000));
    crate::state::MODULE.grants_held_until.store(until, Ordering::Release);
}

/// Puts the fence counter `dlock.fence-lead-ms` ahead of the wall clock `now_wall` (start-up,
/// end of loading, promotion).
pub fn lead_fences(now_wall: Micros) {
    let lead_ms = FENCE_LEAD_MS.load(Ordering::Acquire).clamp(0, FENCE_LEAD_MS_LIMIT) as u64;
    let mut counter = crate::state::fence_counter();
    counter.lead(now_wall, lead_ms * 1_000);
    crate::state::keep_fences(&counter);
}

/// Whether new grants are still held back at `now_mono`.
pub fn new_grants_held(now_mono: Micros) -> bool {
    now_mono < crate::state::MODULE.grants_held_until.load(Ordering::Acquire)
}

/// The monotonic instant new grants are held back until (in the past when none are).
pub fn grants_held_until() -> Micros {
    crate::state::MODULE.grants_held_until.load(Ordering::Acquire)
}
