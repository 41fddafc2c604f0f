//! The lifecycle from the clients most users already have: redis-py (RESP2 and RESP3) and
//! node-redis (a fence must reach JavaScript exactly). Their libraries go into .deps/.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn project() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn install_clients() {
    let status =
        Command::new("bash").arg(project().join("scripts/clients.sh")).status().expect("bash");
    assert!(status.success(), "installing redis-py and node-redis failed");
}

fn run(program: &str, script: &str, env: (&str, &Path), port: u16) {
    let output = Command::new(program)
        .arg(project().join("tests/clients").join(script))
        .arg(port.to_string())
        .env(env.0, env.1)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        output.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_lifecycle_works_from_redis_py_and_node_redis() {
    install_clients();
    let server = Server::start();
    run("python3", "lifecycle.py", ("PYTHONPATH", &project().join(".deps/python")), server.port);
    run(
        "node",
        "lifecycle.cjs",
        ("NODE_PATH", &project().join(".deps/node/node_modules")),
        server.port,
    );
}
