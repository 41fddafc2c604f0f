//! One real `redis-server` (or `valkey-server`) with the module, on its own port and directory,
//! with a start-up deadline; killed (and its directory removed) on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{Clock, eventually, exists, info_value};

/// How long a server may take to answer PING after start.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// Arguments of a primary without persistence that feeds a new replica at once (diskless sync, no
/// delay).
pub const PRIMARY_NO_PERSISTENCE: &[&str] =
    &["--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"];

/// Arguments of a server that fsyncs its AOF before every reply, without RDB snapshots.
pub const AOF_ALWAYS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always", "--save", ""];

/// The module under test: `$DLOCK_MODULE`, or the `libdlock.so` cargo built next to the running
/// binary (a test binary in `target/<profile>/deps`, or a binary in `target/<profile>`).
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

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// How to start a server: [`Server::start_with`] and its siblings cover the usual cases; a
/// `Launch` also picks the binary and the module (the benchmark has its own rules for both).
pub struct Launch {
    binary: String,
    module: Option<PathBuf>,
    /// Started without the module (`MODULE LOAD` later).
    bare: bool,
    args: Vec<String>,
    files: Vec<(String, Vec<u8>)>,
    env: Vec<(String, String)>,
}

impl Default for Launch {
    fn default() -> Self {
        Self::new()
    }
}

impl Launch {
    /// [`server_binary`] with [`module_path`], no extra arguments, an empty directory.
    pub fn new() -> Self {
        Self {
            binary: server_binary(),
            module: None,
            bare: false,
            args: Vec::new(),
            files: Vec::new(),
            env: Vec::new(),
        }
    }

    /// Runs this server binary instead of [`server_binary`].
    pub fn binary(mut self, binary: &str) -> Self {
        self.binary = binary.to_owned();
        self
    }

    /// Loads this module instead of [`module_path`].
    pub fn module(mut self, module: PathBuf) -> Self {
        self.module = Some(module);
        self
    }

    /// Starts the server without the module, with `MODULE LOAD` enabled: the test loads it
    /// ([`module_path`]) when it wants to.
    pub fn without_module(mut self) -> Self {
        self.bare = true;
        self.args.extend(["--enable-module-command".to_owned(), "yes".to_owned()]);
        self
    }

    /// Adds `redis-server` arguments; they come after the defaults, so they may override them.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Puts a file (a path relative to the server's directory) there before the server starts.
    pub fn file(mut self, name: &str, contents: &[u8]) -> Self {
        self.files.push((name.to_owned(), contents.to_vec()));
        self
    }

    /// Runs the server (and its restarts) on `clock`, whose wall clock steps when the test says.
    pub fn clock(mut self, clock: &Clock) -> Self {
        self.env.extend(clock.env());
        self
    }

    /// Starts the server; panics (with its log) if it does not answer within the deadline.
    pub fn start(self) -> Server {
        self.try_start().unwrap_or_else(|why| panic!("{why}"))
    }

    /// Starts the server, or says why it did not start.
    pub fn try_start(self) -> Result<Server, String> {
        let dir = tempfile::Builder::new()
            .prefix("dlock-test-")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        for (name, contents) in &self.files {
            let path = dir.path().join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| format!("mkdir: {e}"))?;
            }
            std::fs::write(&path, contents).map_err(|e| format!("write {name}: {e}"))?;
        }
        let module = match self.module {
            Some(module) => module,
            None => module_path(),
        };
        let mut server = Server {
            child: None,
            port: free_port(),
            dir,
            binary: self.binary,
            module: (!self.bare).then_some(module),
            args: self.args,
            env: self.env,
        };
        server.spawn(true)?;
        Ok(server)
    }
}

/// A running redis-server with the module.
pub struct Server {
    child: Option<Child>,
    /// The loopback port it listens on (kept across restarts).
    pub port: u16,
    dir: TempDir,
    binary: String,
    module: Option<PathBuf>,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Server {
    /// A server without persistence.
    pub fn start() -> Self {
        Self::start_with(&["--save", "", "--appendonly", "no"])
    }

    /// A server with extra `redis-server` arguments (they may override the defaults).
    pub fn start_with(args: &[&str]) -> Self {
        Launch::new().args(args).start()
    }

    /// A server whose directory holds `files` (name, contents) before it starts.
    pub fn start_with_files(files: &[(&str, &[u8])], args: &[&str]) -> Self {
        files
            .iter()
            .fold(Launch::new(), |launch, (name, contents)| launch.file(name, contents))
            .args(args)
            .start()
    }

    /// The server's directory (its RDB, AOF and log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the process; on a first start, retries on another port if this one was taken.
    fn spawn(&mut self, may_change_port: bool) -> Result<(), String> {
        for attempt in 1..=5 {
            match self.try_spawn() {
                Ok(()) => return Ok(()),
                Err(why) if attempt < 5 && may_change_port => {
                    eprintln!(
                        "redis-server on port {} failed ({why}); trying another port",
                        self.port
                    );
                    self.port = free_port();
                }
                Err(why) => return Err(format!("{why}; log:\n{}", self.log())),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Starts the process again on the same port and directory; panics if it does not come up.
    fn respawn(&mut self) {
        if let Err(why) = self.spawn(false) {
            panic!("{why}");
        }
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        let log = self.dir.path().join("redis.log");
        let mut child = Command::new(&self.binary)
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
            .args(self.module.iter().flat_map(|module| [Path::new("--loadmodule"), module]))
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{} must be installed (make deps): {e}", self.binary))?;
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
        info_value(&text, "process_id")?.parse().ok()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A new RESP2 connection, or why there is none (connecting gives up after 5 s).
    pub fn try_client(&self) -> redis::RedisResult<redis::Connection> {
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
        self.respawn();
    }

    /// Kills the server and starts it again with other arguments, same port and directory.
    pub fn crash_and_restart_with(&mut self, args: &[&str]) {
        self.kill();
        self.args = args.iter().map(|a| a.to_string()).collect();
        self.respawn();
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
        let mut launch = Launch::new().args(&["--save", "", "--appendonly", "yes"]).args(args);
        for entry in
            std::fs::read_dir(self.dir.path().join("appendonlydir")).expect("appendonlydir")
        {
            let path = entry.expect("AOF file").path();
            let name = path.file_name().expect("name").to_string_lossy().into_owned();
            launch = launch
                .file(&format!("appendonlydir/{name}"), &std::fs::read(&path).expect("read AOF"));
        }
        launch.start()
    }

    /// Waits up to `deadline` for the process to exit on its own; its exit status, if it did.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<ExitStatus> {
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

/// Waits (up to 20 s) until a write on `primary` reaches `replica`: after a diskless sync the
/// primary streams to a replica only once it has acknowledged, up to a second later. A marker key
/// is set until the replica shows it, then deleted, and the deletion awaited too.
pub fn wait_until_replica_streams(primary: &Server, replica: &Server) -> bool {
    let (mut p, mut r) = (primary.client(), replica.client());
    let streaming = eventually(Duration::from_secs(20), || {
        let _: redis::RedisResult<()> = redis::cmd("SET").arg("sync-marker").arg(1).query(&mut p);
        exists(&mut r, "sync-marker")
    });
    let _: redis::RedisResult<()> = redis::cmd("DEL").arg("sync-marker").query(&mut p);
    streaming && eventually(Duration::from_secs(5), || !exists(&mut r, "sync-marker"))
}

/// A primary and a replica that streams from it, each without persistence unless the extra
/// arguments (applied after the defaults) say otherwise. Returns once writes reach the replica.
pub fn primary_and_replica_with(primary_args: &[&str], replica_args: &[&str]) -> (Server, Server) {
    let primary = Server::start_with(
        &[&["--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"], primary_args]
            .concat(),
    );
    let port = primary.port.to_string();
    let replica = Server::start_with(
        &[
            &["--save", "", "--appendonly", "no"],
            replica_args,
            &["--replicaof", "127.0.0.1", &port],
        ]
        .concat(),
    );
    assert!(
        wait_until_replica_streams(&primary, &replica),
        "the replica does not receive the primary's writes"
    );
    (primary, replica)
}
