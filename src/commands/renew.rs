//! `DLOCK.RENEW resource token ttl-ms [FENCE fence]`: 1 when the owner's live lease (the grant
//! with `fence`, when given) now ends ttl-ms from now.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, V2, lock_at, primary_only, split_args};
use crate::apply::{self, Site};
use crate::core::args;
use crate::core::{Lock, Renewal};
use crate::{clock, config};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.renew",
    flags: "write fast",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    keys: Keys::One,
    summary: "Extends the caller's live lease to ttl-ms from now",
    complexity: "O(log N) where N is the number of leases with a deadline, plus O(log S) for S shared leases on the resource",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::required("ttl-ms", ArgKind::Integer),
        ArgMeta::option("fence", ArgKind::Integer, "FENCE").since(V2),
    ],
    acl_categories: "write fast",
    since: super::V1,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    primary_only(ctx)?;
    let request = args::renew(&rest, config::max_ttl_ms())?;
    let now = clock::now();
    let key = ctx.open_key_writable(resource);
    // A resource without a key is decided on an empty lock, never stored: its refusal is
    // counted like any other, and no key is created or propagated.
    let mut missing = None;
    let (lock, stored) = match lock_at(&key)? {
        Some(lock) => (lock, true),
        None => (missing.insert(Lock::default()), false),
    };
    let (renewal, changes) = apply::decide(now, |step| {
        step.renew_grant(lock, request.token, request.fence, request.ttl_ms)
    });
    let site = Site::new(&key, resource, args.get(2));
    apply::apply(ctx, &site, lock, stored, changes, now);
    Ok(RedisValue::Integer(i64::from(renewal? == Renewal::Renewed)))
}
