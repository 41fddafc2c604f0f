//! Memory per held lock, against the same locks taken with SET NX PX and the Lua scheme.

use dlock_testkit::Server;

use crate::harness::{Result, flush, settled_memory, used_memory};
use crate::report::{Report, ratio};
use crate::schemes::{LUA_ACQUIRE, Op, Scheme, TOKEN, add_op};

/// The memory table.
pub fn run(server: &Server, report: &mut Report) -> Result<()> {
    report.section("Memory per held lock (100k locks, 36-byte tokens, bytes)");
    report.header(&[
        "SET NX PX",
        "two-key Lua (lock + fence counter)",
        "DLOCK.ACQUIRE",
        "dlock / SET",
    ]);
    let set = memory_per_lock(server, Scheme::SetNx, 100_000)?;
    let lua = memory_per_lock(server, Scheme::Lua, 100_000)?;
    let dlock = memory_per_lock(server, Scheme::Dlock, 100_000)?;
    report.row(&[
        format!("{set:.0}"),
        format!("{lua:.0}"),
        format!("{dlock:.0}"),
        ratio(dlock, set),
    ]);

    Ok(())
}

fn memory_per_lock(server: &Server, scheme: Scheme, locks: u64) -> Result<f64> {
    flush(server)?;
    let mut con = server.try_client()?;
    let acquire = redis::Script::new(LUA_ACQUIRE);
    acquire.prepare_invoke().load(&mut con)?;
    let before = settled_memory(&mut con)?;
    for batch in 0..locks / 1_000 {
        let mut pipe = redis::pipe();
        let op = match scheme {
            Scheme::SetNx => Op::SetNx,
            Scheme::Lua => Op::LuaAcquire,
            Scheme::Dlock => Op::Acquire,
        };
        for i in batch * 1_000..(batch + 1) * 1_000 {
            add_op(&mut pipe, op, i, TOKEN, 600_000, &acquire);
        }
        pipe.query::<redis::Value>(&mut con)?;
    }
    let after = used_memory(server)?;
    flush(server)?;
    Ok((after - before) / locks as f64)
}
