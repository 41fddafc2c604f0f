//! `DLOCK.LIST cursor [MATCH pattern] [COUNT count] [HELD | WAITING]`: the locks of the current
//! database a cursor step at a time, as `SCAN` walks the keyspace (it is `SCAN … TYPE dlocklock`
//! underneath, so a call costs what a SCAN call costs, however many keys there are), each with
//! its holder and its line. Keys the caller may not read are left out.

use std::os::raw::c_int;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, FieldValue, Keys, V3, lock_in, write_fields};
use crate::clock;
use crate::core::args::{self, ListFilter};
use crate::core::{DlockError, Lock, Now};
use crate::datatype::LOCK_TYPE_NAME;

pub const META: CommandMeta = CommandMeta {
    name: "dlock.list",
    flags: "readonly",
    arity: -2,
    key_flags: 0,
    keys: Keys::One,
    summary: "Lists the database's locks a cursor step at a time, as SCAN walks keys: resource, mode, holders, owner, fence, remaining ttl, hold time, line",
    complexity: "O(1) for every call. O(N) for a complete iteration, including enough command calls for the cursor to return back to 0. N is the number of keys in the database",
    args: &[
        ArgMeta::required("cursor", ArgKind::Integer),
        ArgMeta::option("pattern", ArgKind::String, "MATCH"),
        ArgMeta::option("count", ArgKind::Integer, "COUNT"),
        ArgMeta::one_of(
            "filter",
            &[
                ArgMeta::flag("held", "HELD").required_here(),
                ArgMeta::flag("waiting", "WAITING").required_here(),
            ],
        ),
    ],
    acl_categories: "read slow",
    since: V3,
};

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let [_, cursor, rest @ ..] = args else {
        return Err(DlockError::WrongArity(META.name).into());
    };
    let rest: Vec<&[u8]> = rest.iter().map(RedisString::as_slice).collect();
    let request = args::list(&rest)?;
    let cursor = cursor.try_as_str().map_err(|_| RedisError::Str("ERR invalid cursor"))?;
    let count = request.count.to_string();
    let type_name = LOCK_TYPE_NAME;
    let mut scan: Vec<&[u8]> = vec![cursor.as_bytes(), b"COUNT", count.as_bytes()];
    if let Some(pattern) = request.pattern {
        scan.extend([&b"MATCH"[..], pattern]);
    }
    scan.extend([&b"TYPE"[..], type_name.as_bytes()]);
    let (next, keys) = match ctx.call("SCAN", scan.as_slice())? {
        RedisValue::Array(reply) => match <[RedisValue; 2]>::try_from(reply) {
            Ok([next, RedisValue::Array(keys)]) => (next, keys),
            _ => return Err(DlockError::InternalCommand("SCAN").into()),
        },
        _ => return Err(DlockError::InternalCommand("SCAN").into()),
    };
    let readable = Readable::of_caller(ctx);
    let now = clock::now();
    let mut shown: Vec<(RedisString, Summary)> = Vec::with_capacity(keys.len());
    for key in keys {
        let name = match key {
            RedisValue::StringBuffer(bytes) => RedisString::create_from_slice(ctx.ctx, &bytes),
            RedisValue::SimpleString(text) | RedisValue::BulkString(text) => {
                RedisString::create_from_slice(ctx.ctx, text.as_bytes())
            }
            RedisValue::BulkRedisString(name) => name,
            _ => continue,
        };
        if !readable.allows(&name) {
            continue;
        }
        let handle = ctx.open_key(&name);
        let Ok(Some(lock)) = lock_in(&handle) else { continue };
        let summary = Summary::of(lock, now);
        let wanted = match request.filter {
            ListFilter::All => summary.holders > 0 || summary.line > 0,
            ListFilter::Held => summary.holders > 0,
            ListFilter::Waiting => summary.line > 0,
        };
        if wanted {
            shown.push((name, summary));
        }
    }
    raw::reply_with_array(ctx.ctx, 2);
    ctx.reply(Ok(match next {
        RedisValue::SimpleString(text) | RedisValue::BulkString(text) => {
            RedisValue::StringBuffer(text.into_bytes())
        }
        other => other,
    }));
    raw::reply_with_array(ctx.ctx, shown.len() as std::os::raw::c_long);
    for (name, summary) in &shown {
        summary.write(ctx, name.as_slice());
    }
    Ok(RedisValue::NoReply)
}

/// One lock as the listing shows it: O(log S) for S shared leases.
#[derive(Default)]
pub(super) struct Summary {
    pub(super) mode: Option<&'static str>,
    pub(super) holders: usize,
    pub(super) owner: Option<Vec<u8>>,
    pub(super) meta: Option<Vec<u8>>,
    pub(super) fence: Option<u64>,
    pub(super) ttl_ms: u64,
    pub(super) held_ms: u64,
    pub(super) line: usize,
}

impl Summary {
    pub(super) fn of(lock: &Lock, now: Now) -> Self {
        let lease = lock.live_lease(now);
        let (mode, holders) =
            lock.live_mode(now).map_or((None, 0), |(mode, n)| (Some(mode.name()), n));
        Self {
            mode,
            holders,
            owner: lease.map(|lease| lease.token.to_vec()),
            meta: lease.and_then(|lease| lease.token.meta()).map(<[u8]>::to_vec),
            fence: lease.map(|lease| lease.fence),
            ttl_ms: lease.map_or(0, |lease| lease.remaining_ms(now)),
            held_ms: lease.map_or(0, |lease| lease.held_ms(now)),
            line: lock.waiters().len(),
        }
    }

    fn write(&self, ctx: &Context, resource: &[u8]) {
        let number = |value: u64| FieldValue::Integer(i64::try_from(value).unwrap_or(i64::MAX));
        write_fields(
            ctx,
            &[
                ("resource", FieldValue::Bytes(resource)),
                (
                    "mode",
                    self.mode.map_or(FieldValue::Null, |mode| FieldValue::Bytes(mode.as_bytes())),
                ),
                ("holders", number(self.holders as u64)),
                ("owner", self.owner.as_deref().map_or(FieldValue::Null, FieldValue::Bytes)),
                ("fence", self.fence.map_or(FieldValue::Null, number)),
                ("ttl-ms", number(self.ttl_ms)),
                ("held-ms", number(self.held_ms)),
                ("line", number(self.line as u64)),
            ],
        );
    }
}

/// Which keys the calling user may read (ACL key patterns): a listing shows no lock the caller
/// could not `DLOCK.INFO`.
pub(super) struct Readable {
    user: *mut raw::RedisModuleUser,
    /// No user to check against (a context without a client: nothing is shown then).
    nobody: bool,
}

impl Readable {
    pub(super) fn of_caller(ctx: &Context) -> Self {
        // SAFETY: ctx is live; the name is freed right away, the user in Drop.
        unsafe {
            let (Some(name_of), Some(user_of)) =
                (raw::RedisModule_GetCurrentUserName, raw::RedisModule_GetModuleUserFromUserName)
            else {
                return Self { user: std::ptr::null_mut(), nobody: true };
            };
            let name = name_of(ctx.ctx);
            if name.is_null() {
                return Self { user: std::ptr::null_mut(), nobody: true };
            }
            let user = user_of(name);
            if let Some(free) = raw::RedisModule_FreeString {
                free(std::ptr::null_mut(), name);
            }
            Self { user, nobody: user.is_null() }
        }
    }

    pub(super) fn allows(&self, key: &RedisString) -> bool {
        if self.nobody {
            return false;
        }
        // Read access: the one flag this check takes for reading (`RO` is refused as invalid).
        let flags = raw::REDISMODULE_CMD_KEY_ACCESS as c_int;
        // SAFETY: the user is live until Drop; the key string lives for this call.
        unsafe {
            raw::RedisModule_ACLCheckKeyPermissions.is_some_and(|check| {
                check(self.user, key.inner, flags) == raw::REDISMODULE_OK as c_int
            })
        }
    }
}

impl Drop for Readable {
    fn drop(&mut self) {
        // SAFETY: the user came from GetModuleUserFromUserName and is freed once.
        unsafe {
            if let (false, Some(free)) = (self.user.is_null(), raw::RedisModule_FreeModuleUser) {
                free(self.user);
            }
        }
    }
}
