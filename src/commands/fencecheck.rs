//! `DLOCK.FENCECHECK resource fence`: 1 when fence is the fence of the live lease.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, lock_in, split_args};
use crate::core::args;
use crate::{clock, metrics};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.fencecheck",
    flags: "readonly fast",
    arity: 3,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    keys: Keys::One,
    summary: "Tells whether a fence is the fence of the live lease on a resource",
    complexity: "O(1) for an exclusive lease, O(log S) for S shared leases on the resource",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("fence", ArgKind::Integer),
    ],
    acl_categories: "read fast",
    since: super::V1,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    let fence = args::fencecheck(&rest)?;
    let key = ctx.open_key(resource);
    let valid = lock_in(&key)?.is_some_and(|lock| lock.fence_check(fence, clock::now()));
    metrics::count(|stats| {
        *(if valid { &mut stats.fencecheck_passed } else { &mut stats.fencecheck_stale }) += 1;
    });
    Ok(RedisValue::Integer(i64::from(valid)))
}
