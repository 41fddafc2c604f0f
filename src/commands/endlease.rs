//! `DLOCK.ENDLEASE resource token fence`: the end of one shared lease (released, expired, taken
//! back) while others live on, applied by replicas and AOF loading. The key goes when no lease is
//! left. Clients cannot send it: it would end leases without their owners.

use redis_module::{Context, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, Keys, internal_only, lock_at, split_args};
use crate::apply::{self, Site};
use crate::clock;
use crate::core::DlockError;
use crate::core::args::{parse_fence, parse_token};
use crate::core::replica;

pub const META: CommandMeta = CommandMeta {
    name: "dlock.endlease",
    flags: "write",
    arity: 4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    keys: Keys::One,
    summary: "Internal: ends one shared lease as the primary decided (replication stream and AOF only)",
    complexity: "O(log S) where S is the number of shared leases on the resource",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("token", ArgKind::String),
        ArgMeta::required("fence", ArgKind::Integer),
    ],
    acl_categories: "write dangerous",
    since: super::V1,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    internal_only(ctx, "DLOCK.ENDLEASE")?;
    let (resource, rest) = split_args(args, META.name)?;
    let [token, fence] = rest.as_slice() else {
        return Err(DlockError::WrongArity(META.name).into());
    };
    let token = parse_token(token).map_err(|_| DlockError::BadReplicatedLease("token length"))?;
    let fence = parse_fence(fence).map_err(|_| DlockError::BadReplicatedLease("fence"))?;
    let key = ctx.open_key_writable(resource);
    match lock_at(&key)? {
        Some(lock) => {
            replica::end_lease(lock, token, fence);
            apply::apply_replicated(ctx, &Site::new(&key, resource, None), lock, clock::now());
        }
        // The arguments are absolute, so passing the command on unchanged is deterministic.
        None => ctx.replicate_verbatim(),
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_name_the_end_travels_as_is_the_registered_name() {
        assert_eq!(crate::apply::ENDLEASE, super::META.name);
    }
}
