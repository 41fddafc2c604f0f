//! `DLOCK.REVOKE resource [FENCE fence] [REASON reason]`: ends a holder's live lease whoever it
//! is (an operator taking a lock from a stuck holder), tells the resource's channel why, and
//! hands the lock on; answers how many leases ended.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, V3, lock_at, primary_only, split_args};
use crate::apply::{self, Site};
use crate::clock;
use crate::core::args;

pub const META: CommandMeta = CommandMeta {
    name: "dlock.revoke",
    flags: "write",
    arity: -2,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    keys: Keys::One,
    summary: "Ends a live lease whoever holds it, telling its holder why",
    complexity: "O(log S) for S shared leases on the resource with FENCE, O(K log S) for the K leases it ends without, plus O(W) for W waiters when the lock passes to one",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::option("fence", ArgKind::Integer, "FENCE"),
        ArgMeta::option("reason", ArgKind::String, "REASON"),
    ],
    acl_categories: "write slow dangerous",
    since: V3,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    primary_only(ctx)?;
    let request = args::revoke(&rest)?;
    let now = clock::now();
    let key = ctx.open_key_writable(resource);
    // No key, no lease: nothing to revoke, and nothing is created.
    let Some(lock) = lock_at(&key)? else { return Ok(RedisValue::Integer(0)) };
    let (revoked, changes) =
        apply::decide(now, |step| step.revoke(lock, request.fence, request.reason));
    apply::apply(ctx, &Site::new(&key, resource, None), lock, true, changes, now);
    Ok(RedisValue::Integer(revoked as i64))
}
