//! The module's state, in one owner: [`MODULE`].
//!
//! Everything dlock keeps from one call to the next lives in [`Module`]: the fence counter, the
//! expiry index and the timer's schedule, the registry of blocked clients, the counters, what the
//! log and the cluster bus remember. Its lifetime is the process's: it is created empty (every
//! part is a `const` initializer, filled on first use), Redis never unloads a module that
//! registers a data type, and nothing in it is freed before exit. It is a static because the
//! module API hands callbacks (commands, timers, server events, type callbacks, cluster
//! messages) no user data of the module's.
//!
//! Redis calls the module from its main thread, so the locks here never contend; they exist to
//! make the static safe. Two parts are also touched from other threads and are atomics for it:
//! the lock-key gauge (a value freed on the lazy-free thread) and the fence counter (read by a
//! crash report). Never call into Redis while holding a lock here: a Redis call can fire a
//! keyspace notification that comes back into this module.
//!
//! Outside the owner, on purpose: the settings Redis writes through the module config API
//! (`config.rs`: `MAX_TTL_MS`, `RESTART_GRANT_DELAY_MS`, `MAX_HOLD_MS`, `FENCE_LEAD_MS`, which
//! the API takes as separate statics), the registered data type (`datatype::LOCK_TYPE`, which
//! the server holds on to), and the origin of the fallback clock in `clock.rs` (used only where
//! the server has no monotonic clock API). The pure core keeps nothing process-wide.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::core::expiry::ExpiryIndex;
use crate::core::fence::FenceCounter;
use crate::core::listeners::Listeners;
use crate::core::ratelimit::RateLimit;
use crate::core::registry::Registry;
use crate::core::schedule::Schedule;
use crate::core::slotfloor::SlotMoves;
use crate::core::stats::Stats;
use crate::core::watch::{self, Watched};

pub use crate::core::registry::{Grant, KeyRef};

/// The module's state (see the module documentation).
pub struct Module {
    /// Largest fence minted or observed by this server (0 before the first).
    last_fence: AtomicU64,
    /// The expiry index, the timer's schedule and the clean-ups it owes.
    expiry: Mutex<Option<Expiry>>,
    /// Something needs the timer (an index entry, a waiter's time-out, a gone waiter): it is
    /// armed before the event loop next sleeps.
    arm_requested: AtomicBool,
    /// Clients blocked in `ACQUIRE … WAIT` (`waiters.rs`).
    pub waiters: Mutex<Option<Registry>>,
    /// The counters of `INFO dlock` (`metrics.rs`).
    pub stats: Mutex<Option<Stats>>,
    /// The watched locks behind `DLOCK.TOP` and `DLOCK.INFO`'s percentiles.
    pub watched: Mutex<Option<Watched>>,
    /// Lock values Redis holds now (changed on the lazy-free thread too).
    pub lock_keys: AtomicU64,
    /// Monotonic instant until which new grants are held back after a start (0: none).
    pub grants_held_until: AtomicU64,
    /// What the log remembers (`notify.rs`).
    pub log: Log,
    /// Slots being taken from other nodes, and the bus messages owed (`cluster.rs`).
    pub slots: Mutex<Option<SlotMoves>>,
    /// Set while a slot is being taken or a change waits: a grant checks the gate only then.
    pub slots_busy: AtomicBool,
}

/// What the log remembers between lines.
pub struct Log {
    /// Whether the server logs at `verbose` (or `debug`): read at load and on every CONFIG
    /// change, so that no line is formatted when it would be dropped.
    pub verbose: AtomicBool,
    /// The rate limit of notice lines for anomalies.
    pub notices: Mutex<Option<RateLimit>>,
    /// The eviction policy last warned about, so a warning is written once per change.
    pub warned_policy: Mutex<Option<String>>,
    /// Whether the server runs in Cluster mode (it cannot change while the server runs).
    pub in_cluster: OnceLock<bool>,
    /// The channel name being published to, reused from message to message, and which
    /// channels may have a subscriber.
    pub channel: Mutex<Option<Channels>>,
    /// Channel messages published (someone may hear them).
    pub messages_published: AtomicU64,
    /// Channel messages not published: nobody subscribed to the channel.
    pub messages_unheard: AtomicU64,
}

/// The publishing side of the resources' channels (`notify::publish`).
#[derive(Default)]
pub struct Channels {
    /// The name being published to, reused from message to message.
    pub name: Vec<u8>,
    /// Which channels may have a subscriber.
    pub listeners: Listeners,
}

/// The one owner of the module's state.
pub static MODULE: Module = Module {
    last_fence: AtomicU64::new(0),
    expiry: Mutex::new(None),
    arm_requested: AtomicBool::new(false),
    waiters: Mutex::new(None),
    stats: Mutex::new(None),
    watched: Mutex::new(None),
    lock_keys: AtomicU64::new(0),
    grants_held_until: AtomicU64::new(0),
    log: Log {
        verbose: AtomicBool::new(false),
        notices: Mutex::new(None),
        warned_policy: Mutex::new(None),
        in_cluster: OnceLock::new(),
        channel: Mutex::new(None),
        messages_published: AtomicU64::new(0),
        messages_unheard: AtomicU64::new(0),
    },
    slots: Mutex::new(None),
    slots_busy: AtomicBool::new(false),
};

/// Locks `mutex`, whose holder never panics with it held in a way that leaves it inconsistent.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f` on the registry of blocked clients. `f` must not call into Redis.
pub fn with_waiters<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    f(lock(&MODULE.waiters).get_or_insert_with(Registry::default))
}

/// Runs `f` on the watched locks. `f` must not call into Redis.
pub fn with_watched<T>(f: impl FnOnce(&mut Watched) -> T) -> T {
    f(lock(&MODULE.watched).get_or_insert_with(|| Watched::with_capacity(watch::CAPACITY)))
}

/// A copy of the server-wide fence counter to decide with; [`keep_fences`] stores it back.
pub fn fence_counter() -> FenceCounter {
    FenceCounter::new(MODULE.last_fence.load(Ordering::Acquire))
}

/// Keeps what a decision minted (never lowers the counter).
pub fn keep_fences(counter: &FenceCounter) {
    MODULE.last_fence.fetch_max(counter.last(), Ordering::AcqRel);
}

/// Raises the counter to a fence known to exist (a loaded key, a replicated grant, saved aux data).
pub fn observe_fence(fence: u64) {
    MODULE.last_fence.fetch_max(fence, Ordering::AcqRel);
}

/// The counter's current value.
pub fn last_fence() -> u64 {
    MODULE.last_fence.load(Ordering::Acquire)
}

/// The expiry index and the one timer that drains it.
#[derive(Default)]
pub struct Expiry {
    /// Deadline-ordered hints of which key may expire next.
    pub index: ExpiryIndex,
    /// When the module's one timer fires, and for what (`timer.rs` performs it).
    pub schedule: Schedule,
    /// Waiters that left their key's line (timeout, disconnect): taken out of line and the key
    /// settled on the next timer turn.
    pub to_prune: Vec<(KeyRef, u64)>,
    /// Hand-overs whose reply never reached the waiter: released on the next timer turn.
    pub to_release: Vec<Grant>,
}

/// Asks the timer to release `grant` if it is still the live lease of its key.
pub fn release_later(grant: Grant) {
    with_expiry(|expiry| expiry.to_release.push(grant));
}

/// The grant with `fence` was answered to its holder since (a repeated ACQUIRE or a RENEW of
/// the same token): a pending release of it, queued because an earlier reply was lost, is
/// dropped. A confirmed answer stands.
pub fn confirm_grant(fence: u64) {
    with_expiry(|expiry| {
        if !expiry.to_release.is_empty() {
            expiry.to_release.retain(|grant| grant.fence != fence);
        }
    });
}

/// Runs `f` on the expiry state. `f` must not call into Redis.
pub fn with_expiry<T>(f: impl FnOnce(&mut Expiry) -> T) -> T {
    f(lock(&MODULE.expiry).get_or_insert_with(Expiry::default))
}

/// Asks the timer to take waiter `id` out of `key`'s line soon and settle the key.
pub fn prune_later(key: KeyRef, id: u64) {
    with_expiry(|expiry| expiry.to_prune.push((key, id)));
}

/// Entries in the expiry index now; `None` if it is busy (crash report).
pub fn index_len_now() -> Option<usize> {
    let guard = MODULE.expiry.try_lock().ok()?;
    Some(guard.as_ref().map_or(0, |expiry| expiry.index.len()))
}

/// Asks for the expiry timer to be armed before the event loop next sleeps.
pub fn arm_soon() {
    MODULE.arm_requested.store(true, Ordering::Release);
}

/// Whether the timer was asked for since the last call (and clears the request).
pub fn take_arm_request() -> bool {
    MODULE.arm_requested.swap(false, Ordering::AcqRel)
}
