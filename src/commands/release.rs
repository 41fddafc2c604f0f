//! `DLOCK.RELEASE resource token`: 1 when the owner's live lease was released.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{CommandMeta, delete_lock_key, lock_at, primary_only, split_args};
use crate::clock;
use crate::core::args;

pub const META: CommandMeta = CommandMeta {
    name: "dlock.release",
    flags: "write fast",
    arity: 3,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    summary: "Releases the caller's live lease",
    complexity: "O(1)",
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    primary_only(ctx)?;
    let token = args::release(&rest)?;
    let now = clock::now();
    let key = ctx.open_key_writable(resource);
    let Some(lock) = lock_at(&key)? else {
        return Ok(RedisValue::Integer(0));
    };
    let released = lock.release(token, now);
    // Deleting also covers a lease that expired unnoticed: the key goes either way.
    if lock.is_vacant(now) {
        delete_lock_key(ctx, &key, resource);
    }
    Ok(RedisValue::Integer(i64::from(released)))
}
