//! Command surface: bad input, WRONGTYPE, MULTI/EXEC, Lua, ACL key patterns, key specs, docs.

use dlock_testkit::*;

fn run(con: &mut redis::Connection, args: &[&[u8]]) -> redis::RedisResult<redis::Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).expect("command name"));
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(con)
}

/// Everything observable about the one real lease, to prove a bad command changed nothing.
fn snapshot(con: &mut redis::Connection) -> (Option<String>, Option<String>, i64) {
    (info_field(con, "lock:a", "owner"), info_field(con, "lock:a", "fence"), dbsize(con))
}

#[test]
fn every_bad_input_gets_an_error_naming_the_argument_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "lock:a", "owner", 60_000).expect("granted");
    let before = snapshot(&mut con);
    let ttl = "ERR ttl-ms must be an integer between 1 and 86400000";
    let timeout = "ERR timeout-ms must be an integer between 0 and 86400000";
    let token = "ERR token must be between 1 and 512 bytes long";
    let fence = "ERR fence must be a positive integer";
    let long_token = vec![b'x'; 513];
    let cases: Vec<(Vec<&[u8]>, &str)> = vec![
        (
            vec![b"DLOCK.ACQUIRE", b"lock:b", b"t"],
            "ERR wrong number of arguments for 'dlock.acquire' command",
        ),
        (
            vec![b"DLOCK.RENEW", b"lock:a", b"owner"],
            "ERR wrong number of arguments for 'dlock.renew' command",
        ),
        (
            vec![b"DLOCK.RELEASE", b"lock:a"],
            "ERR wrong number of arguments for 'dlock.release' command",
        ),
        (
            vec![b"DLOCK.RELEASE", b"lock:a", b"owner", b"x"],
            "ERR wrong number of arguments for 'dlock.release' command",
        ),
        (
            vec![b"DLOCK.FENCECHECK", b"lock:a"],
            "ERR wrong number of arguments for 'dlock.fencecheck' command",
        ),
        (vec![b"DLOCK.INFO"], "ERR wrong number of arguments for 'dlock.info' command"),
        (
            vec![b"DLOCK.INFO", b"lock:a", b"extra"],
            "ERR wrong number of arguments for 'dlock.info' command",
        ),
        (vec![b"DLOCK.ACQUIRE", b"lock:b", b"t", b"0"], ttl),
        (vec![b"DLOCK.ACQUIRE", b"lock:b", b"t", b"-5"], ttl),
        (vec![b"DLOCK.ACQUIRE", b"lock:b", b"t", b"1.5"], ttl),
        (vec![b"DLOCK.ACQUIRE", b"lock:b", b"t", b"abc"], ttl),
        (vec![b"DLOCK.ACQUIRE", b"lock:b", b"t", b"99999999999999999999999"], ttl),
        (vec![b"DLOCK.ACQUIRE", b"lock:b", b"t", b"86400001"], ttl),
        (vec![b"DLOCK.ACQUIRE", b"lock:b", b"", b"1000"], token),
        (vec![b"DLOCK.ACQUIRE", b"lock:b", &long_token, b"1000"], token),
        (
            vec![b"DLOCK.ACQUIRE", b"lock:b", b"t", b"1000", b"NX"],
            "ERR syntax error: unexpected argument 'NX'",
        ),
        (
            vec![b"DLOCK.ACQUIRE", b"lock:b", b"t", b"1000", b"WAIT"],
            "ERR WAIT needs a timeout-ms argument",
        ),
        (vec![b"DLOCK.ACQUIRE", b"lock:b", b"t", b"1000", b"WAIT", b"-1"], timeout),
        (vec![b"DLOCK.ACQUIRE", b"lock:b", b"t", b"1000", b"wait", b"x"], timeout),
        (vec![b"DLOCK.RENEW", b"lock:a", b"owner", b"0"], ttl),
        (vec![b"DLOCK.RENEW", b"lock:a", b"owner", b"86400001"], ttl),
        (vec![b"DLOCK.RENEW", b"lock:a", b"", b"1000"], token),
        (vec![b"DLOCK.RELEASE", b"lock:a", b""], token),
        (vec![b"DLOCK.RELEASE", b"lock:a", &long_token], token),
        (vec![b"DLOCK.FENCECHECK", b"lock:a", b"0"], fence),
        (vec![b"DLOCK.FENCECHECK", b"lock:a", b"-3"], fence),
        (vec![b"DLOCK.FENCECHECK", b"lock:a", b"12abc"], fence),
        (
            vec![b"DLOCK.FENCED", b"lock:a", b"1"],
            "ERR wrong number of arguments for 'dlock.fenced' command",
        ),
        (vec![b"DLOCK.FENCED", b"lock:a", b"x", b"SET", b"k", b"v"], fence),
        (
            vec![b"DLOCK.SETLEASE", b"lock:a", b"forger", b"1", b"99999999999999"],
            "ERR DLOCK.SETLEASE is internal: only the primary's replication stream and the AOF may send it",
        ),
    ];
    for (args, expected) in cases {
        let shown: Vec<String> = args
            .iter()
            .map(|a| String::from_utf8_lossy(&a[..a.len().min(20)]).into_owned())
            .collect();
        assert_eq!(error_text(run(&mut con, &args)), expected, "{shown:?}");
        assert_eq!(snapshot(&mut con), before, "{shown:?} changed something");
    }
    // The boundaries themselves are accepted.
    assert!(acquire(&mut con, "lock:c", &"x".repeat(512), 86_400_000).is_some());
    assert!(acquire(&mut con, "lock:d", "t", 1).is_some());
}

#[test]
fn keywords_are_case_insensitive() {
    let server = Server::start();
    let mut con = server.client();
    for (i, keyword) in ["WAIT", "wait", "WaIt"].iter().enumerate() {
        let resource = format!("lock:k{i}");
        let fence: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
            .arg(&resource)
            .arg("t")
            .arg(1000)
            .arg(*keyword)
            .arg(100)
            .query(&mut con)
            .expect("a free lock is granted at once with WAIT");
        assert!(fence.is_some(), "{keyword}");
    }
    let fence: i64 = redis::cmd("dLoCk.AcQuIrE")
        .arg("lock:k")
        .arg("t")
        .arg(1000)
        .query(&mut con)
        .expect("granted");
    assert!(fence > 0);
}

#[test]
fn another_type_at_the_key_gives_wrongtype_and_stays_untouched() {
    let server = Server::start();
    let mut con = server.client();
    let _: () = redis::cmd("SET").arg("plain").arg("value").query(&mut con).expect("SET");
    let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
    for args in [
        &[&b"DLOCK.ACQUIRE"[..], b"plain", b"t", b"1000"][..],
        &[b"DLOCK.RENEW", b"plain", b"t", b"1000"],
        &[b"DLOCK.RELEASE", b"plain", b"t"],
        &[b"DLOCK.FENCECHECK", b"plain", b"1"],
        &[b"DLOCK.INFO", b"plain"],
    ] {
        assert_eq!(error_text(run(&mut con, args)), wrongtype);
    }
    let value: String = redis::cmd("GET").arg("plain").query(&mut con).expect("GET");
    assert_eq!(value, "value");
}

#[test]
fn commands_work_inside_multi_exec() {
    let server = Server::start();
    let mut con = server.client();
    let (fence, again, busy, checked, renewed, released): (i64, i64, Option<i64>, i64, i64, i64) =
        redis::pipe()
            .atomic()
            .cmd("DLOCK.ACQUIRE")
            .arg("lock:m")
            .arg("a")
            .arg(10_000)
            .cmd("DLOCK.ACQUIRE")
            .arg("lock:m")
            .arg("a")
            .arg(10_000)
            .cmd("DLOCK.ACQUIRE")
            .arg("lock:m")
            .arg("b")
            .arg(10_000)
            .cmd("DLOCK.FENCECHECK")
            .arg("lock:m")
            .arg(1)
            .cmd("DLOCK.RENEW")
            .arg("lock:m")
            .arg("a")
            .arg(10_000)
            .cmd("DLOCK.RELEASE")
            .arg("lock:m")
            .arg("a")
            .query(&mut con)
            .expect("EXEC");
    assert_eq!((again, busy, checked, renewed, released), (fence, None, 0, 1, 1));
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn commands_work_from_a_lua_script() {
    let server = Server::start();
    let mut con = server.client();
    let script = redis::Script::new(
        r"local fence = redis.call('DLOCK.ACQUIRE', KEYS[1], ARGV[1], ARGV[2])
          local ok = redis.call('DLOCK.FENCECHECK', KEYS[1], fence)
          return {fence, ok}",
    );
    let (fence, ok): (i64, i64) =
        script.key("lock:lua").arg("w").arg(10_000).invoke(&mut con).expect("EVALSHA");
    assert_eq!(ok, 1);
    assert_eq!(info_field(&mut con, "lock:lua", "fence"), Some(fence.to_string()));
    let busy: Option<i64> = script
        .key("lock:lua")
        .arg("other")
        .arg(10_000)
        .invoke(&mut con)
        .ok()
        .and_then(|(f, _): (Option<i64>, i64)| f);
    assert_eq!(busy, None, "a busy lock answers nil inside the script too");
    let released: i64 = redis::cmd("EVAL")
        .arg("return redis.call('DLOCK.RELEASE', KEYS[1], ARGV[1])")
        .arg(1)
        .arg("lock:lua")
        .arg("w")
        .query(&mut con)
        .expect("EVAL");
    assert_eq!(released, 1);
}

#[test]
fn an_acl_user_limited_to_lock_keys_can_lock_only_those() {
    let server = Server::start();
    let mut admin = server.client();
    let mut worker = server.client_as("worker", &["~lock:*", "+@all"]);
    assert!(acquire(&mut worker, "lock:1", "w", 10_000).is_some());
    let denied = error_text(run(&mut worker, &[b"DLOCK.ACQUIRE", b"invoice:1", b"w", b"10000"]));
    assert!(denied.starts_with("NOPERM"), "{denied}");
    let denied = error_text(run(&mut worker, &[b"DLOCK.INFO", b"invoice:1"]));
    assert!(denied.starts_with("NOPERM"), "{denied}");
    assert!(!exists(&mut admin, "invoice:1"));

    // Read-only key permissions allow FENCECHECK and INFO but not a grant.
    let mut auditor = server.client_as("auditor", &["%R~lock:*", "+@all"]);
    assert_eq!(info_field(&mut auditor, "lock:1", "owner").as_deref(), Some("w"));
    assert_eq!(fencecheck(&mut auditor, "lock:1", 1), 0);
    let denied = error_text(run(&mut auditor, &[b"DLOCK.RELEASE", b"lock:1", b"w"]));
    assert!(denied.starts_with("NOPERM"), "{denied}");
}

/// A command's reply is Redis's ACL refusal (`NOPERM …`).
fn assert_noperm(con: &mut redis::Connection, args: &[&[u8]]) {
    let shown: Vec<String> = args.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let denied = error_text(run(con, args));
    assert!(denied.starts_with("NOPERM"), "{shown:?}: {denied}");
}

#[test]
fn write_only_key_permission_grants_renews_and_releases_but_reads_nothing() {
    let server = Server::start();
    let mut admin = server.client();
    let mut locker = server.client_as("locker", &["%W~lock:*", "~data:*", "+@all"]);
    let fence = acquire(&mut locker, "lock:w", "w", 60_000).expect("granted");
    let again = acquire(&mut locker, "lock:w", "w", 60_000);
    assert_eq!(again, Some(fence), "a retry with the same token learns the same fence");
    assert_eq!(acquire(&mut locker, "lock:w", "other", 60_000), None, "busy");
    assert_eq!(renew(&mut locker, "lock:w", "w", 60_000), 1);
    // INFO and FENCECHECK read the lease, and FENCED reads it before anything runs.
    let fence_arg = fence.to_string();
    assert_noperm(&mut locker, &[b"DLOCK.INFO", b"lock:w"]);
    assert_noperm(&mut locker, &[b"DLOCK.FENCECHECK", b"lock:w", fence_arg.as_bytes()]);
    assert_noperm(
        &mut locker,
        &[b"DLOCK.FENCED", b"lock:w", fence_arg.as_bytes(), b"SET", b"data:1", b"v"],
    );
    assert!(!exists(&mut admin, "data:1"));
    assert_noperm(&mut locker, &[b"DLOCK.ACQUIRE", b"invoice:1", b"w", b"10000"]);
    assert_eq!(release(&mut locker, "lock:w", "w"), 1);
    assert!(!exists(&mut admin, "lock:w"));
    assert!(!exists(&mut admin, "invoice:1"));
}

#[test]
fn read_only_key_permission_checks_fences_but_decides_no_lease() {
    let server = Server::start();
    let mut admin = server.client();
    let fence = acquire(&mut admin, "lock:r", "w", 60_000).expect("granted");
    let mut auditor = server.client_as("auditor", &["%R~lock:*", "~data:*", "+@all"]);
    assert_eq!(info_field(&mut auditor, "lock:r", "owner").as_deref(), Some("w"));
    assert_eq!(fencecheck(&mut auditor, "lock:r", fence), 1);
    let fence_arg = fence.to_string();
    let _: redis::Value = redis::cmd("DLOCK.FENCED")
        .arg("lock:r")
        .arg(fence)
        .arg(&["SET", "data:1", "v"])
        .query(&mut auditor)
        .expect("FENCED needs only read permission on the lock key");
    // Even the holder's own token decides nothing through a read-only selector.
    for args in [
        &[&b"DLOCK.ACQUIRE"[..], b"lock:r", b"w", b"60000"][..],
        &[b"DLOCK.ACQUIRE", b"lock:new", b"w", b"60000"],
        &[b"DLOCK.ACQUIRE", b"lock:new", b"w", b"60000", b"WAIT", b"10"],
        &[b"DLOCK.RENEW", b"lock:r", b"w", b"60000"],
        &[b"DLOCK.RELEASE", b"lock:r", b"w"],
    ] {
        assert_noperm(&mut auditor, args);
    }
    assert_eq!(info_field(&mut admin, "lock:r", "fence"), Some(fence_arg));
    assert_eq!(info_field(&mut admin, "lock:r", "renewals").as_deref(), Some("0"));
    assert!(!exists(&mut admin, "lock:new"));
}

#[test]
fn a_user_denied_release_holds_locks_until_they_expire() {
    let server = Server::start();
    let mut admin = server.client();
    let mut worker = server.client_as("worker", &["~lock:*", "+@all", "-dlock.release"]);
    let fence = acquire(&mut worker, "lock:x", "w", 60_000).expect("granted");
    assert_noperm(&mut worker, &[b"DLOCK.RELEASE", b"lock:x", b"w"]);
    let script = redis::cmd("EVAL")
        .arg("return redis.call('DLOCK.RELEASE', KEYS[1], ARGV[1])")
        .arg(1)
        .arg("lock:x")
        .arg("w")
        .query::<redis::Value>(&mut worker);
    assert!(script.is_err(), "a script runs with its caller's permissions: {script:?}");
    let queued = redis::pipe()
        .atomic()
        .cmd("DLOCK.RELEASE")
        .arg("lock:x")
        .arg("w")
        .query::<redis::Value>(&mut worker);
    assert!(queued.is_err(), "MULTI refuses it too: {queued:?}");
    assert_eq!(fencecheck(&mut admin, "lock:x", fence), 1, "the lease still stands");
    assert_eq!(renew(&mut worker, "lock:x", "w", 60_000), 1);
    assert_eq!(release(&mut admin, "lock:x", "w"), 1, "a permitted user can release it");
}

#[test]
fn every_command_declares_its_key_and_flags() {
    let server = Server::start();
    let mut con = server.client();
    for (command, args) in [
        ("DLOCK.ACQUIRE", vec!["lock:x", "t", "1000", "WAIT", "0"]),
        ("DLOCK.RENEW", vec!["lock:x", "t", "1000"]),
        ("DLOCK.RELEASE", vec!["lock:x", "t"]),
        ("DLOCK.FENCECHECK", vec!["lock:x", "7"]),
        ("DLOCK.INFO", vec!["lock:x"]),
        ("DLOCK.FENCED", vec!["lock:x", "5", "SET", "data", "v"]),
    ] {
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(command)
            .arg(&args)
            .query(&mut con)
            .expect("GETKEYS");
        // FENCED declares the inner command's keys too (Cluster routing, TRYAGAIN, CROSSSLOT).
        let expected: &[&str] =
            if command == "DLOCK.FENCED" { &["lock:x", "data"] } else { &["lock:x"] };
        assert_eq!(keys, expected, "{command}");
    }
    let expected_flags = [
        ("dlock.acquire", &["write", "denyoom"][..], &["fast"][..]),
        ("dlock.renew", &["write", "fast"], &["denyoom"]),
        ("dlock.release", &["write", "fast"], &["denyoom"]),
        ("dlock.fencecheck", &["readonly", "fast"], &["write"]),
        ("dlock.info", &["readonly", "fast"], &["write"]),
        ("dlock.fenced", &["write", "movablekeys"], &["fast", "readonly"]),
    ];
    for (command, present, absent) in expected_flags {
        let value: redis::Value =
            redis::cmd("COMMAND").arg("INFO").arg(command).query(&mut con).expect("COMMAND INFO");
        let text = format!("{value:?}").to_lowercase();
        for flag in present {
            assert!(text.contains(&format!("\"{flag}\"")), "{command} lacks {flag}: {text}");
        }
        for flag in absent {
            assert!(!text.contains(&format!("\"{flag}\"")), "{command} must not be {flag}: {text}");
        }
    }
    let docs: redis::Value =
        redis::cmd("COMMAND").arg("DOCS").arg("dlock.fencecheck").query(&mut con).expect("DOCS");
    let docs = format!("{docs:?}");
    assert!(docs.contains("fence of the live lease"), "{docs}");
}

#[test]
fn max_ttl_ms_is_a_config_that_bounds_ttl_and_timeout() {
    let server = Server::start();
    let mut con = server.client();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("dlock.max-ttl-ms")
        .arg(5_000)
        .query(&mut con)
        .expect("CONFIG SET");
    let value: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("dlock.max-ttl-ms")
        .query(&mut con)
        .expect("CONFIG GET");
    assert_eq!(value, ["dlock.max-ttl-ms", "5000"]);
    assert_eq!(
        error_text(run(&mut con, &[b"DLOCK.ACQUIRE", b"lock:t", b"t", b"5001"])),
        "ERR ttl-ms must be an integer between 1 and 5000"
    );
    assert_eq!(
        error_text(run(&mut con, &[b"DLOCK.ACQUIRE", b"lock:t", b"t", b"5000", b"WAIT", b"5001"])),
        "ERR timeout-ms must be an integer between 0 and 5000"
    );
    assert!(acquire(&mut con, "lock:t", "t", 5_000).is_some());
    assert_eq!(
        error_text(run(&mut con, &[b"DLOCK.RENEW", b"lock:t", b"t", b"5001"])),
        "ERR ttl-ms must be an integer between 1 and 5000"
    );
    let refused = run(&mut con, &[b"CONFIG", b"SET", b"dlock.max-ttl-ms", b"0"]);
    assert!(refused.is_err(), "0 is out of range");
}

#[test]
fn hostile_bytes_in_keys_and_arguments_never_crash_the_server() {
    let mut server = Server::start();
    let mut con = server.client();
    // Key names with NUL bytes travel through keyspace events, the expiry timer and RDB loading.
    let _: () = redis::cmd("SET").arg(&b"x\0y"[..]).arg("v").query(&mut con).expect("SET");
    let _: () =
        redis::cmd("RENAME").arg(&b"x\0y"[..]).arg(&b"z\0"[..]).query(&mut con).expect("RENAME");
    let fence: i64 = redis::cmd("DLOCK.ACQUIRE")
        .arg(&b"lock:\0nul"[..])
        .arg("t")
        .arg(200)
        .query(&mut con)
        .expect("ACQUIRE");
    let _: () = redis::cmd("RENAME")
        .arg(&b"lock:\0nul"[..])
        .arg(&b"lock:\0moved"[..])
        .query(&mut con)
        .expect("RENAME");
    assert!(fence > 0);
    let long: i64 = redis::cmd("DLOCK.ACQUIRE")
        .arg(&b"lock:\0kept"[..])
        .arg("t")
        .arg(60_000)
        .query(&mut con)
        .expect("ACQUIRE");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).expect("DEBUG RELOAD");
    assert!(eventually(std::time::Duration::from_secs(5), || !exists_bytes(
        &mut con,
        b"lock:\0moved"
    )));
    let kept: i64 = redis::cmd("DLOCK.FENCECHECK")
        .arg(&b"lock:\0kept"[..])
        .arg(long)
        .query(&mut con)
        .expect("FENCECHECK");
    assert_eq!(kept, 1);
    // Unknown arguments in any encoding come back printable and never break the reply.
    for bad in [&b"\xc4\x80"[..], b"\0", b"\r\n", "ĀŁ€".as_bytes(), b"'quoted'"] {
        let text = error_text(run(&mut con, &[b"DLOCK.ACQUIRE", b"lock:h", b"t", b"1000", bad]));
        assert!(text.starts_with("ERR syntax error: unexpected argument '"), "{text}");
        assert!(text.is_ascii(), "{text}");
    }
    assert!(server.is_alive());
}

fn exists_bytes(con: &mut redis::Connection, key: &[u8]) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

#[test]
fn a_writable_replica_refuses_lease_decisions() {
    let (_primary, replica) = primary_and_replica_with(&[], &["--replica-read-only", "no"]);
    let mut r = replica.client();
    for args in [
        &[&b"DLOCK.ACQUIRE"[..], b"lock:w", b"t", b"1000"][..],
        &[b"DLOCK.RENEW", b"lock:w", b"t", b"1000"],
        &[b"DLOCK.RELEASE", b"lock:w", b"t"],
        &[b"DLOCK.FENCED", b"lock:w", b"1", b"SET", b"data", b"v"],
    ] {
        assert_eq!(
            error_text(run(&mut r, args)),
            "READONLY dlock grants, renews and releases leases only on the primary"
        );
    }
    assert_eq!(dbsize(&mut r), 0);
    assert_eq!(info(&mut r, "lock:w"), None, "reads still work on the replica");
}

#[test]
fn percent_signs_in_names_and_tokens_are_logged_as_text() {
    let mut server = Server::start(); // verbose: every transition is logged
    let mut con = server.client();
    let resource = "r%s%s%s%s%n";
    acquire(&mut con, resource, "%s%s%p", 60_000).expect("granted");
    for _ in 0..3 {
        assert_eq!(release(&mut con, resource, "%s%s%s%s%n%n"), 0);
    }
    assert_eq!(release(&mut con, resource, "%s%s%p"), 1);
    assert!(server.is_alive());
    assert!(server.log().contains("resource=r%s%s%s%s%n"), "the name is logged verbatim");
}

#[test]
fn commands_sit_in_acl_categories_where_the_server_supports_them() {
    let server = Server::start();
    let mut con = server.client();
    let version = info_line(&mut con, "server", "redis_version").unwrap_or_default();
    let (major, minor) = version
        .split_once('.')
        .map(|(a, b)| {
            (a.parse().unwrap_or(0), b.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0))
        })
        .unwrap_or((0, 0));
    let supported = (major, minor) >= (7, 2); // Redis 7.2+ and Valkey let modules declare categories
    // The categories COMMAND INFO shows (its seventh element). `ACL CAT write` would do too,
    // but Redis 7.4 leaves module commands out of that list while it enforces their categories.
    let categories = |con: &mut redis::Connection, command: &str| -> Vec<String> {
        let reply: redis::Value =
            redis::cmd("COMMAND").arg("INFO").arg(command).query(con).expect("COMMAND INFO");
        let redis::Value::Array(entries) = reply else { panic!("COMMAND INFO {reply:?}") };
        let Some(redis::Value::Array(fields)) = entries.first() else { panic!("{entries:?}") };
        match fields.get(6) {
            Some(redis::Value::Array(names)) | Some(redis::Value::Set(names)) => names
                .iter()
                .filter_map(|name| match name {
                    redis::Value::SimpleString(s) => Some(s.clone()),
                    redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    };
    for (command, in_write) in [
        ("dlock.acquire", true),
        ("dlock.renew", true),
        ("dlock.release", true),
        ("dlock.fenced", true),
        ("dlock.fencecheck", false),
        ("dlock.info", false),
    ] {
        let listed = categories(&mut con, command);
        let category = if in_write { "@write" } else { "@read" };
        assert_eq!(
            listed.iter().any(|c| c == category),
            supported,
            "{command} on Redis {version}: {listed:?}"
        );
    }
    if supported {
        let mut reader = server.client_as("reader", &["~*", "+@read"]);
        assert_eq!(info(&mut reader, "lock:x"), None);
        let denied = error_text(run(&mut reader, &[b"DLOCK.ACQUIRE", b"lock:x", b"t", b"1000"]));
        assert!(denied.starts_with("NOPERM"), "{denied}");
    }
}
