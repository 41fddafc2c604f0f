//! Clients blocked in `DLOCK.ACQUIRE … WAIT`: the registry that links a queued waiter to its
//! blocked client, and the blocking API callbacks.
//!
//! A waiter is alive while it is registered. Its registration ends exactly once: when it is
//! handed the lease (or superseded) and answered, or when the server reports a timeout, a
//! `CLIENT UNBLOCK` or a disconnection. The queue entry itself is pruned at the next settle of its
//! key, which the ending schedules.

use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};

use redis_module::{Context, raw};

use crate::state::{self, KeyRef};

/// What a blocked ACQUIRE finally answers.
pub enum Outcome {
    /// The lease was handed over with this fence.
    Granted(u64),
    /// Not granted (a newer wait of the same token took this one's place).
    Nil,
}

struct Blocked {
    handle: usize,
    key: KeyRef,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    by_id: HashMap<u64, Blocked>,
    by_handle: HashMap<usize, u64>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    f(registry().get_or_insert_with(Registry::default))
}

/// How many clients are blocked in ACQUIRE … WAIT now.
pub fn count() -> usize {
    with_registry(|registry| registry.by_id.len())
}

/// Whether waiter `id` is still blocked and can be answered.
pub fn is_alive(id: u64) -> bool {
    with_registry(|registry| registry.by_id.contains_key(&id))
}

/// Blocks the client of this command for at most `timeout_ms` (0: no limit). Returns the waiter
/// id to queue, or `None` when the server refused to block the client.
pub fn block(ctx: &Context, key: KeyRef, timeout_ms: u64) -> Option<u64> {
    // SAFETY: ctx is the live command context; the callbacks are plain functions.
    let handle = unsafe {
        let block = raw::RedisModule_BlockClient?;
        let handle = block(
            ctx.ctx,
            Some(on_reply),
            Some(on_timeout),
            Some(free_outcome),
            i64::try_from(timeout_ms).unwrap_or(i64::MAX),
        );
        if handle.is_null() {
            return None;
        }
        if let Some(on_disconnect_of) = raw::RedisModule_SetDisconnectCallback {
            on_disconnect_of(handle, Some(on_disconnect));
        }
        handle
    };
    Some(with_registry(|registry| {
        registry.next_id += 1;
        let id = registry.next_id;
        registry.by_id.insert(id, Blocked { handle: handle as usize, key });
        registry.by_handle.insert(handle as usize, id);
        id
    }))
}

/// Answers waiter `id` (if it is still blocked) and ends its registration.
pub fn answer(id: u64, outcome: Outcome) {
    let Some(blocked) = with_registry(|registry| {
        let blocked = registry.by_id.remove(&id)?;
        registry.by_handle.remove(&blocked.handle);
        Some(blocked)
    }) else {
        return;
    };
    let privdata = Box::into_raw(Box::new(outcome)).cast::<c_void>();
    // SAFETY: the handle came from BlockClient and is unblocked exactly once (its registration
    // is gone now); the outcome is freed by `free_outcome`.
    unsafe {
        if let Some(unblock) = raw::RedisModule_UnblockClient {
            unblock(blocked.handle as *mut raw::RedisModuleBlockedClient, privdata);
        }
    }
}

/// Ends every registration without touching keys (this server stops being primary; the server
/// itself answers the blocked clients).
pub fn forget_all() {
    with_registry(|registry| {
        registry.by_id.clear();
        registry.by_handle.clear();
    });
}

/// The registration of a blocked client the server gave up on, if it was still ours.
fn give_up(handle: *mut raw::RedisModuleBlockedClient) -> Option<KeyRef> {
    let blocked = with_registry(|registry| {
        let id = registry.by_handle.remove(&(handle as usize))?;
        registry.by_id.remove(&id)
    })?;
    // SAFETY: still registered, so never unblocked before: this frees the handle.
    unsafe {
        if let Some(unblock) = raw::RedisModule_UnblockClient {
            unblock(handle, std::ptr::null_mut());
        }
    }
    Some(blocked.key)
}

/// # Safety
/// Called by Redis with the context of a blocked client being answered.
unsafe extern "C" fn on_reply(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: the private data is the Outcome given to UnblockClient (or null).
    unsafe {
        let outcome = raw::RedisModule_GetBlockedClientPrivateData
            .map_or(std::ptr::null_mut(), |f| f(ctx))
            .cast::<Outcome>();
        match outcome.as_ref() {
            Some(Outcome::Granted(fence)) => {
                raw::RedisModule_ReplyWithLongLong.map(|f| f(ctx, *fence as i64));
            }
            _ => {
                raw::RedisModule_ReplyWithNull.map(|f| f(ctx));
            }
        }
    }
    raw::REDISMODULE_OK as c_int
}

/// # Safety
/// Called by Redis when a blocked client's timeout passes or `CLIENT UNBLOCK` ends its wait.
unsafe extern "C" fn on_timeout(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: ctx is the blocked client's context for this call.
    unsafe {
        let handle = raw::RedisModule_GetBlockedClientHandle.map(|f| f(ctx));
        if handle.is_some_and(|handle| forget_blocked(ctx, handle)) {
            crate::metrics::count(|stats| stats.waits_timed_out += 1);
        }
        raw::RedisModule_ReplyWithNull.map(|f| f(ctx));
    }
    raw::REDISMODULE_OK as c_int
}

/// The server gave up on a blocked client: end its registration and have its queue pruned.
fn forget_blocked(
    ctx: *mut raw::RedisModuleCtx,
    handle: *mut raw::RedisModuleBlockedClient,
) -> bool {
    let Some(key) = give_up(handle) else { return false };
    state::prune_later(key);
    crate::expiry::arm(&Context::new(ctx), crate::clock::now());
    true
}

/// # Safety
/// Called by Redis when a blocked client disconnects or is killed.
unsafe extern "C" fn on_disconnect(
    ctx: *mut raw::RedisModuleCtx,
    handle: *mut raw::RedisModuleBlockedClient,
) {
    if forget_blocked(ctx, handle) {
        crate::metrics::count(|stats| stats.waits_abandoned += 1);
    }
}

/// # Safety
/// Called by Redis with the private data given to UnblockClient.
unsafe extern "C" fn free_outcome(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    if !privdata.is_null() {
        // SAFETY: privdata came from Box::into_raw of an Outcome in `answer`.
        drop(unsafe { Box::from_raw(privdata.cast::<Outcome>()) });
    }
}
