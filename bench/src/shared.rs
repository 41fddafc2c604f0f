//! Shared leases: semaphore permits taken and given back, and memory per permit holder, against
//! dlock's exclusive lock and the usual Lua semaphore (a sorted set of holders scored by their
//! deadlines, swept on every acquire, plus a fence counter).

use std::time::Instant;

use dlock_testkit::Server;

use crate::harness::{Result, client_token, flush, run_clients, settled_memory, used_memory};
use crate::report::{Report, fmt_rate, ratio};

/// The Lua semaphore: drop expired holders, admit while fewer than the limit hold, mint a fence.
/// KEYS: holders, fence counter. ARGV: token, limit, ttl-ms.
const LUA_SEMAPHORE_ACQUIRE: &str = "local t = redis.call('TIME') \
    local now = t[1] * 1000 + math.floor(t[2] / 1000) \
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) \
    if redis.call('ZSCORE', KEYS[1], ARGV[1]) or \
       redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then \
        redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1]) \
        redis.call('PEXPIRE', KEYS[1], ARGV[3]) \
        return redis.call('INCR', KEYS[2]) end \
    return false";

/// Permits per semaphore.
const PERMITS: u64 = 10;
/// Semaphores the cycles draw from.
const SEMAPHORES: u64 = 10_000;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `DLOCK.ACQUIRE … SHARED LIMIT n`, `DLOCK.RELEASE`.
    Permit,
    /// The Lua semaphore and `ZREM`.
    LuaSemaphore,
    /// `DLOCK.ACQUIRE` (exclusive), `DLOCK.RELEASE`.
    Exclusive,
}

/// Adds one acquisition of `semaphore` by `token` to `pipe`.
fn add_acquire(
    pipe: &mut redis::Pipeline,
    kind: Kind,
    semaphore: u64,
    token: &str,
    lua: &redis::Script,
) {
    let key = format!("sem:{semaphore}");
    match kind {
        Kind::Permit => pipe
            .cmd("DLOCK.ACQUIRE")
            .arg(&key)
            .arg(token)
            .arg(600_000)
            .arg("SHARED")
            .arg("LIMIT")
            .arg(PERMITS),
        Kind::LuaSemaphore => pipe
            .cmd("EVALSHA")
            .arg(lua.get_hash())
            .arg(2)
            .arg(&key)
            .arg(format!("{key}:fence"))
            .arg(token)
            .arg(PERMITS)
            .arg(600_000),
        Kind::Exclusive => pipe.cmd("DLOCK.ACQUIRE").arg(&key).arg(token).arg(600_000),
    };
}

fn add_release(pipe: &mut redis::Pipeline, kind: Kind, semaphore: u64, token: &str) {
    let key = format!("sem:{semaphore}");
    match kind {
        Kind::LuaSemaphore => pipe.cmd("ZREM").arg(&key).arg(token),
        _ => pipe.cmd("DLOCK.RELEASE").arg(&key).arg(token),
    };
}

/// The shared-lease tables.
pub fn run(server: &Server, report: &mut Report, seconds: u64) -> Result<()> {
    report.section(&format!(
        "Semaphore permits: acquire → release cycles (50 clients, {SEMAPHORES} semaphores of \
         {PERMITS} permits, cycles/s)"
    ));
    report.header(&[
        "Lua semaphore (ZSET + INCR)",
        "DLOCK SHARED LIMIT",
        "DLOCK exclusive",
        "permit / Lua",
        "permit / exclusive",
    ]);
    let lua = cycles(server, Kind::LuaSemaphore, seconds)?;
    let permit = cycles(server, Kind::Permit, seconds)?;
    let exclusive = cycles(server, Kind::Exclusive, seconds)?;
    report.row(&[
        fmt_rate(lua),
        fmt_rate(permit),
        fmt_rate(exclusive),
        ratio(permit, lua),
        ratio(permit, exclusive),
    ]);

    report.section(&format!(
        "Memory per permit holder ({SEMAPHORES} semaphores × {PERMITS} holders, 36-byte tokens, bytes)"
    ));
    report.header(&["Lua semaphore (ZSET + INCR)", "DLOCK SHARED LIMIT", "permit / Lua"]);
    let lua = memory_per_holder(server, Kind::LuaSemaphore)?;
    let permit = memory_per_holder(server, Kind::Permit)?;
    report.row(&[format!("{lua:.0}"), format!("{permit:.0}"), ratio(permit, lua)]);
    Ok(())
}

fn script(server: &Server) -> Result<redis::Script> {
    let lua = redis::Script::new(LUA_SEMAPHORE_ACQUIRE);
    lua.prepare_invoke().load(&mut server.try_client()?)?;
    Ok(lua)
}

fn cycles(server: &Server, kind: Kind, seconds: u64) -> Result<f64> {
    flush(server)?;
    let lua = script(server)?;
    let started = Instant::now();
    let done = run_clients(server, 50, seconds, move |con, rng, running| {
        let token = client_token(rng);
        let mut done = 0;
        while running() {
            let semaphore = rng.next() % SEMAPHORES;
            let mut pipe = redis::pipe();
            add_acquire(&mut pipe, kind, semaphore, &token, &lua);
            add_release(&mut pipe, kind, semaphore, &token);
            pipe.query::<redis::Value>(con)?;
            done += 1;
        }
        Ok(done)
    })?;
    Ok(done as f64 / started.elapsed().as_secs_f64())
}

fn memory_per_holder(server: &Server, kind: Kind) -> Result<f64> {
    flush(server)?;
    let lua = script(server)?;
    let mut con = server.try_client()?;
    let before = settled_memory(&mut con)?;
    for semaphore in 0..SEMAPHORES {
        let mut pipe = redis::pipe();
        for holder in 0..PERMITS {
            let token = format!("{semaphore:018}{holder:018}");
            add_acquire(&mut pipe, kind, semaphore, &token, &lua);
        }
        let granted: Vec<Option<i64>> = pipe.query(&mut con)?;
        if granted.iter().any(Option::is_none) {
            return Err("a permit was refused while the semaphore had room".into());
        }
    }
    let after = used_memory(server)?;
    flush(server)?;
    Ok((after - before) / (SEMAPHORES * PERMITS) as f64)
}
