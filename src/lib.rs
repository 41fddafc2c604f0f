//! dlock: a Redis module that makes the server a lease-lock service with fencing tokens.
//!
//! This file holds the module declaration only; see `core` for the lease logic, `commands` for
//! one file per command, `datatype` for the value's callbacks, `expiry` for the deadline index and
//! `timer` for the one module timer that acts on it (docs/architecture.md has the map).

// A panic inside a command or callback would take the whole server down.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
// Every unsafe block says why it is sound (`// SAFETY:`).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod apply;
pub mod call;
pub mod clock;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod core;
pub mod datatype;
pub mod entry;
pub mod events;
pub mod expiry;
pub mod filter;
pub mod keyspec;
pub mod metrics;
pub mod notify;
pub mod report;
pub mod state;
pub mod timer;
pub mod waiters;

use redis_module::{Context, RedisString, Status, configuration::ConfigurationFlags, redis_module};

use crate::commands::{
    acquireall, endlease, fencecheck, fenced, guarded, info, list, releaseall, renewall, revoke,
    setfence, setlease, top,
};
use crate::core::args::DEFAULT_MAX_TTL_MS;
use crate::datatype::LOCK_TYPE;

// Unit tests and fuzzers run without Redis, so they cannot use Redis's allocator.
#[cfg(any(test, feature = "no-redis-alloc"))]
use std::alloc::System as Allocator;

#[cfg(not(any(test, feature = "no-redis-alloc")))]
use redis_module::alloc::RedisAlloc as Allocator;

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    if let Err(reason) = config::apply_load_arguments(ctx, args) {
        ctx.log_warning(&format!("not loaded: {reason}"));
        return Status::Err;
    }
    // Corrupt or truncated RDB/RESTORE payloads become load errors instead of a server panic.
    // Valkey 9: its atomic slot migration (`CLUSTER MIGRATESLOTS`) may move lock keys (the option
    // bit is Valkey's; Redis 7 leaves it unused).
    const HANDLE_ATOMIC_SLOT_MIGRATION: i32 = 1 << 5;
    // SAFETY: ctx is the load context; SetModuleOptions only records the bits.
    unsafe {
        if let Some(set) = redis_module::raw::RedisModule_SetModuleOptions {
            set(
                ctx.ctx,
                redis_module::ModuleOptions::HANDLE_IO_ERRORS.bits() | HANDLE_ATOMIC_SLOT_MIGRATION,
            );
        }
    }
    let now = clock::now();
    config::hold_new_grants(now.mono);
    config::lead_fences(now.wall);
    notify::refresh_log_level(ctx);
    // DLOCK.ACQUIRE, RENEW and RELEASE have entry points of their own (`entry.rs`).
    if entry::register(ctx) == Status::Err
        || report::register(ctx) == Status::Err
        || events::subscribe(ctx) == Status::Err
        || timer::subscribe_keyspace(ctx) == Status::Err
        || cluster::register(ctx) == Status::Err
    {
        return Status::Err;
    }
    keyspec::register_all(ctx)
}

/// The module's version as `MODULE LIST` shows it (`ver`): major × 10000 + minor × 100 + patch,
/// from the crate's version (`Cargo.toml`, the one place it is written; `INFO dlock` prints it
/// as text in `dlock_version`).
const MODULE_VERSION: i32 = version_part(env!("CARGO_PKG_VERSION_MAJOR")) * 10_000
    + version_part(env!("CARGO_PKG_VERSION_MINOR")) * 100
    + version_part(env!("CARGO_PKG_VERSION_PATCH"));

/// A version part's decimal digits as a number (at compile time).
const fn version_part(digits: &str) -> i32 {
    let bytes = digits.as_bytes();
    let mut value = 0;
    let mut i = 0;
    while i < bytes.len() {
        value = value * 10 + (bytes[i] - b'0') as i32;
        i += 1;
    }
    value
}

redis_module! {
    name: "dlock",
    version: MODULE_VERSION,
    allocator: (Allocator, Allocator),
    data_types: [LOCK_TYPE],
    init: init,
    // DLOCK.ACQUIRE, DLOCK.RENEW and DLOCK.RELEASE are registered by `init` (`entry.rs`).
    commands: [
        [acquireall::META.name, |ctx, args| guarded(ctx, args, acquireall::run), acquireall::META.flags, 0, 0, 0, ""],
        [renewall::META.name, |ctx, args| guarded(ctx, args, renewall::run), renewall::META.flags, 0, 0, 0, ""],
        [releaseall::META.name, |ctx, args| guarded(ctx, args, releaseall::run), releaseall::META.flags, 0, 0, 0, ""],
        [revoke::META.name, |ctx, args| guarded(ctx, args, revoke::run), revoke::META.flags, 1, 1, 1, ""],
        [fencecheck::META.name, |ctx, args| guarded(ctx, args, fencecheck::run), fencecheck::META.flags, 1, 1, 1, ""],
        [info::META.name, |ctx, args| guarded(ctx, args, info::run), info::META.flags, 1, 1, 1, ""],
        [list::META.name, |ctx, args| guarded(ctx, args, list::run), list::META.flags, 0, 0, 0, ""],
        [top::META.name, |ctx, args| guarded(ctx, args, top::run), top::META.flags, 0, 0, 0, ""],
        [fenced::META.name, |ctx, args| guarded(ctx, args, fenced::run), fenced::META.flags, 1, 1, 1, ""],
        [setlease::META.name, |ctx, args| guarded(ctx, args, setlease::run), setlease::META.flags, 1, 1, 1, ""],
        [endlease::META.name, |ctx, args| guarded(ctx, args, endlease::run), endlease::META.flags, 1, 1, 1, ""],
        [setfence::META.name, |ctx, args| guarded(ctx, args, setfence::run), setfence::META.flags, 0, 0, 0, ""],
    ],
    configurations: [
        i64: [
            [config::MAX_TTL_MS_NAME, &config::MAX_TTL_MS, DEFAULT_MAX_TTL_MS as i64, 1, config::MAX_TTL_MS_LIMIT, ConfigurationFlags::DEFAULT, None],
            [config::RESTART_GRANT_DELAY_MS_NAME, &config::RESTART_GRANT_DELAY_MS, 0, 0, config::MAX_TTL_MS_LIMIT, ConfigurationFlags::DEFAULT, None],
            [config::MAX_HOLD_MS_NAME, &config::MAX_HOLD_MS, 0, 0, config::MAX_TTL_MS_LIMIT, ConfigurationFlags::DEFAULT, None],
            [config::FENCE_LEAD_MS_NAME, &config::FENCE_LEAD_MS, config::DEFAULT_FENCE_LEAD_MS, 0, config::FENCE_LEAD_MS_LIMIT, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [],
        enum: [],
        module_args_as_configuration: false,
    ]
}
