//! Module-global state: the fence counter and the expiry index.
//!
//! Redis calls the module from its main thread only, so the locks here never contend; they exist
//! to make the statics safe. Never call into Redis while holding one: a Redis call can fire a
//! keyspace notification that comes back into this module.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::core::expiry::ExpiryIndex;
use crate::core::fence::FenceCounter;
use crate::core::schedule::Schedule;

/// Largest fence minted or observed by this server (0 before the first).
static LAST_FENCE: AtomicU64 = AtomicU64::new(0);

/// A copy of the server-wide fence counter to decide with; [`keep_fences`] stores it back.
pub fn fence_counter() -> FenceCounter {
    FenceCounter::new(LAST_FENCE.load(Ordering::Acquire))
}

/// Keeps what a decision minted (never lowers the counter).
pub fn keep_fences(counter: &FenceCounter) {
    LAST_FENCE.fetch_max(counter.last(), Ordering::AcqRel);
}

/// Raises the counter to a fence known to exist (a loaded key, a replicated grant, saved aux data).
pub fn observe_fence(fence: u64) {
    LAST_FENCE.fetch_max(fence, Ordering::AcqRel);
}

/// The counter's current value.
pub fn last_fence() -> u64 {
    LAST_FENCE.load(Ordering::Acquire)
}

/// A key as the expiry index names it: database number and key name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyRef {
    /// The database (`SELECT` number) holding the key.
    pub db: i32,
    /// The key name.
    pub name: Box<[u8]>,
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

/// A lease handed to a waiter, as needed to undo it if the reply is lost.
#[derive(Clone, Debug)]
pub struct Grant {
    /// Where the lease is.
    pub key: KeyRef,
    /// Its owner.
    pub token: Box<[u8]>,
    /// Its fence.
    pub fence: u64,
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

static EXPIRY: Mutex<Option<Expiry>> = Mutex::new(None);

/// Runs `f` on the expiry state. `f` must not call into Redis.
pub fn with_expiry<T>(f: impl FnOnce(&mut Expiry) -> T) -> T {
    let mut guard: MutexGuard<'_, Option<Expiry>> =
        EXPIRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    f(guard.get_or_insert_with(Expiry::default))
}

/// Asks the timer to take waiter `id` out of `key`'s line soon and settle the key.
pub fn prune_later(key: KeyRef, id: u64) {
    with_expiry(|expiry| expiry.to_prune.push((key, id)));
}

/// Entries in the expiry index now; `None` if it is busy (crash report).
pub fn index_len_now() -> Option<usize> {
    let guard = EXPIRY.try_lock().ok()?;
    Some(guard.as_ref().map_or(0, |expiry| expiry.index.len()))
}

/// Set when something needs the expiry timer (an index entry, a waiter's timeout, a gone
/// waiter): the timer module arms it before the event loop sleeps.
static ARM_REQUESTED: AtomicBool = AtomicBool::new(false);

/// Asks for the expiry timer to be armed before the event loop next sleeps.
pub fn arm_soon() {
    ARM_REQUESTED.store(true, Ordering::Release);
}

/// Whether the timer was asked for since the last call (and clears the request).
pub fn take_arm_request() -> bool {
    ARM_REQUESTED.swap(false, Ordering::AcqRel)
}
