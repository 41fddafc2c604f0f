//! `DLOCK.RENEWALL numkeys resource [resource …] token ttl-ms [FENCES fence …]`: 1 when every
//! member's live lease of the token (the grant with its fence, when given) now ends ttl-ms from
//! now; 0, and nothing renewed, when any member is not held.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, V3, on_lock, set_call};
use crate::core::{DlockError, Renewal, args};
use crate::{clock, config};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.renewall",
    flags: "write getkeys-api",
    arity: -5,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    keys: Keys::Counted,
    summary: "Extends every lease of a set to ttl-ms from now, or none",
    complexity: "O(K log N) for K resources, where N is the number of leases with a deadline, plus O(log S) for S shared leases on each resource",
    args: &[
        ArgMeta::required("numkeys", ArgKind::Integer),
        ArgMeta::required("resource", ArgKind::Key).multiple(),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::required("ttl-ms", ArgKind::Integer),
        ArgMeta::option("fence", ArgKind::Integer, "FENCES").multiple(),
    ],
    acl_categories: "write",
    since: V3,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let Some((resources, rest)) = set_call(ctx, args, &META)? else {
        return Ok(RedisValue::NoReply); // the server asked for the keys
    };
    let request = args::renew_all(&rest, resources.len(), config::max_ttl_ms())?;
    let now = clock::now();
    // Every member says what a RENEW would answer; the first that would not renew is refused
    // as its RENEW would be (counted, logged) and nothing is renewed.
    for (index, resource) in resources.iter().enumerate() {
        let fence = request.fence(index);
        let renewed = on_lock(ctx, resource, None, now, |step, lock| {
            let renewal = step.renewal(lock, request.token, fence, request.ttl_ms)?;
            if renewal != Renewal::Renewed {
                step.renew_grant(lock, request.token, fence, request.ttl_ms)?;
            }
            Ok::<_, DlockError>(renewal == Renewal::Renewed)
        })??;
        if !renewed {
            return Ok(RedisValue::Integer(0));
        }
    }
    for (index, resource) in resources.iter().enumerate() {
        on_lock(ctx, resource, None, now, |step, lock| {
            step.renew_grant(lock, request.token, request.fence(index), request.ttl_ms)
        })??;
    }
    Ok(RedisValue::Integer(1))
}
