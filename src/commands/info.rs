//! `DLOCK.INFO resource`: nil, or the live leases and the line as field/value pairs.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, FieldValue, Keys, lock_in, reply_fields, split_args};
use crate::core::{DlockError, Lock, Now, Waiter};
use crate::{clock, expiry, state, waiters};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.info",
    flags: "readonly fast",
    arity: 2,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    keys: Keys::One,
    summary: "Shows the live leases on a resource: owner, fence, remaining ttl, hold time, renewals, mode, metadata, waiters, tickets, hand-overs and wait and hold percentiles",
    complexity: "O(W + S) where W is the number of waiters and S the number of shared leases on the resource",
    args: &[ArgMeta::required("resource", ArgKind::Key)],
    acl_categories: "read fast",
    since: super::V1,
};

/// How many waiting tokens `next-waiters` shows, head of the queue first.
const NEXT_WAITERS_SHOWN: usize = 5;

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let (resource, rest) = split_args(args, META.name)?;
    if !rest.is_empty() {
        return Err(DlockError::WrongArity(META.name).into());
    }
    let now = clock::now();
    let key = ctx.open_key(resource);
    let Some(lock) = lock_in(&key)? else {
        return Ok(RedisValue::Null);
    };
    // The line as it stands: blocked clients still waiting and tickets not yet lapsed.
    let standing: Vec<&Waiter> = lock
        .waiters()
        .filter(|waiter| match waiter.ticket_until {
            Some(until) => until > now.mono,
            None => waiters::is_alive(waiter.id),
        })
        .collect();
    let queue: Vec<&[u8]> = standing.iter().map(|waiter| &*waiter.token).collect();
    let tickets = standing.iter().filter(|waiter| waiter.ticket_until.is_some()).count();
    let lease = lock.live_lease(now);
    if lease.is_none() && queue.is_empty() {
        return Ok(RedisValue::Null);
    }
    let number = |value: u64| FieldValue::Integer(i64::try_from(value).unwrap_or(i64::MAX));
    fn bytes(value: Option<&[u8]>) -> FieldValue<'_> {
        value.map_or(FieldValue::Null, FieldValue::Bytes)
    }
    let holders = lock.live_holders(now).count();
    let mode = lease.map(|lease| lease.mode().name().as_bytes());
    let meta = lease.and_then(|lease| lease.token.meta());
    // The owner fields show the exclusive lease, or the newest shared one; a queue without a
    // lease (grants held after a restart) shows null owner and fence.
    let mut fields = vec![
        ("owner", lease.map_or(FieldValue::Null, |lease| FieldValue::Bytes(&lease.token))),
        ("fence", lease.map_or(FieldValue::Null, |lease| number(lease.fence))),
        ("ttl-ms", number(lease.map_or(0, |lease| lease.remaining_ms(now)))),
        ("held-ms", number(lease.map_or(0, |lease| lease.held_ms(now)))),
        ("renewals", number(lease.map_or(0, |lease| u64::from(lease.renewals())))),
        ("waiters", number((queue.len() - tickets) as u64)),
        ("next-waiters", FieldValue::List(&queue[..queue.len().min(NEXT_WAITERS_SHOWN)])),
        ("tickets", number(tickets as u64)),
        ("mode", bytes(mode)),
        ("holders", number(holders as u64)),
        ("meta", bytes(meta)),
    ];
    // The lock's history while watched (contended or renewed; `core/watch.rs`), 0 otherwise.
    let db = expiry::selected_db(ctx);
    let history = state::with_watched(|watched| {
        watched.get(db, resource.as_slice()).map_or([0; 5], |record| {
            [
                record.handovers,
                record.waits.percentile(50.0),
                record.waits.percentile(99.0),
                record.holds.percentile(50.0),
                record.holds.percentile(99.0),
            ]
        })
    });
    for (name, value) in ["handovers", "wait-p50-us", "wait-p99-us", "hold-p50-us", "hold-p99-us"]
        .iter()
        .zip(history)
    {
        fields.push((name, number(value)));
    }
    if lease.is_some_and(|lease| lease.shared()) {
        fields.push(("leases", FieldValue::Value(shared_leases(lock, now))));
    }
    reply_fields(ctx, &fields)
}

/// Every live shared lease, oldest grant first: `[token, fence, ttl-ms, meta]` each.
fn shared_leases(lock: &Lock, now: Now) -> RedisValue {
    let integer = |value: u64| RedisValue::Integer(i64::try_from(value).unwrap_or(i64::MAX));
    RedisValue::Array(
        lock.live_holders(now)
            .map(|lease| {
                RedisValue::Array(vec![
                    RedisValue::StringBuffer(lease.token.to_vec()),
                    integer(lease.fence),
                    integer(lease.remaining_ms(now)),
                    lease
                        .token
                        .meta()
                        .map_or(RedisValue::Null, |m| RedisValue::StringBuffer(m.to_vec())),
                ])
            })
            .collect(),
    )
}
