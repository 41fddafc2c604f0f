//! `DLOCK.ACQUIREALL numkeys resource [resource …] token ttl-ms [SHARED [LIMIT n]]
//! [QUEUE ticket-ms] [META value]`: every resource of the set granted to the token, each with its
//! own fence, or none (with `QUEUE`, the set keeps a place in every member's line).

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, V3, acquire, on_lock, set_call};
use crate::apply;
use crate::core::sets::{self, SetOutcome, SetRequest};
use crate::core::{Lock, Now, Step, args};
use crate::{clock, config, waiters};

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
    let set = SetRequest {
        token: request.token,
        ttl_ms: request.ttl_ms,
        mode: request.mode,
        meta: request.meta,
        queue_ms: request.queue_ms,
    };
    match sets::acquire_all(&mut SetKeys { ctx, resources, now }, &set)? {
        SetOutcome::Granted(fences) => Ok(RedisValue::Array(
            fences.into_iter().map(|fence| RedisValue::Integer(fence as i64)).collect(),
        )),
        SetOutcome::Refused | SetOutcome::Queued => Ok(RedisValue::Null),
        SetOutcome::Inconsistent => Err(RedisError::Str(
            "ERR internal error in dlock: a set member admitted then refused; please report it",
        )),
    }
}

/// A set's members as the keys of this call.
struct SetKeys<'a> {
    ctx: &'a Context,
    resources: &'a [RedisString],
    now: Now,
}

impl sets::Members for SetKeys<'_> {
    type Host = apply::Server;
    type Error = RedisError;

    fn count(&self) -> usize {
        self.resources.len()
    }

    fn decide<T>(
        &mut self,
        index: usize,
        op: impl FnOnce(&mut Step<'_, apply::Server>, &mut Lock) -> T,
    ) -> Result<T, RedisError> {
        on_lock(self.ctx, &self.resources[index], None, self.now, op)
    }

    fn new_ticket_id(&mut self) -> u64 {
        waiters::new_ticket_id()
    }
}
