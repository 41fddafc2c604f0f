//! Test harness: one real `redis-server` per test, on its own port and directory, with the
//! freshly built module loaded; killed (and its directory removed) on drop.

#![allow(dead_code)] // Each test binary uses a different part of the harness.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a server may take to answer PING after start.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// The module under test: `$DLOCK_MODULE`, or the `.so` cargo built next to this test binary.
pub fn module_path() -> PathBuf {
    if let Some(path) = std::env::var_os("DLOCK_MODULE") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    for candidate in [deps.join("libdlock.so"), deps.join("../libdlock.so")] {
        if candidate.exists() {
            return candidate.canonicalize().expect("absolute module path");
        }
    }
    panic!("libdlock.so not found next to {}; run through cargo test", exe.display());
}

/// The server under test: `$DLOCK_SERVER` (e.g. a `valkey-server`), or `redis-server`.
pub fn server_binary() -> String {
    std::env::var("DLOCK_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// A running redis-server with the module.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    dir: TempDir,
    args: Vec<String>,
}

impl Server {
    /// A server without persistence.
    pub fn start() -> Self {
        Self::start_with(&["--save", "", "--appendonly", "no"])
    }

    /// A server with extra `redis-server` arguments (they may override the defaults).
    pub fn start_with(args: &[&str]) -> Self {
        Self::start_with_files(&[], args)
    }

    /// A server whose directory holds `files` (name, contents) before it starts.
    pub fn start_with_files(files: &[(&str, &[u8])], args: &[&str]) -> Self {
        let dir = tempfile::Builder::new().prefix("dlock-test-").tempdir().expect("tempdir");
        for (name, contents) in files {
            std::fs::write(dir.path().join(name), contents).expect("write server file");
        }
        let mut server = Server {
            child: None,
            port: free_port(),
            dir,
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        server.spawn(true);
        server
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the process; on a first start, retries on another port if this one was taken.
    fn spawn(&mut self, may_change_port: bool) {
        for attempt in 1..=5 {
            match self.try_spawn() {
                Ok(()) => return,
                Err(why) if attempt < 5 && may_change_port => {
                    eprintln!(
                        "redis-server on port {} failed ({why}); trying another port",
                        self.port
                    );
                    self.port = free_port();
                }
                Err(why) => panic!("{why}; log:\n{}", self.log()),
            }
        }
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        let log = self.dir.path().join("redis.log");
        let mut child = Command::new(server_binary())
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .arg("--loglevel")
            .arg("verbose")
            .arg("--enable-debug-command")
            .arg("yes")
            .arg("--loadmodule")
            .arg(module_path())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (make deps)");
        let started = Instant::now();
        loop {
            // Another test's server may hold the port: only our own process counts as ready, and
            // only once it has loaded its data set (INFO answers while loading, PING does not).
            if self.answering_pid() == Some(child.id()) && self.has_loaded() {
                self.child = Some(child);
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("redis-server exited with {status}"));
            }
            if started.elapsed() > START_DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("redis-server not ready after {START_DEADLINE:?}"));
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server on our port answers PING, which it refuses with LOADING until its RDB
    /// or AOF is loaded.
    fn has_loaded(&self) -> bool {
        self.try_client().is_ok_and(|mut con| redis::cmd("PING").query::<String>(&mut con).is_ok())
    }

    /// The process id of whatever redis-server answers on our port.
    fn answering_pid(&self) -> Option<u32> {
        let mut con = self.try_client().ok()?;
        let text: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
        text.lines().find_map(|line| line.strip_prefix("process_id:")?.trim().parse().ok())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn try_client(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(5))
    }

    /// A new RESP2 connection.
    pub fn client(&self) -> redis::Connection {
        self.try_client().expect("connect")
    }

    /// A new RESP3 connection.
    pub fn client_resp3(&self) -> redis::Connection {
        redis::Client::open(format!("{}?protocol=resp3", self.url()))
            .and_then(|c| c.get_connection())
            .expect("connect with RESP3")
    }

    /// Creates (or updates) ACL user `name` with password `secret` and `rules`, and connects as it.
    pub fn client_as(&self, name: &str, rules: &[&str]) -> redis::Connection {
        let mut admin = self.client();
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(name)
            .arg(&["on", ">secret"])
            .arg(rules)
            .query(&mut admin)
            .expect("ACL SETUSER");
        redis::Client::open(format!("redis://{name}:secret@127.0.0.1:{}/", self.port))
            .and_then(|c| c.get_connection())
            .expect("AUTH")
    }

    /// SIGKILL: the process dies without saving anything.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again on the same port and directory.
    pub fn crash_and_restart(&mut self) {
        self.kill();
        self.spawn(false);
    }

    /// Kills the server and starts it again with other arguments, same port and directory.
    pub fn crash_and_restart_with(&mut self, args: &[&str]) {
        self.kill();
        self.args = args.iter().map(|a| a.to_string()).collect();
        self.spawn(false);
    }

    /// SIGSTOP: the process freezes (a long GC pause, a stalled VM).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`Server::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill").arg(signal).arg(pid).status().expect("kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Every AOF file's bytes, concatenated (base first, then increments).
    pub fn aof_contents(&self) -> Vec<u8> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.path().join("appendonlydir"))
            .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.sort_by_key(|path| !path.to_string_lossy().contains(".base."));
        files
            .iter()
            .filter(|p| !p.to_string_lossy().ends_with(".manifest"))
            .flat_map(|p| std::fs::read(p).unwrap_or_default())
            .collect()
    }

    /// A new server loaded from a copy of this server's AOF directory as it is on disk now (with
    /// `appendfsync always`, every acknowledged write); this server is left untouched.
    pub fn start_from_aof_copy(&self, args: &[&str]) -> Server {
        let source = self.dir.path().join("appendonlydir");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&source).expect("appendonlydir") {
            let path = entry.expect("AOF file").path();
            let name = path.file_name().expect("name").to_string_lossy().into_owned();
            files.push((format!("appendonlydir/{name}"), std::fs::read(&path).expect("read AOF")));
        }
        let dir = tempfile::Builder::new().prefix("dlock-test-").tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("appendonlydir")).expect("mkdir");
        for (name, contents) in &files {
            std::fs::write(dir.path().join(name), contents).expect("write AOF copy");
        }
        let mut all = vec!["--save", "", "--appendonly", "yes"];
        all.extend_from_slice(args);
        let mut server = Server {
            child: None,
            port: free_port(),
            dir,
            args: all.iter().map(|a| a.to_string()).collect(),
        };
        server.spawn(true);
        server
    }

    /// Waits up to `deadline` for the process to exit on its own; its exit status, if it did.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Some(status);
            }
            sleep(Duration::from_millis(10));
        }
        None
    }

    /// Whether the process is still running (it did not crash).
    pub fn is_alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The error reply of a command as the server sent it: `CODE detail`.
pub fn error_text(result: redis::RedisResult<redis::Value>) -> String {
    match result {
        Ok(value) => panic!("expected an error reply, got {value:?}"),
        Err(error) => match (error.code(), error.detail()) {
            (Some(code), Some(detail)) => format!("{code} {detail}"),
            (Some(code), None) => code.to_string(),
            _ => error.to_string(),
        },
    }
}

/// Polls `probe` every few milliseconds until it returns true or `deadline` passes.
pub fn eventually(deadline: Duration, mut probe: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < deadline {
        if probe() {
            return true;
        }
        sleep(Duration::from_millis(5));
    }
    probe()
}

pub fn acquire(
    con: &mut redis::Connection,
    resource: &str,
    token: &str,
    ttl_ms: u64,
) -> Option<i64> {
    redis::cmd("DLOCK.ACQUIRE").arg(resource).arg(token).arg(ttl_ms).query(con).expect("ACQUIRE")
}

pub fn renew(con: &mut redis::Connection, resource: &str, token: &str, ttl_ms: u64) -> i64 {
    redis::cmd("DLOCK.RENEW").arg(resource).arg(token).arg(ttl_ms).query(con).expect("RENEW")
}

pub fn release(con: &mut redis::Connection, resource: &str, token: &str) -> i64 {
    redis::cmd("DLOCK.RELEASE").arg(resource).arg(token).query(con).expect("RELEASE")
}

pub fn fencecheck(con: &mut redis::Connection, resource: &str, fence: i64) -> i64 {
    redis::cmd("DLOCK.FENCECHECK").arg(resource).arg(fence).query(con).expect("FENCECHECK")
}

/// DLOCK.INFO as (field, value) pairs rendered as strings, or None for nil.
pub fn info(con: &mut redis::Connection, resource: &str) -> Option<Vec<(String, String)>> {
    let value: redis::Value = redis::cmd("DLOCK.INFO").arg(resource).query(con).expect("INFO");
    let render = |v: &redis::Value| match v {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    };
    match value {
        redis::Value::Nil => None,
        redis::Value::Array(items) => {
            Some(items.chunks(2).map(|pair| (render(&pair[0]), render(&pair[1]))).collect())
        }
        redis::Value::Map(pairs) => {
            Some(pairs.iter().map(|(k, v)| (render(k), render(v))).collect())
        }
        other => panic!("unexpected DLOCK.INFO reply {other:?}"),
    }
}

/// One field of DLOCK.INFO.
pub fn info_field(con: &mut redis::Connection, resource: &str, field: &str) -> Option<String> {
    info(con, resource)?.into_iter().find(|(name, _)| name == field).map(|(_, value)| value)
}

pub fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

pub fn dbsize(con: &mut redis::Connection) -> i64 {
    redis::cmd("DBSIZE").query(con).expect("DBSIZE")
}

/// Arguments of a server that fsyncs its AOF before every reply, without RDB snapshots.
pub const AOF_ALWAYS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always", "--save", ""];

/// The `field:value` of a line in `INFO section`.
pub fn info_line(con: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
    text.lines().find_map(|line| line.strip_prefix(&format!("{field}:")).map(str::to_owned))
}

/// Waits until no AOF rewrite or RDB save runs.
pub fn wait_for_background_persistence(con: &mut redis::Connection) {
    let idle = |con: &mut redis::Connection| {
        ["aof_rewrite_in_progress", "aof_rewrite_scheduled", "rdb_bgsave_in_progress"]
            .iter()
            .all(|field| info_line(con, "persistence", field).as_deref() == Some("0"))
    };
    assert!(
        eventually(Duration::from_secs(20), || idle(con)),
        "background persistence did not finish"
    );
}

/// Microseconds since the Unix epoch, as the module mints fences.
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_micros()
        as i64
}

/// Encodes a command in RESP, as the AOF stores it.
pub fn resp_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A TCP forwarder in front of a server, for cutting a replication link on demand.
pub struct LinkProxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    drop_next_reply: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<std::net::TcpStream>>>,
    /// Connections numbered below this forward nothing more, but stay open (a half-open link).
    silent_below: Arc<AtomicU64>,
    /// The number of the last accepted connection.
    accepted: Arc<AtomicU64>,
}

impl LinkProxy {
    /// Forwards connections on a fresh local port to `127.0.0.1:target_port`.
    pub fn start(target_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let proxy = LinkProxy {
            port,
            cut: Arc::default(),
            drop_next_reply: Arc::default(),
            streams: Arc::default(),
            silent_below: Arc::default(),
            accepted: Arc::default(),
        };
        let accepted = proxy.accepted.clone();
        let (cut, drop_reply, open, silent_below) = (
            proxy.cut.clone(),
            proxy.drop_next_reply.clone(),
            proxy.streams.clone(),
            proxy.silent_below.clone(),
        );
        std::thread::spawn(move || {
            for (number, client) in (1u64..).zip(listener.incoming()) {
                accepted.store(number, Ordering::SeqCst);
                let Ok(client) = client else { continue };
                if cut.load(Ordering::SeqCst) {
                    continue; // dropped: the link stays down
                }
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target_port)) else {
                    continue;
                };
                let mut open = open.lock().expect("proxy streams");
                for (from, to, replies) in [(&client, &server, false), (&server, &client, true)] {
                    let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else { continue };
                    let drop_reply = drop_reply.clone();
                    let silent = (silent_below.clone(), number);
                    std::thread::spawn(move || {
                        forward(from, to, replies.then_some(drop_reply), silent)
                    });
                }
                open.push(client);
                open.push(server);
            }
        });
        proxy
    }

    /// Cuts every forwarded connection at once and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for stream in self.streams.lock().expect("proxy streams").iter() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The next reply from the server is swallowed and its connection closed: the request was
    /// carried out, the client never learns how.
    pub fn drop_next_reply(&self) {
        self.drop_next_reply.store(true, Ordering::SeqCst);
    }

    /// Every connection open now goes silent: what is sent is swallowed, nothing is closed (the
    /// peer vanished without a FIN). New connections work.
    pub fn silence_open_connections(&self) {
        let last = self.accepted.load(Ordering::SeqCst);
        self.silent_below.store(last + 1, Ordering::SeqCst);
    }
}

/// Copies one direction of a proxied connection; a reply direction obeys `drop_reply`.
fn forward(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    drop_reply: Option<Arc<AtomicBool>>,
    (silent_below, number): (Arc<AtomicU64>, u64),
) {
    use std::io::{Read, Write};
    let mut buffer = [0u8; 16 * 1024];
    while let Ok(read) = from.read(&mut buffer) {
        if read == 0 {
            break;
        }
        if number < silent_below.load(Ordering::SeqCst) {
            continue; // swallowed
        }
        if drop_reply.as_ref().is_some_and(|flag| flag.swap(false, Ordering::SeqCst)) {
            let _ = from.shutdown(std::net::Shutdown::Both);
            break;
        }
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// A primary and a replica that streams from it, each without persistence unless the extra
/// arguments (applied after the defaults) say otherwise. Returns once writes reach the replica.
pub fn primary_and_replica_with(primary_args: &[&str], replica_args: &[&str]) -> (Server, Server) {
    let mut args = vec!["--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"];
    args.extend_from_slice(primary_args);
    let primary = Server::start_with(&args);
    let port = primary.port.to_string();
    let mut args = vec!["--save", "", "--appendonly", "no"];
    args.extend_from_slice(replica_args);
    args.extend_from_slice(&["--replicaof", "127.0.0.1", &port]);
    let replica = Server::start_with(&args);
    // After a diskless sync the primary streams to the replica only once the replica has
    // acknowledged (up to a second later): wait until a marker write arrives.
    let (mut p, mut r) = (primary.client(), replica.client());
    let streaming = eventually(Duration::from_secs(20), || {
        let _: () = redis::cmd("SET").arg("sync-marker").arg(1).query(&mut p).expect("SET");
        exists(&mut r, "sync-marker")
    });
    assert!(streaming, "the replica does not receive the primary's writes");
    let _: () = redis::cmd("DEL").arg("sync-marker").query(&mut p).expect("DEL");
    assert!(eventually(Duration::from_secs(5), || !exists(&mut r, "sync-marker")));
    (primary, replica)
}

/// `DEBUG DIGEST-VALUE` of one key.
pub fn digest(con: &mut redis::Connection, key: &str) -> String {
    let digests: Vec<String> =
        redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(con).expect("DIGEST-VALUE");
    digests.into_iter().next().expect("one digest")
}

/// A small seeded generator (SplitMix64): the same seed gives the same choices.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi.saturating_sub(lo) + 1)
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

/// A seed from `$name` (to replay a failure), or a fresh one; printed either way.
pub fn seed_from_env(name: &str) -> u64 {
    let seed = std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("{name}={seed}");
    seed
}
