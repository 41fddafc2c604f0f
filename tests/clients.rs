//! The lifecycle from the clients most users already have: redis-py (RESP2 and RESP3) and
//! node-redis (RESP2 and RESP3; a fence must reach JavaScript exactly). What the defaults of
//! redis-py, node-redis, ioredis and valkey-glide do to `DLOCK.ACQUIRE … WAIT`, and that the
//! settings docs/clients.md recommends make one WAIT one wait in the server; ioredis in Redis
//! Cluster with and without the keyed command of tests/clients/dlock_ioredis.cjs. The snippets
//! that docs/clients.md prints are files here, run as they are. Libraries go into .deps/, at the
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
    assert!(status.success(), "installing the client libraries failed");
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
    for snippet in [
        "snippet.py",
        "snippet.cjs",
        "snippet.go",
        "snippet_ioredis.cjs",
        "snippet_glide.cjs",
        "dlock_ioredis.cjs",
    ] {
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

#[test]
fn the_ioredis_and_glide_snippets_run_with_the_lock_free_and_held() {
    install_clients();
    let server = Server::start();
    let mut con = server.client();
    let paid = |con: &mut redis::Connection| {
        let status: Option<String> =
            redis::cmd("HGET").arg("invoice:{123}:data").arg("status").query(con).expect("HGET");
        let _: () = redis::cmd("DEL").arg("invoice:{123}:data").query(con).expect("DEL");
        status.as_deref() == Some("paid")
    };
    for snippet in ["snippet_ioredis.cjs", "snippet_glide.cjs"] {
        assert!(node(snippet, server.port).starts_with("paid under fence "), "{snippet}");
        assert!(paid(&mut con), "{snippet} wrote under the fence");
        assert!(!exists(&mut con, "invoice:{123}"), "{snippet} released in `finally`");
    }
    // Held by someone else: both give up after 5 s (run side by side) and write nothing.
    assert!(acquire(&mut con, "invoice:{123}", "someone-else", 60_000).is_some());
    let spawn = |snippet: &str| {
        Command::new("node")
            .arg(project().join("tests/clients").join(snippet))
            .arg(server.port.to_string())
            .env("NODE_PATH", project().join(".deps/node/node_modules"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("node")
    };
    let running = [spawn("snippet_ioredis.cjs"), spawn("snippet_glide.cjs")];
    for child in running {
        let output = child.wait_with_output().expect("snippet");
        assert!(output.status.success());
        assert!(String::from_utf8_lossy(&output.stdout).contains("held by someone else"));
    }
    assert!(!paid(&mut con), "nothing was written");
    // ioredis waited once in the server and timed out there (its commandTimeout is above the
    // wait); glide waited in the line with a ticket and never blocked.
    assert_eq!(dlock_count(&mut con, "waits_started"), 1);
    assert_eq!(dlock_count(&mut con, "waits_timed_out"), 1);
    assert_eq!(dlock_count(&mut con, "tickets_queued"), 1);
}

/// The `name=value` lines a script printed, as numbers.
fn measured(stdout: &str) -> std::collections::BTreeMap<String, i64> {
    stdout
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter_map(|(name, value)| Some((name.to_owned(), value.trim().parse().ok()?)))
        .collect()
}

/// The `name=value` lines of a script's output, shown (`--nocapture`) and looked up by name.
fn measure(client: &str, stdout: String) -> impl Fn(&str) -> i64 {
    let values = measured(&stdout);
    eprintln!("{client}: {values:?}");
    move |name: &str| {
        *values.get(name).unwrap_or_else(|| panic!("{client} did not report {name}:\n{stdout}"))
    }
}

fn dlock_count(con: &mut redis::Connection, field: &str) -> i64 {
    info_line(con, "dlock", &format!("dlock_{field}"))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("INFO dlock has no {field}"))
}

#[test]
fn redis_py_defaults_cut_a_wait_over_5_s_and_send_it_again() {
    install_clients();
    let server = Server::start();
    let value = measure("redis-py", python("timeouts_redis_py.py", server.port));
    // redis-py 8.1's defaults: a 5 s socket timeout, 10 retries of a timed-out command.
    assert_eq!(value("default_socket_timeout_s"), 5);
    assert_eq!(value("default_retries"), 10);
    // A WAIT below 5 s: one wait, ended by the server.
    assert!((950..3000).contains(&value("short_wait_elapsed_ms")));
    assert_eq!(value("short_wait_waits_started"), 1);
    // WAIT 6000: cut at 5 s; redis-py closed the connection (the server dropped that waiter, so
    // no grant can go to it) and sent the same ACQUIRE again: two waits for one call.
    assert!((4900..7500).contains(&value("resent_after_ms")), "resent at the socket timeout");
    assert_eq!(value("abandoned_when_resent"), 1);
    assert_eq!(value("waiters_when_resent"), 1);
    assert_eq!(value("long_wait_waits_started"), 2);
    assert_eq!(value("long_wait_waits_granted"), 1);
    // Socket timeout above the wait, no retries, CLAIM: one wait, granted and claimed.
    for name in ["waits_started", "waits_granted", "grants_claimed"] {
        assert_eq!(value(&format!("recommended_{name}")), 1, "{name}");
    }
    let mut con = server.client();
    assert_eq!(dlock_count(&mut con, "waits_started"), 4);
    assert_eq!(dlock_count(&mut con, "waits_abandoned"), 1);
    assert_eq!(dlock_count(&mut con, "claims_lapsed"), 0);
}

#[test]
fn node_redis_defaults_wait_in_the_server_and_hold_up_the_connection() {
    install_clients();
    let server = Server::start();
    let value = measure("node-redis", node("timeouts_node_redis.cjs", server.port));
    // No timeout on a sent command: the server ends WAIT 1000. A PING sent behind it on the
    // same client answers only then.
    assert!((950..3000).contains(&value("default_wait_elapsed_ms")));
    assert!(value("default_ping_behind_wait_ms") >= 950, "the PING waited behind the WAIT");
    assert_eq!(value("default_waits_started"), 1);
    // The per-command `timeout` (200 ms) never cuts a WAIT already written.
    assert!(value("command_timeout_200_wait_elapsed_ms") >= 950);
    // socketTimeout 500 does: the socket is closed and the server drops the waiter.
    assert!((450..2000).contains(&value("socket_timeout_500_rejected_after_ms")));
    assert_eq!(value("socket_timeout_500_waits_abandoned"), 1);
    // A connection of its own for the wait, CLAIM: one wait, granted and claimed; the main
    // client answers meanwhile.
    assert!(value("recommended_ping_during_wait_ms") < 500);
    for name in ["waits_started", "waits_granted", "grants_claimed"] {
        assert_eq!(value(&format!("recommended_{name}")), 1, "{name}");
    }
    let mut con = server.client();
    assert_eq!(dlock_count(&mut con, "waits_started"), 4);
    assert_eq!(dlock_count(&mut con, "claims_lapsed"), 0);
}

#[test]
fn ioredis_timeouts_leave_a_wait_in_the_server_or_send_it_again() {
    install_clients();
    let server = Server::start();
    let value = measure("ioredis", node("timeouts_ioredis.cjs", server.port));
    // Defaults (no commandTimeout, no socketTimeout): the server ends WAIT 1000; a PING behind it
    // on the same client answers only then.
    assert!((950..3000).contains(&value("default_wait_elapsed_ms")));
    assert!(value("default_ping_behind_wait_ms") >= 950, "the PING waited behind the WAIT");
    assert_eq!(value("default_waits_started"), 1);
    // commandTimeout 500: the call fails at 500 ms, the connection and the waiter stay; the
    // lease handed over to that waiter lapses after CLAIM 500, and another client gets it.
    assert!((450..2000).contains(&value("command_timeout_500_rejected_after_ms")));
    assert_eq!(value("command_timeout_500_waiters_after_rejection"), 1);
    let free_again = value("command_timeout_500_free_again_after_ms");
    assert!((450..2000).contains(&free_again), "free again {free_again} ms after the release");
    assert_eq!(value("command_timeout_500_claims_lapsed"), 1);
    // socketTimeout 500: ioredis reconnects and sends the same WAIT again, every 500 ms.
    assert!(value("socket_timeout_500_waits_for_one_call") >= 3);
    assert!(value("socket_timeout_500_waits_abandoned") >= 2);
    // A connection of its own, commandTimeout above the wait, CLAIM: one wait, granted, claimed.
    assert!(value("recommended_ping_during_wait_ms") < 500);
    for name in ["waits_started", "waits_granted", "grants_claimed"] {
        assert_eq!(value(&format!("recommended_{name}")), 1, "{name}");
    }
}

#[test]
fn glide_default_request_timeout_gives_up_on_a_wait_and_claim_frees_the_lease() {
    install_clients();
    let server = Server::start();
    let value = measure("valkey-glide", node("timeouts_glide.cjs", server.port));
    // requestTimeout 250 ms by default: WAIT 2000 fails on the client at 250 ms; the connection
    // stays open, the server keeps the waiter, and the client's next request waits behind it.
    assert!((240..1500).contains(&value("default_rejected_after_ms")));
    assert_eq!(value("default_waiters_after_rejection"), 1);
    assert_eq!(value("default_waits_abandoned"), 0);
    assert_eq!(value("default_connections_closed"), 0);
    assert!((240..1500).contains(&value("default_ping_behind_wait_rejected_after_ms")));
    // The lease handed over to that waiter lapses after CLAIM 500; another client gets it.
    let free_again = value("default_claim_500_free_again_after_ms");
    assert!((450..2000).contains(&free_again), "free again {free_again} ms after the release");
    assert_eq!(value("default_claim_500_claims_lapsed"), 1);
    // Without CLAIM the unread hand-over holds the resource for the full ttl (30 s).
    assert!(value("no_claim_handover_ttl_ms") > 25_000);
    // QUEUE tickets on the shared client: answers at once, blocks nothing, no wait in the server;
    // the ticket's grant is claimed by the ACQUIRE that answers its fence.
    assert!(value("queue_first_reply_ms") < 250);
    assert!(value("queue_ping_ms") < 250);
    assert_eq!(value("queue_waits_started"), 0);
    for name in ["tickets_queued", "tickets_granted", "grants_claimed"] {
        assert_eq!(value(&format!("queue_{name}")), 1, "{name}");
    }
    // A client of its own for waits, requestTimeout above the wait: one wait, granted, claimed.
    for name in ["waits_started", "waits_granted", "grants_claimed"] {
        assert_eq!(value(&format!("dedicated_{name}")), 1, "{name}");
    }
}

#[test]
fn ioredis_cluster_sends_dlock_commands_to_the_resources_primary_with_a_keyed_command() {
    install_clients();
    let cluster = Cluster::start();
    let ports: Vec<String> = cluster.nodes.iter().map(|node| node.port.to_string()).collect();
    let output = Command::new("node")
        .arg(project().join("tests/clients/ioredis_cluster.cjs"))
        .args(&ports)
        .env("NODE_PATH", project().join(".deps/node/node_modules"))
        .output()
        .expect("node");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "ioredis_cluster.cjs failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value = measure("ioredis Cluster", stdout);
    // Through `call`: every command ran once, but most went to a wrong primary first, each such
    // MOVED followed by a slot map refresh.
    assert_eq!(value("call_calls"), value("call_sent"));
    assert!(value("call_moved") > value("call_sent") / 3, "about two of three go astray");
    assert!(value("call_refreshes") > 0);
    // Through `dlock` (tests/clients/dlock_ioredis.cjs): every command ran where it was sent.
    assert_eq!(value("keyed_calls"), value("keyed_sent"));
    assert_eq!(value("keyed_moved"), 0);
    assert_eq!(value("keyed_refreshes"), 0);
}
