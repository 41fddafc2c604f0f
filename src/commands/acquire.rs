//! `DLOCK.ACQUIRE resource token ttl-ms [SHARED [LIMIT n]] [WAIT timeout-ms | QUEUE ticket-ms]
//! [NOTIFY request] [CLAIM claim-ms] [META value]`: fence, or nil when not granted.

use redis_module::{Context, ContextFlags, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, V2, on_lock, primary_only, split_args};
use crate::apply;
use crate::core::{Acquired, DlockError, Lock, Step, Waiter};
use crate::core::{args, sets};
use crate::{clock, config, expiry, waiters};

/// `SHARED [LIMIT n]`.
pub const SHARED: &[ArgMeta] = &[ArgMeta::option("n", ArgKind::Integer, "LIMIT")];

/// `WAIT timeout-ms | QUEUE ticket-ms`.
const WAIT_OR_QUEUE: &[ArgMeta] = &[
    ArgMeta::option("timeout-ms", ArgKind::Integer, "WAIT").required_here(),
    ArgMeta::option("ticket-ms", ArgKind::Integer, "QUEUE").required_here().since(V2),
];

pub const META: CommandMeta = CommandMeta {
    name: "dlock.acquire",
    flags: "write deny-oom",
    arity: -4,
    // Write permission only (`%W~`): the reply is a fence the module minted, never user data read
    // from the key, so no `ACCESS`. `UPDATE` rather than `INSERT`: a grant may replace an expired
    // lease or extend the holder's own (Redis allows only one of INSERT, UPDATE and DELETE).
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    keys: Keys::One,
    summary: "Acquires a lease on a resource and returns its fencing token",
    complexity: "O(log N) where N is the number of leases with a deadline, plus O(log W) for W waiters and O(log S) for S shared leases on the resource",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::required("ttl-ms", ArgKind::Integer),
        ArgMeta::option("shared", ArgKind::Block(SHARED), "SHARED").since(V2),
        ArgMeta::one_of("wait-or-queue", WAIT_OR_QUEUE),
        ArgMeta::option("request", ArgKind::Integer, "NOTIFY").since(V2),
        ArgMeta::option("claim-ms", ArgKind::Integer, "CLAIM").since(V2),
        ArgMeta::option("value", ArgKind::String, "META").since(V2),
    ],
    acl_categories: "write slow blocking",
    since: super::V1,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    primary_only(ctx)?;
    let request = args::acquire(&rest, config::max_ttl_ms())?;
    let now = clock::now();
    // A slot moving here: the resource's last fence may be known only to the old owner (a free
    // resource has no key; a shared lease released there left no trace in the key that moved).
    crate::cluster::gate(ctx, resource.as_slice(), now)?;
    // The waiter this command put in line, to block once the decision is applied.
    let mut waiting = 0;
    let outcome = on_lock(ctx, resource, args.get(2), now, |step, lock| {
        let outcome =
            step.acquire_as(lock, request.token, request.ttl_ms, request.mode, request.meta)?;
        Ok::<_, DlockError>(match outcome {
            Acquired::Granted { fence, .. } | Acquired::Reacquired { fence } => {
                RedisValue::Integer(fence as i64)
            }
            Acquired::Busy | Acquired::GrantsHeld => match (request.wait_ms, request.queue_ms) {
                (Some(timeout_ms), _) if may_block(ctx) => {
                    waiting = wait(ctx, resource, step, lock, &request, timeout_ms);
                    RedisValue::NoReply
                }
                (_, Some(ticket_ms)) => {
                    queue(step, lock, &request, ticket_ms);
                    RedisValue::Null
                }
                _ => {
                    step.contended();
                    RedisValue::Null
                }
            },
        })
    })?;
    match outcome? {
        // The server refused to block the client (it left the line again): no lease, now.
        RedisValue::NoReply if !waiters::is_blocked(waiting) => Ok(RedisValue::Null),
        outcome => Ok(outcome),
    }
}

/// Whether this call may block: not inside MULTI/EXEC or a script (they answer at once, as
/// BLPOP does there).
fn may_block(ctx: &Context) -> bool {
    !crate::call::context_flags(ctx)
        .intersects(ContextFlags::MULTI | ContextFlags::LUA | ContextFlags::DENY_BLOCKING)
}

/// Puts the caller in line as a waiter to block; the reply comes from the hand-over or the
/// timeout.
fn wait(
    ctx: &Context,
    resource: &RedisString,
    step: &mut Step<'_, apply::Server>,
    lock: &mut Lock,
    request: &args::AcquireArgs<'_>,
    timeout_ms: u64,
) -> u64 {
    let now = step.now();
    let gives_up_at = (timeout_ms > 0).then(|| now.mono.saturating_add(timeout_ms * 1_000));
    let key = expiry::key_ref(ctx, resource.as_slice());
    // Only registered here: the client is blocked when the decision is applied.
    let id = waiters::register(key, gives_up_at);
    let waiter = Waiter {
        id,
        token: request.token.into(),
        ttl_ms: request.ttl_ms,
        gives_up_at,
        queued_at: now.mono,
        claim_ms: request.claim_ms,
        ticket_until: None,
        set: false,
        notify: None,
        mode: request.mode,
        meta: request.meta.map(Into::into),
    };
    step.enqueue(lock, waiter);
    id
}

/// Takes or keeps the token's place in line with a ticket of `ticket_ms`; its turn is granted
/// with a claim window (`CLAIM`, by default the ticket's life).
fn queue(
    step: &mut Step<'_, apply::Server>,
    lock: &mut Lock,
    request: &args::AcquireArgs<'_>,
    ticket_ms: u64,
) {
    let claim = Some(request.claim_ms.unwrap_or(ticket_ms));
    let (token, mode, meta) = (request.token, request.mode, request.meta);
    let now = step.now().mono;
    let id = waiters::new_ticket_id();
    let ticket =
        sets::ticket(lock, token, request.ttl_ms, mode, meta, claim, ticket_ms, false, now, id);
    step.enqueue_ticket(lock, Waiter { notify: request.notify, ..ticket });
}
