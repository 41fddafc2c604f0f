//! Acquire throughput against PING, SET NX PX and the Lua script, at pipeline 1 and 16.

use std::time::Instant;

use dlock_testkit::Server;

use crate::harness::{Result, flush, run_clients};
use crate::report::{Report, fmt_rate, versus};
use crate::schemes::{LUA_ACQUIRE, Op, RESOURCES, add_op};

/// The throughput table.
pub fn run(server: &Server, report: &mut Report, seconds: u64) -> Result<()> {
    report.section("Acquire throughput (50 clients, random resources, ops/s)");
    report.header(&[
        "pipeline",
        "PING",
        "SET NX PX",
        "Lua SET NX PX + INCR",
        "DLOCK.ACQUIRE",
        "dlock / SET",
        "dlock / Lua",
    ]);
    for pipeline in [1, 16] {
        let ping = throughput(server, Op::Ping, 50, pipeline, seconds)?;
        let set = throughput(server, Op::SetNx, 50, pipeline, seconds)?;
        let lua = throughput(server, Op::LuaAcquire, 50, pipeline, seconds)?;
        let dlock = throughput(server, Op::Acquire, 50, pipeline, seconds)?;
        report.row(
            &[[pipeline.to_string(), fmt_rate(ping)].as_slice(), &versus(set, lua, dlock)].concat(),
        );
        flush(server)?;
    }
    Ok(())
}

/// Ops/s of `op` on random resources from `clients` clients at `pipeline`.
pub fn throughput(
    server: &Server,
    op: Op,
    clients: usize,
    pipeline: usize,
    seconds: u64,
) -> Result<f64> {
    flush(server)?;
    let lua = redis::Script::new(LUA_ACQUIRE);
    lua.prepare_invoke().load(&mut server.try_client()?)?;
    let started = Instant::now();
    let ops = run_clients(server, clients, seconds, move |con, rng, running| {
        let mut done = 0;
        while running() {
            let mut pipe = redis::pipe();
            for _ in 0..pipeline {
                add_op(&mut pipe, op, rng.next() % RESOURCES, 1_000, &lua);
            }
            pipe.query::<redis::Value>(con)?;
            done += pipeline as u64;
        }
        Ok(done)
    })?;
    Ok(ops as f64 / started.elapsed().as_secs_f64())
}
