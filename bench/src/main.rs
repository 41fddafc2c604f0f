//! `make bench`: dlock against what users would do instead, measured side by side in one run on
//! one server, reported as ratios (these machines are noisy; no absolute figure stands alone).
//!
//! Environment: `BENCH_SECONDS` (per case, default 3), `BENCH_STORM_LEASES` (default 1000000),
//! `BENCH_OUT` (default `bench/results.md`), `DLOCK_MODULE` (default target/release/libdlock.so),
//! `BENCH_ONLY` (`storm`, `memory` or `throughput`: run only that section).

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

/// SET NX PX plus a fence counter, in one round trip: what a careful user runs today.
const LUA_ACQUIRE: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
                           return redis.call('INCR', KEYS[2]) end return false";
/// The owner-checked release that goes with it.
const LUA_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

const TOKEN: &str = "0123456789abcdef0123456789abcdef0123"; // 36 bytes, a UUID's length
const RESOURCES: u64 = 1_000_000;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> Result<()> {
    let seconds: u64 = env_or("BENCH_SECONDS", 3);
    let storm_leases: u64 = env_or("BENCH_STORM_LEASES", 1_000_000);
    let server = Server::start()?;
    let mut report = Report::new(&server)?;
    // BENCH_ONLY=storm runs just the expiry storm (for profiling the sweep); BENCH_ONLY=memory
    // and BENCH_ONLY=throughput just those comparisons.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    if only == "memory" {
        memory(&server, &mut report)?;
        return report.finish();
    }
    if only == "throughput" {
        throughputs(&server, &mut report, seconds)?;
        return report.finish();
    }
    if only != "storm" {
        throughputs(&server, &mut report, seconds)?;
        compare(&server, &mut report, seconds)?;
        memory(&server, &mut report)?;
    }
    report.section(&format!("Expiry storm ({storm_leases} leases expiring within one second)"));
    report.header(&[
        "leases",
        "PING p99 ms",
        "PING max ms",
        "lock p99 ms",
        "lock max ms",
        "all gone after last deadline (s)",
    ]);
    let mut gone = Vec::new();
    for (label, dlock) in [("SET NX PX (Redis's own expiry)", false), ("DLOCK.ACQUIRE", true)] {
        let storm = expiry_storm(&server, storm_leases, dlock)?;
        report.row(&[
            label.to_owned(),
            format!("{:.2}", storm.ping_p99_ms),
            format!("{:.2}", storm.ping_max_ms),
            format!("{:.2}", storm.acquire_p99_ms),
            format!("{:.2}", storm.acquire_max_ms),
            format!("{:.2}", storm.gone_after_s),
        ]);
        gone.push(storm.gone_after_s);
    }
    report.note(&format!(
        "Redis's own expiry of SET NX PX keys takes {:.1}× as long as dlock's sweep.",
        gone[0] / gone[1].max(0.001)
    ));

    report.finish()
}

/// Acquire throughput against PING, SET NX PX and the Lua script, at pipeline 1 and 16.
fn throughputs(server: &Server, report: &mut Report, seconds: u64) -> Result<()> {
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
        report.row(&[
            pipeline.to_string(),
            fmt_rate(ping),
            fmt_rate(set),
            fmt_rate(lua),
            fmt_rate(dlock),
            ratio(dlock, set),
            ratio(dlock, lua),
        ]);
        server.flush()?;
    }
    Ok(())
}

/// The side-by-side comparisons: cycles and contention.
fn compare(server: &Server, report: &mut Report, seconds: u64) -> Result<()> {
    report.section("Full cycle acquire → release (50 clients, cycles/s)");
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
    report.row(&[
        fmt_rate(set),
        fmt_rate(lua),
        fmt_rate(dlock),
        ratio(dlock, set),
        ratio(dlock, lua),
    ]);
    server.flush()?;

    report.section("Contended hand-over (16 workers, one resource, 1 ms of work each)");
    report.header(&["scheme", "critical sections/s", "wait p50 ms", "wait p99 ms"]);
    let backoff = contended(server, false, seconds.max(3))?;
    let wait = contended(server, true, seconds.max(3))?;
    for (name, result) in
        [("retry loop, exponential backoff + jitter", &backoff), ("DLOCK.ACQUIRE … WAIT", &wait)]
    {
        report.row(&[
            name.to_owned(),
            fmt_rate(result.rate),
            format!("{:.2}", result.p50_ms),
            format!("{:.2}", result.p99_ms),
        ]);
    }
    report.note(&format!("WAIT / backoff rate: {}", ratio(wait.rate, backoff.rate)));
    server.flush()?;
    Ok(())
}

/// Memory per held lock, against the same locks taken with SET NX PX and the Lua scheme.
fn memory(server: &Server, report: &mut Report) -> Result<()> {
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

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn fmt_rate(rate: f64) -> String {
    format!("{rate:.0}")
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 { format!("{:.2}×", a / b) } else { "n/a".to_owned() }
}

/// A tiny, fast, deterministic-per-thread random source.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A redis-server with the module, on a free port, killed on drop.
struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Server {
    fn start() -> Result<Self> {
        let module = match std::env::var_os("DLOCK_MODULE") {
            Some(path) => PathBuf::from(path),
            None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/libdlock.so"),
        }
        .canonicalize()?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!("dlock-bench-{port}"));
        std::fs::create_dir_all(&dir)?;
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--maxclients", "10000", "--loglevel", "warning"])
            .arg("--dir")
            .arg(&dir)
            .arg("--loadmodule")
            .arg(&module)
            .stdout(Stdio::null())
            .spawn()?;
        let server = Server { child, port, dir };
        let started = Instant::now();
        while server
            .connect()
            .and_then(|mut c| Ok(redis::cmd("PING").query::<String>(&mut c)?))
            .is_err()
        {
            if started.elapsed() > Duration::from_secs(20) {
                return Err("redis-server did not start".into());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    fn connect(&self) -> Result<redis::Connection> {
        Ok(redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?.get_connection()?)
    }

    fn flush(&self) -> Result<()> {
        let mut con = self.connect()?;
        redis::cmd("FLUSHALL").arg("SYNC").query::<()>(&mut con)?;
        Ok(())
    }

    fn used_memory(&self) -> Result<f64> {
        let mut con = self.connect()?;
        let info: String = redis::cmd("INFO").arg("memory").query(&mut con)?;
        let value = info
            .lines()
            .find_map(|line| line.strip_prefix("used_memory:"))
            .ok_or("no used_memory")?;
        Ok(value.trim().parse()?)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Clone, Copy)]
enum Op {
    Ping,
    SetNx,
    LuaAcquire,
    Acquire,
}

/// Adds one acquisition of `resource` (or a PING) to `pipe`, the way each scheme does it.
fn add_op(pipe: &mut redis::Pipeline, op: Op, resource: u64, ttl_ms: u64, lua: &redis::Script) {
    let key = format!("lock:{resource}");
    match op {
        Op::Ping => pipe.cmd("PING"),
        Op::SetNx => pipe.cmd("SET").arg(&key).arg(TOKEN).arg("NX").arg("PX").arg(ttl_ms),
        Op::LuaAcquire => pipe
            .cmd("EVALSHA")
            .arg(lua.get_hash())
            .arg(2)
            .arg(&key)
            .arg(format!("fence:{resource}"))
            .arg(TOKEN)
            .arg(ttl_ms),
        Op::Acquire => pipe.cmd("DLOCK.ACQUIRE").arg(&key).arg(TOKEN).arg(ttl_ms),
    };
}

/// Runs `f` on `clients` threads, each with its own connection and random source, for `seconds`;
/// returns the sum of what the threads count.
fn run_clients(
    server: &Server,
    clients: usize,
    seconds: u64,
    f: impl Fn(&mut redis::Connection, &mut Rng, &dyn Fn() -> bool) -> Result<u64>
    + Send
    + Sync
    + 'static,
) -> Result<u64> {
    let f = Arc::new(f);
    let start = Arc::new(Barrier::new(clients + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for client in 0..clients {
        let mut con = server.connect()?;
        let (f, start, stop, total) = (f.clone(), start.clone(), stop.clone(), total.clone());
        handles.push(thread::spawn(move || -> Result<()> {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((client as u64 + 1) * 0x1000_0001));
            start.wait();
            let running = || !stop.load(Ordering::Relaxed);
            total.fetch_add(f(&mut con, &mut rng, &running)?, Ordering::Relaxed);
            Ok(())
        }));
    }
    start.wait();
    thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle.join().map_err(|_| "client thread panicked")??;
    }
    Ok(total.load(Ordering::Relaxed))
}

fn throughput(
    server: &Server,
    op: Op,
    clients: usize,
    pipeline: usize,
    seconds: u64,
) -> Result<f64> {
    server.flush()?;
    let lua = redis::Script::new(LUA_ACQUIRE);
    lua.prepare_invoke().load(&mut server.connect()?)?;
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

#[derive(Clone, Copy, PartialEq)]
enum Scheme {
    SetNx,
    Lua,
    Dlock,
}

/// Takes a lock on `resource`; `true` when granted.
fn lock(
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

fn unlock(
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

fn cycles(server: &Server, scheme: Scheme, clients: usize, seconds: u64) -> Result<f64> {
    server.flush()?;
    let started = Instant::now();
    let done = run_clients(server, clients, seconds, move |con, rng, running| {
        let (acquire, release) = (redis::Script::new(LUA_ACQUIRE), redis::Script::new(LUA_RELEASE));
        let token = client_token(rng);
        let mut done = 0;
        while running() {
            let resource = format!("lock:{}", rng.next() % RESOURCES);
            if lock(con, scheme, &resource, &token, 1_000, &acquire)? {
                unlock(con, scheme, &resource, &token, &release)?;
                done += 1;
            }
        }
        Ok(done)
    })?;
    Ok(done as f64 / started.elapsed().as_secs_f64())
}

/// A 36-byte token of this client's own: competing clients must not share an identity.
fn client_token(rng: &mut Rng) -> String {
    format!("{:018x}{:018x}", rng.next() >> 8, rng.next() >> 8)
}

struct Contention {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// 16 workers take turns on one resource, ~1 ms of work each.
fn contended(server: &Server, wait: bool, seconds: u64) -> Result<Contention> {
    server.flush()?;
    let waits = Arc::new(std::sync::Mutex::new(Vec::<f64>::new()));
    let recorded = waits.clone();
    let started = Instant::now();
    let done = run_clients(server, 16, seconds, move |con, rng, running| {
        let (acquire, release) = (redis::Script::new(LUA_ACQUIRE), redis::Script::new(LUA_RELEASE));
        let token = client_token(rng);
        let mut mine = Vec::new();
        while running() {
            let asked = Instant::now();
            if wait {
                let fence: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
                    .arg("hot")
                    .arg(&token)
                    .arg(5_000)
                    .arg("WAIT")
                    .arg(2_000)
                    .query(con)?;
                if fence.is_none() {
                    continue;
                }
            } else {
                let mut backoff_us = 1_000u64;
                while !lock(con, Scheme::Lua, "hot", &token, 5_000, &acquire)? {
                    if !running() {
                        return Ok(0);
                    }
                    let jitter = rng.next() % backoff_us;
                    thread::sleep(Duration::from_micros(backoff_us + jitter));
                    backoff_us = (backoff_us * 2).min(64_000);
                }
            }
            mine.push(asked.elapsed().as_secs_f64() * 1_000.0);
            thread::sleep(Duration::from_millis(1)); // the work
            let scheme = if wait { Scheme::Dlock } else { Scheme::Lua };
            unlock(con, scheme, "hot", &token, &release)?;
        }
        let count = mine.len() as u64;
        recorded.lock().map_err(|_| "poisoned")?.extend(mine);
        Ok(count)
    })?;
    let rate = done as f64 / started.elapsed().as_secs_f64();
    let mut waits = waits.lock().map_err(|_| "poisoned")?.clone();
    waits.sort_by(f64::total_cmp);
    Ok(Contention { rate, p50_ms: percentile(&waits, 50.0), p99_ms: percentile(&waits, 99.0) })
}

fn memory_per_lock(server: &Server, scheme: Scheme, locks: u64) -> Result<f64> {
    server.flush()?;
    let mut con = server.connect()?;
    let acquire = redis::Script::new(LUA_ACQUIRE);
    acquire.prepare_invoke().load(&mut con)?;
    let before = server.used_memory()?;
    for batch in 0..locks / 1_000 {
        let mut pipe = redis::pipe();
        let op = match scheme {
            Scheme::SetNx => Op::SetNx,
            Scheme::Lua => Op::LuaAcquire,
            Scheme::Dlock => Op::Acquire,
        };
        for i in batch * 1_000..(batch + 1) * 1_000 {
            add_op(&mut pipe, op, i, 600_000, &acquire);
        }
        pipe.query::<redis::Value>(&mut con)?;
    }
    let after = server.used_memory()?;
    server.flush()?;
    Ok((after - before) / locks as f64)
}

struct Storm {
    ping_p99_ms: f64,
    ping_max_ms: f64,
    acquire_p99_ms: f64,
    acquire_max_ms: f64,
    gone_after_s: f64,
}

/// `leases` leases whose deadlines all fall within one second; probes latency meanwhile. With
/// `dlock` false, plain `SET NX PX` keys, which Redis's own active expiry removes (the baseline).
fn expiry_storm(server: &Server, leases: u64, dlock: bool) -> Result<Storm> {
    server.flush()?;
    let mut con = server.connect()?;
    // Leave time to load them all: about 5 µs a lease here, with a wide margin.
    let load_budget = Duration::from_millis(3_000 + leases / 100);
    let first_deadline = Instant::now() + load_budget;
    let mut rng = Rng(42);
    for batch in 0..leases.div_ceil(10_000) {
        let mut pipe = redis::pipe();
        for i in batch * 10_000..((batch + 1) * 10_000).min(leases) {
            let deadline = first_deadline + Duration::from_millis(rng.next() % 1_000);
            let ttl = deadline.saturating_duration_since(Instant::now()).as_millis().max(1) as u64;
            if dlock {
                pipe.cmd("DLOCK.ACQUIRE").arg(format!("storm:{i}")).arg(TOKEN).arg(ttl);
            } else {
                pipe.cmd("SET").arg(format!("storm:{i}")).arg(TOKEN).arg("NX").arg("PX").arg(ttl);
            }
        }
        pipe.query::<redis::Value>(&mut con)?;
    }
    let last_deadline = first_deadline + Duration::from_secs(1);
    let (mut pings, mut acquires) = (Vec::new(), Vec::new());
    thread::sleep(
        first_deadline.saturating_duration_since(Instant::now() + Duration::from_millis(200)),
    );
    let mut probe = 0u64;
    let gone_at = loop {
        let sent = Instant::now();
        redis::cmd("PING").query::<String>(&mut con)?;
        pings.push(sent.elapsed().as_secs_f64() * 1_000.0);
        let sent = Instant::now();
        let key = format!("probe:{probe}");
        if dlock {
            redis::cmd("DLOCK.ACQUIRE")
                .arg(&key)
                .arg(TOKEN)
                .arg(1_000)
                .query::<Option<i64>>(&mut con)?;
            acquires.push(sent.elapsed().as_secs_f64() * 1_000.0);
            redis::cmd("DLOCK.RELEASE").arg(&key).arg(TOKEN).query::<i64>(&mut con)?;
        } else {
            redis::cmd("SET")
                .arg(&key)
                .arg(TOKEN)
                .arg("NX")
                .arg("PX")
                .arg(1_000)
                .query::<Option<String>>(&mut con)?;
            acquires.push(sent.elapsed().as_secs_f64() * 1_000.0);
            redis::cmd("DEL").arg(&key).query::<i64>(&mut con)?;
        }
        probe += 1;
        if Instant::now() > last_deadline && probe.is_multiple_of(10) {
            let left: i64 = redis::cmd("DBSIZE").query(&mut con)?;
            if left == 0 {
                break Instant::now();
            }
            if Instant::now() > last_deadline + Duration::from_secs(60) {
                return Err("expired leases still present a minute after their deadline".into());
            }
        }
        thread::sleep(Duration::from_millis(1));
    };
    pings.sort_by(f64::total_cmp);
    acquires.sort_by(f64::total_cmp);
    Ok(Storm {
        ping_p99_ms: percentile(&pings, 99.0),
        ping_max_ms: pings.last().copied().unwrap_or_default(),
        acquire_p99_ms: percentile(&acquires, 99.0),
        acquire_max_ms: acquires.last().copied().unwrap_or_default(),
        gone_after_s: gone_at.saturating_duration_since(last_deadline).as_secs_f64(),
    })
}

/// The markdown table, printed as it grows and written to `BENCH_OUT` at the end.
struct Report {
    text: String,
}

impl Report {
    fn new(server: &Server) -> Result<Self> {
        let mut con = server.connect()?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut con)?;
        let version =
            info.lines().find_map(|l| l.strip_prefix("redis_version:")).unwrap_or("?").trim();
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
            .unwrap_or_else(|| "unknown CPU".to_owned());
        let cores = thread::available_parallelism().map_or(0, |n| n.get());
        let mut text = String::from("# dlock benchmark results\n\n");
        let _ = writeln!(
            text,
            "Machine: {cores} cores, {cpu}; Redis {version}; benchmark clients on the same machine.\n\
             Every figure in a table was measured in the same run on the same server: read the ratios.\n"
        );
        print!("{text}");
        Ok(Self { text })
    }

    fn push(&mut self, line: &str) {
        println!("{line}");
        self.text.push_str(line);
        self.text.push('\n');
    }

    fn section(&mut self, title: &str) {
        self.push(&format!("\n## {title}\n"));
    }

    fn header(&mut self, columns: &[&str]) {
        self.push(&format!("| {} |", columns.join(" | ")));
        self.push(&format!("|{}", "---|".repeat(columns.len())));
    }

    fn row(&mut self, cells: &[String]) {
        self.push(&format!("| {} |", cells.join(" | ")));
    }

    fn note(&mut self, line: &str) {
        self.push(&format!("\n{line}"));
    }

    fn finish(self) -> Result<()> {
        let out = std::env::var("BENCH_OUT")
            .unwrap_or_else(|_| format!("{}/results.md", env!("CARGO_MANIFEST_DIR")));
        std::fs::write(&out, &self.text)?;
        println!("\nwritten to {out}");
        Ok(())
    }
}
