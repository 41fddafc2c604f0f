//! Acquire throughput against PING, SET NX PX and the Lua script, at pipeline 1 and 16, with
//! leases (and PX) of an hour: none expires during the case, so no figure includes the expiry
//! path. Each client has a token of its own, so a draw of a resource another client holds is
//! refused by dlock as SET NX refuses it; each case starts from an empty server, every scheme sees
//! the same draws, and the note gives the share each granted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use dlock_testkit::Server;

use crate::harness::{Result, client_token, flush, run_clients};
use crate::report::{Report, fmt_rate, versus};
use crate::schemes::{HELD_MS, LUA_ACQUIRE, Op, RESOURCES, add_op};

/// The throughput table.
pub fn run(server: &Server, report: &mut Report, seconds: u64) -> Result<()> {
    report.section(
        "Acquire throughput, leases that do not expire (50 clients, random resources, ops/s)",
    );
    report.header(&[
        "pipeline",
        "PING",
        "SET NX PX",
        "Lua SET NX PX + INCR",
        "DLOCK.ACQUIRE",
        "dlock / SET",
        "dlock / Lua",
    ]);
    let mut granted = Vec::new();
    for pipeline in [1, 16] {
        let ping = throughput(server, Op::Ping, 50, pipeline, seconds, HELD_MS)?;
        let set = throughput(server, Op::SetNx, 50, pipeline, seconds, HELD_MS)?;
        let lua = throughput(server, Op::LuaAcquire, 50, pipeline, seconds, HELD_MS)?;
        let dlock = throughput(server, Op::Acquire, 50, pipeline, seconds, HELD_MS)?;
        report.row(
            &[
                [pipeline.to_string(), fmt_rate(ping.rate)].as_slice(),
                &versus(set.rate, lua.rate, dlock.rate),
            ]
            .concat(),
        );
        granted.push(format!(
            "pipeline {pipeline}: SET NX PX {:.0} %, Lua {:.0} %, dlock {:.0} %",
            set.granted * 100.0,
            lua.granted * 100.0,
            dlock.granted * 100.0
        ));
        flush(server)?;
    }
    report.note(&format!(
        "Leases and PX of {} s, on {RESOURCES} resources drawn at random, a token per client: a \
         draw of a resource another client holds is refused by every scheme alike (one the \
         client holds itself is dlock's idempotent re-acquire, granted). Share of acquisitions \
         granted ({}).",
        HELD_MS / 1_000,
        granted.join("; ")
    ));
    Ok(())
}

/// What a throughput case measured.
pub struct Throughput {
    /// Operations a second.
    pub rate: f64,
    /// The share of operations answered with something other than nil (granted, for an acquire).
    pub granted: f64,
}

/// Ops/s of `op` on random resources from `clients` clients at `pipeline`, leases of `ttl_ms`.
pub fn throughput(
    server: &Server,
    op: Op,
    clients: usize,
    pipeline: usize,
    seconds: u64,
    ttl_ms: u64,
) -> Result<Throughput> {
    flush(server)?;
    let lua = redis::Script::new(LUA_ACQUIRE);
    lua.prepare_invoke().load(&mut server.try_client()?)?;
    let granted = Arc::new(AtomicU64::new(0));
    let counted = granted.clone();
    let started = Instant::now();
    let ops = run_clients(server, clients, seconds, move |con, rng, running| {
        // Each client a token of its own: a draw of a resource another client holds is refused,
        // by dlock as by SET NX (the holder's own draw would be an idempotent re-acquire).
        let token = client_token(rng);
        let (mut done, mut granted) = (0, 0);
        while running() {
            let mut pipe = redis::pipe();
            for _ in 0..pipeline {
                add_op(&mut pipe, op, rng.next() % RESOURCES, &token, ttl_ms, &lua);
            }
            let replies: Vec<redis::Value> = pipe.query(con)?;
            granted += replies.iter().filter(|r| !matches!(r, redis::Value::Nil)).count() as u64;
            done += pipeline as u64;
        }
        counted.fetch_add(granted, Ordering::Relaxed);
        Ok(done)
    })?;
    Ok(Throughput {
        rate: ops as f64 / started.elapsed().as_secs_f64(),
        granted: granted.load(Ordering::Relaxed) as f64 / ops.max(1) as f64,
    })
}
