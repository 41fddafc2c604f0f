//! The floor for what a client blocked by a module costs the server: `FLOOR.BLOCK` blocks its
//! caller with `RedisModule_BlockClient` and nothing else (no private data, no registry, no
//! timer), lets go of the handle when the client disconnects, and answers nil if unblocked. The
//! benchmark loads it next to dlock to tell the server's share of a waiter from dlock's.

use std::os::raw::c_int;

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw, redis_module};

fn block(ctx: &Context, _args: Vec<RedisString>) -> RedisResult {
    // SAFETY: ctx is the live command context; the callbacks are plain functions. Timeout 0:
    // the client waits until it disconnects or `CLIENT UNBLOCK`.
    unsafe {
        let (Some(block), Some(on_disconnect_of)) =
            (raw::RedisModule_BlockClient, raw::RedisModule_SetDisconnectCallback)
        else {
            return Err(redis_module::RedisError::Str("no blocking API"));
        };
        let handle = block(ctx.ctx, Some(answer_nil), Some(unblocked), None, 0);
        if !handle.is_null() {
            on_disconnect_of(handle, Some(let_go));
        }
    }
    Ok(RedisValue::NoReply)
}

/// # Safety
/// Called by the server with the blocked client's context.
unsafe extern "C" fn answer_nil(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: ctx is valid for this call.
    unsafe { raw::RedisModule_ReplyWithNull.map(|reply| reply(ctx)) };
    raw::REDISMODULE_OK as c_int
}

/// # Safety
/// Called by the server for `CLIENT UNBLOCK`: answers nil and lets go of the handle.
unsafe extern "C" fn unblocked(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: ctx is valid for this call; the handle was not unblocked before.
    unsafe {
        if let Some(handle) = raw::RedisModule_GetBlockedClientHandle.map(|of| of(ctx)) {
            let_go(ctx, handle);
        }
        answer_nil(ctx, argv, argc)
    }
}

/// # Safety
/// Called by the server when a blocked client goes away: the handle must be unblocked once.
unsafe extern "C" fn let_go(
    _ctx: *mut raw::RedisModuleCtx,
    handle: *mut raw::RedisModuleBlockedClient,
) {
    // SAFETY: the handle was never unblocked before (it only ends here).
    unsafe { raw::RedisModule_UnblockClient.map(|unblock| unblock(handle, std::ptr::null_mut())) };
}

// A test binary runs without Redis, so it cannot use Redis's allocator.
#[cfg(not(test))]
use redis_module::alloc::RedisAlloc as Allocator;
#[cfg(test)]
use std::alloc::System as Allocator;

redis_module! {
    name: "floor",
    version: 1,
    allocator: (Allocator, Allocator),
    data_types: [],
    commands: [
        ["floor.block", block, "", 0, 0, 0, ""],
    ],
}
