//! `DLOCK.SETFENCE fence`: raises the fence counter to at least `fence`. Written to the AOF (and
//! replicas) whenever the server forks, so the counter survives an AOF rewrite without an RDB
//! preamble even when no lock key holds it. Clients cannot send it.

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, internal_only};
use crate::core::args::parse_fence;
use crate::core::{DlockError, Now};
use crate::state;

pub const META: CommandMeta = CommandMeta {
    name: "dlock.setfence",
    flags: "write",
    arity: 2,
    key_flags: 0,
    keys: Keys::One,
    summary: "Internal: raises the fence counter (AOF and replication stream only)",
    complexity: "O(1)",
    args: &[ArgMeta::required("fence", ArgKind::Integer)],
    acl_categories: "write dangerous",
    since: super::V1,
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

/// Propagates the counter as `DLOCK.SETFENCE` on the next turn of the event loop, so the AOF
/// file opened for a fork carries it. Not at once: a fork can happen inside a command (PSYNC,
/// BGSAVE, BGREWRITEAOF), and replicating from there marks that command as a write, so the
/// server would append it to the AOF and the replication stream (a PSYNC replayed from the AOF
/// crashes the next load).
///
/// The module's one timer does it (`core::schedule`), with the counter as it is when it fires.
pub fn propagate_counter_soon(now: Now) {
    crate::state::with_expiry(|expiry| expiry.schedule.want_propagation(now.mono));
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_name_the_counter_travels_as_is_the_registered_name() {
        assert_eq!(crate::apply::SETFENCE, super::META.name);
    }
}
