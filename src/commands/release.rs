//! `DLOCK.RELEASE resource token [FENCE fence]`: 1 when the owner's live lease (the grant with
//! `fence`, when given) was released.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, V2, lock_at, primary_only, split_args};
use crate::apply::{self, Site};
use crate::clock;
use crate::core::Lock;
use crate::core::args;

pub const META: CommandMeta = CommandMeta {
    name: "dlock.release",
    flags: "write fast",
    arity: -3,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    keys: Keys::One,
    summary: "Releases the caller's live lease",
    complexity: "O(log N) where N is the number of leases with a deadline, plus O(log S) for S shared leases on the resource and O(W) for W waiters when the lease passes to one",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::option("fence", ArgKind::Integer, "FENCE").since(V2),
    ],
    acl_categories: "write fast",
    since: super::V1,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    primary_only(ctx)?;
    let request = args::release(&rest)?;
    let now = clock::now();
    let key = ctx.open_key_writable(resource);
    // A resource without a key is decided on an empty lock, never stored: its refusal is
    // counted like any other, and no key is created or propagated.
    let mut missing = None;
    let (lock, stored) = match lock_at(&key)? {
        Some(lock) => (lock, true),
        None => (missing.insert(Lock::default()), false),
    };
    let (released, changes) =
        apply::decide(now, |step| step.release_grant(lock, request.token, request.fence));
    apply::apply(ctx, &Site { key: &key, name: resource, token: None }, lock, stored, changes, now);
    Ok(RedisValue::Integer(i64::from(released)))
}
