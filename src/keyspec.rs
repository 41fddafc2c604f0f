//! Command metadata through `RedisModule_SetCommandInfo`: key specs (ACL key patterns, Cluster
//! routing, `COMMAND GETKEYS`), arity and `COMMAND DOCS` text. Works on Redis 7.0 and later.

use std::ffi::CString;
use std::mem::{size_of, zeroed};
use std::os::raw::c_char;

use redis_module::{Context, Status, raw};

use crate::commands::{ALL, ArgKind, ArgMeta, CommandMeta, Keys};

/// Declares every command's metadata; logs and fails the load if the server refuses one.
pub fn register_all(ctx: &Context) -> Status {
    for meta in ALL {
        if let Err(reason) = register(ctx, meta) {
            crate::notify::log(
                ctx,
                crate::notify::Level::Warning,
                &format!("dlock: cannot set command info of {}: {reason}", meta.name),
            );
            return Status::Err;
        }
    }
    Status::Ok
}

/// Leaks a C string: command info is set once at load and lives as long as the server.
fn leaked(text: &str) -> Result<*const c_char, &'static str> {
    CString::new(text).map(|s| s.into_raw().cast_const()).map_err(|_| "text contains NUL")
}

/// The zero-terminated argument array `COMMAND DOCS` shows, leaked like the rest.
fn command_args(args: &[ArgMeta]) -> Result<*mut raw::RedisModuleCommandArg, &'static str> {
    let mut described = Vec::with_capacity(args.len() + 1);
    for arg in args {
        // SAFETY: all-zero is the "unset" value of every field of this C struct.
        let mut c_arg: raw::RedisModuleCommandArg = unsafe { zeroed() };
        c_arg.name = leaked(arg.name)?;
        c_arg.type_ = match arg.kind {
            ArgKind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
            ArgKind::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
            ArgKind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
            ArgKind::Flag => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
            ArgKind::Block(_) => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            ArgKind::OneOf(_) => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
        };
        if let ArgKind::Block(inner) | ArgKind::OneOf(inner) = arg.kind {
            c_arg.subargs = command_args(inner)?;
        }
        if let Some(since) = arg.since {
            c_arg.since = leaked(since)?;
        }
        c_arg.key_spec_index = if matches!(arg.kind, ArgKind::Key) { 0 } else { -1 };
        if let Some(token) = arg.token {
            c_arg.token = leaked(token)?;
        }
        let optional = if arg.optional { raw::REDISMODULE_CMD_ARG_OPTIONAL } else { 0 };
        let multiple = if arg.multiple { raw::REDISMODULE_CMD_ARG_MULTIPLE } else { 0 };
        c_arg.flags = (optional | multiple) as i32;
        described.push(c_arg);
    }
    // SAFETY: as above; a zeroed entry ends the array.
    described.push(unsafe { zeroed() });
    Ok(Box::leak(described.into_boxed_slice()).as_mut_ptr())
}

fn register(ctx: &Context, meta: &CommandMeta) -> Result<(), &'static str> {
    // SAFETY: reading the API function pointers Redis filled in at module load (static muts the
    // crate declares); nothing writes them after that.
    let (Some(get_command), Some(set_info)) =
        (unsafe { raw::RedisModule_GetCommand }, unsafe { raw::RedisModule_SetCommandInfo })
    else {
        // Servers before 7.0 have no key specs; the legacy first/last/step positions still apply.
        return Ok(());
    };
    let name = leaked(meta.name)?;
    // SAFETY: ctx is the load context; name is a valid C string.
    let command = unsafe { get_command(ctx.ctx, name) };
    if command.is_null() {
        return Err("command not registered");
    }
    let version = Box::leak(Box::new(raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    }));
    // SAFETY: all-zero is the documented "unset" value of every field of these C structs,
    // and a zeroed key spec terminates the key spec array.
    let key_specs: &mut [raw::RedisModuleCommandKeySpec; 3] =
        Box::leak(Box::new(unsafe { zeroed() }));
    if meta.keys == Keys::FoundByCommand {
        // Keys the server cannot find from the arguments alone: it asks the command instead
        // (ACL, Cluster routing, TRYAGAIN during a migration, CROSSSLOT, COMMAND GETKEYS).
        let more = &mut key_specs[1];
        // Servers require one access flag; the command reports each key's own.
        more.flags = u64::from(
            raw::REDISMODULE_CMD_KEY_RW
                | raw::REDISMODULE_CMD_KEY_INCOMPLETE
                | raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS,
        );
        more.begin_search_type =
            raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_UNKNOWN;
        more.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_UNKNOWN;
    }
    let spec = &mut key_specs[0];
    spec.flags = u64::from(meta.key_flags);
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs.index.pos = 1;
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    if meta.keys == Keys::Counted {
        // `numkeys` first, then that many keys.
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
        spec.fk.keynum.keynumidx = 0;
        spec.fk.keynum.firstkey = 1;
        spec.fk.keynum.keystep = 1;
    } else {
        spec.fk.range.lastkey = 0;
        spec.fk.range.keystep = 1;
        spec.fk.range.limit = 0;
    }
    // SAFETY: as above.
    let mut info: raw::RedisModuleCommandInfo = unsafe { zeroed() };
    info.version = version;
    info.summary = leaked(meta.summary)?;
    info.complexity = leaked(meta.complexity)?;
    info.since = leaked(meta.since)?;
    info.arity = meta.arity;
    if meta.key_flags != 0 {
        info.key_specs = key_specs.as_mut_ptr();
    }
    info.args = command_args(meta.args)?;
    // Servers that let modules declare ACL categories (Redis 7.2+, Valkey) get them; on 7.0 the
    // function does not exist and commands stay in no category.
    // SAFETY: command is live; the category string is NUL-terminated and leaked.
    unsafe {
        if let Some(set_categories) = raw::RedisModule_SetCommandACLCategories
            && set_categories(command, leaked(meta.acl_categories)?) != raw::REDISMODULE_OK as i32
        {
            return Err("the server refused the ACL categories");
        }
    }
    // SAFETY: command is a live command of this module; info and everything it points to
    // outlive the call (they are leaked).
    if unsafe { set_info(command, &info) } == raw::REDISMODULE_OK as i32 {
        Ok(())
    } else {
        Err("the server refused the command info")
    }
}
