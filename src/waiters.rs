//! Clients blocked in `DLOCK.ACQUIRE … WAIT`: the registry that links a queued waiter to its
//! blocked client, the waiters' own timeouts, and the blocking API callbacks.
//!
//! A registration goes `Waiting` → `Answered` → gone. Only the module decides: timeouts are
//! enforced by the module's timer (the client is blocked without a server timeout), so a
//! hand-over and a timeout can never both answer one client. A grant whose reply never reached
//! its client (it disconnected, or was unblocked with an error, between the hand-over and the
//! reply) is released again by the timer, so no lease is left to a client that cannot know it.
//!
//! The ends of a wait that no decision of a lock makes (a timeout, `SWAPDB`, `CLIENT UNBLOCK`, a
//! disconnection) are answered and counted here, in the callbacks Redis calls for them, and
//! nothing else happens here: no lease or line changes, nothing is propagated, no event or log
//! line. A lost reply ends nothing here: its wait was counted as granted at the hand-over. The
//! lock's line is pruned, or the lost grant undone, by the timer through `apply`
//! (`state::prune_later`, `state::release_later`). docs/architecture.md says why.

use std::os::raw::{c_int, c_void};

use redis_module::{Context, raw};

use crate::core::Micros;
pub use crate::core::registry::Outcome;
use crate::core::registry::{Blocked, Registry, State};
use crate::state::{self, Grant, KeyRef};

/// Private data handed to `UnblockClient`: which registration it answers.
struct Answer(u64);

fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    state::with_waiters(f)
}

/// How many clients wait in ACQUIRE … WAIT now; `None` if the registry is busy (crash report).
pub fn count_now() -> Option<usize> {
    let guard = state::MODULE.waiters.try_lock().ok()?;
    Some(guard.as_ref().map_or(0, |registry| {
        registry.by_id.values().filter(|b| matches!(b.state, State::Waiting { .. })).count()
    }))
}

/// A fresh waiter id for a ticket: tickets and blocked clients never share one.
pub fn new_ticket_id() -> u64 {
    with_registry(|registry| {
        registry.next_id += 1;
        registry.next_id
    })
}

/// Whether waiter `id` still waits (it can be handed the lease).
pub fn is_alive(id: u64) -> bool {
    with_registry(|registry| {
        registry.by_id.get(&id).is_some_and(|b| matches!(b.state, State::Waiting { .. }))
    })
}

/// Registers a waiter for the client of this command, waiting on `key`, before the decision
/// that puts it in line; `gives_up_at` is when the module's timer answers nil (`None`: never).
/// Only bookkeeping: the client is blocked by [`block`] once the decision is made.
pub fn register(key: KeyRef, gives_up_at: Option<Micros>) -> u64 {
    with_registry(|registry| {
        registry.next_id += 1;
        let id = registry.next_id;
        let state = State::Waiting { gives_up_at };
        registry.by_id.insert(id, Blocked { handle: 0, key, state });
        if let Some(at) = gives_up_at {
            registry.timeouts.insert((at, id));
        }
        id
    })
}

/// Blocks the client of this command as waiter `id` (registered by [`register`]) until the module
/// answers it. Returns false, and takes the waiter out of its line, when the server refused to
/// block the client (the command then answers nil).
pub fn block(ctx: &Context, id: u64) -> bool {
    // SAFETY: ctx is the live command context; the callbacks are plain functions. Timeout 0:
    // the server never times the client out on its own.
    let handle = unsafe {
        raw::RedisModule_BlockClient
            .map(|block| block(ctx.ctx, Some(on_reply), Some(on_unblock), Some(free_answer), 0))
            .filter(|handle| !handle.is_null())
    };
    let Some(handle) = handle else {
        let key = with_registry(|registry| {
            let blocked = registry.remove(id)?;
            if let State::Waiting { gives_up_at: Some(at) } = blocked.state {
                registry.timeouts.remove(&(at, id));
            }
            Some(blocked.key)
        });
        if let Some(key) = key {
            state::prune_later(key, id);
        }
        return false;
    };
    // SAFETY: the handle was just returned by BlockClient; the callback is a plain function.
    unsafe {
        if let Some(on_disconnect_of) = raw::RedisModule_SetDisconnectCallback {
            on_disconnect_of(handle, Some(on_disconnect));
        }
    }
    with_registry(|registry| {
        if let Some(blocked) = registry.by_id.get_mut(&id) {
            blocked.handle = handle as usize;
            registry.by_handle.insert(handle as usize, id);
        }
    });
    true
}

/// Whether waiter `id` is a blocked client (registered and blocked, answered or not).
pub fn is_blocked(id: u64) -> bool {
    with_registry(|registry| registry.by_id.get(&id).is_some_and(|blocked| blocked.handle != 0))
}

/// Answers a waiting client: the fence of the lease it was handed (`grant` says where, so the
/// lease can be undone if the reply is lost), or nil. Returns whether it was still waiting.
pub fn answer(id: u64, outcome: Outcome, grant: Option<Grant>) -> bool {
    let handle = with_registry(|registry| {
        let blocked = registry.by_id.get_mut(&id)?;
        let State::Waiting { gives_up_at } = blocked.state else { return None };
        if let Some(at) = gives_up_at {
            registry.timeouts.remove(&(at, id));
        }
        let fence = match outcome {
            Outcome::Granted(fence) => Some(fence),
            Outcome::Nil => None,
        };
        if let Some(grant) = &grant {
            registry.answered_grants.insert(grant.fence, id);
        }
        blocked.state = State::Answered { fence, grant: grant.map(Box::new), delivered: false };
        Some(blocked.handle)
    });
    let Some(handle) = handle else { return false };
    let privdata = Box::into_raw(Box::new(Answer(id))).cast::<c_void>();
    // SAFETY: the handle came from BlockClient and is unblocked once (its state left Waiting);
    // the private data is freed by `free_answer`.
    unsafe {
        if let Some(unblock) = raw::RedisModule_UnblockClient {
            unblock(handle as *mut raw::RedisModuleBlockedClient, privdata);
        }
    }
    true
}

/// The grant with `fence` was answered to its holder by another command (a repeated ACQUIRE
/// or a RENEW of the same token): if its hand-over reply is lost after all, the grant stays.
pub fn confirm_grant(fence: u64) {
    with_registry(|registry| {
        if registry.answered_grants.is_empty() {
            return;
        }
        let Some(id) = registry.answered_grants.remove(&fence) else { return };
        if let Some(Blocked { state: State::Answered { grant, .. }, .. }) =
            registry.by_id.get_mut(&id)
        {
            *grant = None;
        }
    });
}

/// The earliest moment a waiter gives up, for the timer.
pub fn next_timeout() -> Option<Micros> {
    with_registry(|registry| registry.timeouts.first().map(|(at, _)| *at))
}

/// Answers nil to every waiter whose wait ended by `now_mono`; their queues get pruned.
pub fn time_out(now_mono: Micros) -> usize {
    let due: Vec<(u64, KeyRef)> = with_registry(|registry| {
        let mut due = Vec::new();
        while let Some(&(at, id)) = registry.timeouts.first().filter(|(at, _)| *at <= now_mono) {
            registry.timeouts.remove(&(at, id));
            if let Some(blocked) = registry.by_id.get(&id) {
                due.push((id, blocked.key.clone()));
            }
        }
        due
    });
    let count = due.len();
    if count > 0 {
        crate::metrics::count(|stats| stats.waits_timed_out += count as u64);
    }
    for (id, key) in due {
        answer(id, Outcome::Nil, None);
        state::prune_later(key, id);
    }
    count
}

/// Answers nil to every client waiting on a key of database `first` or `second` (they were
/// swapped: a waiter is only ever granted the key it asked for); their lines are pruned where
/// the values now are.
pub fn dismiss_swapped(first: i32, second: i32) -> usize {
    let due: Vec<(u64, KeyRef)> = with_registry(|registry| {
        registry
            .by_id
            .iter()
            .filter(|(_, b)| matches!(b.state, State::Waiting { .. }))
            .filter(|(_, b)| b.key.db == first || b.key.db == second)
            .map(|(&id, b)| (id, b.key.clone()))
            .collect()
    });
    let count = due.len();
    if count > 0 {
        crate::metrics::count(|stats| stats.waits_timed_out += count as u64);
    }
    for (id, key) in due {
        answer(id, Outcome::Nil, None);
        let db = if key.db == first { second } else { first };
        state::prune_later(KeyRef { db, name: key.name }, id);
    }
    count
}

/// How a registration that the server ends on its own (disconnect, `CLIENT UNBLOCK`) ends.
enum Ended {
    /// It was still waiting (this id): it must leave its key's line.
    WasWaiting(KeyRef, u64),
    /// It had been answered; this is what it was told (if anything yet).
    WasAnswered(Option<u64>),
    /// Not ours any more.
    Unknown,
}

fn end(handle: *mut raw::RedisModuleBlockedClient, deliver: bool) -> Ended {
    let ended = with_registry(|registry| {
        let Some(&id) = registry.by_handle.get(&(handle as usize)) else { return Ended::Unknown };
        let Some(blocked) = registry.by_id.get_mut(&id) else { return Ended::Unknown };
        match &mut blocked.state {
            State::Waiting { gives_up_at } => {
                if let Some(at) = *gives_up_at {
                    registry.timeouts.remove(&(at, id));
                }
                match registry.remove(id) {
                    Some(blocked) => Ended::WasWaiting(blocked.key, id),
                    None => Ended::Unknown,
                }
            }
            State::Answered { fence, delivered, .. } => {
                *delivered |= deliver;
                Ended::WasAnswered(*fence)
            }
        }
    });
    if matches!(ended, Ended::WasWaiting(..)) {
        // SAFETY: a waiting registration was never unblocked: this frees the handle.
        unsafe {
            if let Some(unblock) = raw::RedisModule_UnblockClient {
                unblock(handle, std::ptr::null_mut());
            }
        }
    }
    ended
}

/// # Safety
/// Called by Redis with the context of a blocked client being answered.
unsafe extern "C" fn on_reply(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: the private data is the Answer given to UnblockClient (or null).
    let id = unsafe {
        raw::RedisModule_GetBlockedClientPrivateData
            .map_or(std::ptr::null_mut(), |f| f(ctx))
            .cast::<Answer>()
            .as_ref()
            .map(|answer| answer.0)
    };
    let fence = id.and_then(|id| {
        with_registry(|registry| match registry.by_id.get_mut(&id).map(|b| &mut b.state) {
            Some(State::Answered { fence, delivered, .. }) => {
                *delivered = true;
                *fence
            }
            _ => None,
        })
    });
    reply(ctx, fence);
    raw::REDISMODULE_OK as c_int
}

fn reply(ctx: *mut raw::RedisModuleCtx, fence: Option<u64>) {
    // SAFETY: ctx is the blocked client's context for this call.
    unsafe {
        match fence {
            Some(fence) => {
                raw::RedisModule_ReplyWithLongLong.map(|f| f(ctx, fence as i64));
            }
            None => {
                raw::RedisModule_ReplyWithNull.map(|f| f(ctx));
            }
        }
    }
}

/// # Safety
/// Called by Redis when `CLIENT UNBLOCK` ends a wait (the module sets no server timeout).
unsafe extern "C" fn on_unblock(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: ctx is the blocked client's context for this call.
    let handle = unsafe { raw::RedisModule_GetBlockedClientHandle.map(|f| f(ctx)) };
    let ended = handle.map_or(Ended::Unknown, |handle| end(handle, true));
    match ended {
        Ended::WasWaiting(key, id) => {
            state::prune_later(key, id);
            state::arm_soon();
            crate::metrics::count(|stats| stats.waits_timed_out += 1);
            reply(ctx, None);
        }
        // Already answered: the reply callback will not run now, so the answer goes here.
        Ended::WasAnswered(fence) => reply(ctx, fence),
        Ended::Unknown => reply(ctx, None),
    }
    raw::REDISMODULE_OK as c_int
}

/// # Safety
/// Called by Redis when a blocked client disconnects, is killed, or is unblocked with an error.
unsafe extern "C" fn on_disconnect(
    _ctx: *mut raw::RedisModuleCtx,
    handle: *mut raw::RedisModuleBlockedClient,
) {
    if let Ended::WasWaiting(key, id) = end(handle, false) {
        state::prune_later(key, id);
        state::arm_soon();
        crate::metrics::count(|stats| stats.waits_abandoned += 1);
    }
}

/// # Safety
/// Called by Redis (main thread) with the private data given to UnblockClient, after the reply
/// callback had its chance.
unsafe extern "C" fn free_answer(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    if privdata.is_null() {
        return;
    }
    // SAFETY: privdata came from Box::into_raw of an Answer in `answer`.
    let Answer(id) = *unsafe { Box::from_raw(privdata.cast::<Answer>()) };
    let lost = with_registry(|registry| match registry.remove(id)?.state {
        State::Answered { grant: Some(grant), delivered: false, .. } => Some(*grant),
        _ => None,
    });
    // Its wait was counted as granted at the hand-over; taking the lease back counts it in
    // `grants_undone`.
    if let Some(grant) = lost {
        state::release_later(grant);
        state::arm_soon();
    }
}
