//! `DLOCK.SETFENCE fence`: raises the fence counter to at least `fence`. Written to the AOF (and
//! replicas) whenever the server forks, so the counter survives an AOF rewrite without an RDB
//! preamble even when no lock key holds it. Clients cannot send it.

use std::sync::Mutex;

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, internal_only};
use crate::core::args::parse_fence;
use crate::core::{DlockError, Micros, Now};
use crate::state;

pub const META: CommandMeta = CommandMeta {
    name: "dlock.setfence",
    flags: "write",
    arity: 2,
    key_flags: 0,
    summary: "Internal: raises the fence counter (AOF and replication stream only)",
    complexity: "O(1)",
    args: &[ArgMeta::required("fence", ArgKind::Integer)],
    acl_categories: "write dangerous",
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    internal_only(ctx, "DLOCK.SETFENCE")?;
    let [_, fence] = args else {
        return Err(DlockError::WrongArity(META.name).into());
    };
    let fence =
        parse_fence(fence.as_slice()).map_err(|_| DlockError::BadReplicatedLease("fence"))?;
    state::observe_fence(fence);
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// Propagates the counter as `DLOCK.SETFENCE` on the next turn of the event loop, so the AOF
/// file opened for a fork carries it. Not at once: a fork can happen inside a command (PSYNC,
/// BGSAVE, BGREWRITEAOF), and replicating from there marks that command as a write, so the
/// server would append it to the AOF and the replication stream (a PSYNC replayed from the AOF
/// crashes the next load).
///
/// One timer at a time: it propagates the counter as it is when it fires.
pub fn propagate_counter_soon(now: Now) {
    want_timer_at(now.mono);
}

/// The propagation timer: when it is wanted (monotonic µs) and, once [`before_sleep`] armed it,
/// its id. Only `before_sleep` creates the timer (see `timer::before_sleep` for why a timer
/// callback never does).
#[derive(Clone, Copy)]
struct Pending {
    due: Micros,
    id: Option<u64>,
}

static PENDING: Mutex<Option<Pending>> = Mutex::new(None);

/// Asks for the propagation timer at `due`, unless one is wanted or armed already.
fn want_timer_at(due: Micros) {
    if let Ok(mut pending) = PENDING.lock()
        && pending.is_none()
    {
        *pending = Some(Pending { due, id: None });
    }
}

/// Called before the event loop sleeps: arms the propagation timer wanted since, and replaces
/// one held up by a step back of the wall clock (Redis runs module timers on it) by one due at
/// once.
pub fn before_sleep(ctx: &Context, now: Now) {
    let Ok(mut pending) = PENDING.lock() else { return };
    let Some(Pending { due, id }) = *pending else { return };
    let delay_ms = match id {
        None => due.saturating_sub(now.mono).div_ceil(1_000),
        Some(id) if now.mono > due.saturating_add(crate::clock::TIMER_LATE_US) => {
            // SAFETY: ctx is live; the id was returned by CreateTimer and carries no data; this
            // is not a timer callback, so the stopped timer is not the one running.
            unsafe {
                if let Some(stop) = raw::RedisModule_StopTimer {
                    stop(ctx.ctx, id, std::ptr::null_mut());
                }
            }
            0
        }
        Some(_) => return,
    };
    // SAFETY: ctx is live for this call; the timer carries no data.
    unsafe {
        if let Some(create) = raw::RedisModule_CreateTimer {
            let id =
                create(ctx.ctx, delay_ms as i64, Some(on_propagate_timer), std::ptr::null_mut());
            let due = now.mono.saturating_add(delay_ms * 1_000);
            *pending = Some(Pending { due, id: Some(id) });
        }
    }
}

/// # Safety
/// Called by Redis on its main thread with a context valid for this call.
unsafe extern "C" fn on_propagate_timer(
    ctx: *mut raw::RedisModuleCtx,
    _data: *mut std::ffi::c_void,
) {
    let ctx = Context::new(ctx);
    if let Ok(mut pending) = PENDING.lock() {
        *pending = None;
    }
    if !crate::expiry::decides_expiry(&ctx) {
        return;
    }
    if crate::expiry::writes_paused() {
        // Propagating while writes are paused aborts the server: try again after the pause.
        let now = crate::clock::now();
        want_timer_at(now.mono.saturating_add(crate::expiry::PAUSED_POLL_MS * 1_000));
        return;
    }
    crate::apply::propagate_fence_counter(&ctx);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_name_the_counter_travels_as_is_the_registered_name() {
        assert_eq!(crate::apply::SETFENCE, super::META.name);
    }
}
