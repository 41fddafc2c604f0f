//! A crowd of shared requests granted at once: `BENCH_CROWD` (default 100,000) readers' tickets
//! wait behind a writer on one resource, and the writer releases. Before the settle was bounded,
//! the one RELEASE granted them all (100,000 in 269–399 ms, the server stalled meanwhile); now it
//! grants a slice and the timer the rest, a slice a turn. A PING probe (every millisecond on a
//! connection of its own) shows the worst stall; its median is this run's baseline.

use std::time::{Duration, Instant};

use dlock_testkit::{Server, info_line};

use crate::harness::{PingProbe, Result, flush};
use crate::report::{Report, percentile};

pub fn run(server: &Server, report: &mut Report, crowd: u64) -> Result<()> {
    report.section(&format!("A crowd of {crowd} readers granted when a writer leaves"));
    report.header(&[
        "readers",
        "RELEASE ms",
        "all granted after (ms)",
        "PING median ms (baseline)",
        "PING max ms",
        "max / median",
    ]);
    let mut worst: f64 = 0.0;
    for readers in [crowd / 10, crowd] {
        flush(server)?;
        let mut con = server.try_client()?;
        redis::cmd("DLOCK.ACQUIRE")
            .arg("crowd")
            .arg("writer")
            .arg(3_600_000)
            .query::<i64>(&mut con)?;
        for batch in 0..readers.div_ceil(10_000) {
            let mut pipe = redis::pipe();
            for i in batch * 10_000..((batch + 1) * 10_000).min(readers) {
                pipe.cmd("DLOCK.ACQUIRE").arg("crowd").arg(format!("reader-{i:029}"));
                pipe.arg(3_600_000).arg("SHARED").arg("QUEUE").arg(3_600_000).ignore();
            }
            pipe.query::<()>(&mut con)?;
        }
        let probe = PingProbe::start(server)?;
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        redis::cmd("DLOCK.RELEASE").arg("crowd").arg("writer").query::<i64>(&mut con)?;
        let release_ms = started.elapsed().as_secs_f64() * 1_000.0;
        // Every ticket granted: none standing (an O(1) gauge, so the poll costs the server nothing).
        let all_granted = loop {
            let standing = info_line(&mut con, "dlock", "dlock_tickets").unwrap_or_default();
            if standing == "0" {
                break started.elapsed().as_secs_f64() * 1_000.0;
            }
            if started.elapsed() > Duration::from_secs(120) {
                return Err("the crowd was not granted within two minutes".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        std::thread::sleep(Duration::from_millis(200));
        let rtts_us = probe.finish()?;
        let median = percentile(&rtts_us, 50.0) / 1_000.0;
        let max = rtts_us.last().copied().unwrap_or_default() / 1_000.0;
        worst = worst.max(max).max(release_ms);
        report.row(&[
            readers.to_string(),
            format!("{release_ms:.2}"),
            format!("{all_granted:.0}"),
            format!("{median:.3}"),
            format!("{max:.2}"),
            format!("{:.0}×", max / median.max(0.001)),
        ]);
    }
    report.note(&format!(
        "Worst stall seen (the RELEASE itself or a PING): {worst:.2} ms (target: nothing over 10 ms)."
    ));
    expiring(server, report, crowd)?;
    flush(server)
}

/// `crowd` shared leases of one resource, and a write pause (`CLIENT PAUSE … WRITE`) that lasts
/// past all their deadlines, so that they all end when it does: the worst PING while they end,
/// against its median.
fn expiring(server: &Server, report: &mut Report, crowd: u64) -> Result<()> {
    report.header(&[
        "shared leases ending when a write pause ends",
        "all ended after the pause (ms)",
        "PING median ms",
        "PING max ms",
    ]);
    for leases in [crowd / 10, crowd] {
        flush(server)?;
        let mut con = server.try_client()?;
        let ttl_ms = 2_000 + leases / 50;
        let granted = Instant::now();
        for batch in 0..leases.div_ceil(10_000) {
            let mut pipe = redis::pipe();
            for i in batch * 10_000..((batch + 1) * 10_000).min(leases) {
                pipe.cmd("DLOCK.ACQUIRE").arg("ending").arg(format!("reader-{i:029}"));
                pipe.arg(ttl_ms).arg("SHARED").ignore();
            }
            pipe.query::<()>(&mut con)?;
        }
        let pause_ms = (ttl_ms + 1_000).saturating_sub(granted.elapsed().as_millis() as u64);
        redis::cmd("CLIENT").arg("PAUSE").arg(pause_ms).arg("WRITE").query::<()>(&mut con)?;
        let deadline = Instant::now() + Duration::from_millis(pause_ms);
        std::thread::sleep(Duration::from_millis(pause_ms.saturating_sub(300)));
        let probe = PingProbe::start(server)?;
        let all_ended = loop {
            let keys = info_line(&mut con, "dlock", "dlock_lock_keys").unwrap_or_default();
            if keys == "0" {
                break deadline.elapsed().as_secs_f64() * 1_000.0;
            }
            if granted.elapsed() > Duration::from_secs(120) {
                return Err("the leases had not ended two minutes later".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        std::thread::sleep(Duration::from_millis(200));
        let rtts_us = probe.finish()?;
        report.row(&[
            leases.to_string(),
            format!("{all_ended:.0}"),
            format!("{:.3}", percentile(&rtts_us, 50.0) / 1_000.0),
            format!("{:.2}", rtts_us.last().copied().unwrap_or_default() / 1_000.0),
        ]);
    }
    Ok(())
}
