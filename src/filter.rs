//! A command as a command filter sees it: its argument count and its arguments as bytes, read
//! without allocating (a filter runs before every command the server executes).

use redis_module::raw;

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
        if pos >= self.len() {
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
