//! The `dlocklock` module data type: one value per lock key, and its callbacks.
//!
//! The RDB layout of a lock and its decoder live in [`crate::core::encoding`]; here Redis's RDB
//! reader and writer carry its fields (a field is an RDB unsigned or string buffer).
//! Module aux data (before the keyspace): `last_fence: unsigned`.
//! The AOF form of a lock is one `DLOCK.SETLEASE key token fence deadline-unix-us …` per lease.

use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::ptr;

use redis_module::native_types::RedisType;
use redis_module::{RedisString, raw};

use crate::clock;
use crate::core::encoding::{
    ENCODING_VERSION, FieldSink, FieldSource, decode_lock, encode_lock, is_known_version,
};
use crate::core::error::MAX_FENCE;
use crate::core::{Lease, Lock, Now};
use crate::{metrics, state};

/// The module type of every lock key (`TYPE key` answers `dlocklock`).
/// The name of the lock values' data type (`TYPE` answers it; `SCAN … TYPE` filters by it).
pub const LOCK_TYPE_NAME: &str = "dlocklock";

pub static LOCK_TYPE: RedisType = RedisType::new(
    LOCK_TYPE_NAME,
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

/// Redis's RDB reader (files, `RESTORE` payloads) as a source of fields. With
/// `HANDLE_IO_ERRORS` set, a short or corrupted read is an error here, not a server abort.
struct RdbFields(*mut raw::RedisModuleIO);

impl FieldSource for RdbFields {
    fn unsigned(&mut self) -> Option<u64> {
        raw::load_unsigned(self.0).ok()
    }

    fn bytes(&mut self) -> Option<Vec<u8>> {
        raw::load_string_buffer(self.0).ok().map(|buffer| buffer.as_ref().to_vec())
    }
}

impl FieldSink for RdbFields {
    fn unsigned(&mut self, value: u64) {
        raw::save_unsigned(self.0, value);
    }

    fn bytes(&mut self, value: &[u8]) {
        raw::save_slice(self.0, value);
    }
}

/// # Safety
/// Called by Redis with a valid IO handle; returns an owned `Lock` or null (load error).
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    let Some(lock) = decode_lock(&mut RdbFields(rdb), encver, clock::now(), state::last_fence())
    else {
        return ptr::null_mut();
    };
    for lease in lock.holders() {
        state::observe_fence(lease.fence);
    }
    metrics::lock_key_created();
    Box::into_raw(Box::new(lock)).cast()
}

/// # Safety
/// `value` is a `Lock` this module allocated; `rdb` is a valid IO handle.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: Redis passes back the pointer rdb_load/set_value gave it.
    let lock = unsafe { &*value.cast::<Lock>() };
    encode_lock(&mut RdbFields(rdb), lock);
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
    // Only leases are durable: waiters belong to connections.
    let now = clock::now();
    for lease in lock.holders() {
        if lease.is_plain() {
            emit_plain(aof, key, lease, now);
        } else {
            emit_args(aof, key, &lease.effect_args(now));
        }
    }
}

/// `DLOCK.SETLEASE key token fence deadline GRANTED granted RENEWALS n`, without copying the token.
fn emit_plain(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    lease: &Lease,
    now: Now,
) {
    let granted = lease.granted_wall(now) as c_longlong;
    // SAFETY: the format "sbllclcl" matches the arguments: a RedisModuleString, a (pointer,
    // length) buffer, two long longs, then a C string and a long long, twice. Fences and
    // deadlines fit: fences are capped at i64::MAX and deadlines are wall-clock microseconds.
    unsafe {
        if let Some(emit) = raw::RedisModule_EmitAOF {
            emit(
                aof,
                c"DLOCK.SETLEASE".as_ptr(),
                c"sbllclcl".as_ptr(),
                key,
                lease.token.as_ptr().cast::<c_char>(),
                lease.token.len(),
                lease.fence as c_longlong,
                lease.deadline_wall() as c_longlong,
                c"GRANTED".as_ptr(),
                granted,
                c"RENEWALS".as_ptr(),
                c_longlong::from(lease.renewals()),
            );
        }
    }
}

/// `DLOCK.SETLEASE key args…` for a shared or described lease.
fn emit_args(aof: *mut raw::RedisModuleIO, key: *mut raw::RedisModuleString, args: &[Vec<u8>]) {
    let strings: Vec<RedisString> =
        args.iter().map(|arg| RedisString::create_from_slice(ptr::null_mut(), arg)).collect();
    let mut pointers: Vec<*mut raw::RedisModuleString> =
        strings.iter().map(|string| string.inner).collect();
    // SAFETY: "sv" takes a RedisModuleString, then an array of them and its length; every
    // string lives until after the call (Redis copies what it writes).
    unsafe {
        if let Some(emit) = raw::RedisModule_EmitAOF {
            emit(
                aof,
                c"DLOCK.SETLEASE".as_ptr(),
                c"sv".as_ptr(),
                key,
                pointers.as_mut_ptr(),
                pointers.len(),
            );
        }
    }
}

/// # Safety
/// `value` is a `Lock` of this module.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: as in rdb_save.
    let lock = unsafe { &*value.cast::<Lock>() };
    std::mem::size_of::<Lock>() + lock.heap_bytes()
}

/// # Safety
/// `md` is a valid digest for this call; `value` is a `Lock` of this module.
unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: as in rdb_save.
    let lock = unsafe { &*value.cast::<Lock>() };
    // SAFETY: md is valid; each buffer pointer and length describes a live slice.
    unsafe {
        if let (Some(add_buffer), Some(add_integer), Some(end)) = (
            raw::RedisModule_DigestAddStringBuffer,
            raw::RedisModule_DigestAddLongLong,
            raw::RedisModule_DigestEndSequence,
        ) {
            for lease in lock.holders() {
                add_buffer(md, lease.token.as_ptr().cast::<c_char>(), lease.token.len());
                add_integer(md, lease.fence as c_longlong);
                add_integer(md, lease.deadline_wall() as c_longlong);
                if lease.shared() {
                    add_buffer(md, c"shared".as_ptr(), 6);
                }
                if let Some(meta) = lease.token.meta() {
                    add_buffer(md, meta.as_ptr().cast::<c_char>(), meta.len());
                }
                end(md);
            }
        }
    }
}

/// # Safety
/// `value` is a `Lock` this module allocated and Redis no longer uses.
unsafe extern "C" fn free(value: *mut c_void) {
    if !value.is_null() {
        // SAFETY: value came from Box::into_raw of a Lock.
        let lock = unsafe { Box::from_raw(value.cast::<Lock>()) };
        crate::apply::value_freed(&lock);
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
    if !is_known_version(encver) {
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
