//! `DLOCK.RENEW resource token ttl-ms`: 1 when the owner's live lease now ends ttl-ms from now.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, lock_at, primary_only, replicate_lease, split_args};
use crate::core::Renewal;
use crate::core::args;
use crate::core::args::printable;
use crate::notify::{self, Transition};
use crate::{clock, config, metrics, settle};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.renew",
    flags: "write fast",
    arity: 4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    summary: "Extends the caller's live lease to ttl-ms from now",
    complexity: "O(log N) where N is the number of leases with a deadline",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::required("ttl-ms", ArgKind::Integer),
    ],
    acl_categories: "write fast",
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    primary_only(ctx)?;
    let request = args::renew(&rest, config::max_ttl_ms())?;
    let now = clock::now();
    let key = ctx.open_key_writable(resource);
    let Some(lock) = lock_at(&key)? else {
        return Ok(RedisValue::Integer(0));
    };
    // An expired lease passes to the queue first: its old owner renews nothing.
    settle::pass_on(ctx, resource, lock, now)?;
    let renewal = lock.renew(request.token, request.ttl_ms, now, config::rules(now.mono));
    metrics::count(|stats| match renewal {
        Renewal::Renewed => stats.renew_ok += 1,
        Renewal::NotHeld => stats.renew_refused += 1,
        Renewal::PastMaxHold => {
            stats.renew_refused += 1;
            stats.renew_refused_max_hold += 1;
        }
    });
    let renewed = renewal == Renewal::Renewed;
    match (renewal, lock.live_lease(now)) {
        (Renewal::Renewed, Some(lease)) => {
            replicate_lease(ctx, resource, lease);
            notify::transition(ctx, Transition::Renewed, resource, lease, now);
        }
        (_, Some(lease)) => notify::anomaly(ctx, now, || {
            let why = if renewal == Renewal::PastMaxHold {
                "past dlock.max-hold-ms"
            } else {
                "not the owner"
            };
            format!(
                "renewal refused ({why}) resource={} token={} holder={} held-ms={}",
                printable(resource.as_slice()),
                printable(request.token),
                printable(&lease.token),
                lease.held_ms(now)
            )
        }),
        (_, None) => {}
    }
    settle::tidy(ctx, &key, resource, lock, now);
    Ok(RedisValue::Integer(i64::from(renewed)))
}
