//! `DLOCK.RELEASE resource token [FENCE fence]`: 1 when the owner's live lease (the grant with
//! `fence`, when given) was released.

use redis_module::{Context, ContextFlags, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, V2, lock_at, primary_in, split_args};
use crate::apply::{self, Site};
use crate::clock;
use crate::core::{DlockError, Lock, args, replica};

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
    let flags = crate::call::context_flags(ctx);
    if flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        return Ok(replayed(ctx, resource)?);
    }
    primary_in(flags)?;
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
    let site = Site { replays_as_delete: true, ..Site::new(&key, resource, None) };
    apply::apply(ctx, &site, lock, stored, changes, now);
    Ok(RedisValue::Integer(i64::from(released)))
}

/// A RELEASE replayed by a replica or from the AOF. The primary propagates its own RELEASE only
/// when the key went with it ([`Site::replays_as_delete`]), so the key goes here too, whatever
/// this copy's clock says of the lease; then the command is passed on, as every replicated
/// change is.
fn replayed(ctx: &Context, resource: &RedisString) -> Result<RedisValue, DlockError> {
    let key = ctx.open_key_writable(resource);
    match lock_at(&key)? {
        Some(lock) => {
            replica::end_all(lock);
            apply::apply_replicated(ctx, &Site::new(&key, resource, None), lock, clock::now());
        }
        None => ctx.replicate_verbatim(),
    }
    Ok(RedisValue::Integer(1))
}
