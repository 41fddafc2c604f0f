//! Fences across a slot move: the cluster bus side of `core::slotfloor`.
//!
//! A command filter sees `CLUSTER SETSLOT` on this node (the module API has no event for it);
//! an `ACQUIRE` of a resource in a slot this node is taking asks the slot's old owner for
//! its fence counter over the cluster bus, answers `TRYAGAIN` until the answer is in, and the
//! answer raises this node's counter. Every node answers the question with its counter.

use std::ffi::CString;
use std::os::raw::c_char;
use std::sync::atomic::Ordering;

use redis_module::{Context, ContextFlags, raw};

use crate::config;
use crate::core::slotfloor::{Gate, NodeId, SlotChange, SlotMoves, key_slot};
use crate::core::{DlockError, Now};
use crate::notify::{self, Level};
use crate::state::{self, MODULE};

/// Cluster bus message types of this module.
const QUESTION: u8 = 1;
const ANSWER: u8 = 2;

fn with_taking<T>(f: impl FnOnce(&mut SlotMoves) -> T) -> T {
    let mut guard = state::lock(&MODULE.slots);
    let taking = guard.get_or_insert_with(SlotMoves::default);
    let result = f(taking);
    MODULE
        .slots_busy
        .store(!taking.floors.is_idle() || !taking.changes.is_empty(), Ordering::Release);
    result
}

/// In cluster mode: answers other nodes' questions and watches `CLUSTER SETSLOT`.
pub fn register(ctx: &Context) -> redis_module::Status {
    if !ctx.get_flags().contains(ContextFlags::CLUSTER) {
        return redis_module::Status::Ok;
    }
    // SAFETY: ctx is the load context; the receiver and the filter are plain functions.
    unsafe {
        let (Some(receiver), Some(filter)) = (
            raw::RedisModule_RegisterClusterMessageReceiver,
            raw::RedisModule_RegisterCommandFilter,
        ) else {
            return redis_module::Status::Err;
        };
        receiver(ctx.ctx, QUESTION, Some(on_message));
        receiver(ctx.ctx, ANSWER, Some(on_message));
        if filter(ctx.ctx, Some(on_command), raw::REDISMODULE_CMDFILTER_NOSELF as i32).is_null() {
            return redis_module::Status::Err;
        }
    }
    redis_module::Status::Ok
}

/// An `ACQUIRE` of `resource` at `now`: `Err` (TRYAGAIN) while its slot waits for the
/// old owner's counter.
pub fn gate(ctx: &Context, resource: &[u8], now: Now) -> Result<(), DlockError> {
    if !MODULE.slots_busy.load(Ordering::Acquire) {
        return Ok(());
    }
    let gate = with_taking(|taking| {
        apply_changes(taking, now);
        let gate = taking.floors.gate(key_slot(resource), resource, now.mono);
        if let Gate::TryAgain { ask: Some(question) } = &gate {
            taking.outbox.push(*question);
        }
        gate
    });
    flush(ctx);
    match gate {
        Gate::Mint => Ok(()),
        Gate::TryAgain { .. } => Err(DlockError::SlotMoving),
        Gate::GaveUp { source } => {
            config::lead_fences(now.wall);
            notify::log(
                ctx,
                Level::Warning,
                &format!(
                    "dlock: node {} did not answer with its fence counter; fences of the slot it \
                     gave this node rely on dlock.fence-lead-ms now",
                    String::from_utf8_lossy(&source)
                ),
            );
            Ok(())
        }
    }
}

/// Valkey's server event for its atomic slot migration (`CLUSTER MIGRATESLOTS`).
pub const ATOMIC_SLOT_MIGRATION_EVENT: u64 = 19;
const IMPORT_STARTED: u64 = 0;
const IMPORT_ABORTED: u64 = 2;
const IMPORT_COMPLETED: u64 = 4;

/// Valkey's `ValkeyModuleSlotRange`.
#[repr(C)]
struct SlotRange {
    start: std::os::raw::c_int,
    end: std::os::raw::c_int,
}

/// Valkey's `ValkeyModuleAtomicSlotMigrationInfoV1`.
#[repr(C)]
struct MigrationInfo {
    version: u64,
    job_name: [c_char; 41],
    slot_ranges: *const SlotRange,
    num_slot_ranges: u32,
}

/// An atomic slot migration into this node: the slots it imports come from their owner now
/// (read from `CLUSTER SLOTS` when it starts); once it completes they are this node's, and its
/// grants there wait for the old owner's counter, as after `CLUSTER SETSLOT … NODE`.
///
/// # Safety
/// `data` is null or points to the event's `MigrationInfo`, valid for this call.
pub unsafe fn slot_migration(ctx: &Context, subevent: u64, data: *const std::os::raw::c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: as documented; the ranges array holds num_slot_ranges entries.
    let slots: Vec<u16> = unsafe {
        let info = &*data.cast::<MigrationInfo>();
        if info.version < 1 || info.slot_ranges.is_null() {
            return;
        }
        std::slice::from_raw_parts(info.slot_ranges, info.num_slot_ranges as usize)
            .iter()
            .flat_map(|range| range.start.max(0)..=range.end.min(16_383))
            .map(|slot| slot as u16)
            .collect()
    };
    let changes: Vec<SlotChange> = match subevent {
        IMPORT_STARTED => {
            let owners = slot_owners(ctx);
            slots
                .iter()
                .filter_map(|slot| {
                    let (_, owner) = owners.iter().find(|(range, _)| range.contains(slot))?;
                    Some(SlotChange::Importing(*slot, *owner))
                })
                .collect()
        }
        IMPORT_COMPLETED => match my_id() {
            Some(me) => slots.iter().map(|slot| SlotChange::Node(*slot, me)).collect(),
            None => Vec::new(),
        },
        IMPORT_ABORTED => slots.iter().map(|slot| SlotChange::Stable(*slot)).collect(),
        _ => Vec::new(),
    };
    if !changes.is_empty() {
        with_taking(|taking| taking.changes.extend(changes));
    }
}

/// Each range of slots and the id of the primary serving it, from `CLUSTER SLOTS`.
fn slot_owners(ctx: &Context) -> Vec<(std::ops::RangeInclusive<u16>, NodeId)> {
    let Ok(redis_module::RedisValue::Array(ranges)) = ctx.call("CLUSTER", &["SLOTS"]) else {
        return Vec::new();
    };
    let number = |value: &redis_module::RedisValue| match value {
        redis_module::RedisValue::Integer(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    ranges
        .iter()
        .filter_map(|range| {
            let redis_module::RedisValue::Array(fields) = range else { return None };
            let (start, end) = (number(fields.first()?)?, number(fields.get(1)?)?);
            let redis_module::RedisValue::Array(primary) = fields.get(2)? else { return None };
            let id = match primary.get(2)? {
                redis_module::RedisValue::BulkString(id) => node_id(id.as_bytes())?,
                redis_module::RedisValue::SimpleString(id) => node_id(id.as_bytes())?,
                redis_module::RedisValue::BulkRedisString(id) => node_id(id.as_slice())?,
                _ => return None,
            };
            Some((start..=end, id))
        })
        .collect()
}

/// Before the event loop sleeps: applies the `SETSLOT`s seen and sends the questions they need.
pub fn before_sleep(ctx: &Context, now: Now) {
    if MODULE.slots_busy.load(Ordering::Acquire) {
        with_taking(|taking| apply_changes(taking, now));
        flush(ctx);
    }
}

fn apply_changes(taking: &mut SlotMoves, now: Now) {
    let me = my_id();
    for change in std::mem::take(&mut taking.changes) {
        match change {
            SlotChange::Importing(slot, source) => taking.floors.importing(slot, source),
            SlotChange::Node(slot, node) if Some(node) == me => {
                if let Some(question) = taking.floors.owned(slot, now.mono) {
                    taking.outbox.push(question);
                }
            }
            SlotChange::Node(slot, _) | SlotChange::Stable(slot) => taking.floors.stable(slot),
        }
    }
}

/// Sends the questions waiting in the outbox (the gate's too).
fn flush(ctx: &Context) {
    let outbox = with_taking(|taking| std::mem::take(&mut taking.outbox));
    for question in outbox {
        send(ctx, &question.to, QUESTION, &question.seq.to_le_bytes());
    }
}

fn send(ctx: &Context, to: &NodeId, kind: u8, payload: &[u8]) {
    let Ok(target) = CString::new(to.to_vec()) else { return };
    // SAFETY: ctx is live; target is a NUL-terminated node name; payload outlives the call.
    unsafe {
        if let Some(send) = raw::RedisModule_SendClusterMessage {
            send(ctx.ctx, target.as_ptr(), kind, payload.as_ptr().cast(), payload.len() as u32);
        }
    }
}

/// This node's name. `GetMyClusterID` points to the name's 40 bytes, which are not
/// NUL-terminated (read as a C string, they ran on into what follows, and the name was never
/// this node's: a slot made this node's by `SETSLOT … NODE` was taken for another's).
fn my_id() -> Option<NodeId> {
    // SAFETY: GetMyClusterID returns null outside a cluster, else this node's name.
    let id = unsafe { raw::RedisModule_GetMyClusterID.map(|f| f())? };
    if id.is_null() {
        return None;
    }
    // SAFETY: non-null, and the name is REDISMODULE_NODE_ID_LEN (40) bytes, valid while the
    // server runs.
    node_id(unsafe { std::slice::from_raw_parts(id.cast::<u8>(), 40) })
}

fn node_id(bytes: &[u8]) -> Option<NodeId> {
    bytes.try_into().ok()
}

/// # Safety
/// Called by Redis on its main thread; `sender` points to a node name of 40 bytes and `payload`
/// to `len` bytes, both valid for this call.
unsafe extern "C" fn on_message(
    ctx: *mut raw::RedisModuleCtx,
    sender: *const c_char,
    kind: u8,
    payload: *const u8,
    len: u32,
) {
    if sender.is_null() || (payload.is_null() && len > 0) {
        return;
    }
    // SAFETY: as documented above.
    let (sender, payload) = unsafe {
        (
            std::slice::from_raw_parts(sender.cast::<u8>(), 40),
            std::slice::from_raw_parts(payload, len as usize),
        )
    };
    let Some(sender) = node_id(sender) else { return };
    let ctx = Context::new(ctx);
    match (kind, payload.len()) {
        (QUESTION, 8) => {
            let mut answer = payload.to_vec();
            answer.extend_from_slice(&state::last_fence().to_le_bytes());
            send(&ctx, &sender, ANSWER, &answer);
        }
        (ANSWER, 16) => {
            let (seq, counter) = payload.split_at(8);
            let seq = u64::from_le_bytes(seq.try_into().unwrap_or_default());
            let counter = u64::from_le_bytes(counter.try_into().unwrap_or_default());
            state::observe_fence(counter);
            with_taking(|taking| taking.floors.answered(sender, seq));
        }
        _ => {}
    }
}

/// # Safety
/// Called by Redis for every command, with a filter context valid for this call.
unsafe extern "C" fn on_command(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // SAFETY: fctx is this call's filter context, and `command` lives only in this call.
    let command = unsafe { crate::filter::Filtered::new(fctx) };
    if !(4..=5).contains(&command.len())
        || !command.arg(0).eq_ignore_ascii_case(b"cluster")
        || !command.arg(1).eq_ignore_ascii_case(b"setslot")
    {
        return;
    }
    let node = (command.len() == 5).then(|| command.arg(4));
    if let Some(change) = slot_change(command.arg(2), command.arg(3), node) {
        with_taking(|taking| taking.changes.push(change));
    }
}

/// `CLUSTER SETSLOT slot state [node]`, read; `None` if it is not one that matters here (or
/// malformed: the server refuses it).
fn slot_change(slot: &[u8], state: &[u8], node: Option<&[u8]>) -> Option<SlotChange> {
    let slot: u16 = std::str::from_utf8(slot).ok()?.parse().ok()?;
    if slot >= crate::core::slotfloor::SLOTS {
        return None;
    }
    let node = node.and_then(node_id);
    if state.eq_ignore_ascii_case(b"importing") {
        Some(SlotChange::Importing(slot, node?))
    } else if state.eq_ignore_ascii_case(b"node") {
        Some(SlotChange::Node(slot, node?))
    } else if state.eq_ignore_ascii_case(b"stable") {
        Some(SlotChange::Stable(slot))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setslot_arguments_read_as_the_server_reads_them() {
        let id = [b'f'; 40];
        assert!(matches!(
            slot_change(b"7", b"IMPORTING", Some(&id)),
            Some(SlotChange::Importing(7, node)) if node == id
        ));
        assert!(matches!(slot_change(b"7", b"node", Some(&id)), Some(SlotChange::Node(7, _))));
        assert!(matches!(slot_change(b"16383", b"STABLE", None), Some(SlotChange::Stable(16_383))));
        assert!(slot_change(b"16384", b"STABLE", None).is_none());
        assert!(slot_change(b"x", b"STABLE", None).is_none());
        assert!(slot_change(b"7", b"MIGRATING", Some(&id)).is_none());
        assert!(slot_change(b"7", b"IMPORTING", Some(b"short")).is_none());
    }
}
