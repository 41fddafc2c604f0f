//! A throwaway PostgreSQL from Debian's packages: its own data directory, a free loopback port,
//! `trust` authentication for the user `dlock`; stopped and removed on drop. Never assumes a
//! running server. `initdb` refuses to run as root, so as root the server runs as `postgres`.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::free_port;

/// The database user the tests connect as.
pub const PG_USER: &str = "dlock";

/// A running PostgreSQL server.
pub struct Postgres {
    child: Option<Child>,
    /// The loopback port it listens on.
    pub port: u16,
    dir: TempDir,
}

/// The directory of `initdb` and `postgres`: `$DLOCK_PG_BIN`, or the newest
/// `/usr/lib/postgresql/<version>/bin`.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DLOCK_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed (run `make deps`)")
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).expect("no /usr/lib/postgresql/*/bin/initdb")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
}

/// `program args…`, as the `postgres` user when running as root.
fn command(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

impl Postgres {
    /// Creates a cluster in a temporary directory and starts it on a free loopback port.
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = tempfile::Builder::new().prefix("dlock-pg").tempdir().expect("tempdir");
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(status.success(), "chown of the data directory to postgres failed");
        }
        let data = dir.path().join("data");
        let output = command(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", PG_USER, "--no-sync", "-E", "UTF8", "--locale=C"])
            .output()
            .expect("run initdb");
        assert!(
            output.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("postgres.log")).expect("log file");
        let child = command(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.path().display()))
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start postgres");
        let server = Self { child: Some(child), port, dir };
        server.wait_until_ready(&bin);
        server
    }

    fn wait_until_ready(&self, bin: &Path) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let ready = TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && Command::new(bin.join("pg_isready"))
                    .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", PG_USER])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|status| status.success());
            if ready {
                return;
            }
            sleep(Duration::from_millis(50));
        }
        panic!("postgres did not start on port {}:\n{}", self.port, self.log());
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// A connection string for `tokio-postgres` / `postgres`.
    pub fn config(&self) -> String {
        format!("host=127.0.0.1 port={} user={PG_USER} dbname=postgres", self.port)
    }

    /// The same as a URL.
    pub fn url(&self) -> String {
        format!("postgres://{PG_USER}@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The child may be `runuser`; kill the server by its pid file if it is there.
            if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("data/postmaster.pid"))
                && let Some(pid) = pid.lines().next()
            {
                let _ = Command::new("kill").args(["-INT", pid.trim()]).status();
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
