//! `DLOCK.FENCED resource fence command [arg …]`: runs the inner command, as the calling user,
//! only if `fence` is the fence of the live lease on `resource`. The check and the write are one
//! atomic step in the server; a stale worker's write simply does not happen.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::{Context, ContextFlags, RedisResult, RedisString, RedisValue, raw};

use super::{ArgKind, ArgMeta, CommandMeta, lock_in, primary_only};
use crate::core::DlockError;
use crate::core::args::{parse_fence, printable};
use crate::core::fenced::{key_slot, refusal};
use crate::{clock, metrics};

pub const META: CommandMeta = CommandMeta {
    name: "dlock.fenced",
    flags: "write",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
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
};

/// `RM_Call` flags: `v` argv array, `!` replicate the inner command (and nothing else), `C` check
/// the caller's ACL, `E` errors as replies, `M` refuse deny-oom commands when out of memory,
/// `S` script mode (commands scripts may not run are refused, whatever they were renamed to, and
/// so are writes the server would refuse a script), `0` answer in the caller's protocol.
const CALL_FLAGS: &[u8] = b"v!CEMS0\0";

pub fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let [_, resource, fence, command, inner_args @ ..] = args else {
        return Err(DlockError::WrongArity(META.name).into());
    };
    let fence = parse_fence(fence.as_slice())?;
    primary_only(ctx)?;
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
    let mut argv: Vec<*mut raw::RedisModuleString> = inner.iter().map(|arg| arg.inner).collect();
    let mut count: c_int = 0;
    // SAFETY: argv holds live strings of this call; the returned positions are freed below.
    let keys: Vec<&RedisString> = unsafe {
        let Some(get_keys) = raw::RedisModule_GetCommandKeys else {
            return Err(refused("this server cannot tell which keys a command uses"));
        };
        let positions = get_keys(ctx.ctx, argv.as_mut_ptr(), argv.len() as c_int, &mut count);
        if positions.is_null() {
            // An unknown command or a wrong arity: running it gives the server's own error.
            let errno = std::io::Error::last_os_error().raw_os_error();
            return if matches!(errno, Some(ENOENT | EINVAL)) {
                Ok(())
            } else {
                Err(refused(KEYLESS))
            };
        }
        let keys = std::slice::from_raw_parts(positions, count.max(0) as usize)
            .iter()
            .filter_map(|&at| inner.get(usize::try_from(at).ok()?))
            .collect();
        if let Some(free) = raw::RedisModule_Free {
            free(positions.cast());
        }
        keys
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

/// Runs the inner command and passes its reply through unchanged.
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
            return Err(call_failure(command).into());
        }
        metrics::count(|stats| stats.fenced_writes_ok += 1);
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
