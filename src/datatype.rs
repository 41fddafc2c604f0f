//! The `dlocklock` module data type: one value per lock key, and its callbacks.
//!
//! RDB layout, encoding version 2:
//! `flags: unsigned` (bit 0: a lease follows; other bits must be 0), then, when bit 0 is set,
//! `token: string buffer`, `fence: unsigned`, `deadline: unsigned` (absolute Unix µs),
//! `held: unsigned` (µs from the grant to the deadline), `renewals: unsigned`.
//! Version 1 (still loaded) ends after `deadline`.
//! Module aux data (before the keyspace): `last_fence: unsigned`.
//! The AOF form of a lock is `DLOCK.SETLEASE key token fence deadline-unix-us`.

use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::ptr;

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::clock;
use crate::core::error::MAX_FENCE;
use crate::core::{Lease, Lock};
use crate::{metrics, state};

/// RDB encoding version written by this build; loading refuses any other.
pub const ENCODING_VERSION: i32 = 2;
/// The first encoding, without hold history; still loaded.
const ENCODING_V1: i32 = 1;
const HAS_LEASE: u64 = 1;

/// The module type of every lock key (`TYPE key` answers `dlocklock`).
pub static LOCK_TYPE: RedisType = RedisType::new(
    "dlocklock",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    },
);

/// Reads one lock; `None` on a short read, an unknown flag or an invalid lease.
fn load_lock(rdb: *mut raw::RedisModuleIO, encver: c_int) -> Option<Lock> {
    let flags = raw::load_unsigned(rdb).ok()?;
    if flags & !HAS_LEASE != 0 {
        return None;
    }
    if flags & HAS_LEASE == 0 {
        return Some(Lock::default());
    }
    let token = raw::load_string_buffer(rdb).ok()?;
    let fence = raw::load_unsigned(rdb).ok()?;
    let deadline_wall = raw::load_unsigned(rdb).ok()?;
    let mut lease = Lease::restore(token.as_ref(), fence, deadline_wall, clock::now()).ok()?;
    if encver >= ENCODING_VERSION {
        let held = raw::load_unsigned(rdb).ok()?;
        lease.renewals = raw::load_unsigned(rdb).ok()?;
        lease.granted_mono = lease.deadline_mono.saturating_sub(held);
    }
    state::observe_fence(lease.fence);
    Some(Lock::with_lease(lease))
}

/// # Safety
/// Called by Redis with a valid IO handle; returns an owned `Lock` or null (load error).
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    if encver != ENCODING_VERSION && encver != ENCODING_V1 {
        return ptr::null_mut();
    }
    match load_lock(rdb, encver) {
        Some(lock) => {
            metrics::lock_key_created();
            Box::into_raw(Box::new(lock)).cast()
        }
        None => ptr::null_mut(),
    }
}

/// # Safety
/// `value` is a `Lock` this module allocated; `rdb` is a valid IO handle.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: Redis passes back the pointer rdb_load/set_value gave it.
    let lock = unsafe { &*value.cast::<Lock>() };
    match lock.lease() {
        Some(lease) => {
            raw::save_unsigned(rdb, HAS_LEASE);
            raw::save_slice(rdb, &lease.token);
            raw::save_unsigned(rdb, lease.fence);
            raw::save_unsigned(rdb, lease.deadline_wall);
            raw::save_unsigned(rdb, lease.deadline_mono.saturating_sub(lease.granted_mono));
            raw::save_unsigned(rdb, lease.renewals);
        }
        None => raw::save_unsigned(rdb, 0),
    }
}

/// # Safety
/// `aof` and `key` are valid for this call; `value` is a `Lock` of this module.
unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: as in rdb_save.
    let lock = unsafe { &*value.cast::<Lock>() };
    // A lock without a lease has nothing durable: waiters belong to connections.
    let Some(lease) = lock.lease() else { return };
    let (Ok(command), Ok(format)) = (CString::new("DLOCK.SETLEASE"), CString::new("sbll")) else {
        return;
    };
    // SAFETY: the format "sbll" matches the arguments: a RedisModuleString, a (pointer, length)
    // buffer, and two long longs. Fences and deadlines fit: fences are capped at i64::MAX and
    // deadlines are wall-clock microseconds.
    unsafe {
        if let Some(emit) = raw::RedisModule_EmitAOF {
            emit(
                aof,
                command.as_ptr(),
                format.as_ptr(),
                key,
                lease.token.as_ptr().cast::<c_char>(),
                lease.token.len(),
                lease.fence as c_longlong,
                lease.deadline_wall as c_longlong,
            );
        }
    }
}

/// # Safety
/// `value` is a `Lock` of this module.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: as in rdb_save.
    let lock = unsafe { &*value.cast::<Lock>() };
    std::mem::size_of::<Lock>() + lock.lease().map_or(0, |lease| lease.token.heap_bytes())
}

/// # Safety
/// `md` is a valid digest for this call; `value` is a `Lock` of this module.
unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: as in rdb_save.
    let lock = unsafe { &*value.cast::<Lock>() };
    let Some(lease) = lock.lease() else { return };
    // SAFETY: md is valid; the buffer pointer and length describe the token.
    unsafe {
        if let (Some(add_buffer), Some(add_integer), Some(end)) = (
            raw::RedisModule_DigestAddStringBuffer,
            raw::RedisModule_DigestAddLongLong,
            raw::RedisModule_DigestEndSequence,
        ) {
            add_buffer(md, lease.token.as_ptr().cast::<c_char>(), lease.token.len());
            add_integer(md, lease.fence as c_longlong);
            add_integer(md, lease.deadline_wall as c_longlong);
            end(md);
        }
    }
}

/// # Safety
/// `value` is a `Lock` this module allocated and Redis no longer uses.
unsafe extern "C" fn free(value: *mut c_void) {
    if !value.is_null() {
        // SAFETY: value came from Box::into_raw of a Lock.
        let lock = unsafe { Box::from_raw(value.cast::<Lock>()) };
        // The key is gone (DEL, FLUSHALL, overwrite, reload): its waiters wait for nothing now.
        for waiter in lock.waiters() {
            crate::waiters::answer(waiter.id, crate::waiters::Outcome::Nil, None);
        }
        drop(lock);
        metrics::lock_key_freed();
    }
}

/// # Safety
/// `value` is a `Lock` of this module; the copy is owned by Redis afterwards.
unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: as in rdb_save.
    let lock = unsafe { &*value.cast::<Lock>() };
    metrics::lock_key_created();
    Box::into_raw(Box::new(lock.copied())).cast()
}

/// # Safety
/// `rdb` is a valid IO handle.
unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, _when: c_int) {
    raw::save_unsigned(rdb, state::last_fence());
}

/// # Safety
/// `rdb` is a valid IO handle.
unsafe extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, _when: c_int) -> c_int {
    if encver != ENCODING_VERSION && encver != ENCODING_V1 {
        return raw::REDISMODULE_ERR as c_int;
    }
    match raw::load_unsigned(rdb) {
        Ok(last_fence) if last_fence <= MAX_FENCE => {
            state::observe_fence(last_fence);
            raw::REDISMODULE_OK as c_int
        }
        _ => raw::REDISMODULE_ERR as c_int,
    }
}
