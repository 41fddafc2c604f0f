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
        ArgMeta { name: "arg", kind: ArgKind::String, token: None, optional: true, multiple: true },
    ],
    acl_categories: "write slow",
};

/// `RM_Call` flags: `v` argv array, `!` replicate the inner command (and nothing else), `C` check
/// the caller's ACL, `E` errors as replies, `M` refuse deny-oom commands when out of memory,
/// `0` answer in the caller's protocol.
const CALL_FLAGS: &[u8] = b"v!CEM0\0";

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
    if let Err(stale) = check_fence(ctx, resource, fence) {
        if matches!(stale, DlockError::Stale { .. }) {
            metrics::count(|stats| stats.fenced_writes_refused += 1);
        }
        return Err(stale.into());
    }
    if ctx.get_flags().contains(ContextFlags::CLUSTER) {
        check_slots(ctx, resource, &args[3..])?;
    }
    call(ctx, command, &args[3..])
}

/// The fence must be the live lease's: otherwise `STALE`, naming the current fence if any.
fn check_fence(ctx: &Context, resource: &RedisString, fence: u64) -> Result<(), DlockError> {
    let key = ctx.open_key(resource);
    let current = lock_in(&key)?.and_then(|lock| lock.live_lease(clock::now())).map(|l| l.fence);
    if current == Some(fence) {
        Ok(())
    } else {
        Err(DlockError::Stale { fence, resource: printable(resource.as_slice()), current })
    }
}

/// In Redis Cluster every key of the inner command must live in the resource's slot.
fn check_slots(
    ctx: &Context,
    resource: &RedisString,
    inner: &[RedisString],
) -> Result<(), DlockError> {
    let slot = key_slot(resource.as_slice());
    let mut argv: Vec<*mut raw::RedisModuleString> = inner.iter().map(|arg| arg.inner).collect();
    let mut count: c_int = 0;
    // SAFETY: argv holds live strings of this call; the returned positions are freed below.
    unsafe {
        // Without a way to find the inner keys, nothing can be checked: refuse rather than guess.
        let Some(get_keys) = raw::RedisModule_GetCommandKeys else {
            return Err(DlockError::CrossSlot {
                key: "?".into(),
                resource: printable(resource.as_slice()),
            });
        };
        let positions = get_keys(ctx.ctx, argv.as_mut_ptr(), argv.len() as c_int, &mut count);
        if positions.is_null() {
            return Ok(());
        }
        let found = std::slice::from_raw_parts(positions, count.max(0) as usize)
            .iter()
            .filter_map(|&at| inner.get(usize::try_from(at).ok()?))
            .find(|key| key_slot(key.as_slice()) != slot)
            .map(|key| printable(key.as_slice()));
        if let Some(free) = raw::RedisModule_Free {
            free(positions.cast());
        }
        match found {
            Some(key) => {
                Err(DlockError::CrossSlot { key, resource: printable(resource.as_slice()) })
            }
            None => Ok(()),
        }
    }
}

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
    // RM_Call reports why through errno (Linux values).
    const ENOENT: i32 = 2;
    const EACCES: i32 = 13;
    const EINVAL: i32 = 22;
    const ENOSPC: i32 = 28;
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
