//! `DLOCK.SETLEASE resource token fence deadline-unix-us [GRANTED granted-unix-us RENEWALS n]
//! [SHARED] [META value]`, or `DLOCK.SETLEASE resource token effect` for a plain exclusive
//! lease (the [compact effect](crate::core::replica::write_compact)
//! `fence:deadline[:granted:renewals]`): the effect of a grant or renewal, applied by replicas
//! and AOF loading.
//! An exclusive lease replaces every lease of the resource; a shared one replaces the exclusive
//! lease and any shared lease of the same token. Clients cannot send it: it would forge fences.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, internal_only, lock_at, split_args};
use crate::apply::{self, Site};
use crate::core::args::{parse_fence, parse_meta, parse_token};
use crate::core::replica::{self, History};
use crate::core::{DlockError, Lease, Lock};
use crate::datatype::LOCK_TYPE;
use crate::{clock, metrics, state};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.setlease",
    flags: "write",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE,
    keys: Keys::One,
    summary: "Internal: applies a lease decided by the primary (replication stream and AOF only)",
    complexity: "O(log N) where N is the number of leases with a deadline",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::one_of("lease", LEASE).required_here(),
    ],
    acl_categories: "write dangerous",
    since: super::V1,
};

/// The compact effect, or the long form with its options.
const LEASE: &[ArgMeta] = &[
    ArgMeta::required("effect", ArgKind::String).since(super::V3),
    ArgMeta::required("long-form", ArgKind::Block(LONG_FORM)),
];

/// `fence deadline-unix-us [GRANTED granted-unix-us RENEWALS n] [SHARED] [META value]`.
const LONG_FORM: &[ArgMeta] = &[
    ArgMeta::required("fence", ArgKind::Integer),
    ArgMeta::required("deadline-unix-us", ArgKind::Integer),
    ArgMeta::option("granted-unix-us", ArgKind::Integer, "GRANTED"),
    ArgMeta::option("renewals", ArgKind::Integer, "RENEWALS"),
    ArgMeta::flag("shared", "SHARED"),
    ArgMeta::option("value", ArgKind::String, "META"),
];

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    internal_only(ctx, "DLOCK.SETLEASE")?;
    let (resource, rest) = split_args(args, META.name)?;
    let (token, fence, deadline, (history, shared, meta)) = match rest.as_slice() {
        [token, effect] => {
            let (fence, deadline, history) =
                replica::parse_compact(effect).map_err(DlockError::BadReplicatedLease)?;
            (token, fence, deadline, (history, false, None))
        }
        [token, fence, deadline, options @ ..] => {
            let fence = parse_fence(fence).map_err(|_| DlockError::BadReplicatedLease("fence"))?;
            let deadline =
                replica::unsigned(deadline).ok_or(DlockError::BadReplicatedLease("deadline"))?;
            (token, fence, deadline, parse_options(options)?)
        }
        _ => return Err(DlockError::WrongArity(META.name).into()),
    };
    let token = parse_token(token).map_err(|_| DlockError::BadReplicatedLease("token length"))?;
    let now = clock::now();
    let mut lease = Lease::restore(token, fence, deadline, now, state::last_fence())?;
    lease.set_shared(shared);
    if meta.is_some() {
        lease.token = lease.token.with_meta(meta);
    }
    let key = ctx.open_key_writable(resource);
    // Checks the type before anything changes: another type at the key is WRONGTYPE.
    let mut fresh = None;
    let lock = match lock_at(&key)? {
        Some(lock) => lock,
        None => fresh.insert(Lock::default()),
    };
    replica::set_lease(lock, lease, history, now);
    state::observe_fence(fence);
    apply::apply_replicated(ctx, &Site::new(&key, resource, None), lock, now);
    if let Some(lock) = fresh.take() {
        key.set_value(&LOCK_TYPE, lock)?;
        metrics::lock_key_created();
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// `[GRANTED granted-unix-us RENEWALS renewals] [SHARED] [META value]`, in this order.
fn parse_options<'a>(args: &[&'a [u8]]) -> Result<(History, bool, Option<&'a [u8]>), DlockError> {
    let (history, rest) = match args {
        [granted_kw, granted, renewals_kw, renewals, rest @ ..]
            if granted_kw.eq_ignore_ascii_case(b"GRANTED")
                && renewals_kw.eq_ignore_ascii_case(b"RENEWALS") =>
        {
            let granted =
                replica::unsigned(granted).ok_or(DlockError::BadReplicatedLease("granted"))?;
            let renewals = replica::unsigned(renewals)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or(DlockError::BadReplicatedLease("renewals"))?;
            (Some((granted, renewals)), rest)
        }
        rest => (None, rest),
    };
    let (shared, rest) = match rest {
        [kw, rest @ ..] if kw.eq_ignore_ascii_case(b"SHARED") => (true, rest),
        rest => (false, rest),
    };
    match rest {
        [] => Ok((history, shared, None)),
        [kw, meta] if kw.eq_ignore_ascii_case(b"META") => {
            let meta = parse_meta(meta).map_err(|_| DlockError::BadReplicatedLease("meta"))?;
            Ok((history, shared, Some(meta)))
        }
        _ => Err(DlockError::WrongArity(META.name)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_name_effects_travel_as_is_the_registered_name() {
        assert_eq!(crate::apply::SETLEASE.to_str(), Ok(super::META.name));
    }
}
