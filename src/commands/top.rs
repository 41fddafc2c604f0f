//! `DLOCK.TOP [BY waiters | held-ms | handovers] [COUNT count]`: the watched locks of the
//! current database that hurt most, largest first. A lock is watched from its first contention
//! (`core/watch.rs`), so the answer costs O(W log W) for the W ≤ 4,096 watched
//! locks, whatever the number of keys, and an uncontended ACQUIRE pays nothing for it. Keys the
//! caller may not read are left out, as in `DLOCK.LIST`.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::list::{Readable, Summary};
use super::{ArgKind, ArgMeta, CommandMeta, FieldValue, Keys, V3, lock_in, write_fields};
use crate::core::args::{self, TopOrder};
use crate::core::limits::MAX_TOP_COUNT;
use crate::{clock, expiry, state};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.top",
    flags: "readonly",
    arity: -1,
    key_flags: 0,
    keys: Keys::One,
    summary: "Shows the watched (contended) locks that hurt most: by line length, hold time or hand-overs, with holders, metadata and wait and hold percentiles",
    complexity: "O(W log W) where W is the number of watched locks (at most 4096)",
    args: &[
        ArgMeta {
            token: Some("BY"),
            ..ArgMeta::one_of(
                "order",
                &[
                    ArgMeta::flag("waiters", "WAITERS").required_here(),
                    ArgMeta::flag("held-ms", "HELD-MS").required_here(),
                    ArgMeta::flag("handovers", "HANDOVERS").required_here(),
                ],
            )
        },
        ArgMeta::option("count", ArgKind::Integer, "COUNT"),
    ],
    acl_categories: "read slow",
    since: V3,
};

/// One watched lock as the view shows it.
struct Row {
    name: RedisString,
    summary: Summary,
    handovers: u64,
    wait_p99_us: u64,
    hold_p99_us: u64,
}

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let rest: Vec<&[u8]> = args.iter().skip(1).map(RedisString::as_slice).collect();
    let request = args::top(&rest)?;
    debug_assert!(request.count <= MAX_TOP_COUNT);
    let db = expiry::selected_db(ctx);
    // Copied out first: no call into Redis while the state is locked.
    let watched: Vec<(Vec<u8>, u64, u64, u64)> = state::with_watched(|watched| {
        watched
            .of_db(db)
            .map(|(name, record)| {
                (
                    name.to_vec(),
                    record.handovers,
                    record.waits.percentile(99.0),
                    record.holds.percentile(99.0),
                )
            })
            .collect()
    });
    let readable = Readable::of_caller(ctx);
    let now = clock::now();
    let mut rows = Vec::new();
    for (name, handovers, wait_p99_us, hold_p99_us) in watched {
        let name = RedisString::create_from_slice(ctx.ctx, &name);
        if !readable.allows(&name) {
            continue;
        }
        let key = ctx.open_key(&name);
        let summary = match lock_in(&key) {
            Ok(Some(lock)) => Summary::of(lock, now),
            // A lock between bursts (its key gone) still has its history.
            Ok(None) => Summary::default(),
            Err(_) => continue,
        };
        rows.push(Row { name, summary, handovers, wait_p99_us, hold_p99_us });
    }
    let measure = |row: &Row| match request.order {
        TopOrder::Waiters => row.summary.line as u64,
        TopOrder::HeldMs if row.summary.holders > 0 => row.summary.held_ms,
        TopOrder::HeldMs => 0,
        TopOrder::Handovers => row.handovers,
    };
    rows.retain(|row| measure(row) > 0);
    rows.sort_by(|a, b| {
        measure(b).cmp(&measure(a)).then_with(|| a.name.as_slice().cmp(b.name.as_slice()))
    });
    rows.truncate(request.count);
    raw::reply_with_array(ctx.ctx, rows.len() as std::os::raw::c_long);
    for row in &rows {
        write_row(ctx, row);
    }
    Ok(RedisValue::NoReply)
}

fn write_row(ctx: &Context, row: &Row) {
    let number = |value: u64| FieldValue::Integer(i64::try_from(value).unwrap_or(i64::MAX));
    fn bytes(value: Option<&[u8]>) -> FieldValue<'_> {
        value.map_or(FieldValue::Null, FieldValue::Bytes)
    }
    let summary = &row.summary;
    write_fields(
        ctx,
        &[
            ("resource", FieldValue::Bytes(row.name.as_slice())),
            ("mode", bytes(summary.mode.map(str::as_bytes))),
            ("holders", number(summary.holders as u64)),
            ("owner", bytes(summary.owner.as_deref())),
            ("meta", bytes(summary.meta.as_deref())),
            ("fence", summary.fence.map_or(FieldValue::Null, number)),
            ("ttl-ms", number(summary.ttl_ms)),
            ("held-ms", number(summary.held_ms)),
            ("line", number(summary.line as u64)),
            ("handovers", number(row.handovers)),
            ("wait-p99-us", number(row.wait_p99_us)),
            ("hold-p99-us", number(row.hold_p99_us)),
        ],
    );
}
