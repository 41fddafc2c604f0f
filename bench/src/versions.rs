//! "Version 2 options cost nothing when absent": `DLOCK.ACQUIRE resource token ttl` (no option)
//! on the last version-1 module and on this one, each on its own server, in the same run,
//! alternating so that the machine's drift falls on both. The old module is `BENCH_V1_MODULE`
//! (`bash scripts/v1-module.sh` builds it and prints its path); without it the section says so.
//! Instructions per ACQUIRE, which do not drift, come from `scripts/instructions.sh old.so new.so`.

use std::path::PathBuf;

use dlock_testkit::Server;

use crate::harness::{Result, start_server_with};
use crate::report::{Report, fmt_rate, ratio};
use crate::schemes::Op;
use crate::throughput::throughput;

/// Measurements of each module per pipeline depth (alternating), averaged.
const REPEATS: usize = 2;
/// The leases' ttl: 1 s, as this table has always used (both modules expire alike).
const LEASE_MS: u64 = 1_000;

/// The version 1 against version 2 table.
pub fn run(server: &Server, report: &mut Report, seconds: u64) -> Result<()> {
    report.section(
        "ACQUIRE without options: last version-1 module against this one (50 clients, random \
         resources, ops/s)",
    );
    let Some(old) = std::env::var_os("BENCH_V1_MODULE").map(PathBuf::from) else {
        report.note(
            "Not measured: set BENCH_V1_MODULE to the version-1 module \
             (`BENCH_V1_MODULE=$(bash scripts/v1-module.sh)`).",
        );
        return Ok(());
    };
    let old_server = start_server_with(old.clone())?;
    report.header(&["pipeline", "version 1", "this build", "this / version 1"]);
    for pipeline in [1, 16] {
        let (mut v1, mut v2) = (0.0, 0.0);
        for _ in 0..REPEATS {
            v1 += throughput(&old_server, Op::Acquire, 50, pipeline, seconds, LEASE_MS)?.rate;
            v2 += throughput(server, Op::Acquire, 50, pipeline, seconds, LEASE_MS)?.rate;
        }
        let (v1, v2) = (v1 / REPEATS as f64, v2 / REPEATS as f64);
        report.row(&[pipeline.to_string(), fmt_rate(v1), fmt_rate(v2), ratio(v2, v1)]);
    }
    report.note(&format!(
        "Version 1: `{}`. Each figure is the mean of {REPEATS} runs of {seconds} s, the two \
         modules alternating; the two servers run side by side (one idle while the other is \
         measured). Instructions per ACQUIRE: `bash scripts/instructions.sh <v1.so> \
         target/release/libdlock.so`.",
        old.display()
    ));
    Ok(())
}
