//! The release artifacts of `scripts/dist.sh` (`make dist`): the tarball holds what an operator
//! needs and its checksums hold; the Debian package puts the module and its configuration
//! snippet in place, and a server whose configuration includes the snippet loads the module and
//! grants.
//!
//! With `DLOCK_TEST_DPKG_INSTALL=1` (CI sets it: its machine is thrown away) the package is
//! installed with `dpkg -i` into the machine itself and purged afterwards; otherwise it is
//! unpacked with `dpkg-deb -x` into a temporary root, so a developer's machine is left alone.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::*;

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The crate's version, as `Cargo.toml` gives it to the build.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Starts the server with `conf` (its only configuration), waits for it, returns it and a client.
fn serve(conf: &Path, dir: &Path) -> (std::process::Child, redis::Connection) {
    let port = free_port();
    let mut child = Command::new(server_binary())
        .arg(conf)
        .args(["--port", &port.to_string(), "--dir"])
        .arg(dir)
        .args(["--save", "", "--logfile"])
        .arg(dir.join("server.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
        if let Ok(con) = client.get_connection() {
            return (child, con);
        }
        if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
            let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
            let _ = child.kill();
            panic!("the server did not start with {}:\n{log}", conf.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_tarball_and_the_debian_package_install_and_load() {
    let out = tempfile::tempdir().expect("tempdir");
    let project = Path::new(env!("CARGO_MANIFEST_DIR"));
    run(Command::new("bash")
        .arg(project.join("scripts/dist.sh"))
        .arg("--module")
        .arg(module_path())
        .arg("--out")
        .arg(out.path()));
    let arch = run(Command::new("dpkg").arg("--print-architecture")).trim().to_owned();
    let tarball = format!("dlock-{VERSION}-linux-{arch}.tar.gz");
    let package = format!("redis-dlock_{VERSION}_{arch}.deb");
    run(Command::new("sha256sum").arg("-c").arg("SHA256SUMS").current_dir(out.path()));

    // The tarball: everything an operator needs, each file with its checksum.
    run(Command::new("tar").arg("xzf").arg(&tarball).current_dir(out.path()));
    let unpacked = out.path().join(format!("dlock-{VERSION}-linux-{arch}"));
    for file in [
        "libdlock.so",
        "dlock.conf",
        "redis.conf.example",
        "README.md",
        "docs/operations.md",
        "docs/commands/dlock.acquire.md",
    ] {
        assert!(unpacked.join(file).is_file(), "the tarball has {file}");
    }
    let checked = run(Command::new("sha256sum").arg("-c").arg("SHA256SUMS").current_dir(&unpacked));
    assert!(checked.contains("libdlock.so: OK"), "{checked}");

    // The package: installed (CI) or unpacked, then a server including its snippet.
    let installed = std::env::var("DLOCK_TEST_DPKG_INSTALL").as_deref() == Ok("1");
    let root = out.path().join("root");
    let snippet = if installed {
        run(Command::new("dpkg").arg("-i").arg(out.path().join(&package)));
        std::fs::read_to_string("/etc/redis/dlock.conf").expect("the package's snippet")
    } else {
        run(Command::new("dpkg-deb").arg("-x").arg(out.path().join(&package)).arg(&root));
        std::fs::read_to_string(root.join("etc/redis/dlock.conf"))
            .expect("the package's snippet")
            .replace(
                "/usr/lib/redis/modules/",
                &format!("{}/usr/lib/redis/modules/", root.display()),
            )
    };
    assert!(snippet.contains("loadmodule "), "{snippet}");
    let conf = out.path().join("redis.conf");
    let snippet_path = out.path().join("dlock.conf");
    std::fs::write(&snippet_path, &snippet).expect("snippet");
    std::fs::write(&conf, format!("include {}\n", snippet_path.display())).expect("redis.conf");
    let data = out.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    let (mut server, mut con) = serve(&conf, &data);
    let fence = acquire(&mut con, "invoice:1", "worker", 30_000);
    let version = info_line(&mut con, "dlock", "dlock_version");
    let appendonly: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("appendonly").query(&mut con).expect("CONFIG GET");
    let _ = server.kill();
    let _ = server.wait();
    if installed {
        run(Command::new("dpkg").arg("-P").arg("redis-dlock"));
        assert!(!Path::new("/usr/lib/redis/modules/libdlock.so").exists(), "purged");
    }
    assert!(fence.is_some(), "the installed module grants");
    assert_eq!(version.as_deref(), Some(VERSION));
    assert_eq!(appendonly[1], "yes", "the snippet's settings apply");
}
