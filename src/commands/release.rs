//! `DLOCK.RELEASE resource token`: 1 when the owner's live lease was released.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, lock_at, primary_only, split_args};
use crate::core::args;
use crate::core::args::printable;
use crate::notify::{self, Transition};
use crate::{clock, metrics, settle};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.release",
    flags: "write fast",
    arity: 3,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    summary: "Releases the caller's live lease",
    complexity: "O(log N) where N is the number of leases with a deadline, plus O(W) for W waiters when the lease passes to one",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("token", ArgKind::String),
    ],
    acl_categories: "write fast",
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
    let holder = lock.live_lease(now).map(|lease| lease.token.clone());
    let released = lock.release(token, now);
    match (&released, holder) {
        (Some(lease), _) => notify::transition(ctx, Transition::Released, resource, lease, now),
        (None, Some(holder)) => notify::anomaly(ctx, now, || {
            format!(
                "release by a non-owner refused resource={} token={} holder={}",
                printable(resource.as_slice()),
                printable(token),
                printable(&holder)
            )
        }),
        (None, None) => {}
    }
    metrics::count(|stats| match &released {
        Some(lease) => {
            stats.release_ok += 1;
            stats.hold_time.record(now.mono.saturating_sub(lease.granted_mono));
        }
        None => stats.release_not_owner += 1,
    });
    // The lease (released, or expired unnoticed) passes to the queue, or the key goes.
    settle::settle(ctx, &key, resource, lock, now);
    Ok(RedisValue::Integer(i64::from(released.is_some())))
}
