//! `DLOCK.ACQUIREALL numkeys resource [resource …] token ttl-ms [SHARED [LIMIT n]]
//! [QUEUE ticket-ms] [META value]`: every resource of the set granted to the token, each with its
//! own fence, or none (with `QUEUE`, the set keeps a place in every member's line).

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, V3, acquire, on_lock, set_call};
use crate::core::{Acquired, args};
use crate::{clock, config};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.acquireall",
    flags: "write deny-oom getkeys-api",
    arity: -5,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    keys: Keys::Counted,
    summary: "Acquires a lease on every resource of a set, or on none, and returns their fencing tokens",
    complexity: "O(K log N) for K resources, where N is the number of leases with a deadline, plus O(log S) for S shared leases and O(log W) for W waiters on each resource",
    args: &[
        ArgMeta::required("numkeys", ArgKind::Integer),
        ArgMeta::required("resource", ArgKind::Key).multiple(),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::required("ttl-ms", ArgKind::Integer),
        ArgMeta::option("shared", ArgKind::Block(acquire::SHARED), "SHARED"),
        ArgMeta::option("ticket-ms", ArgKind::Integer, "QUEUE"),
        ArgMeta::option("value", ArgKind::String, "META"),
    ],
    acl_categories: "write slow",
    since: V3,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let Some((resources, rest)) = set_call(ctx, args, &META)? else {
        return Ok(RedisValue::NoReply); // the server asked for the keys
    };
    let request = args::acquire_all(&rest, config::max_ttl_ms())?;
    let now = clock::now();
    for resource in resources {
        crate::cluster::gate(ctx, resource.as_slice(), now)?;
    }
    // Every member settles and says what an ACQUIRE would answer (the token's own set ticket
    // heading a member's line does not stand in its way). Nothing runs between these decisions
    // and the grants below (one command), so each grant answers what its member said here.
    let mut admitted = Vec::with_capacity(resources.len());
    for resource in resources {
        let admission = on_lock(ctx, resource, now, |step, lock| {
            step.set_admission(lock, request.token, request.mode)
        })??;
        admitted.push(admission.grants());
    }
    if let Some(refused) = admitted.iter().position(|grants| !grants) {
        match request.queue_ms {
            Some(ticket_ms) => queue_set(ctx, resources, &request, ticket_ms, now)?,
            // One refusal, counted once, on the first member that refused.
            None => on_lock(ctx, &resources[refused], now, |step, _| step.contended())?,
        }
        return Ok(RedisValue::Null);
    }
    let mut fences = Vec::with_capacity(resources.len());
    for resource in resources {
        let outcome = on_lock(ctx, resource, now, |step, lock| {
            step.acquire_member(lock, request.token, request.ttl_ms, request.mode, request.meta)
        })??;
        match outcome {
            Acquired::Granted { fence, .. } | Acquired::Reacquired { fence } => {
                fences.push(RedisValue::Integer(fence as i64));
            }
            // Unreachable by the rule above; said rather than hidden if a change breaks it.
            Acquired::Busy | Acquired::GrantsHeld => {
                return Err(RedisError::Str(
                    "ERR internal error in dlock: a set member admitted then refused; please report it",
                ));
            }
        }
    }
    Ok(RedisValue::Array(fences))
}

/// `QUEUE ticket-ms`: the set's ticket takes or keeps its place in every member's line. A set
/// whose ticket is missing from some line (it lapsed there, or the key was deleted) first leaves
/// every line and joins them all at the back: every two sets then stand in the same order in
/// every line they share, so the oldest set is never behind a younger one, and no two sets can
/// wait for each other.
fn queue_set(
    ctx: &Context,
    resources: &[RedisString],
    request: &args::AcquireArgs<'_>,
    ticket_ms: u64,
    now: crate::core::Now,
) -> Result<(), RedisError> {
    let mut in_line = 0;
    for resource in resources {
        let queued = on_lock(ctx, resource, now, |_, lock| {
            lock.queued(request.token).is_some_and(|waiter| waiter.set)
        })?;
        in_line += usize::from(queued);
    }
    let rejoin = in_line != 0 && in_line != resources.len();
    for resource in resources {
        on_lock(ctx, resource, now, |step, lock| {
            if rejoin {
                step.withdraw_ticket(lock, request.token);
            }
            acquire::queue(step, lock, request, ticket_ms, true);
        })?;
    }
    Ok(())
}
