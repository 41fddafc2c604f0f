//! `DLOCK.SETFENCE fence`: raises the fence counter to at least `fence`. Written to the AOF (and
//! replicas) whenever the server forks, so the counter survives an AOF rewrite without an RDB
//! preamble even when no lock key holds it. Clients cannot send it.

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use super::{ArgKind, ArgMeta, CommandMeta, internal_only};
use crate::core::DlockError;
use crate::core::args::parse_fence;
use crate::state;

pub const META: CommandMeta = CommandMeta {
    name: "dlock.setfence",
    flags: "write",
    arity: 2,
    key_flags: 0,
    summary: "Internal: raises the fence counter (AOF and replication stream only)",
    complexity: "O(1)",
    args: &[ArgMeta::required("fence", ArgKind::Integer)],
    acl_categories: "write dangerous",
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    internal_only(ctx, "DLOCK.SETFENCE")?;
    let [_, fence] = args else {
        return Err(DlockError::WrongArity(META.name).into());
    };
    let fence =
        parse_fence(fence.as_slice()).map_err(|_| DlockError::BadReplicatedLease("fence"))?;
    state::observe_fence(fence);
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// Propagates the counter as `DLOCK.SETFENCE`, so the AOF file opened for this fork carries it.
pub fn propagate_counter(ctx: &Context) {
    let last = state::last_fence();
    if last > 0 {
        ctx.replicate(META.name, &[last.to_string().as_str()]);
    }
}
