//! `DLOCK.INFO resource`: nil, or the live lease as field/value pairs.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{CommandMeta, FieldValue, lock_in, reply_fields, split_args};
use crate::core::DlockError;
use crate::{clock, waiters};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.info",
    flags: "readonly fast",
    arity: 2,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    summary: "Shows the live lease on a resource: owner, fence, remaining ttl, waiters",
    complexity: "O(1)",
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    if !rest.is_empty() {
        return Err(DlockError::WrongArity(META.name).into());
    }
    let now = clock::now();
    let key = ctx.open_key(resource);
    let Some(lock) = lock_in(&key)? else {
        return Ok(RedisValue::Null);
    };
    let waiting = lock.waiters().filter(|waiter| waiters::is_alive(waiter.id)).count();
    let lease = lock.live_lease(now);
    if lease.is_none() && waiting == 0 {
        return Ok(RedisValue::Null);
    }
    // A queue without a lease (grants held after a restart) shows null owner and fence.
    reply_fields(
        ctx,
        &[
            ("owner", lease.map_or(FieldValue::Null, |lease| FieldValue::Bytes(&lease.token))),
            (
                "fence",
                lease.map_or(FieldValue::Null, |lease| FieldValue::Integer(lease.fence as i64)),
            ),
            (
                "ttl-ms",
                FieldValue::Integer(lease.map_or(0, |lease| lease.remaining_ms(now)) as i64),
            ),
            ("waiters", FieldValue::Integer(waiting as i64)),
        ],
    )
}
