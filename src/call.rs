//! The command running now through the entry points of `entry.rs` (ACQUIRE, RENEW, RELEASE):
//! the argument vector Redis holds for it, which a lease's effect may be propagated as
//! (`apply.rs`), and the context's flags, read once for it.

use std::cell::Cell;
use std::os::raw::c_int;

use redis_module::{Context, ContextFlags, raw};

/// An argument vector Redis passed to a command, and its length.
pub type Call = (*mut *mut raw::RedisModuleString, usize);

/// What [`enter`] replaced, for [`leave`] to put back.
pub struct Outer(Call, Option<c_int>);

thread_local! {
    static CALL: Cell<Call> = const { Cell::new((std::ptr::null_mut(), 0)) };
    /// The context's flags as bits, once read during the call.
    static FLAGS: Cell<Option<c_int>> = const { Cell::new(None) };
}

/// A command with these arguments starts. A module calling this one from inside it nests: the
/// outer call's state comes back with [`leave`].
pub fn enter(argv: *mut *mut raw::RedisModuleString, argc: usize) -> Outer {
    Outer(CALL.with(|call| call.replace((argv, argc))), FLAGS.with(|flags| flags.replace(None)))
}

/// The command [`enter`] announced returned.
pub fn leave(outer: Outer) {
    CALL.with(|call| call.set(outer.0));
    FLAGS.with(|flags| flags.set(outer.1));
}

/// The argument vector of the ACQUIRE, RENEW or RELEASE running now, if one is: the array
/// Redis holds for the client and passes on when the command is replicated verbatim.
pub fn current() -> Option<Call> {
    let call = CALL.with(Cell::get);
    (!call.0.is_null()).then_some(call)
}

/// The context's flags (`RedisModule_GetContextFlags`, which computes them all on each call),
/// read once per ACQUIRE, RENEW or RELEASE: they do not change while a command runs.
pub fn context_flags(ctx: &Context) -> ContextFlags {
    if current().is_none() {
        return ctx.get_flags();
    }
    let bits = FLAGS.with(|flags| {
        flags.get().unwrap_or_else(|| {
            let read = ctx.get_flags().bits();
            flags.set(Some(read));
            read
        })
    });
    ContextFlags::from_bits_retain(bits)
}
