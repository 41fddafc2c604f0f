//! `DLOCK.RELEASEALL numkeys resource [resource …] token [FENCES fence …]`: releases every
//! member the token holds (the grant with its fence, when given); the number released.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, V3, on_lock, set_call};
use crate::clock;
use crate::core::args;

pub const META: CommandMeta = CommandMeta {
    name: "dlock.releaseall",
    flags: "write getkeys-api",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    keys: Keys::Counted,
    summary: "Releases every lease of a set the caller holds",
    complexity: "O(K log N) for K resources, where N is the number of leases with a deadline, plus O(log S) for S shared leases on each resource and O(W) for W waiters when a lease passes to one",
    args: &[
        ArgMeta::required("numkeys", ArgKind::Integer),
        ArgMeta::required("resource", ArgKind::Key).multiple(),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::option("fence", ArgKind::Integer, "FENCES").multiple(),
    ],
    acl_categories: "write",
    since: V3,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let Some((resources, rest)) = set_call(ctx, args, &META)? else {
        return Ok(RedisValue::NoReply); // the server asked for the keys
    };
    let request = args::release_all(&rest, resources.len())?;
    let now = clock::now();
    let mut released = 0;
    for (index, resource) in resources.iter().enumerate() {
        let done = on_lock(ctx, resource, None, now, |step, lock| {
            step.release_grant(lock, request.token, request.fence(index))
        })?;
        released += i64::from(done);
    }
    Ok(RedisValue::Integer(released))
}
