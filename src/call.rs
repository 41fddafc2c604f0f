//! The command running now through the entry points of `entry.rs` (ACQUIRE, RENEW, RELEASE):
//! the argument vector Redis holds for it, which a lease's effect may be propagated as
//! (`apply.rs`), and the context's flags, read once for it.

use std::cell::Cell;
use std::os::raw::c_int;

use redis_module::{Context, ContextFlags, raw};

/// An argument vector Redis passed to a command, and its length.
pub type Call = (*mut *mut raw::RedisModuleString, usize);

/// What runs now: the call's arguments (none in a timer's turn), the context's flags once read,
/// and whether anything runs at all. One thread-local: each access to one costs a lookup.
#[derive(Clone, Copy)]
struct Running {
    call: Call,
    flags: Option<c_int>,
    /// A command or a timer turn runs, so that the flags read once hold for all of it.
    running: bool,
}

/// What [`enter`] replaced, for [`leave`] to put back.
pub struct Outer(Running);

thread_local! {
    static NOW: Cell<Running> = const {
        Cell::new(Running { call: (std::ptr::null_mut(), 0), flags: None, running: false })
    };
}

/// A command with these arguments starts. A module calling this one from inside it nests: the
/// outer call's state comes back with [`leave`].
pub fn enter(argv: *mut *mut raw::RedisModuleString, argc: usize) -> Outer {
    let running = Running { call: (argv, argc), flags: None, running: true };
    Outer(NOW.with(|now| now.replace(running)))
}

/// A timer's turn starts: no client's arguments, and the context's flags read once for the
/// whole turn (a sweep of many keys asked for them once a key).
pub fn enter_turn() -> Outer {
    enter(std::ptr::null_mut(), 0)
}

/// The command [`enter`] announced returned.
pub fn leave(outer: Outer) {
    NOW.with(|now| now.set(outer.0));
}

/// The argument vector of the ACQUIRE, RENEW or RELEASE running now, if one is: the array
/// Redis holds for the client and passes on when the command is replicated verbatim.
pub fn current() -> Option<Call> {
    let call = NOW.with(Cell::get).call;
    (!call.0.is_null()).then_some(call)
}

/// The context's flags (`RedisModule_GetContextFlags`, which computes them all on each call),
/// read once per ACQUIRE, RENEW or RELEASE, and once per timer turn: they do not change while
/// one runs.
pub fn context_flags(ctx: &Context) -> ContextFlags {
    let bits = NOW.with(|now| {
        let running = now.get();
        match running.flags {
            Some(bits) => bits,
            None => {
                let bits = ctx.get_flags().bits();
                if running.running {
                    now.set(Running { flags: Some(bits), ..running });
                }
                bits
            }
        }
    });
    ContextFlags::from_bits_retain(bits)
}
