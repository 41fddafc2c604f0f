//! The entry points of the commands every lease takes on its way (`DLOCK.ACQUIRE`, `RENEW`,
//! `RELEASE`), registered here rather than by the module declaration: its generic entry point
//! retains and frees a string per argument and collects them into a vector (a twentieth of an
//! uncontended ACQUIRE's instructions). Here the command reads the arguments Redis holds for the
//! call, unretained and unfreed, from an array on the stack; a command of more arguments than it
//! holds takes the generic way. Everything else (the panic guard, the reply) is as for every
//! other command.

use std::mem::ManuallyDrop;
use std::os::raw::c_int;

use redis_module::{Context, RedisResult, RedisString, Status, raw};

use crate::call;
use crate::commands::{CommandMeta, acquire, guarded, guarded_slice, release, renew};

/// Most arguments read without retaining them (ACQUIRE with every option has 13).
const ON_STACK: usize = 16;

type Body = fn(&Context, &[RedisString]) -> RedisResult;

/// Registers the three commands (key positions 1, 1, 1, as the others).
pub fn register(ctx: &Context) -> Status {
    type Entry =
        extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;
    let commands: [(&CommandMeta, Entry); 3] = [
        (&acquire::META, acquire_entry),
        (&renew::META, renew_entry),
        (&release::META, release_entry),
    ];
    for (meta, entry) in commands {
        let (Ok(name), Ok(flags)) =
            (std::ffi::CString::new(meta.name), std::ffi::CString::new(meta.flags))
        else {
            return Status::Err;
        };
        // SAFETY: ctx is the load context; the name and flags are NUL-terminated and copied by
        // Redis; the entry point is a plain function.
        let created = unsafe {
            raw::RedisModule_CreateCommand
                .map(|create| create(ctx.ctx, name.as_ptr(), Some(entry), flags.as_ptr(), 1, 1, 1))
        };
        if created != Some(raw::Status::Ok as c_int) {
            return Status::Err;
        }
    }
    Status::Ok
}

/// An entry point that runs `body` (Redis calls it with the context and the arguments).
macro_rules! entry_point {
    ($name:ident, $body:path) => {
        extern "C" fn $name(
            ctx: *mut raw::RedisModuleCtx,
            argv: *mut *mut raw::RedisModuleString,
            argc: c_int,
        ) -> c_int {
            entry(ctx, argv, argc, $body)
        }
    };
}

entry_point!(acquire_entry, acquire::run);
entry_point!(renew_entry, renew::run);
entry_point!(release_entry, release::run);

/// Runs `body` with the call's arguments and replies with what it returns.
fn entry(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    body: Body,
) -> c_int {
    let context = Context::new(ctx);
    let count = usize::try_from(argc).unwrap_or(0);
    let outer = call::enter(argv, count);
    let reply = if argv.is_null() || count > ON_STACK {
        guarded(&context, redis_module::decode_args(ctx, argv, argc), body)
    } else {
        // SAFETY: Redis passes `argc` valid strings at `argv`, which it holds until the command
        // returns; they are read only during this call.
        let given = unsafe { std::slice::from_raw_parts(argv, count) };
        // Not retained, so never dropped (a drop would free them): they stay Redis's alone.
        let args = ManuallyDrop::new(std::array::from_fn::<_, ON_STACK, _>(|at| {
            let arg = given.get(at).copied().unwrap_or(std::ptr::null_mut());
            RedisString::from_redis_module_string(ctx, arg)
        }));
        guarded_slice(&context, args.get(..count).unwrap_or_default(), body)
    };
    call::leave(outer);
    context.reply(reply) as c_int
}
