//! `DLOCK.FENCED`: a write that carries a stale fence does not happen.

use std::io::Write;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use dlock_testkit::*;

fn fenced(
    con: &mut redis::Connection,
    resource: &str,
    fence: i64,
    command: &[&str],
) -> redis::RedisResult<redis::Value> {
    redis::cmd("DLOCK.FENCED").arg(resource).arg(fence).arg(command).query(con)
}

fn get(con: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).expect("GET")
}

#[test]
fn the_holders_write_applies_and_its_reply_passes_through_unchanged() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "invoice:1", "worker", 60_000).expect("granted");
    let added = fenced(
        &mut con,
        "invoice:1",
        fence,
        &["HSET", "invoice:1:data", "status", "paid", "by", "worker"],
    );
    assert_eq!(added.expect("HSET"), redis::Value::Int(2));
    let all =
        fenced(&mut con, "invoice:1", fence, &["HGETALL", "invoice:1:data"]).expect("HGETALL");
    assert!(matches!(all, redis::Value::Array(ref items) if items.len() == 4), "{all:?}");
    let mut resp3 = server.client_resp3();
    let all =
        fenced(&mut resp3, "invoice:1", fence, &["HGETALL", "invoice:1:data"]).expect("HGETALL");
    assert!(
        matches!(all, redis::Value::Map(ref pairs) if pairs.len() == 2),
        "RESP3 reply kept: {all:?}"
    );
    let missing = fenced(&mut con, "invoice:1", fence, &["GET", "nothing"]).expect("GET");
    assert_eq!(missing, redis::Value::Nil);
}

#[test]
fn expired_released_and_never_issued_fences_are_refused_and_write_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let _: () = redis::cmd("SET").arg("balance").arg(100).query(&mut con).expect("SET");
    let granted_at = Instant::now();
    let expired = acquire(&mut con, "account", "worker-a", 200).expect("granted");
    sleep((granted_at + Duration::from_millis(250)).saturating_duration_since(Instant::now()));
    let current = acquire(&mut con, "account", "worker-b", 60_000).expect("re-granted");
    let refused = error_text(fenced(&mut con, "account", expired, &["SET", "balance", "0"]));
    assert_eq!(
        refused,
        format!("STALE fence {expired} does not hold account (current fence {current})")
    );
    let refused = error_text(fenced(&mut con, "account", 1, &["SET", "balance", "0"]));
    assert!(refused.starts_with("STALE fence 1 does not hold account"), "{refused}");
    assert_eq!(release(&mut con, "account", "worker-b"), 1);
    let refused = error_text(fenced(&mut con, "account", current, &["SET", "balance", "0"]));
    assert_eq!(refused, format!("STALE fence {current} does not hold account (no live lease)"));
    assert_eq!(get(&mut con, "balance").as_deref(), Some("100"), "no stale write happened");
}

#[test]
fn a_worker_frozen_past_its_lease_wakes_and_its_write_is_refused() {
    let server = Server::start();
    let mut con = server.client();
    let stale_fence = acquire(&mut con, "report", "worker-a", 300).expect("granted");
    // worker-a: a real process that will write under its fence when it gets to run.
    let mut worker = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "read go; redis-cli -p {} DLOCK.FENCED report {stale_fence} SET report:owner worker-a",
            server.port
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("worker process");
    let pid = worker.id().to_string();
    let _ = Command::new("kill").arg("-STOP").arg(&pid).status();
    sleep(Duration::from_millis(400)); // frozen past its lease
    let fresh = acquire(&mut con, "report", "worker-b", 60_000).expect("granted to worker-b");
    fenced(&mut con, "report", fresh, &["SET", "report:owner", "worker-b"])
        .expect("worker-b writes");
    let _ = Command::new("kill").arg("-CONT").arg(&pid).status();
    worker.stdin.take().expect("stdin").write_all(b"go\n").expect("wake the worker");
    let output = worker.wait_with_output().expect("worker output");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(said.contains("STALE"), "worker-a's late write was refused: {said}");
    assert_eq!(
        get(&mut con, "report:owner").as_deref(),
        Some("worker-b"),
        "the new holder's write stands"
    );
}

#[test]
fn the_inner_command_is_checked_against_the_callers_acl() {
    let server = Server::start();
    let mut admin = server.client();
    let mut worker = server.client_as("worker", &["~invoice:*", "+@all"]);
    let fence = acquire(&mut worker, "invoice:7", "w", 60_000).expect("granted");
    let denied = error_text(fenced(&mut worker, "invoice:7", fence, &["SET", "payroll", "0"]));
    assert!(denied.contains("acl") || denied.starts_with("NOPERM"), "{denied}");
    assert!(!exists(&mut admin, "payroll"));
    fenced(&mut worker, "invoice:7", fence, &["SET", "invoice:7:data", "ok"]).expect("allowed key");
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "worker", "-set"])
        .query(&mut admin)
        .expect("ACL SETUSER");
    let denied =
        error_text(fenced(&mut worker, "invoice:7", fence, &["SET", "invoice:7:data", "x"]));
    assert!(denied.contains("acl") || denied.starts_with("NOPERM"), "{denied}");
    assert_eq!(get(&mut admin, "invoice:7:data").as_deref(), Some("ok"));
}

#[test]
fn inner_errors_come_back_and_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "r", "w", 60_000).expect("granted");
    let _: () = redis::cmd("SET").arg("text").arg("v").query(&mut con).expect("SET");
    assert!(
        error_text(fenced(&mut con, "r", fence, &["NOSUCHCMD", "x"]))
            .starts_with("ERR unknown command")
    );
    assert_eq!(
        error_text(fenced(&mut con, "r", fence, &["GET"])),
        "ERR wrong number of arguments for 'get' command"
    );
    assert!(
        error_text(fenced(&mut con, "r", fence, &["LPUSH", "text", "x"])).starts_with("WRONGTYPE")
    );
    assert_eq!(get(&mut con, "text").as_deref(), Some("v"));
    assert_eq!(
        error_text(fenced(&mut con, "r", 0, &["SET", "text", "x"])),
        "ERR fence must be a positive integer"
    );
}

#[test]
fn commands_that_cannot_be_safe_under_a_fence_are_refused_with_a_reason() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "r", "w", 60_000).expect("granted");
    for command in [
        &["BLPOP", "q", "0"][..],
        &["MULTI"],
        &["EXEC"],
        &["WATCH", "k"],
        &["EVAL", "return 1", "0"],
        &["FCALL", "f", "0"],
        &["DLOCK.RELEASE", "r", "w"],
        &["SUBSCRIBE", "ch"],
        &["XREAD", "BLOCK", "0", "STREAMS", "s", "$"],
    ] {
        let text = error_text(fenced(&mut con, "r", fence, command));
        assert!(text.starts_with(&format!("ERR DLOCK.FENCED refuses '{}'", command[0])), "{text}");
    }
    // MIGRATE names a key of its own (not the lock's), yet is refused: it moves data to
    // another server, beyond what the fence protects.
    assert_eq!(
        error_text(fenced(&mut con, "r", fence, &["MIGRATE", "127.0.0.1", "1", "k", "0", "1000"])),
        "ERR DLOCK.FENCED refuses 'MIGRATE': connection, replication and server commands cannot \
         run under a fence"
    );
    assert_eq!(info_field(&mut con, "r", "owner").as_deref(), Some("w"), "the lease is untouched");
}

#[test]
fn fenced_writes_work_inside_multi_and_from_scripts() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "r", "w", 60_000).expect("granted");
    let replies: Vec<redis::Value> = redis::pipe()
        .atomic()
        .cmd("DLOCK.FENCED")
        .arg("r")
        .arg(fence)
        .arg("INCR")
        .arg("count")
        .cmd("DLOCK.FENCED")
        .arg("r")
        .arg(fence + 1)
        .arg("INCR")
        .arg("count")
        .cmd("DLOCK.FENCED")
        .arg("r")
        .arg(fence)
        .arg("INCR")
        .arg("count")
        .query(&mut con)
        .unwrap_or_default();
    assert_eq!(
        get(&mut con, "count").as_deref(),
        Some("2"),
        "the stale one in the middle wrote nothing: {replies:?}"
    );
    let scripted: i64 = redis::cmd("EVAL")
        .arg("return redis.call('DLOCK.FENCED', KEYS[1], ARGV[1], 'INCR', 'count')")
        .arg(1)
        .arg("r")
        .arg(fence)
        .query(&mut con)
        .expect("EVAL");
    assert_eq!(scripted, 3);
}

#[test]
fn the_fenced_write_is_replicated_and_logged_once_and_alone() {
    let (primary, replica) =
        primary_and_replica_with(&["--appendonly", "yes", "--appendfsync", "always"], &[]);
    let (mut p, mut r) = (primary.client(), replica.client());
    let fence = acquire(&mut p, "invoice:9", "w", 60_000).expect("granted");
    fenced(&mut p, "invoice:9", fence, &["HSET", "invoice:9:data", "status", "paid"])
        .expect("HSET");
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(&mut p).expect("WAIT");
    assert_eq!(acked, 1);
    let status: Option<String> =
        redis::cmd("HGET").arg("invoice:9:data").arg("status").query(&mut r).expect("HGET");
    assert_eq!(status.as_deref(), Some("paid"));
    let refused =
        fenced(&mut p, "invoice:9", fence + 1, &["HSET", "invoice:9:data", "status", "stale"]);
    assert!(refused.is_err());
    let aof = String::from_utf8_lossy(&primary.aof_contents()).to_lowercase();
    assert!(!aof.contains("dlock.fenced"), "only the inner write is logged:\n{aof}");
    assert_eq!(aof.matches("hset").count(), 1, "exactly once:\n{aof}");
    assert!(!aof.contains("stale"));
}

#[test]
fn server_admin_and_keyspace_wide_commands_are_refused_whatever_their_name() {
    // Renamed commands are judged by what they are, not by their name; MODULE stays refused
    // even where plain MODULE is disabled.
    let server = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--rename-command",
        "DEBUG",
        "xdebug",
        "--rename-command",
        "FLUSHALL",
        "wipe",
        "--enable-module-command",
        "no",
    ]);
    let mut con = server.client();
    let _: () = redis::cmd("SET").arg("data").arg("kept").query(&mut con).expect("SET");
    let _: i64 = redis::cmd("RPUSH").arg("list").arg(&[3, 1, 2]).query(&mut con).expect("RPUSH");
    let fence = acquire(&mut con, "r", "w", 60_000).expect("granted");
    for command in [
        &["MODULE", "LOAD", "/nonexistent/other.so"][..],
        &["xdebug", "SLEEP", "0"],
        &["wipe"],
        &["FLUSHDB"],
        &["CONFIG", "SET", "maxmemory", "1"],
        &["SAVE"],
        &["KEYS", "*"],
        &["SET", "r", "overwritten"],
        &["DEL", "r"],
        &["RENAME", "r", "elsewhere"],
    ] {
        let text = error_text(fenced(&mut con, "r", fence, command));
        assert!(text.starts_with(&format!("ERR DLOCK.FENCED refuses '{}'", command[0])), "{text}");
    }
    // MOVE names the lock key as its key, SORT as the destination of STORE: both refused.
    for command in [&["MOVE", "r", "1"][..], &["SORT", "list", "STORE", "r"]] {
        assert_eq!(
            error_text(fenced(&mut con, "r", fence, command)),
            format!(
                "ERR DLOCK.FENCED refuses '{}': the lock key itself cannot be used under its own \
                 fence",
                command[0]
            )
        );
    }
    assert_eq!(get(&mut con, "data").as_deref(), Some("kept"), "nothing was flushed");
    let kind: String = redis::cmd("TYPE").arg("r").query(&mut con).expect("TYPE");
    assert_eq!(kind, "dlocklock", "the lock key is neither moved nor overwritten by SORT");
    assert_eq!(info_field(&mut con, "r", "owner").as_deref(), Some("w"), "the lease is untouched");
    let maxmemory = info_line(&mut con, "memory", "maxmemory");
    assert_eq!(maxmemory.as_deref(), Some("0"), "no config changed");
    // Ordinary keyed writes still run.
    let reply = fenced(&mut con, "r", fence, &["SET", "data", "new"]).expect("fenced SET");
    assert_eq!(reply, redis::Value::Okay);
}

/// A resource key holding another type answers `WRONGTYPE`, whatever the inner command (it said
/// the lock key could not be used under its own fence when the inner command named it).
#[test]
fn a_resource_of_another_type_answers_wrongtype() {
    let server = Server::start();
    let mut con = server.client();
    let _: () = redis::cmd("SET").arg("str:1").arg("5").query(&mut con).expect("SET");
    for inner in [&["GET", "str:1"][..], &["SET", "other", "x"]] {
        let refused = error_text(fenced(&mut con, "str:1", 5, inner));
        assert!(refused.starts_with("WRONGTYPE"), "{inner:?}: {refused}");
    }
    let value: String = redis::cmd("GET").arg("str:1").query(&mut con).expect("GET");
    assert_eq!(value, "5");
    assert_eq!(dbsize(&mut con), 1, "nothing written");
}

/// `fenced_writes_ok` counts inner commands that succeeded; an inner command that answered an
/// error after the fence check passed (wrong type, not an integer, the caller's ACL) counts in
/// `fenced_writes_failed`, and its error passes through unchanged.
#[test]
fn an_inner_command_that_answers_an_error_counts_as_failed_not_as_ok() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "job", "worker", 60_000).expect("granted");
    let _: () = redis::cmd("SET").arg("job:text").arg("not a number").query(&mut con).expect("SET");
    let mut limited = server.client_as("no-incr", &["~*", "+@all", "-incr"]);

    let wrong_type = error_text(fenced(&mut con, "job", fence, &["LPUSH", "job:text", "x"]));
    assert!(wrong_type.starts_with("WRONGTYPE"), "{wrong_type}");
    let not_a_number = error_text(fenced(&mut con, "job", fence, &["INCR", "job:text"]));
    assert!(not_a_number.starts_with("ERR"), "{not_a_number}");
    let denied = error_text(fenced(&mut limited, "job", fence, &["INCR", "job:n"]));
    // Redis 7.0 words it `ERR acl verification failed …`, later servers `NOPERM …`.
    assert!(denied.starts_with("NOPERM") || denied.contains("acl"), "{denied}");
    assert_eq!(get(&mut con, "job:text").as_deref(), Some("not a number"));
    assert_eq!(get(&mut con, "job:n"), None);
    assert_eq!(
        fenced(&mut con, "job", fence, &["INCR", "job:n"]).expect("INCR"),
        redis::Value::Int(1)
    );
    let missing = fenced(&mut con, "job", fence, &["GET", "job:none"]).expect("GET");
    assert_eq!(missing, redis::Value::Nil, "a nil reply is a success");
    let stale = error_text(fenced(&mut con, "job", fence - 1, &["INCR", "job:n"]));
    assert!(stale.starts_with("STALE"), "{stale}");

    let stats = dlock_counters(&mut con);
    assert_eq!(stats["fenced_writes_ok"], 2, "{stats:?}");
    assert_eq!(stats["fenced_writes_refused"], 1, "{stats:?}");
    assert_eq!(stats.get("fenced_writes_failed"), Some(&3), "{stats:?}");
}
