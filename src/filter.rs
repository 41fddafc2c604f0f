//! The module's command filter, and a command as it sees it: its argument count and its
//! arguments as bytes, read without allocating (a filter runs before every command the server
//! executes, so it looks at the name's length first).
//!
//! It watches for what the module API has no event for: `CONFIG RESETSTAT` (the counters go back
//! to 0) and the subscribing commands (`SUBSCRIBE`, `SSUBSCRIBE`, `PSUBSCRIBE`: their channels
//! may be heard from now on, `core/listeners.rs`), seen before they run.

use redis_module::{Context, Status, raw};

use crate::core::listeners;
use crate::{metrics, notify};

/// Registers the filter (not for the module's own calls into the server).
pub fn register(ctx: &Context) -> Status {
    // SAFETY: ctx is the load context; the filter is a plain function.
    let filter = unsafe {
        raw::RedisModule_RegisterCommandFilter.map(|register| {
            register(ctx.ctx, Some(on_command), raw::REDISMODULE_CMDFILTER_NOSELF as i32)
        })
    };
    if filter.is_some_and(|f| !f.is_null()) { Status::Ok } else { Status::Err }
}

/// # Safety
/// Called by Redis for every command, with a filter context valid for this call.
unsafe extern "C" fn on_command(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // SAFETY: fctx is this call's filter context, and `command` lives only in this call.
    let command = unsafe { Filtered::new(fctx) };
    let name = command.arg(0);
    // Every command of the server comes here: most are turned away by the length of their name
    // (`config` 6, `subscribe` 9, `ssubscribe` and `psubscribe` 10).
    if !matches!(name.len(), 6 | 9 | 10) {
        return;
    }
    if let Some(what) = listeners::subscribing(name) {
        let names: Vec<&[u8]> = (1..command.len()).map(|pos| command.arg(pos)).collect();
        notify::subscribing(what, &names);
    } else if command.len() == 2
        && name.eq_ignore_ascii_case(b"config")
        && command.arg(1).eq_ignore_ascii_case(b"resetstat")
    {
        metrics::reset();
    }
}

/// A command seen by a filter callback.
pub struct Filtered {
    fctx: *mut raw::RedisModuleCommandFilterCtx,
}

impl Filtered {
    /// # Safety
    /// `fctx` is the filter context Redis passed to the running filter callback; the value must
    /// not outlive that call.
    pub unsafe fn new(fctx: *mut raw::RedisModuleCommandFilterCtx) -> Self {
        Self { fctx }
    }

    /// How many arguments the command has, its name included.
    pub fn len(&self) -> usize {
        // SAFETY: fctx is valid for the filter call (`new`'s contract).
        let count = unsafe { raw::RedisModule_CommandFilterArgsCount.map_or(0, |f| f(self.fctx)) };
        usize::try_from(count).unwrap_or(0)
    }

    /// Whether the command has no arguments at all (never, for a command Redis runs).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Argument `pos` (0: the command's name) as bytes; empty past the end.
    pub fn arg(&self, pos: usize) -> &[u8] {
        // Every command has its name: only a later argument needs the count.
        if pos > 0 && pos >= self.len() {
            return &[];
        }
        let Ok(pos) = i32::try_from(pos) else { return &[] };
        // SAFETY: fctx is valid for the filter call, pos is in range, and the argument string
        // lives until the command runs, past this call.
        unsafe {
            let Some(arg) = raw::RedisModule_CommandFilterArgGet else { return &[] };
            let string = arg(self.fctx, pos);
            let mut len = 0;
            let ptr =
                raw::RedisModule_StringPtrLen.map_or(std::ptr::null(), |f| f(string, &mut len));
            if ptr.is_null() { &[] } else { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
        }
    }
}
