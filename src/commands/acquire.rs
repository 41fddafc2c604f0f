//! `DLOCK.ACQUIRE resource token ttl-ms [WAIT timeout-ms]`: fence, or nil when held by another.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{CommandMeta, lock_at, primary_only, replicate_lease, split_args};
use crate::core::args;
use crate::core::{Acquired, DlockError, Lock};
use crate::datatype::LOCK_TYPE;
use crate::{clock, config, expiry, state};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.acquire",
    flags: "write deny-oom",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_UPDATE,
    summary: "Acquires a lease on a resource and returns its fencing token",
    complexity: "O(log N) where N is the number of leases with a deadline",
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    primary_only(ctx)?;
    let request = args::acquire(&rest, config::max_ttl_ms())?;
    if request.wait_ms.is_some() {
        return Err(DlockError::WaitNotSupported.into());
    }
    let now = clock::now();
    let key = ctx.open_key_writable(resource);
    let mut created = None;
    let lock = match lock_at(&key)? {
        Some(lock) => lock,
        // Just started or promoted: a lease lost with the old primary may still run elsewhere.
        None if config::new_grants_held(now.mono) => return Ok(RedisValue::Null),
        None => created.insert(Lock::default()),
    };
    let outcome = state::with_fences(|fences| {
        lock.acquire(request.token, request.ttl_ms, now, fences, false)
    })?;
    let fence = match outcome {
        Acquired::Busy | Acquired::Held => return Ok(RedisValue::Null),
        Acquired::Granted { fence, .. } | Acquired::Reacquired { fence } => fence,
    };
    if let Some(lease) = lock.lease() {
        replicate_lease(ctx, resource, lease);
    }
    expiry::schedule(ctx, resource, lock, now);
    if let Some(lock) = created {
        key.set_value(&LOCK_TYPE, lock)?;
    }
    Ok(RedisValue::Integer(fence as i64))
}
