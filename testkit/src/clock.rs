//! A server's wall clock that steps on demand: `clockshim/clockshim.c`, preloaded into the
//! server (`LD_PRELOAD`), adds the offset a [`Clock`] writes to its file to `CLOCK_REALTIME`,
//! `gettimeofday()` and `time()`, and leaves the monotonic clocks alone. The shim is compiled
//! once per source into the temp directory with the system's `cc`.
//!
//! (libfaketime does the same but hangs Debian's Redis 7.0 at start: that server links the
//! system jemalloc, which reads the clock while libfaketime is still initialising.)

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tempfile::TempDir;

const SOURCE: &str = include_str!("../clockshim/clockshim.c");

/// The compiled shim, built on first use (and kept in the temp directory for later runs).
pub fn clock_shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let mut hasher = DefaultHasher::new();
        SOURCE.hash(&mut hasher);
        let shim =
            std::env::temp_dir().join(format!("dlock-clockshim-{:016x}.so", hasher.finish()));
        if !shim.exists() {
            let id = std::process::id();
            let source = shim.with_extension(format!("{id}.c"));
            let built = shim.with_extension(format!("{id}.so"));
            std::fs::write(&source, SOURCE).expect("write the clock shim's source");
            let status = Command::new("cc")
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .arg(&built)
                .arg(&source)
                .status()
                .expect("cc must be installed (make deps) to build the clock shim");
            assert!(status.success(), "cc failed to build the clock shim");
            // A rename is atomic: test processes building it at once each get a whole file.
            std::fs::rename(&built, &shim).expect("install the clock shim");
            let _ = std::fs::remove_file(&source);
        }
        shim
    })
}

/// The offset of one or more servers' wall clocks from the machine's, in microseconds; servers
/// started with [`crate::Launch::clock`] read it within 2 ms of a change (restarts included).
#[derive(Debug)]
pub struct Clock {
    dir: TempDir,
    offset_us: AtomicI64,
    step_monotonic: bool,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock at the machine's time (offset 0).
    pub fn new() -> Self {
        let clock = Self {
            dir: tempfile::Builder::new().prefix("dlock-clock-").tempdir().expect("tempdir"),
            offset_us: AtomicI64::new(0),
            step_monotonic: false,
        };
        clock.set_offset_us(0);
        clock
    }

    /// A broken clock for self-checks: its monotonic clock steps with the wall clock, which no
    /// real machine's does.
    pub fn stepping_monotonic_too() -> Self {
        Self { step_monotonic: true, ..Self::new() }
    }

    /// Sets the offset from the machine's wall clock.
    pub fn set_offset_us(&self, offset_us: i64) {
        let file = self.file();
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, offset_us.to_string()).expect("write the clock offset");
        std::fs::rename(&tmp, &file).expect("install the clock offset");
        self.offset_us.store(offset_us, Ordering::SeqCst);
        // The shim reads the file at most every 2 ms.
        std::thread::sleep(Duration::from_millis(5));
    }

    /// Steps the clock forward by `by`.
    pub fn forward(&self, by: Duration) {
        self.set_offset_us(self.offset_us() + by.as_micros() as i64);
    }

    /// Steps the clock backward by `by`.
    pub fn backward(&self, by: Duration) {
        self.set_offset_us(self.offset_us() - by.as_micros() as i64);
    }

    /// The offset now.
    pub fn offset_us(&self) -> i64 {
        self.offset_us.load(Ordering::SeqCst)
    }

    /// The environment a server needs to run on this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("LD_PRELOAD".to_owned(), clock_shim().display().to_string()),
            ("DLOCK_CLOCK_OFFSET_FILE".to_owned(), self.file().display().to_string()),
        ];
        if self.step_monotonic {
            env.push(("DLOCK_CLOCK_STEP_MONOTONIC".to_owned(), "1".to_owned()));
        }
        env
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("offset-us")
    }
}
