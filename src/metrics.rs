//! The module's counters and latency percentiles; `report.rs` shows them in `INFO dlock`.

use std::sync::MutexGuard;
use std::sync::atomic::Ordering;

use crate::core::stats::{Gauges, Stats};
use crate::state::{self, MODULE};

fn stats() -> MutexGuard<'static, Option<Stats>> {
    state::lock(&MODULE.stats)
}

/// Updates the counters. `f` must not call into Redis.
pub fn count(f: impl FnOnce(&mut Stats)) {
    f(stats().get_or_insert_with(Stats::default));
}

/// A lock value was handed to Redis (new key, load, copy).
pub fn lock_key_created() {
    MODULE.lock_keys.fetch_add(1, Ordering::Relaxed);
}

/// Redis freed a lock value.
pub fn lock_key_freed() {
    let _ = MODULE
        .lock_keys
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_sub(1)));
}

/// Every `INFO dlock` field now, given the gauges kept elsewhere; `None` if the counters are
/// busy (a crash report must not wait on a lock the crashing code may hold).
pub fn fields_now(waiters: u64, index_entries: u64) -> Option<Vec<(String, u64)>> {
    let mut stats = MODULE.stats.try_lock().ok()?;
    let gauges =
        Gauges { lock_keys: MODULE.lock_keys.load(Ordering::Relaxed), waiters, index_entries };
    let mut fields = stats.get_or_insert_with(Stats::default).fields(gauges);
    for (name, counter) in [
        ("messages_published", &MODULE.log.messages_published),
        ("messages_unheard", &MODULE.log.messages_unheard),
    ] {
        fields.push((name.to_owned(), counter.load(Ordering::Relaxed)));
    }
    Some(fields)
}

/// `CONFIG RESETSTAT`: every counter back to 0 (gauges are not counters), and the watched
/// locks' histories forgotten.
pub fn reset() {
    stats().get_or_insert_with(Stats::default).reset();
    MODULE.log.messages_published.store(0, Ordering::Relaxed);
    MODULE.log.messages_unheard.store(0, Ordering::Relaxed);
    crate::state::with_watched(|watched| watched.clear());
}
