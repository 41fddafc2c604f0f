//! The expiry index as the glue sees it: which key to look at when. Entries are inserted
//! whenever a lease's deadline (or a ticket's lapse) is set, or a lock key appears under a new
//! name; `timer.rs` drains them. Replicas keep no index: they never expire on their own.
//!
//! Nothing here arms the timer: an insert asks for it (`state::arm_soon`), and the timer module
//! arms it before the event loop sleeps, so the index sits below everything that decides.

use redis_module::{Context, ContextFlags, RedisString, raw};

use crate::core::{Lock, Micros, Now};
use crate::state::{self, KeyRef};

/// Whether this server decides expiry: it is a primary (replicas follow their primary).
pub fn decides_expiry(ctx: &Context) -> bool {
    !crate::call::context_flags(ctx).contains(ContextFlags::SLAVE)
}

/// Whether writes are paused (`CLIENT PAUSE WRITE`, `FAILOVER`, a `SHUTDOWN` waiting for its
/// replicas, a cluster manual failover). Like Redis's own expiry, the module then neither
/// expires, hands over nor propagates anything: the server would abort on a propagated write,
/// and a replica being caught up for a failover must not receive more.
pub fn writes_paused() -> bool {
    // SAFETY: the function pointer is filled in at load; the call takes no arguments.
    unsafe { raw::RedisModule_AvoidReplicaTraffic.is_some_and(|paused| paused() != 0) }
}

/// Makes sure `lock`, stored at `name` in the selected database, has an index entry at or before
/// its deadline, and that the timer will fire for it.
pub fn schedule(ctx: &Context, name: &RedisString, lock: &Lock, now: Now) {
    if !decides_expiry(ctx) {
        return;
    }
    if let Some(deadline) = lock.needs_index_entry(now) {
        insert(ctx, name.as_slice(), deadline);
    }
}

/// Makes the timer look at the key `name` of the selected database at `deadline`.
pub fn wake_at(ctx: &Context, name: &RedisString, deadline: Micros) {
    if decides_expiry(ctx) {
        insert(ctx, name.as_slice(), deadline);
    }
}

/// The key `name` in the selected database goes away: its index entry pending at `deadline`
/// is dropped when that is cheap (see `ExpiryIndex::forget_recent`).
pub fn forget(ctx: &Context, name: &RedisString, deadline: Micros) {
    let db = selected_db(ctx);
    state::with_expiry(|expiry| expiry.index.forget_recent(deadline, db, name.as_slice()));
}

/// Indexes key `name` of the selected database at `deadline`.
pub fn insert(ctx: &Context, name: &[u8], deadline: Micros) {
    let db = selected_db(ctx);
    state::with_expiry(|expiry| expiry.index.insert(deadline, db, name));
    state::arm_soon();
}

/// The database the context addresses.
pub fn selected_db(ctx: &Context) -> i32 {
    // SAFETY: ctx is the live context of the current call.
    unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx.ctx)) }
}

/// The name of key `name` of the selected database, for the waiter registry.
pub fn key_ref(ctx: &Context, name: &[u8]) -> KeyRef {
    KeyRef { db: selected_db(ctx), name: name.into() }
}
