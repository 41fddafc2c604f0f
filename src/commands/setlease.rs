//! `DLOCK.SETLEASE resource token fence deadline-unix-us`: the effect of a grant or renewal,
//! applied by replicas and AOF loading. Clients cannot send it: it would forge fences.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, internal_only, lock_at, split_args};
use crate::core::args::{parse_fence, parse_int, parse_token};
use crate::core::{DlockError, Lease, Lock};
use crate::datatype::LOCK_TYPE;
use crate::{clock, expiry, metrics, state};

/// The command name as a C string, for propagating it through the raw API.
pub const C_NAME: &std::ffi::CStr = c"dlock.setlease";

pub const META: CommandMeta = CommandMeta {
    name: "dlock.setlease",
    flags: "write",
    arity: 5,
    key_flags: raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE,
    summary: "Internal: applies a lease decided by the primary (replication stream and AOF only)",
    complexity: "O(log N) where N is the number of leases with a deadline",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::required("fence", ArgKind::Integer),
        ArgMeta::required("deadline-unix-us", ArgKind::Integer),
    ],
    acl_categories: "write dangerous",
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    internal_only(ctx, "DLOCK.SETLEASE")?;
    let (resource, rest) = split_args(args, META.name)?;
    let [token, fence, deadline] = rest.as_slice() else {
        return Err(DlockError::WrongArity(META.name).into());
    };
    let token = parse_token(token).map_err(|_| DlockError::BadReplicatedLease("token length"))?;
    let fence = parse_fence(fence).map_err(|_| DlockError::BadReplicatedLease("fence"))?;
    let deadline = parse_int(deadline)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or(DlockError::BadReplicatedLease("deadline"))?;
    let now = clock::now();
    let mut lock =
        Lock::with_lease(Lease::restore(token, fence, deadline, now, state::last_fence())?);
    let key = ctx.open_key_writable(resource);
    // Checks the type before anything changes: another type at the key is WRONGTYPE. A renewal
    // of the grant this copy already has keeps its hold history.
    if let Some(previous) =
        lock_at(&key)?.and_then(|lock| lock.lease()).filter(|l| l.fence == fence)
    {
        let renewed = previous.deadline_wall != deadline;
        if let Some(lease) = lock.lease_mut() {
            lease.granted_mono = previous.granted_mono;
            lease.renewals = previous.renewals.saturating_add(u32::from(renewed));
        }
    }
    state::observe_fence(fence);
    expiry::schedule(ctx, resource, &lock, now);
    key.set_value(&LOCK_TYPE, lock)?;
    metrics::lock_key_created();
    // The arguments are absolute, so passing the command on unchanged is deterministic.
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_c_name_is_the_registered_name() {
        assert_eq!(super::C_NAME.to_str(), Ok(super::META.name));
    }
}
