//! `DLOCK.ACQUIREALL`, `DLOCK.RENEWALL`, `DLOCK.RELEASEALL`: a set of resources granted to one
//! token all at once or not at all, each member an ordinary lease with its own fence.

use std::time::Duration;

use dlock_testkit::*;

/// `command numkeys resource… token rest…`, the shape of every set command.
fn on_set<T: redis::FromRedisValue>(
    command: &str,
    con: &mut redis::Connection,
    resources: &[&str],
    token: &str,
    rest: &[&str],
) -> redis::RedisResult<T> {
    redis::cmd(command).arg(resources.len()).arg(resources).arg(token).arg(rest).query(con)
}

fn acquire_all(
    con: &mut redis::Connection,
    resources: &[&str],
    token: &str,
    rest: &[&str],
) -> redis::RedisResult<Option<Vec<i64>>> {
    on_set("DLOCK.ACQUIREALL", con, resources, token, rest)
}

fn renew_all(
    con: &mut redis::Connection,
    resources: &[&str],
    token: &str,
    rest: &[&str],
) -> redis::RedisResult<i64> {
    on_set("DLOCK.RENEWALL", con, resources, token, rest)
}

fn release_all(
    con: &mut redis::Connection,
    resources: &[&str],
    token: &str,
    rest: &[&str],
) -> redis::RedisResult<i64> {
    on_set("DLOCK.RELEASEALL", con, resources, token, rest)
}

fn counter(con: &mut redis::Connection, name: &str) -> u64 {
    dlock_counters(con)
        .get(name.trim_start_matches("dlock_"))
        .copied()
        .unwrap_or_else(|| panic!("no counter {name}"))
}

fn ttl_left(con: &mut redis::Connection, resource: &str) -> i64 {
    info_field(con, resource, "ttl-ms").expect("a live lease").parse().expect("a number")
}

#[test]
fn a_free_set_is_granted_whole_each_member_with_its_own_fence_and_a_retry_gets_the_same_fences() {
    let server = Server::start();
    let mut con = server.client();
    let fences = acquire_all(&mut con, &["a", "b", "c"], "mover", &["60000"])
        .expect("reply")
        .expect("granted");
    assert_eq!(fences.len(), 3);
    assert!(fences.windows(2).all(|pair| pair[0] < pair[1]), "{fences:?}");
    for (resource, fence) in ["a", "b", "c"].iter().zip(&fences) {
        assert_eq!(info_field(&mut con, resource, "owner").as_deref(), Some("mover"));
        assert_eq!(fencecheck(&mut con, resource, *fence), 1, "{resource}");
    }
    // A retry after a lost reply: the same grants, the same fences.
    let again = acquire_all(&mut con, &["a", "b", "c"], "mover", &["60000"]).expect("reply");
    assert_eq!(again, Some(fences.clone()));
    assert_eq!(counter(&mut con, "dlock_acquire_granted"), 3);
    assert_eq!(counter(&mut con, "dlock_acquire_reacquired"), 3);
    // Each member is an ordinary lease: its own RELEASE frees it alone.
    assert_eq!(release(&mut con, "b", "mover"), 1);
    assert_eq!(info_field(&mut con, "a", "owner").as_deref(), Some("mover"));
}

#[test]
fn one_held_member_refuses_the_whole_set_and_grants_none_of_it() {
    let server = Server::start();
    let mut con = server.client();
    let held = acquire(&mut con, "b", "other", 60_000).expect("granted");
    let before = dbsize(&mut con);
    assert_eq!(acquire_all(&mut con, &["a", "b", "c"], "mover", &["60000"]), Ok(None));
    assert!(!exists(&mut con, "a"), "a free member before the held one was not granted");
    assert!(!exists(&mut con, "c"), "nor one after it");
    assert_eq!(dbsize(&mut con), before);
    assert_eq!(fencecheck(&mut con, "b", held), 1, "the holder keeps its lease");
    assert_eq!(counter(&mut con, "dlock_acquire_contended"), 1, "one refusal, counted once");
    assert_eq!(counter(&mut con, "dlock_acquire_granted"), 1);
    // A member with others waiting in line is not free either: the line goes first.
    let mut waiter = send_wait_for(&server, "b", "next", 60_000, 10_000, &[]);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut con, "b", "waiters").as_deref() == Some("1")
    }));
    assert_eq!(release(&mut con, "b", "other"), 1);
    let handed: Option<i64> =
        redis::from_redis_value(&waiter.recv_response().expect("reply")).expect("fence");
    assert!(handed.expect("the waiter is handed the lease") > held);
    assert_eq!(acquire_all(&mut con, &["a", "b"], "mover", &["60000"]), Ok(None));
    assert_eq!(release(&mut con, "b", "next"), 1);
    let fences = acquire_all(&mut con, &["a", "b"], "mover", &["60000"]).expect("reply");
    assert_eq!(fences.map(|f| f.len()), Some(2), "granted once every member is free");
}

#[test]
fn shared_sets_share_every_member_and_an_exclusive_set_waits_for_none_of_them() {
    let server = Server::start();
    let mut con = server.client();
    let one = acquire_all(&mut con, &["x", "y"], "r1", &["60000", "SHARED"]).expect("reply");
    let two = acquire_all(&mut con, &["x", "y"], "r2", &["60000", "SHARED"]).expect("reply");
    assert!(one.is_some() && two.is_some(), "{one:?} {two:?}");
    assert_eq!(info_field(&mut con, "x", "holders").as_deref(), Some("2"));
    // LIMIT applies to each member.
    assert_eq!(
        acquire_all(&mut con, &["x", "y"], "r3", &["60000", "SHARED", "LIMIT", "2"]),
        Ok(None)
    );
    assert_eq!(acquire_all(&mut con, &["y", "z"], "w", &["60000"]), Ok(None));
    assert!(!exists(&mut con, "z"));
    let mismatch = error_text(
        redis::cmd("DLOCK.ACQUIREALL")
            .arg(2)
            .arg("x")
            .arg("q")
            .arg("r1")
            .arg(60_000)
            .query(&mut con),
    );
    assert!(mismatch.starts_with("LOCKMODE"), "{mismatch}");
    assert!(!exists(&mut con, "q"), "a mode conflict grants nothing");
}

#[test]
fn renewall_renews_every_member_or_none_and_releaseall_frees_what_the_token_holds() {
    let server = Server::start();
    let mut con = server.client();
    let fences = acquire_all(&mut con, &["p", "q"], "t", &["60000"]).expect("reply").expect("set");
    let fence_args: Vec<String> = fences.iter().map(i64::to_string).collect();
    let with_fences = |ttl: &'static str| -> Vec<&str> {
        [ttl, "FENCES"].into_iter().chain(fence_args.iter().map(String::as_str)).collect()
    };
    assert_eq!(renew_all(&mut con, &["p", "q"], "t", &with_fences("120000")), Ok(1));
    assert!(ttl_left(&mut con, "p") > 60_000 && ttl_left(&mut con, "q") > 60_000);
    // A wrong fence for one member: nothing is renewed.
    let wrong = [
        "300000".to_owned(),
        "FENCES".to_owned(),
        fence_args[0].clone(),
        (fences[1] + 1).to_string(),
    ];
    let wrong: Vec<&str> = wrong.iter().map(String::as_str).collect();
    assert_eq!(renew_all(&mut con, &["p", "q"], "t", &wrong[..]), Ok(0));
    assert!(ttl_left(&mut con, "p") <= 120_000, "the held member was not renewed either");
    // A member lost (an operator's DEL): the set is no longer held; nothing renewed.
    redis::cmd("DEL").arg("q").exec(&mut con).expect("DEL");
    assert_eq!(renew_all(&mut con, &["p", "q"], "t", &["300000"]), Ok(0));
    assert!(ttl_left(&mut con, "p") <= 120_000);
    assert_eq!(counter(&mut con, "dlock_renew_ok"), 2, "one RENEWALL renewed two members");
    assert_eq!(counter(&mut con, "dlock_renew_refused"), 2, "each refused RENEWALL counted once");
    // RELEASEALL frees what the token still holds and says how many.
    assert_eq!(release_all(&mut con, &["p", "q"], "t", &[]), Ok(1));
    assert!(!exists(&mut con, "p"));
    let again = acquire_all(&mut con, &["p", "q"], "t", &["60000"]).expect("reply").expect("set");
    let stale = ["FENCES".to_owned(), fences[0].to_string(), again[1].to_string()];
    let stale: Vec<&str> = stale.iter().map(String::as_str).collect();
    assert_eq!(
        release_all(&mut con, &["p", "q"], "t", &stale[..]),
        Ok(1),
        "a late RELEASEALL with an earlier grant's fence frees only the member it names"
    );
    assert_eq!(info_field(&mut con, "p", "owner").as_deref(), Some("t"));
    assert!(!exists(&mut con, "q"));
}

#[test]
fn bad_arguments_name_what_is_wrong_and_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let cases: &[(&[&str], &str)] = &[
        (
            &["DLOCK.ACQUIREALL", "0", "t", "100", "x"],
            "ERR numkeys must be an integer between 1 and 64",
        ),
        (
            &["DLOCK.ACQUIREALL", "65", "t", "100", "x"],
            "ERR numkeys must be an integer between 1 and 64",
        ),
        (
            &["DLOCK.ACQUIREALL", "abc", "a", "t", "100"],
            "ERR numkeys must be an integer between 1 and 64",
        ),
        (
            &["DLOCK.ACQUIREALL", "2", "a", "a", "t", "100"],
            "ERR resource 'a' appears twice in the set",
        ),
        (
            &["DLOCK.ACQUIREALL", "2", "a", "b", "t", "100", "WAIT", "5"],
            "ERR syntax error: dlock.acquireall does not take WAIT",
        ),
        (
            &["DLOCK.ACQUIREALL", "2", "a", "b", "t", "100", "CLAIM", "5"],
            "ERR syntax error: dlock.acquireall does not take CLAIM",
        ),
        (
            &["DLOCK.ACQUIREALL", "2", "a", "b", "t", "0"],
            "ERR ttl-ms must be an integer between 1 and",
        ),
        (
            &["DLOCK.ACQUIREALL", "3", "a", "b", "t", "100"],
            "ERR wrong number of arguments for 'dlock.acquireall'",
        ),
        (
            &["DLOCK.RENEWALL", "2", "a", "b", "t", "100", "FENCES", "1"],
            "ERR FENCES needs one fence per resource (2)",
        ),
        (
            &["DLOCK.RENEWALL", "2", "a", "b", "t", "100", "FENCE", "1"],
            "ERR syntax error: unexpected argument 'FENCE'",
        ),
        (
            &["DLOCK.RELEASEALL", "2", "a", "b", "t", "FENCES", "1", "0"],
            "ERR fence must be a positive integer",
        ),
        (&["DLOCK.RELEASEALL", "1", "a"], "ERR wrong number of arguments for 'dlock.releaseall'"),
    ];
    for (args, expected) in cases {
        let error = error_text(redis::cmd(args[0]).arg(&args[1..]).query::<redis::Value>(&mut con));
        assert!(error.starts_with(expected), "{args:?}: {error}");
    }
    assert_eq!(dbsize(&mut con), 0, "no bad call created a key");
    redis::cmd("SET").arg("text").arg("v").exec(&mut con).expect("SET");
    let wrongtype = error_text(
        redis::cmd("DLOCK.ACQUIREALL")
            .arg(2)
            .arg("a")
            .arg("text")
            .arg("t")
            .arg(100)
            .query::<redis::Value>(&mut con),
    );
    assert!(wrongtype.starts_with("WRONGTYPE"), "{wrongtype}");
    assert!(!exists(&mut con, "a"), "a member of another type grants nothing");
    // The key spec: every resource is a key (ACL patterns, Cluster routing, GETKEYS).
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("DLOCK.ACQUIREALL")
        .arg(2)
        .arg("a")
        .arg("b")
        .arg("t")
        .arg(100)
        .query(&mut con)
        .expect("GETKEYS");
    assert_eq!(keys, ["a", "b"]);
}

#[test]
fn a_set_reaches_the_replica_whole_and_survives_an_aof_restart() {
    let (primary, replica) =
        primary_and_replica_with(&["--appendonly", "yes", "--appendfsync", "always"], &[]);
    let (mut p, mut r) = (primary.client(), replica.client());
    let fences = acquire_all(&mut p, &["s1", "s2"], "t", &["60000"]).expect("reply").expect("set");
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(&mut p).expect("WAIT");
    assert_eq!(acked, 1);
    for (resource, fence) in ["s1", "s2"].iter().zip(&fences) {
        assert_eq!(fencecheck(&mut r, resource, *fence), 1, "{resource} on the replica");
        assert_eq!(digest(&mut p, resource), digest(&mut r, resource), "{resource}");
    }
    // One MULTI/EXEC around the set's leases: a copy applies them together or not at all.
    let aof = String::from_utf8_lossy(&primary.aof_contents()).to_lowercase();
    let at = |needle: &str, from: usize| aof[from..].find(needle).map(|i| i + from);
    let multi = at("\r\nmulti\r\n", 0).expect("a MULTI in the AOF");
    let first = at("dlock.setlease", multi).expect("a lease after the MULTI");
    let second = at("dlock.setlease", first + 1).expect("a second lease");
    let exec = at("\r\nexec\r\n", multi).expect("an EXEC");
    assert!(exec > second, "both leases between MULTI and EXEC: {aof:?}");
    assert!(!aof[multi..first].contains("dlock."), "nothing else first");
    let restarted = primary.start_from_aof_copy(&[]);
    let mut a = restarted.client();
    for (resource, fence) in ["s1", "s2"].iter().zip(&fences) {
        assert_eq!(fencecheck(&mut a, resource, *fence), 1, "{resource} after the AOF restart");
    }
    assert_eq!(release_all(&mut p, &["s1", "s2"], "t", &[]), Ok(2));
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(&mut p).expect("WAIT");
    assert_eq!(acked, 1);
    assert!(!exists(&mut r, "s1") && !exists(&mut r, "s2"), "the release reached the replica");
}

fn ticket_count(con: &mut redis::Connection, resource: &str) -> String {
    info_field(con, resource, "tickets").unwrap_or_else(|| "no key".into())
}

#[test]
fn a_queued_set_holds_nothing_keeps_its_place_in_every_line_and_is_granted_when_all_are_free() {
    let server = Server::start();
    let mut con = server.client();
    let held = acquire(&mut con, "b", "x", 60_000).expect("granted");
    let set_queue = ["60000", "QUEUE", "10000"];
    assert_eq!(acquire_all(&mut con, &["a", "b"], "s", &set_queue), Ok(None));
    assert_eq!(ticket_count(&mut con, "a"), "1", "the set stands in line on the free member too");
    assert_eq!(ticket_count(&mut con, "b"), "1");
    assert_eq!(
        info_field(&mut con, "a", "holders").as_deref(),
        Some("0"),
        "a set in line holds nothing"
    );
    // Nobody passes the set on the free member: a later request waits behind it.
    assert_eq!(acquire(&mut con, "a", "y", 60_000), None);
    let later: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
        .arg("a")
        .arg("y")
        .arg(60_000)
        .arg("QUEUE")
        .arg(10_000)
        .query(&mut con)
        .expect("ticket");
    assert_eq!(later, None);
    // A refresh keeps the set's place; the other member is still held.
    assert_eq!(acquire_all(&mut con, &["a", "b"], "s", &set_queue), Ok(None));
    assert_eq!(release(&mut con, "b", "x"), 1);
    // The set's ticket heads b's line: the lease is not handed to it alone.
    assert_eq!(info_field(&mut con, "b", "holders").as_deref(), Some("0"));
    let fences = acquire_all(&mut con, &["a", "b"], "s", &set_queue).expect("reply").expect("set");
    assert!(fences[1] > held);
    assert_eq!(ticket_count(&mut con, "b"), "0");
    // The single ticket behind the set on a comes next, when the set lets go.
    assert_eq!(ticket_count(&mut con, "a"), "1");
    assert_eq!(release_all(&mut con, &["a", "b"], "s", &[]), Ok(2));
    assert_eq!(info_field(&mut con, "a", "owner").as_deref(), Some("y"));
    let counters = dlock_counters(&mut con);
    assert_eq!(counters["tickets_queued"], 3);
    assert_eq!(
        counters["tickets_granted"], 3,
        "two set tickets used and the single one handed over"
    );
    counters_add_up(&counters).expect("every ticket accounted for");
}

#[test]
fn two_queued_sets_over_the_same_resources_never_wait_for_each_other() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "a", "x", 60_000).expect("granted");
    acquire(&mut con, "b", "y", 60_000).expect("granted");
    let set_queue = ["60000", "QUEUE", "10000"];
    assert_eq!(acquire_all(&mut con, &["a", "b"], "s1", &set_queue), Ok(None));
    assert_eq!(acquire_all(&mut con, &["b", "a"], "s2", &set_queue), Ok(None));
    // An operator's DEL of a's key takes its holder and both tickets there. Were a refresh to
    // put back only the missing ticket, s2 (refreshing first) would head a's line while s1
    // heads b's, each waiting for the other for as long as both refresh.
    redis::cmd("DEL").arg("a").exec(&mut con).expect("DEL");
    assert_eq!(acquire_all(&mut con, &["b", "a"], "s2", &set_queue), Ok(None));
    assert_eq!(acquire_all(&mut con, &["a", "b"], "s1", &set_queue), Ok(None));
    assert_eq!(release(&mut con, "b", "y"), 1);
    assert_eq!(acquire_all(&mut con, &["a", "b"], "s1", &set_queue), Ok(None), "s2 is ahead");
    let s2 = acquire_all(&mut con, &["b", "a"], "s2", &set_queue).expect("reply");
    assert!(s2.is_some(), "s2 heads both lines and is granted");
    assert_eq!(release_all(&mut con, &["a", "b"], "s2", &[]), Ok(2));
    let s1 = acquire_all(&mut con, &["a", "b"], "s1", &set_queue).expect("reply");
    assert!(s1.is_some(), "then s1");
}

#[test]
fn a_set_ticket_not_refreshed_lapses_everywhere_and_the_line_moves_on() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "b", "x", 60_000).expect("granted");
    assert_eq!(acquire_all(&mut con, &["a", "b"], "s", &["60000", "QUEUE", "300"]), Ok(None));
    let mut waiter = send_wait_for(&server, "a", "y", 60_000, 10_000, &[]);
    // The blocked waiter behind the set's ticket on the free member is granted once it lapses.
    let granted: Option<i64> =
        redis::from_redis_value(&waiter.recv_response().expect("reply")).expect("fence or nil");
    assert!(granted.is_some(), "handed over after the set's ticket lapsed");
    assert!(eventually(Duration::from_secs(3), || {
        dlock_counters(&mut con)["tickets_lapsed"] == 2
    }));
    assert_eq!(ticket_count(&mut con, "b"), "0");
    let counters = dlock_counters(&mut con);
    counters_add_up(&counters).expect("every ticket accounted for");
}

/// CPU seconds the server has used (`INFO cpu`).
fn server_cpu(con: &mut redis::Connection) -> f64 {
    ["used_cpu_user", "used_cpu_sys"]
        .iter()
        .map(|field| info_line(con, "cpu", field).expect(field).parse::<f64>().expect("seconds"))
        .sum()
}

#[test]
fn a_set_ticket_heading_a_free_member_leaves_the_timer_idle() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "b", "x", 60_000).expect("granted");
    assert_eq!(acquire_all(&mut con, &["a", "b"], "s", &["60000", "QUEUE", "60000"]), Ok(None));
    // The free member's line waits for the set, not for the timer: no turn comes due for it
    // until the ticket would lapse. (A member looked at again every turn kept a core busy.)
    let before = server_cpu(&mut con);
    std::thread::sleep(Duration::from_secs(1));
    let used = server_cpu(&mut con) - before;
    assert!(used < 0.3, "the server used {used:.2} s of CPU in one idle second");
}
