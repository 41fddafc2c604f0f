//! `INFO dlock` and `CONFIG RESETSTAT`: the server's view of the module's counters and gauges.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::{Context, Status, raw};

use crate::{metrics, state, waiters};

/// Registers the `INFO` callback and the module's command filter (`filter.rs`).
pub fn register(ctx: &Context) -> Status {
    // SAFETY: ctx is the load context; the callback is a plain function. Registering replaces
    // the generic handler the module declaration installs.
    let registered = unsafe {
        raw::RedisModule_RegisterInfoFunc.map(|register| register(ctx.ctx, Some(on_info)))
    };
    if registered != Some(raw::REDISMODULE_OK as i32) {
        return Status::Err;
    }
    crate::filter::register(ctx)
}

/// # Safety
/// Called by Redis with an INFO context valid for this call.
unsafe extern "C" fn on_info(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    // A crash report must not wait on a lock the crashing code may hold: each part is tried.
    let Some(waiting) = waiters::count_now() else { return };
    let Some(index_entries) = state::index_len_now() else { return };
    let Some(fields) = metrics::fields_now(waiting as u64, index_entries as u64) else { return };
    // SAFETY: ctx is the INFO context of this call; names are NUL-terminated ASCII.
    unsafe {
        let (Some(add_section), Some(add_field), Some(add_text)) = (
            raw::RedisModule_InfoAddSection,
            raw::RedisModule_InfoAddFieldULongLong,
            raw::RedisModule_InfoAddFieldCString,
        ) else {
            return;
        };
        if add_section(ctx, c"".as_ptr()) != raw::REDISMODULE_OK as i32 {
            return; // the caller asked for other sections
        }
        // The crate's version (Cargo.toml): what the clients print beside theirs.
        let version = concat!(env!("CARGO_PKG_VERSION"), "\0");
        add_text(
            ctx,
            c"version".as_ptr(),
            version.as_ptr().cast::<std::os::raw::c_char>().cast_mut(),
        );
        for (name, value) in fields {
            if let Ok(name) = CString::new(name) {
                add_field(ctx, name.as_ptr(), value);
            }
        }
    }
}
