//! Ticket and shared-lease scale: what one operation costs with 10 … 100,000 tickets (or shared
//! holders) standing on one resource, and with 100,000 resources holding one each. Tickets need
//! no connection, so they are pipelined from one; each figure is the best of a few rounds of
//! pipelined operations, in µs per operation. Flat (the largest size costing about what the
//! smallest does) is the goal: a line or a holder set must never be scanned per operation.

use std::collections::VecDeque;
use std::time::Instant;

use dlock_testkit::{Rng, Server};

use crate::harness::{Result, flush};
use crate::report::{Report, ratio};

/// Tickets or holders standing on the one resource.
const SIZES: [usize; 5] = [10, 100, 1_000, 10_000, 100_000];
/// Resources of the many-resources case, one ticket (or holder) each.
const MANY: usize = 100_000;
/// Operations per round, and rounds (the best round counts).
const OPS: usize = 10_000;
const ROUNDS: usize = 3;
/// Commands per pipelined request.
const BATCH: usize = 1_000;
/// The most shared holders measured on one resource, unless `BENCH_SCALE_SHARED_MAX` says
/// otherwise: each shared ACQUIRE and RELEASE costs O(holders) today, so standing 100,000 of
/// them up costs O(n²) (minutes).
const SHARED_MAX: usize = 10_000;
/// Every lease and ticket lasts far longer than the measurement.
const LONG_MS: u64 = 600_000;

/// The scale table.
pub fn run(server: &Server, report: &mut Report) -> Result<()> {
    let shared_max = crate::env_or("BENCH_SCALE_SHARED_MAX", SHARED_MAX);
    report.section(&format!(
        "Ticket and shared-lease scale (µs per operation, best of {ROUNDS} rounds of {OPS} \
         pipelined operations, {BATCH} commands a request)"
    ));
    report.header(&[
        "standing on the resource",
        "ticket refresh µs",
        "hand-over µs (RELEASE, re-queue, claim)",
        "SHARED acquire + release µs",
    ]);
    let mut rows = Vec::new();
    let cases = SIZES.iter().map(|&size| (format!("{size} on one resource"), 1, size));
    for (label, resources, per) in cases.chain([(format!("{MANY} resources × 1 each"), MANY, 1)]) {
        let m = measure(server, resources, per, per <= shared_max)?;
        report.row(&[
            label.clone(),
            format!("{:.2}", m.refresh_us),
            format!("{:.2}", m.handover_us),
            m.shared_us.map_or_else(
                || format!("not measured (above BENCH_SCALE_SHARED_MAX={shared_max})"),
                |us| format!("{us:.2}"),
            ),
        ]);
        rows.push((label, m));
    }
    let (small, large, many) = (&rows[0].1, &rows[SIZES.len() - 1].1, &rows[SIZES.len()].1);
    let largest_shared = rows[..SIZES.len()].iter().rev().find_map(|(_, m)| m.shared_us);
    let shared_ratio = |us: Option<f64>| match (us, small.shared_us) {
        (Some(a), Some(b)) => ratio(a, b),
        _ => "n/a".to_owned(),
    };
    let shared_size = SIZES.iter().rev().find(|&&n| n <= shared_max).copied().unwrap_or(0);
    report.note(&format!(
        "Largest / smallest on one resource ({} / {}): refresh {}, hand-over {}; shared ({} / {}) \
         {}. \
         {MANY} resources × 1 against {} on one resource: refresh {}, hand-over {}, shared {}. \
         A refresh is `DLOCK.ACQUIRE r t {LONG_MS} QUEUE {LONG_MS}` by a random standing ticket; \
         a hand-over is the holder's RELEASE (the head ticket is granted), the old holder's \
         ticket at the back of the line, and the new holder's claiming ACQUIRE (three commands, \
         the line's length unchanged); shared is `ACQUIRE … SHARED` and `RELEASE` of one more \
         token beside the standing holders (two commands).",
        SIZES[SIZES.len() - 1],
        SIZES[0],
        ratio(large.refresh_us, small.refresh_us),
        ratio(large.handover_us, small.handover_us),
        shared_size,
        SIZES[0],
        shared_ratio(largest_shared),
        SIZES[0],
        ratio(many.refresh_us, small.refresh_us),
        ratio(many.handover_us, small.handover_us),
        shared_ratio(many.shared_us),
    ));
    flush(server)
}

struct Measured {
    refresh_us: f64,
    handover_us: f64,
    /// `None` when not measured (too many holders to stand up in reasonable time).
    shared_us: Option<f64>,
}

/// One resource's line, as the server keeps it (first in, first out).
struct Line {
    holder: String,
    tickets: VecDeque<String>,
}

fn resource(r: usize) -> String {
    format!("scale:{r}")
}

/// A 36-byte token.
fn token(r: usize, i: usize) -> String {
    format!("{r:017}-{i:018}")
}

fn measure(server: &Server, resources: usize, per: usize, shared: bool) -> Result<Measured> {
    let mut con = server.try_client()?;
    let mut rng = Rng::new(7);

    // Tickets: a holder per resource, `per` tickets behind it.
    flush(server)?;
    let mut lines = Vec::with_capacity(resources);
    let mut setup = Pipe::new();
    for r in 0..resources {
        let holder = format!("holder-{r:029}");
        setup.add(&mut con, acquire(&resource(r), &holder))?;
        let mut tickets = VecDeque::with_capacity(per);
        for i in 0..per {
            let t = token(r, i);
            setup.add(&mut con, queue(&resource(r), &t))?;
            tickets.push_back(t);
        }
        lines.push(Line { holder, tickets });
    }
    setup.flush(&mut con)?;
    progress(resources, per, "tickets standing");
    let refresh_us = best_of(OPS, || {
        let mut pipe = Pipe::new();
        for _ in 0..OPS {
            let r = rng.below(resources as u64) as usize;
            let i = rng.below(per as u64) as usize;
            pipe.add(&mut con, queue(&resource(r), &lines[r].tickets[i]))?;
        }
        pipe.flush(&mut con)
    })?;
    progress(resources, per, "refreshes timed");
    let handover_us = best_of(OPS, || {
        let mut pipe = Pipe::new();
        for _ in 0..OPS {
            let r = rng.below(resources as u64) as usize;
            let line = &mut lines[r];
            let next = line.tickets.pop_front().ok_or("empty line")?;
            let key = resource(r);
            let mut release = redis::cmd("DLOCK.RELEASE");
            release.arg(&key).arg(&line.holder);
            pipe.add(&mut con, release)?;
            pipe.add(&mut con, queue(&key, &line.holder))?;
            pipe.add_expecting_fence(&mut con, queue(&key, &next))?;
            line.tickets.push_back(std::mem::replace(&mut line.holder, next));
        }
        pipe.flush(&mut con)
    })?;

    progress(resources, per, "hand-overs timed");
    flush(server)?;
    let shared_us =
        if shared { Some(measure_shared(&mut con, &mut rng, resources, per)?) } else { None };
    flush(server)?;
    Ok(Measured { refresh_us, handover_us, shared_us })
}

/// Shared leases: `per` holders per resource, and one more token comes and goes (fewer rounds'
/// operations on a large holder set, where each costs O(holders)).
fn measure_shared(
    con: &mut redis::Connection,
    rng: &mut Rng,
    resources: usize,
    per: usize,
) -> Result<f64> {
    let mut setup = Pipe::new();
    for r in 0..resources {
        for i in 0..per {
            setup.add_expecting_fence(con, shared(&resource(r), &token(r, i)))?;
        }
    }
    setup.flush(con)?;
    progress(resources, per, "shared holders standing");
    let extra = "one-more-token-000000000000000000000";
    let ops = (OPS * 100 / per).clamp(100, OPS);
    best_of(ops, || {
        let mut pipe = Pipe::new();
        for _ in 0..ops {
            let key = resource(rng.below(resources as u64) as usize);
            pipe.add_expecting_fence(con, shared(&key, extra))?;
            let mut release = redis::cmd("DLOCK.RELEASE");
            release.arg(&key).arg(extra);
            pipe.add(con, release)?;
        }
        pipe.flush(con)
    })
}

/// Where a long case is, on stderr (the tables go to stdout).
fn progress(resources: usize, per: usize, what: &str) {
    eprintln!("scale: {resources} resource(s) × {per}: {what}");
}

/// The best of [`ROUNDS`] rounds of `round` (which does `ops` operations), in µs per op.
fn best_of(ops: usize, mut round: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        round()?;
        best = best.min(started.elapsed().as_secs_f64() * 1e6 / ops as f64);
    }
    Ok(best)
}

fn acquire(key: &str, token: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("DLOCK.ACQUIRE");
    cmd.arg(key).arg(token).arg(LONG_MS);
    cmd
}

fn queue(key: &str, token: &str) -> redis::Cmd {
    let mut cmd = acquire(key, token);
    cmd.arg("QUEUE").arg(LONG_MS);
    cmd
}

fn shared(key: &str, token: &str) -> redis::Cmd {
    let mut cmd = acquire(key, token);
    cmd.arg("SHARED");
    cmd
}

/// Commands sent [`BATCH`] at a time; replies that must be fences are checked.
struct Pipe {
    pipe: redis::Pipeline,
    len: usize,
    fences: Vec<usize>,
}

impl Pipe {
    fn new() -> Self {
        Self { pipe: redis::pipe(), len: 0, fences: Vec::new() }
    }

    fn add(&mut self, con: &mut redis::Connection, cmd: redis::Cmd) -> Result<()> {
        self.pipe.add_command(cmd);
        self.len += 1;
        if self.len == BATCH { self.flush(con) } else { Ok(()) }
    }

    fn add_expecting_fence(&mut self, con: &mut redis::Connection, cmd: redis::Cmd) -> Result<()> {
        self.fences.push(self.len);
        self.add(con, cmd)
    }

    fn flush(&mut self, con: &mut redis::Connection) -> Result<()> {
        if self.len > 0 {
            let replies: Vec<redis::Value> = self.pipe.query(con)?;
            for &i in &self.fences {
                if !matches!(replies.get(i), Some(redis::Value::Int(_))) {
                    return Err(format!("expected a fence, got {:?}", replies.get(i)).into());
                }
            }
        }
        *self = Self::new();
        Ok(())
    }
}
