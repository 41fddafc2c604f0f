//! The server every scenario runs against, and clients on threads.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use dlock_testkit::{Launch, Rng, Server, info_value};

pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A redis-server (never `$DLOCK_SERVER`) with the release module: `$DLOCK_MODULE`, else
/// `target/release/libdlock.so` of this repository. The floor module (`bench/floor`,
/// `libdlock_floor.so` next to it) is loaded too when it was built.
pub fn start_server() -> Result<Server> {
    start_server_with(module_path())
}

/// The module benchmarked: `$DLOCK_MODULE`, else `target/release/libdlock.so`.
pub fn module_path() -> PathBuf {
    match std::env::var_os("DLOCK_MODULE") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/libdlock.so"),
    }
}

/// A redis-server like [`start_server`]'s with the module at `module` (and the floor module when
/// it was built next to it).
pub fn start_server_with(module: PathBuf) -> Result<Server> {
    let module = module.canonicalize()?;
    let floor = module.with_file_name("libdlock_floor.so");
    let floor = floor.exists().then(|| floor.display().to_string());
    let floor_args: Vec<&str> = floor.iter().flat_map(|path| ["--loadmodule", path]).collect();
    Ok(Launch::new()
        .binary("redis-server")
        .module(module)
        .args(&["--save", "", "--appendonly", "no"])
        .args(&["--maxclients", "19900", "--loglevel", "warning"])
        .args(&floor_args)
        .try_start()?)
}

/// Empties the server between cases.
pub fn flush(server: &Server) -> Result<()> {
    let mut con = server.try_client()?;
    redis::cmd("FLUSHALL").arg("SYNC").query::<()>(&mut con)?;
    Ok(())
}

/// `used_memory` from `INFO memory`, in bytes.
pub fn used_memory(server: &Server) -> Result<f64> {
    used_memory_on(&mut server.try_client()?)
}

/// `used_memory` read on an open connection.
pub fn used_memory_on(probe: &mut redis::Connection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("memory").query(probe)?;
    Ok(info_value(&info, "used_memory").ok_or("no used_memory")?.parse()?)
}

/// `used_memory` once it holds still (within 16 KB over a second, for at most 3 minutes): what
/// an earlier case left in the server's pool of module clients is trimmed first (tens of
/// thousands of them after the waiters case, about 500 a second), so a baseline taken here is not
/// undercut by that trimming while a case runs.
pub fn settled_memory(probe: &mut redis::Connection) -> Result<f64> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(180);
    let mut last = used_memory_on(probe)?;
    loop {
        thread::sleep(Duration::from_secs(1));
        let now = used_memory_on(probe)?;
        if (now - last).abs() < 16.0 * 1024.0 {
            return Ok(now);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "used_memory did not settle in {} s (last step {:.0} bytes)",
                started.elapsed().as_secs(),
                now - last
            )
            .into());
        }
        last = now;
    }
}

/// Runs `f` on `clients` threads, each with its own connection and random source, for `seconds`;
/// returns the sum of what the threads count.
pub fn run_clients(
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
        let mut con = server.try_client()?;
        let (f, start, stop, total) = (f.clone(), start.clone(), stop.clone(), total.clone());
        handles.push(thread::spawn(move || -> Result<()> {
            let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15 ^ ((client as u64 + 1) * 0x1000_0001));
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

/// A 36-byte token of this client's own: competing clients must not share an identity.
pub fn client_token(rng: &mut Rng) -> String {
    format!("{:018x}{:018x}", rng.next() >> 8, rng.next() >> 8)
}

/// A thread that sends PING every millisecond on a connection of its own, until finished.
pub struct PingProbe {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Result<Vec<f64>>>,
}

impl PingProbe {
    pub fn start(server: &Server) -> Result<Self> {
        let mut con = server.try_client()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let handle = thread::spawn(move || -> Result<Vec<f64>> {
            let mut rtts = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                let sent = Instant::now();
                redis::cmd("PING").query::<String>(&mut con)?;
                rtts.push(sent.elapsed().as_secs_f64() * 1e6);
                thread::sleep(Duration::from_millis(1));
            }
            Ok(rtts)
        });
        Ok(Self { stop, handle })
    }

    /// Stops the probe; answers its round trips in µs, sorted.
    pub fn finish(self) -> Result<Vec<f64>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut rtts = self.handle.join().map_err(|_| "PING probe panicked")??;
        rtts.sort_by(f64::total_cmp);
        Ok(rtts)
    }
}
