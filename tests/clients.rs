//! The lifecycle from the clients most users already have: redis-py (RESP2 and RESP3) and
//! node-redis (RESP2 and RESP3; a fence must reach JavaScript exactly). The snippets that
//! docs/clients.md prints are files here, run as they are. Libraries go into .deps/, at the
//! versions scripts/clients.sh pins.

use std::path::Path;
use std::process::Command;

use dlock_testkit::*;

fn project() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn install_clients() {
    let status =
        Command::new("bash").arg(project().join("scripts/clients.sh")).status().expect("bash");
    assert!(status.success(), "installing redis-py and node-redis failed");
}

fn run(program: &str, script: &str, env: (&str, &Path), port: u16) -> String {
    let output = Command::new(program)
        .arg(project().join("tests/clients").join(script))
        .arg(port.to_string())
        .env(env.0, env.1)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{script} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn python(script: &str, port: u16) -> String {
    run("python3", script, ("PYTHONPATH", &project().join(".deps/python")), port)
}

fn node(script: &str, port: u16) -> String {
    run("node", script, ("NODE_PATH", &project().join(".deps/node/node_modules")), port)
}

#[test]
fn the_lifecycle_works_from_redis_py_and_node_redis() {
    install_clients();
    let server = Server::start();
    python("lifecycle.py", server.port);
    node("lifecycle.cjs", server.port);
}

#[test]
fn the_snippets_docs_clients_md_prints_are_these_files_and_they_run() {
    let page = std::fs::read_to_string(project().join("docs/clients.md")).expect("docs/clients.md");
    for snippet in ["snippet.py", "snippet.cjs", "snippet.go"] {
        let text = std::fs::read_to_string(project().join("tests/clients").join(snippet))
            .expect("snippet file");
        assert!(page.contains(&text), "docs/clients.md must print tests/clients/{snippet} as is");
    }
    install_clients();
    let server = Server::start();
    let mut con = server.client();
    assert!(python("snippet.py", server.port).starts_with("paid under fence "));
    assert!(node("snippet.cjs", server.port).starts_with("paid under fence "));
    let status: String =
        redis::cmd("HGET").arg("invoice:{123}:data").arg("status").query(&mut con).expect("HGET");
    assert_eq!(status, "paid");
    // Both released in `finally`: no lock key is left.
    assert!(!exists(&mut con, "invoice:{123}"));
    // Held by someone else: the snippets give up after their WAIT and write nothing.
    assert!(acquire(&mut con, "invoice:{123}", "someone-else", 60_000).is_some());
    let _: () = redis::cmd("DEL").arg("invoice:{123}:data").query(&mut con).expect("DEL");
    let refused = Command::new("python3")
        .arg(project().join("tests/clients/snippet.py"))
        .arg(server.port.to_string())
        .env("PYTHONPATH", project().join(".deps/python"))
        .output()
        .expect("python3");
    assert!(!refused.status.success(), "the Python snippet exits non-zero when the lock is held");
    assert!(node("snippet.cjs", server.port).contains("held by someone else"));
    assert!(!exists(&mut con, "invoice:{123}:data"), "nothing was written");
    // Each snippet waited once and timed out once in the server: no client-side timeout gave up
    // first, and no retry queued the token again.
    let count = |con: &mut redis::Connection, field: &str| {
        info_line(con, "dlock", &format!("dlock_{field}")).expect("INFO dlock field")
    };
    assert_eq!(count(&mut con, "waits_started"), "2");
    assert_eq!(count(&mut con, "waits_timed_out"), "2");
}
