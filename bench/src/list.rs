//! `DLOCK.LIST` over a large keyspace: a whole iteration with `COUNT 1000` while a PING probe
//! runs, against a whole `SCAN … COUNT 1000 TYPE dlocklock` iteration (what it wraps) as the
//! baseline, measured in the same run.

use std::time::Instant;

use dlock_testkit::Server;

use crate::harness::{PingProbe, Result, flush};
use crate::report::{Report, percentile};

/// `locks` held locks (and as many plain keys beside them), then one whole iteration of each
/// command: calls, time, and the worst PING meanwhile.
pub fn run(server: &Server, report: &mut Report, locks: u64) -> Result<()> {
    report.section(&format!("Listing {locks} locks (DLOCK.LIST, COUNT 1000)"));
    flush(server)?;
    let mut con = server.try_client()?;
    for batch in 0..locks.div_ceil(10_000) {
        let mut pipe = redis::pipe();
        for i in batch * 10_000..((batch + 1) * 10_000).min(locks) {
            pipe.cmd("DLOCK.ACQUIRE")
                .arg(format!("list:{i}"))
                .arg("holder")
                .arg(3_600_000)
                .ignore();
            pipe.cmd("SET").arg(format!("data:{i}")).arg("x").ignore();
        }
        pipe.query::<()>(&mut con)?;
    }
    report.header(&[
        "iteration",
        "calls",
        "locks listed",
        "whole iteration s",
        "PING median ms",
        "PING max ms",
    ]);
    let mut worst = [0.0; 2];
    for (row, (label, command)) in
        [("SCAN … COUNT 1000 TYPE dlocklock", "SCAN"), ("DLOCK.LIST … COUNT 1000", "DLOCK.LIST")]
            .into_iter()
            .enumerate()
    {
        let probe = PingProbe::start(server)?;
        let started = Instant::now();
        let (mut cursor, mut calls, mut listed) = ("0".to_owned(), 0u64, 0usize);
        loop {
            let mut call = redis::cmd(command);
            call.arg(&cursor).arg("COUNT").arg(1_000);
            if command == "SCAN" {
                call.arg("TYPE").arg("dlocklock");
            }
            let (next, entries): (String, Vec<redis::Value>) = call.query(&mut con)?;
            calls += 1;
            listed += entries.len();
            if next == "0" {
                break;
            }
            cursor = next;
        }
        let took = started.elapsed().as_secs_f64();
        let rtts = probe.finish()?;
        worst[row] = rtts.last().copied().unwrap_or_default() / 1_000.0;
        report.row(&[
            label.to_owned(),
            calls.to_string(),
            listed.to_string(),
            format!("{took:.2}"),
            format!("{:.3}", percentile(&rtts, 50.0) / 1_000.0),
            format!("{:.2}", worst[row]),
        ]);
    }
    report.note(&format!(
        "Worst PING during the listing: {:.2} ms ({:.2} ms during the SCAN it wraps; target: nothing over 10 ms).",
        worst[1], worst[0]
    ));
    flush(server)
}
