//! One file per command: parse → decide in the core → apply → reply. Shared plumbing lives here.

pub mod acquire;
pub mod acquireall;
pub mod endlease;
pub mod fencecheck;
pub mod fenced;
pub mod info;
pub mod list;
pub mod release;
pub mod releaseall;
pub mod renew;
pub mod renewall;
pub mod revoke;
pub mod setfence;
pub mod setlease;
pub mod top;

use std::os::raw::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

use redis_module::key::{RedisKey, RedisKeyWritable};
use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, raw};

use crate::apply::{self, Site};
use crate::core::{DlockError, Lock, Now, Step};
use crate::datatype::LOCK_TYPE;
use crate::metrics;

/// What Redis is told about a command: registration flags, arity, key spec, docs.
pub struct CommandMeta {
    /// Command name as clients type it.
    pub name: &'static str,
    /// Registration flags (`write`, `readonly`, `deny-oom`, `fast`).
    pub flags: &'static str,
    /// Redis arity: positive is exact, negative is a minimum; the command name counts.
    pub arity: i32,
    /// Key spec flags for the one key at position 1 (`REDISMODULE_CMD_KEY_*`); 0: no key.
    pub key_flags: u32,
    /// Where the keys are, beside `key_flags`.
    pub keys: Keys,
    /// One line for `COMMAND DOCS`.
    pub summary: &'static str,
    /// Time complexity for `COMMAND DOCS`.
    pub complexity: &'static str,
    /// Arguments after the command name, for `COMMAND DOCS`.
    pub args: &'static [ArgMeta],
    /// ACL categories, on servers that let modules declare them (Redis 7.2+, Valkey).
    pub acl_categories: &'static str,
    /// The module version that added the command.
    pub since: &'static str,
}

/// Where a command's keys are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// The one key at position 1 (or none, when `key_flags` is 0).
    One,
    /// The key at position 1, and more keys found by the command itself (`getkeys-api`):
    /// declared to the server as an incomplete key spec with variable flags, so it asks the
    /// command (`DLOCK.FENCED`).
    FoundByCommand,
    /// `numkeys` at position 1, then that many keys (`DLOCK.ACQUIREALL` and the set commands).
    Counted,
}

/// One argument as `COMMAND DOCS` describes it.
pub struct ArgMeta {
    /// Its name in the syntax line.
    pub name: &'static str,
    /// What kind of value it takes.
    pub kind: ArgKind,
    /// The keyword that introduces it (`WAIT`), if any.
    pub token: Option<&'static str>,
    /// Whether it may be left out.
    pub optional: bool,
    /// Whether it may repeat.
    pub multiple: bool,
    /// The module version that added it, when later than its command.
    pub since: Option<&'static str>,
}

/// The module version that added every command.
pub const V1: &str = "0.1.0";

/// The module version that added the options of version 2 (`SHARED`, `LIMIT`, `QUEUE`, `CLAIM`,
/// `META`, `FENCE`).
pub const V2: &str = "0.2.0";

/// The module version that added `DLOCK.REVOKE` (the version in development).
pub const V3: &str = "0.3.0";

/// The value kinds our commands take.
#[derive(Clone, Copy)]
pub enum ArgKind {
    /// The resource key.
    Key,
    /// A binary-safe string.
    String,
    /// An integer.
    Integer,
    /// A keyword alone, with no value (`pure-token`).
    Flag,
    /// Arguments that come together, in order (`SHARED [LIMIT n]`).
    Block(&'static [ArgMeta]),
    /// Exactly one of these (`WAIT timeout-ms | QUEUE ticket-ms`).
    OneOf(&'static [ArgMeta]),
}

impl ArgMeta {
    /// A required argument.
    pub const fn required(name: &'static str, kind: ArgKind) -> Self {
        Self { name, kind, token: None, optional: false, multiple: false, since: None }
    }

    /// An optional keyword on its own (`SHARED`).
    pub const fn flag(name: &'static str, token: &'static str) -> Self {
        Self {
            name,
            kind: ArgKind::Flag,
            token: Some(token),
            optional: true,
            multiple: false,
            since: None,
        }
    }

    /// An optional argument introduced by a keyword (`FENCE fence`).
    pub const fn option(name: &'static str, kind: ArgKind, token: &'static str) -> Self {
        Self { name, kind, token: Some(token), optional: true, multiple: false, since: None }
    }

    /// An optional group: one of `choices` (`[WAIT timeout-ms | QUEUE ticket-ms]`).
    pub const fn one_of(name: &'static str, choices: &'static [ArgMeta]) -> Self {
        Self {
            name,
            kind: ArgKind::OneOf(choices),
            token: None,
            optional: true,
            multiple: false,
            since: None,
        }
    }

    /// The same argument, repeated one or more times (`resource [resource …]`).
    pub const fn multiple(mut self) -> Self {
        self.multiple = true;
        self
    }

    /// The same argument, as added by module version `version`.
    pub const fn since(mut self, version: &'static str) -> Self {
        self.since = Some(version);
        self
    }

    /// The same argument, required within its group (a choice of a one-of).
    pub const fn required_here(mut self) -> Self {
        self.optional = false;
        self
    }
}

/// Every command the module registers, for key specs and docs.
pub const ALL: [&CommandMeta; 15] = [
    &acquire::META,
    &renew::META,
    &release::META,
    &acquireall::META,
    &renewall::META,
    &releaseall::META,
    &revoke::META,
    &fencecheck::META,
    &info::META,
    &list::META,
    &top::META,
    &fenced::META,
    &setlease::META,
    &endlease::META,
    &setfence::META,
];

impl From<DlockError> for RedisError {
    fn from(error: DlockError) -> Self {
        RedisError::String(error.to_string())
    }
}

/// Runs a command body, turning a panic (a bug) into an error reply instead of a crashed server.
pub fn guarded(
    ctx: &Context,
    args: Vec<RedisString>,
    body: fn(&Context, &[RedisString]) -> RedisResult,
) -> RedisResult {
    guarded_slice(ctx, &args, body)
}

/// [`guarded`] for arguments held elsewhere (`entry.rs`).
pub fn guarded_slice(
    ctx: &Context,
    args: &[RedisString],
    body: fn(&Context, &[RedisString]) -> RedisResult,
) -> RedisResult {
    catch_unwind(AssertUnwindSafe(|| body(ctx, args)))
        .unwrap_or_else(|_| Err(RedisError::Str("ERR internal error in dlock; please report it")))
}

/// Splits `[command, resource, rest…]`, or fails with the command's arity error.
pub fn split_args<'a>(
    args: &'a [RedisString],
    command: &'static str,
) -> Result<(&'a RedisString, Rest<'a>), DlockError> {
    match args {
        [_, resource, rest @ ..] => {
            Ok((resource, rest.iter().map(RedisString::as_slice).collect()))
        }
        _ => Err(DlockError::WrongArity(command)),
    }
}

/// The arguments after a command's resource, in place for as many as a command usually has (no
/// allocation on the hot path).
pub type Rest<'a> = smallvec::SmallVec<[&'a [u8]; 8]>;

/// A set command's resources, and the arguments after them.
pub type Members<'a> = (&'a [RedisString], Vec<&'a [u8]>);

/// Splits `[command, numkeys, resource…, rest…]` of a set command: the resources (each named
/// once), and the arguments after them.
fn split_members<'a>(
    args: &'a [RedisString],
    command: &'static str,
) -> Result<Members<'a>, DlockError> {
    let [_, numkeys, after @ ..] = args else {
        return Err(DlockError::WrongArity(command));
    };
    let count = crate::core::args::numkeys(numkeys.as_slice(), after.len())?;
    let (resources, rest) = after.split_at(count);
    let mut seen = std::collections::BTreeSet::new();
    for resource in resources {
        if !seen.insert(resource.as_slice()) {
            return Err(DlockError::RepeatedResource(crate::core::args::printable(
                resource.as_slice(),
            )));
        }
    }
    Ok((resources, rest.iter().map(RedisString::as_slice).collect()))
}

/// Whether the server asks this call for its keys (`getkeys-api`) instead of running it.
pub fn keys_position_request(ctx: &Context) -> bool {
    // SAFETY: ctx is the live context of this call.
    unsafe { raw::RedisModule_IsKeysPositionRequest.is_some_and(|f| f(ctx.ctx) != 0) }
}

/// Answers a key position request: the argument at `pos` is a key, used as `flags` say.
pub fn declare_key(ctx: &Context, pos: usize, flags: u32) {
    // SAFETY: ctx is a key position request; pos is an index into this call's argv.
    unsafe {
        if let Some(key_at) = raw::RedisModule_KeyAtPosWithFlags {
            key_at(ctx.ctx, pos as c_int, flags as c_int);
        } else if let Some(key_at) = raw::RedisModule_KeyAtPos {
            key_at(ctx.ctx, pos as c_int);
        }
    }
}

/// Answers a key position request of a set command: its `numkeys` resources (none when
/// `numkeys` is invalid: the call then fails on its own). Redis 7.0 routes a module command
/// in Cluster (`MOVED`, `ASK`, `TRYAGAIN`, `CROSSSLOT`) by these, not by its key spec.
fn declare_members(ctx: &Context, args: &[RedisString], flags: u32) {
    let [_, numkeys, after @ ..] = args else {
        return;
    };
    if let Ok(count) = crate::core::args::numkeys(numkeys.as_slice(), after.len()) {
        for pos in 2..2 + count {
            declare_key(ctx, pos, flags);
        }
    }
}

/// The start of every set command: a key position request is answered (`None`); otherwise the
/// call's resources and the arguments after them, on a primary.
pub fn set_call<'a>(
    ctx: &Context,
    args: &'a [RedisString],
    meta: &CommandMeta,
) -> Result<Option<Members<'a>>, DlockError> {
    if keys_position_request(ctx) {
        declare_members(ctx, args, meta.key_flags);
        return Ok(None);
    }
    let split = split_members(args, meta.name)?;
    primary_only(ctx)?;
    Ok(Some(split))
}

/// Decides `op` on the lock of `resource` (an empty lock when it has no key, stored only if
/// the decision leaves something in it) and applies the changes: the path every command that
/// may create a lock takes, once per resource. `token` is the request's token as the client
/// sent it, when it has one string for it (`apply::Site`).
pub fn on_lock<T>(
    ctx: &Context,
    resource: &RedisString,
    token: Option<&RedisString>,
    now: Now,
    op: impl FnOnce(&mut Step<'_, apply::Server>, &mut Lock) -> T,
) -> Result<T, RedisError> {
    let key = ctx.open_key_writable(resource);
    let mut fresh = None;
    let lock = match lock_at(&key)? {
        Some(lock) => lock,
        None => fresh.insert(Lock::default()),
    };
    let (outcome, changes) = apply::decide(now, |step| op(step, lock));
    let stored = match fresh.take() {
        Some(lock) if !lock.is_vacant(now) => {
            key.set_value(&LOCK_TYPE, lock)?;
            metrics::lock_key_created();
            true
        }
        Some(_) => false,
        None => true,
    };
    let site = Site::new(&key, resource, token);
    match lock_at(&key)? {
        Some(lock) => apply::apply(ctx, &site, lock, stored, changes, now),
        None => apply::apply(ctx, &site, &Lock::default(), false, changes, now),
    }
    Ok(outcome)
}

/// The lock stored at an open key: `None` when the key is empty, `WRONGTYPE` for another type.
/// The borrow lives no longer than the open key.
pub fn lock_at(key: &RedisKeyWritable) -> Result<Option<&mut Lock>, DlockError> {
    key.get_value::<Lock>(&LOCK_TYPE).map_err(|_| DlockError::WrongType)
}

/// Read-only twin of [`lock_at`].
pub fn lock_in(key: &RedisKey) -> Result<Option<&Lock>, DlockError> {
    key.get_value::<Lock>(&LOCK_TYPE).map_err(|_| DlockError::WrongType)
}

/// Lease decisions belong to the primary: a writable replica must not grant, renew or release
/// on its own (its primary would never hear of it).
pub fn primary_only(ctx: &Context) -> Result<(), DlockError> {
    primary_in(crate::call::context_flags(ctx))
}

/// [`primary_only`] with the context's flags already read.
pub fn primary_in(flags: ContextFlags) -> Result<(), DlockError> {
    if flags.contains(ContextFlags::SLAVE) && !flags.contains(ContextFlags::REPLICATED) {
        Err(DlockError::NotPrimary)
    } else {
        Ok(())
    }
}

/// Internal effect commands are accepted only from the primary's stream or the AOF.
pub fn internal_only(ctx: &Context, name: &'static str) -> Result<(), DlockError> {
    if ctx.get_flags().intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        Ok(())
    } else {
        Err(DlockError::InternalCommand(name))
    }
}

/// Replies with field/value pairs: a map under RESP3, a flat array under RESP2.
pub fn reply_fields(ctx: &Context, fields: &[(&str, FieldValue)]) -> RedisResult {
    write_fields(ctx, fields);
    Ok(redis_module::RedisValue::NoReply)
}

/// Writes field/value pairs into the reply being built (an element of an array, or the reply).
pub fn write_fields(ctx: &Context, fields: &[(&str, FieldValue)]) {
    raw::reply_with_map(ctx.ctx, fields.len() as std::os::raw::c_long);
    for (name, value) in fields {
        ctx.reply(Ok(redis_module::RedisValue::StringBuffer(name.as_bytes().to_vec())));
        ctx.reply(Ok(match value {
            FieldValue::Bytes(bytes) => redis_module::RedisValue::StringBuffer(bytes.to_vec()),
            FieldValue::Integer(n) => redis_module::RedisValue::Integer(*n),
            FieldValue::Null => redis_module::RedisValue::Null,
            FieldValue::List(items) => redis_module::RedisValue::Array(
                items
                    .iter()
                    .map(|item| redis_module::RedisValue::StringBuffer(item.to_vec()))
                    .collect(),
            ),
            FieldValue::Value(value) => value.clone(),
        }));
    }
}

/// A value in a field/value reply.
pub enum FieldValue<'a> {
    /// A bulk string.
    Bytes(&'a [u8]),
    /// An integer.
    Integer(i64),
    /// Nil (RESP2) or null (RESP3).
    Null,
    /// An array of bulk strings.
    List(&'a [&'a [u8]]),
    /// Any reply (nested arrays).
    Value(redis_module::RedisValue),
}
