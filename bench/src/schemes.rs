//! What each lock scheme sends: plain `SET NX PX`, the Lua scripts a careful user writes, and
//! dlock's commands.

use crate::harness::Result;

/// SET NX PX plus a fence counter, in one round trip: what a careful user runs today.
pub const LUA_ACQUIRE: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
                           return redis.call('INCR', KEYS[2]) end return false";
/// The owner-checked release that goes with it.
pub const LUA_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// Every client's token in the single-owner cases.
pub const TOKEN: &str = "0123456789abcdef0123456789abcdef0123"; // 36 bytes, a UUID's length
/// How many resources the random cases draw from.
pub const RESOURCES: u64 = 1_000_000;
/// A lease that outlives any section (one hour): the throughput and cycle cases measure taking
/// and giving back locks, not the expiry path (the `expiry` and `storm` sections measure that).
pub const HELD_MS: u64 = 3_600_000;

/// One pipelined request of the throughput and memory cases.
#[derive(Clone, Copy)]
pub enum Op {
    Ping,
    SetNx,
    LuaAcquire,
    Acquire,
}

/// Adds one acquisition of `resource` by `token` (or a PING) to `pipe`, the way each scheme does
/// it.
pub fn add_op(
    pipe: &mut redis::Pipeline,
    op: Op,
    resource: u64,
    token: &str,
    ttl_ms: u64,
    lua: &redis::Script,
) {
    let key = format!("lock:{resource}");
    match op {
        Op::Ping => pipe.cmd("PING"),
        Op::SetNx => pipe.cmd("SET").arg(&key).arg(token).arg("NX").arg("PX").arg(ttl_ms),
        Op::LuaAcquire => pipe
            .cmd("EVALSHA")
            .arg(lua.get_hash())
            .arg(2)
            .arg(&key)
            .arg(format!("fence:{resource}"))
            .arg(token)
            .arg(ttl_ms),
        Op::Acquire => pipe.cmd("DLOCK.ACQUIRE").arg(&key).arg(token).arg(ttl_ms),
    };
}

/// A way to take and give back a lock.
#[derive(Clone, Copy, PartialEq)]
pub enum Scheme {
    SetNx,
    Lua,
    Dlock,
}

/// Takes a lock on `resource`; `true` when granted.
pub fn lock(
    con: &mut redis::Connection,
    scheme: Scheme,
    resource: &str,
    token: &str,
    ttl_ms: u64,
    acquire: &redis::Script,
) -> Result<bool> {
    Ok(match scheme {
        Scheme::SetNx => redis::cmd("SET")
            .arg(resource)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query::<Option<String>>(con)?
            .is_some(),
        Scheme::Lua => acquire
            .key(resource)
            .key(format!("{resource}:fence"))
            .arg(token)
            .arg(ttl_ms)
            .invoke::<Option<i64>>(con)?
            .is_some(),
        Scheme::Dlock => redis::cmd("DLOCK.ACQUIRE")
            .arg(resource)
            .arg(token)
            .arg(ttl_ms)
            .query::<Option<i64>>(con)?
            .is_some(),
    })
}

/// Gives back a lock taken with `lock`.
pub fn unlock(
    con: &mut redis::Connection,
    scheme: Scheme,
    resource: &str,
    token: &str,
    release: &redis::Script,
) -> Result<()> {
    match scheme {
        Scheme::Dlock => redis::cmd("DLOCK.RELEASE").arg(resource).arg(token).query::<i64>(con)?,
        _ => release.key(resource).arg(token).invoke::<i64>(con)?,
    };
    Ok(())
}
