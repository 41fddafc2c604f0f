//! `DLOCK.FENCED resource fence command [arg …]`: runs the inner command, as the calling user,
//! only if `fence` is the fence of the live lease on `resource`. The check and the write are one
//! atomic step in the server; a stale worker's write simply does not happen.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::{Context, ContextFlags, RedisResult, RedisString, RedisValue, raw};

use super::{
    ArgKind, ArgMeta, CommandMeta, Keys, declare_key, keys_position_request, lock_in, primary_only,
};
use crate::core::DlockError;
use crate::core::args::{parse_fence, printable};
use crate::core::fenced::{key_slot, refusal};
use crate::{clock, metrics};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.fenced",
    flags: "write getkeys-api",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    keys: Keys::FoundByCommand,
    summary: "Runs a command only if a fence is the fence of the live lease on a resource",
    complexity: "O(1) plus the complexity of the fenced command",
    args: &[
        ArgMeta::required("resource", ArgKind::Key),
        ArgMeta::required("fence", ArgKind::Integer),
        ArgMeta::required("command", ArgKind::String),
        ArgMeta {
            name: "arg",
            kind: ArgKind::String,
            token: None,
            optional: true,
            multiple: true,
            since: None,
        },
    ],
    acl_categories: "write slow",
    since: super::V1,
};

/// `RM_Call` flags: `v` argv array, `!` replicate the inner command (and nothing else), `C` check
/// the caller's ACL, `E` errors as replies, `M` refuse deny-oom commands when out of memory,
/// `S` script mode (commands scripts may not run are refused, whatever they were renamed to, and
/// so are writes the server would refuse a script), `0` answer in the caller's protocol.
const CALL_FLAGS: &[u8] = b"v!CEMS0\0";

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    if keys_position_request(ctx) {
        declare_keys(ctx, args);
        return Ok(RedisValue::NoReply);
    }
    let [_, resource, fence, command, inner_args @ ..] = args else {
        return Err(DlockError::WrongArity(META.name).into());
    };
    let fence = parse_fence(fence.as_slice())?;
    primary_only(ctx)?;
    // A resource key of another type answers WRONGTYPE, as every dlock command on it does.
    lock_in(&ctx.open_key(resource))?;
    let inner: Vec<&[u8]> = inner_args.iter().map(RedisString::as_slice).collect();
    if let Some(reason) = refusal(command.as_slice(), &inner) {
        return Err(
            DlockError::FencedRefused { command: printable(command.as_slice()), reason }.into()
        );
    }
    check_keys(ctx, resource, &args[3..])?;
    if let Err(stale) = check_fence(ctx, resource, fence) {
        if matches!(stale, DlockError::Stale { .. }) {
            metrics::count(|stats| stats.fenced_writes_refused += 1);
        }
        return Err(stale.into());
    }
    call(ctx, command, &args[3..])
}

/// The fence must be a live lease's (the exclusive lease, or any shared one): otherwise `STALE`,
/// naming the current fence if any (the newest one, for shared leases).
fn check_fence(ctx: &Context, resource: &RedisString, fence: u64) -> Result<(), DlockError> {
    let key = ctx.open_key(resource);
    let now = clock::now();
    let Some(lock) = lock_in(&key)? else {
        return Err(DlockError::Stale {
            fence,
            resource: printable(resource.as_slice()),
            current: None,
        });
    };
    if lock.fence_check(fence, now) {
        return Ok(());
    }
    let current = lock.live_lease(now).map(|lease| lease.fence);
    Err(DlockError::Stale { fence, resource: printable(resource.as_slice()), current })
}

/// Tells the server every key the call touches: the resource (read) and the inner command's
/// keys with the inner command's own flags. Cluster then routes, redirects and answers
/// `TRYAGAIN` or `CROSSSLOT` as for a native multi-key command, so during a slot migration a
/// fenced write never follows the lock key to a node that lacks its data key (which created a
/// second copy of the data key there), and ACL key rules see every key.
fn declare_keys(ctx: &Context, args: &[RedisString]) {
    const RESOURCE: usize = 1;
    const INNER: usize = 3;
    let key_at = |pos: usize, flags: u32| declare_key(ctx, pos, flags);
    if args.len() <= RESOURCE {
        return;
    }
    key_at(RESOURCE, META.key_flags);
    if args.len() <= INNER {
        return;
    }
    if let Ok(keys) = inner_keys(ctx, &args[INNER..]) {
        for (at, flags) in keys {
            key_at(INNER + at, flags);
        }
    }
}

/// Why the server could not tell an inner command's keys.
enum NoKeys {
    /// An unknown command or a wrong arity: running it gives the server's own error.
    Invalid,
    /// The server cannot tell, or the command takes none.
    Keyless(&'static str),
}

/// The positions (in `inner`, the command name at 0) and flags (`REDISMODULE_CMD_KEY_*`) of the
/// inner command's keys, from its own key specs: a renamed command is judged like the original.
fn inner_keys(ctx: &Context, inner: &[RedisString]) -> Result<Vec<(usize, u32)>, NoKeys> {
    let mut argv: Vec<*mut raw::RedisModuleString> = inner.iter().map(|arg| arg.inner).collect();
    let mut count: c_int = 0;
    let mut flags: *mut c_int = std::ptr::null_mut();
    // SAFETY: argv holds live strings of this call; the returned arrays are freed below.
    unsafe {
        let positions = if let Some(get_keys) = raw::RedisModule_GetCommandKeysWithFlags {
            get_keys(ctx.ctx, argv.as_mut_ptr(), argv.len() as c_int, &mut count, &mut flags)
        } else if let Some(get_keys) = raw::RedisModule_GetCommandKeys {
            get_keys(ctx.ctx, argv.as_mut_ptr(), argv.len() as c_int, &mut count)
        } else {
            return Err(NoKeys::Keyless("this server cannot tell which keys a command uses"));
        };
        if positions.is_null() {
            let errno = std::io::Error::last_os_error().raw_os_error();
            return Err(if matches!(errno, Some(ENOENT | EINVAL)) {
                NoKeys::Invalid
            } else {
                NoKeys::Keyless(KEYLESS)
            });
        }
        let count = count.max(0) as usize;
        let positions_of = std::slice::from_raw_parts(positions, count);
        let flags_of = (!flags.is_null()).then(|| std::slice::from_raw_parts(flags, count));
        let keys = positions_of
            .iter()
            .enumerate()
            .filter_map(|(i, &at)| {
                let at = usize::try_from(at).ok().filter(|&at| at < inner.len())?;
                let declared = flags_of.map_or(INNER_KEY_FLAGS, |flags| flags[i] as u32);
                Some((at, declared))
            })
            .collect();
        if let Some(free) = raw::RedisModule_Free {
            free(positions.cast());
            if !flags.is_null() {
                free(flags.cast());
            }
        }
        Ok(keys)
    }
}

/// What an inner key is declared as when the server does not say (it may be written).
const INNER_KEY_FLAGS: u32 = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE;

/// The inner command must name a key, never the lock key itself, and in Redis Cluster every key
/// must live in the resource's slot. Keys are found from the command's own key specs, so a
/// renamed command is judged like the original: keyless server, admin and keyspace-wide commands
/// (`FLUSHALL`, `CONFIG`, `MODULE`, `DEBUG`, …) cannot run under a fence.
fn check_keys(
    ctx: &Context,
    resource: &RedisString,
    inner: &[RedisString],
) -> Result<(), DlockError> {
    let command = printable(inner[0].as_slice());
    let refused = |reason| DlockError::FencedRefused { command: command.clone(), reason };
    let keys: Vec<&RedisString> = match inner_keys(ctx, inner) {
        Ok(keys) => keys.into_iter().map(|(at, _)| &inner[at]).collect(),
        Err(NoKeys::Invalid) => return Ok(()),
        Err(NoKeys::Keyless(reason)) => return Err(refused(reason)),
    };
    if keys.is_empty() {
        return Err(refused(KEYLESS));
    }
    if keys.iter().any(|key| key.as_slice() == resource.as_slice()) {
        return Err(refused("the lock key itself cannot be used under its own fence"));
    }
    if ctx.get_flags().contains(ContextFlags::CLUSTER) {
        let slot = key_slot(resource.as_slice());
        if let Some(key) = keys.iter().find(|key| key_slot(key.as_slice()) != slot) {
            return Err(DlockError::CrossSlot {
                key: printable(key.as_slice()),
                resource: printable(resource.as_slice()),
            });
        }
    }
    Ok(())
}

const KEYLESS: &str =
    "commands that name no key (server, admin and keyspace-wide commands) cannot run under a fence";

// RM_GetCommandKeys and RM_Call report why through errno (Linux values).
const ENOENT: i32 = 2;
const EACCES: i32 = 13;
const EINVAL: i32 = 22;
const ENOSPC: i32 = 28;

/// Runs the inner command and passes its reply through unchanged; counts it in
/// `fenced_writes_ok`, or in `fenced_writes_failed` when it answered an error (or could not run).
fn call(ctx: &Context, command: &RedisString, inner: &[RedisString]) -> RedisResult {
    let Ok(name) = CString::new(command.as_slice()) else {
        return Err(unknown(command).into());
    };
    let mut argv: Vec<*mut raw::RedisModuleString> =
        inner[1..].iter().map(|arg| arg.inner).collect();
    // SAFETY: name and the flags are NUL-terminated; "v" takes the argv pointer and its length,
    // and every string in argv lives for this call. The reply is freed after being passed on.
    unsafe {
        let Some(call) = raw::RedisModule_Call else { return Err(unknown(command).into()) };
        let reply =
            call(ctx.ctx, name.as_ptr(), CALL_FLAGS.as_ptr().cast(), argv.as_mut_ptr(), argv.len());
        if reply.is_null() {
            metrics::count(|stats| stats.fenced_writes_failed += 1);
            return Err(call_failure(command).into());
        }
        let failed = raw::RedisModule_CallReplyType
            .is_some_and(|kind| kind(reply) == raw::REDISMODULE_REPLY_ERROR as c_int);
        metrics::count(|stats| {
            *(if failed {
                &mut stats.fenced_writes_failed
            } else {
                &mut stats.fenced_writes_ok
            }) += 1;
        });
        raw::RedisModule_ReplyWithCallReply.map(|f| f(ctx.ctx, reply));
        if let Some(free) = raw::RedisModule_FreeCallReply {
            free(reply);
        }
    }
    Ok(RedisValue::NoReply)
}

fn unknown(command: &RedisString) -> DlockError {
    DlockError::InnerCommand(format!("ERR unknown command '{}'", printable(command.as_slice())))
}

/// The error for an inner command the server refused to run (servers without `E`-flag replies).
fn call_failure(command: &RedisString) -> DlockError {
    let name = printable(command.as_slice());
    let message = match std::io::Error::last_os_error().raw_os_error() {
        Some(ENOENT) => format!("ERR unknown command '{name}'"),
        Some(EINVAL) => format!("ERR wrong number of arguments for '{name}' command"),
        Some(EACCES) => {
            format!("NOPERM this user has no permissions to run the '{name}' command or its keys")
        }
        Some(ENOSPC) => "OOM command not allowed when used memory > 'maxmemory'.".to_owned(),
        _ => format!("ERR DLOCK.FENCED could not run '{name}'"),
    };
    DlockError::InnerCommand(message)
}
