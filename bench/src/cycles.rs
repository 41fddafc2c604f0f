//! Full cycles, acquire then release, on random resources: SET NX PX with a Lua release, the Lua
//! pair, and dlock. Leases (and PX) of an hour, so that none expires during the case: each is
//! released by its holder, never by the expiry path.

use std::time::Instant;

use dlock_testkit::Server;

use crate::harness::{Result, client_token, flush, run_clients};
use crate::report::{Report, versus};
use crate::schemes::{HELD_MS, LUA_ACQUIRE, LUA_RELEASE, RESOURCES, Scheme, lock, unlock};

/// The full-cycle table.
pub fn run(server: &Server, report: &mut Report, seconds: u64) -> Result<()> {
    report
        .section("Full cycle acquire → release, leases that do not expire (50 clients, cycles/s)");
    report.header(&[
        "SET NX PX + Lua release",
        "Lua acquire + Lua release",
        "DLOCK.ACQUIRE + RELEASE",
        "dlock / SET",
        "dlock / Lua",
    ]);
    let set = cycles(server, Scheme::SetNx, 50, seconds)?;
    let lua = cycles(server, Scheme::Lua, 50, seconds)?;
    let dlock = cycles(server, Scheme::Dlock, 50, seconds)?;
    report.row(&versus(set, lua, dlock));
    flush(server)?;
    Ok(())
}

fn cycles(server: &Server, scheme: Scheme, clients: usize, seconds: u64) -> Result<f64> {
    flush(server)?;
    let started = Instant::now();
    let done = run_clients(server, clients, seconds, move |con, rng, running| {
        let (acquire, release) = (redis::Script::new(LUA_ACQUIRE), redis::Script::new(LUA_RELEASE));
        let token = client_token(rng);
        let mut done = 0;
        while running() {
            let resource = format!("lock:{}", rng.next() % RESOURCES);
            if lock(con, scheme, &resource, &token, HELD_MS, &acquire)? {
                unlock(con, scheme, &resource, &token, &release)?;
                done += 1;
            }
        }
        Ok(done)
    })?;
    Ok(done as f64 / started.elapsed().as_secs_f64())
}
