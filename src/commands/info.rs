//! `DLOCK.INFO resource`: nil, or the live lease as field/value pairs.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{CommandMeta, FieldValue, lock_in, reply_fields, split_args};
use crate::clock;
use crate::core::DlockError;

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
    let Some(lease) = lock_in(&key)?.and_then(|lock| lock.live_lease(now)) else {
        return Ok(RedisValue::Null);
    };
    reply_fields(
        ctx,
        &[
            ("owner", FieldValue::Bytes(&lease.token)),
            ("fence", FieldValue::Integer(lease.fence as i64)),
            ("ttl-ms", FieldValue::Integer(lease.remaining_ms(now) as i64)),
            ("waiters", FieldValue::Integer(0)),
        ],
    )
}
