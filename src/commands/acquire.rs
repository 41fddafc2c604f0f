//! `DLOCK.ACQUIRE resource token ttl-ms [WAIT timeout-ms]`: fence, or nil when held by another.

use redis_module::{Context, ContextFlags, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, lock_at, primary_only, replicate_lease, split_args};
use crate::core::args;
use crate::core::{Acquired, Lock, Now, Waiter};
use crate::datatype::LOCK_TYPE;
use crate::notify::{self, Transition};
use crate::waiters::{self, Outcome};
use crate::{clock, config, expiry, metrics, settle, state};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.acquire",
    flags: "write deny-oom",
    arity: -4,
    // Write permission only (`%W~`): the reply is a fence the module minted, never user data read
    // from the key, so no `ACCESS`. `UPDATE` rather than `INSERT`: a grant may replace an expired
    // lease or extend the holder's own (Redis allows only one of INSERT, UPDATE and DELETE).
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    summary: "Acquires a lease on a resource and returns its fencing token",
    complexity: "O(log N) where N is the number of leases with a deadline, plus O(W) for W waiters on the resource",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::required("ttl-ms", ArgKind::Integer),
        ArgMeta {
            name: "timeout-ms",
            kind: ArgKind::Integer,
            token: Some("WAIT"),
            optional: true,
            multiple: false,
        },
    ],
    acl_categories: "write slow blocking",
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    primary_only(ctx)?;
    let request = args::acquire(&rest, config::max_ttl_ms())?;
    let now = clock::now();
    let rules = config::rules(now.mono);
    let key = ctx.open_key_writable(resource);
    let mut created = None;
    let lock = match lock_at(&key)? {
        Some(lock) => {
            settle::pass_on(ctx, resource, lock, now)?;
            lock
        }
        None => created.insert(Lock::default()),
    };
    let outcome = state::with_fences(|fences| {
        lock.acquire(request.token, request.ttl_ms, now, fences, rules)
    })?;
    let reply = match outcome {
        Acquired::Granted { fence, .. } | Acquired::Reacquired { fence } => {
            let fresh = matches!(outcome, Acquired::Granted { .. });
            metrics::count(|stats| {
                *(if fresh {
                    &mut stats.acquire_granted
                } else {
                    &mut stats.acquire_reacquired
                }) += 1;
            });
            if let Some(lease) = lock.lease() {
                replicate_lease(ctx, resource, lease);
                let what = if fresh { Transition::Acquired } else { Transition::Renewed };
                notify::transition(ctx, what, resource, lease, now);
            }
            RedisValue::Integer(fence as i64)
        }
        Acquired::Busy | Acquired::Held => match request.wait_ms {
            Some(timeout_ms) if may_block(ctx) => {
                wait(ctx, resource, lock, &request, timeout_ms, now)
            }
            _ => {
                metrics::count(|stats| stats.acquire_contended += 1);
                RedisValue::Null
            }
        },
    };
    if let Some(lock) = created.take().filter(|lock| !lock.is_vacant(now)) {
        key.set_value(&LOCK_TYPE, lock)?;
        metrics::lock_key_created();
    }
    if let Some(lock) = lock_at(&key)? {
        settle::tidy(ctx, &key, resource, lock, now);
    }
    Ok(reply)
}

/// Whether this call may block: not inside MULTI/EXEC or a script (they answer at once, as
/// BLPOP does there).
fn may_block(ctx: &Context) -> bool {
    !ctx.get_flags()
        .intersects(ContextFlags::MULTI | ContextFlags::LUA | ContextFlags::DENY_BLOCKING)
}

/// Blocks the caller and puts it in line; the reply comes from the hand-over or the timeout.
fn wait(
    ctx: &Context,
    resource: &RedisString,
    lock: &mut Lock,
    request: &args::AcquireArgs<'_>,
    timeout_ms: u64,
    now: Now,
) -> RedisValue {
    let gives_up_at = (timeout_ms > 0).then(|| now.mono.saturating_add(timeout_ms * 1_000));
    let key = expiry::key_ref(ctx, resource.as_slice());
    let Some(id) = waiters::block(ctx, key, gives_up_at) else {
        return RedisValue::Null;
    };
    expiry::arm(ctx, now); // the timer answers the wait when it times out
    let waiter = Waiter {
        id,
        token: request.token.into(),
        ttl_ms: request.ttl_ms,
        gives_up_at,
        queued_at: now.mono,
    };
    metrics::count(|stats| stats.waits_started += 1);
    if let Some(superseded) = lock.enqueue(waiter) {
        waiters::answer(superseded, Outcome::Nil, None);
        metrics::count(|stats| stats.waits_timed_out += 1);
    }
    RedisValue::NoReply
}
