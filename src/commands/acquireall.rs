//! `DLOCK.ACQUIREALL numkeys resource [resource …] token ttl-ms [SHARED [LIMIT n]] [META value]`:
//! every resource of the set granted to the token, each with its own fence, or none.

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue, raw};

use super::{
    ArgKind, ArgMeta, CommandMeta, Keys, V3, acquire, declare_members, keys_position_request,
    on_lock, primary_only, split_members,
};
use crate::core::{Acquired, args};
use crate::{clock, config};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.acquireall",
    flags: "write deny-oom getkeys-api",
    arity: -5,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    keys: Keys::Counted,
    summary: "Acquires a lease on every resource of a set, or on none, and returns their fencing tokens",
    complexity: "O(K log N) for K resources, where N is the number of leases with a deadline, plus O(log S) for S shared leases on each resource",
    args: &[
        ArgMeta::required("numkeys", ArgKind::Integer),
        ArgMeta::required("resource", ArgKind::Key).multiple(),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::required("ttl-ms", ArgKind::Integer),
        ArgMeta::option("shared", ArgKind::Block(acquire::SHARED), "SHARED"),
        ArgMeta::option("value", ArgKind::String, "META"),
    ],
    acl_categories: "write slow",
    since: V3,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    if keys_position_request(ctx) {
        declare_members(ctx, args, META.key_flags);
        return Ok(RedisValue::NoReply);
    }
    let (resources, rest) = split_members(args, META.name)?;
    primary_only(ctx)?;
    let request = args::acquire_all(&rest, config::max_ttl_ms())?;
    let now = clock::now();
    for resource in resources {
        crate::cluster::gate(ctx, resource.as_slice(), now)?;
    }
    // Every member settles and says what an ACQUIRE would answer; the first that would not
    // grant ends the call, its refusal counted once, and nothing is granted. Nothing runs
    // between these decisions and the grants below (one command), so each grant answers what
    // its member said here.
    for resource in resources {
        let admitted = on_lock(ctx, resource, now, |step, lock| {
            let admission = step.admission(lock, request.token, request.mode)?;
            if !admission.grants() {
                step.contended();
            }
            Ok::<_, crate::core::DlockError>(admission.grants())
        })??;
        if !admitted {
            return Ok(RedisValue::Null);
        }
    }
    let mut fences = Vec::with_capacity(resources.len());
    for resource in resources {
        let outcome = on_lock(ctx, resource, now, |step, lock| {
            step.acquire_as(lock, request.token, request.ttl_ms, request.mode, request.meta)
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
