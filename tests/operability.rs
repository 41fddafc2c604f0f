//! What an operator sees: `INFO dlock`, `DLOCK.INFO`, keyspace events, log lines, configs.

use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use dlock_testkit::*;

#[test]
fn counters_move_exactly_as_a_scripted_sequence_predicts_and_resetstat_clears_them() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "job", "a", 60_000).expect("granted"); // granted
    assert_eq!(acquire(&mut con, "job", "a", 60_000), Some(fence)); // reacquired
    assert_eq!(acquire(&mut con, "job", "b", 60_000), None); // contended
    assert_eq!(renew(&mut con, "job", "a", 60_000), 1); // renew ok
    assert_eq!(renew(&mut con, "job", "b", 60_000), 0); // renew refused
    assert_eq!(fencecheck(&mut con, "job", fence), 1); // passed
    assert_eq!(fencecheck(&mut con, "job", 1), 0); // stale
    let _: i64 = redis::cmd("DLOCK.FENCED")
        .arg("job")
        .arg(fence)
        .arg("INCR")
        .arg("n")
        .query(&mut con)
        .expect("fenced");
    let _ = redis::cmd("DLOCK.FENCED")
        .arg("job")
        .arg(1)
        .arg("INCR")
        .arg("n")
        .query::<redis::Value>(&mut con);
    let mut waiter = server.client();
    let timed_out: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
        .arg("job")
        .arg("c")
        .arg(1_000)
        .arg("WAIT")
        .arg(50)
        .query(&mut waiter)
        .expect("wait");
    assert_eq!(timed_out, None); // wait started, timed out
    let granted = thread::spawn(move || {
        redis::cmd("DLOCK.ACQUIRE")
            .arg("job")
            .arg("d")
            .arg(100)
            .arg("WAIT")
            .arg(0)
            .query::<Option<i64>>(&mut waiter)
    });
    assert!(eventually(Duration::from_secs(5), || info_field(&mut con, "job", "waiters")
        .as_deref()
        == Some("1")));
    assert_eq!(dlock_counters(&mut con)["waiters"], 1);
    assert_eq!(dlock_counters(&mut con)["lock_keys"], 1);
    assert_eq!(release(&mut con, "job", "b"), 0); // not owner
    assert_eq!(release(&mut con, "job", "a"), 1); // released, handed to d
    assert!(granted.join().expect("waiter").expect("reply").is_some());
    assert!(eventually(Duration::from_secs(5), || !exists(&mut con, "job"))); // d's lease expires

    let stats = dlock_counters(&mut con);
    let expected = [
        ("acquire_granted", 1),
        ("acquire_reacquired", 1),
        ("acquire_contended", 1),
        ("renew_ok", 1),
        ("renew_refused", 1),
        ("release_ok", 1),
        ("release_not_owner", 1),
        ("fencecheck_passed", 1),
        ("fencecheck_stale", 1),
        ("fenced_writes_ok", 1),
        ("fenced_writes_refused", 1),
        ("waits_started", 2),
        ("waits_timed_out", 1),
        ("waits_granted", 1),
        ("leases_expired", 1),
        ("lock_keys", 0),
        ("waiters", 0),
        ("hold_time_us_count", 2),
        ("wait_time_us_count", 1),
    ];
    for (name, value) in expected {
        assert_eq!(stats[name], value, "{name}");
    }
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut con).expect("RESETSTAT");
    let stats = dlock_counters(&mut con);
    // index_entries is a gauge of the expiry index (stale entries of renewed leases wait for
    // their old deadlines): RESETSTAT does not touch it.
    let counters = stats.iter().filter(|(name, _)| name.as_str() != "index_entries");
    assert!(counters.clone().all(|(_, value)| *value == 0), "{stats:?}");
}

#[test]
fn hold_time_percentiles_are_sane_for_known_hold_times() {
    let server = Server::start();
    let mut con = server.client();
    for (i, hold_ms) in [20u64, 40, 60, 80, 100, 120, 140, 160, 180, 300].iter().enumerate() {
        let resource = format!("r{i}");
        acquire(&mut con, &resource, "w", 60_000).expect("granted");
        sleep(Duration::from_millis(*hold_ms));
        assert_eq!(release(&mut con, &resource, "w"), 1);
    }
    let stats = dlock_counters(&mut con);
    let (p50, p95, p99, max) = (
        stats["hold_time_us_p50"],
        stats["hold_time_us_p95"],
        stats["hold_time_us_p99"],
        stats["hold_time_us_max"],
    );
    assert_eq!(stats["hold_time_us_count"], 10);
    assert!((100_000..300_000).contains(&p50), "p50 {p50}: the 5th of ten holds is 100 ms");
    assert!((300_000..5_000_000).contains(&max), "max {max}");
    assert!(p50 <= p95 && p95 <= p99 && p99 <= max, "{p50} {p95} {p99} {max}");
}

#[test]
fn ownership_events_arrive_in_order_on_the_resources_channel() {
    let server = Server::start();
    let mut con = server.client();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("Kd")
        .query(&mut con)
        .expect("CONFIG");
    let mut listener = server.client();
    listener.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe("__keyspace@0__:job").expect("SUBSCRIBE");
    acquire(&mut con, "job", "a", 60_000).expect("granted");
    assert_eq!(renew(&mut con, "job", "a", 300), 1);
    let waiter_server_port = server.port;
    let waiter = thread::spawn(move || {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{waiter_server_port}/"))
            .and_then(|c| c.get_connection())
            .expect("connect");
        redis::cmd("DLOCK.ACQUIRE")
            .arg("job")
            .arg("b")
            .arg(60_000)
            .arg("WAIT")
            .arg(0)
            .query::<Option<i64>>(&mut c)
    });
    assert!(waiter.join().expect("waiter").expect("reply").is_some(), "handed over at expiry");
    assert_eq!(release(&mut con, "job", "b"), 1);
    let events: Vec<String> = (0..5)
        .map(|_| pubsub.get_message().expect("event").get_payload::<String>().expect("payload"))
        .collect();
    assert_eq!(
        events,
        ["dlock.acquired", "dlock.renewed", "dlock.expired", "dlock.handoff", "dlock.released"]
    );
}

#[test]
fn transitions_are_logged_greppable_and_anomalies_are_rate_limited() {
    let server = Server::start(); // the harness runs servers at loglevel verbose
    let mut con = server.client();
    let fence = acquire(&mut con, "invoice:42", "worker-a", 60_000).expect("granted");
    assert!(
        server
            .log()
            .contains(&format!("lease acquired resource=invoice:42 owner=worker-a fence={fence}"))
    );
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("loglevel")
        .arg("notice")
        .query(&mut con)
        .expect("CONFIG");
    acquire(&mut con, "invoice:43", "worker-a", 60_000).expect("granted");
    assert!(
        !server.log().contains("resource=invoice:43"),
        "no verbose line once the level is notice"
    );
    for _ in 0..200 {
        assert_eq!(release(&mut con, "invoice:42", "intruder"), 0);
    }
    let noticed =
        server.log().matches("release by a non-owner refused resource=invoice:42").count();
    assert!((1..=20).contains(&noticed), "{noticed} notice lines for 200 anomalies");
    sleep(Duration::from_millis(1_100));
    assert_eq!(release(&mut con, "invoice:42", "intruder"), 0);
    assert!(server.log().contains("anomaly lines suppressed in the last second"));
}

#[test]
fn max_hold_ms_refuses_the_renewal_that_would_outlast_it() {
    let server = Server::start();
    let mut con = server.client();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("dlock.max-hold-ms")
        .arg(1_000)
        .query(&mut con)
        .expect("CONFIG SET");
    let granted_at = Instant::now();
    acquire(&mut con, "job", "stuck-worker", 400).expect("granted");
    assert_eq!(renew(&mut con, "job", "stuck-worker", 800), 1, "well within the limit");
    sleep((granted_at + Duration::from_millis(700)).saturating_duration_since(Instant::now()));
    assert_eq!(renew(&mut con, "job", "stuck-worker", 400), 0, "700 + 400 ms would pass 1000 ms");
    assert_eq!(dlock_counters(&mut con)["renew_refused_max_hold"], 1);
    for bad in ["-1", "abc", "99999999999999"] {
        let refused =
            redis::cmd("CONFIG").arg("SET").arg("dlock.max-hold-ms").arg(bad).query::<()>(&mut con);
        assert!(refused.is_err(), "{bad} accepted");
    }
    let value: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("dlock.max-hold-ms").query(&mut con).expect("GET");
    assert_eq!(value[1], "1000");
}

/// Module load arguments go through `CONFIG SET`'s own rules: a bad one (out of range, not a
/// number, unknown, without a value, given twice) stops the server with a log line naming it,
/// never an abort and never a server running with a setting no ACQUIRE can pass; names are taken
/// in any case, as `CONFIG SET` takes them.
#[test]
fn a_bad_load_argument_is_refused_naming_it_and_the_server_does_not_start() {
    let config_set = "CONFIG SET failed (possibly related to argument";
    let cases: [(&[&str], &str); 8] = [
        (&["max-ttl-ms", "0"], "load argument max-ttl-ms 0: CONFIG SET failed"),
        (&["max-ttl-ms", "-5"], "load argument max-ttl-ms -5: CONFIG SET failed"),
        (&["max-ttl-ms", "99999999999999"], "load argument max-ttl-ms 99999999999999: CONFIG"),
        (&["max-hold-ms", "-1"], "load argument max-hold-ms -1: CONFIG SET failed"),
        (&["max-ttl-ms", "abc"], "load argument max-ttl-ms abc: CONFIG SET failed"),
        (&["bogus", "5"], "unknown load argument 'bogus' (the settings: max-ttl-ms,"),
        (&["max-ttl-ms"], "load argument max-ttl-ms has no value"),
        (&["max-ttl-ms", "5000", "MAX-TTL-MS", "6000"], "load argument max-ttl-ms is given twice"),
    ];
    for (args, reason) in cases {
        let Err(why) = Launch::new().args(args).try_start() else {
            panic!("the server started with load arguments {args:?}");
        };
        assert!(why.contains(&format!("<dlock> not loaded: {reason}")), "{args:?}: {why}");
        if reason.contains("CONFIG") {
            assert!(why.contains(config_set), "{args:?}: {why}");
        }
        assert!(!why.contains("panic"), "{args:?}: {why}");
    }
    let server = Launch::new().args(&["MAX-TTL-MS", "5000", "max-hold-ms", "7000"]).start();
    let mut con = server.client();
    let values: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("dlock.max-*").query(&mut con).expect("CONFIG GET");
    let pairs: std::collections::BTreeMap<&str, &str> =
        values.chunks(2).map(|pair| (pair[0].as_str(), pair[1].as_str())).collect();
    assert_eq!(pairs["dlock.max-ttl-ms"], "5000");
    assert_eq!(pairs["dlock.max-hold-ms"], "7000");
}

#[test]
fn every_config_is_settable_at_load_and_by_config_set() {
    let server = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--dlock.max-ttl-ms",
        "60000",
        "--dlock.max-hold-ms",
        "120000",
        "--dlock.restart-grant-delay-ms",
        "0",
    ]);
    let mut con = server.client();
    let values: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("dlock.*").query(&mut con).expect("CONFIG GET");
    let pairs: std::collections::BTreeMap<&str, &str> =
        values.chunks(2).map(|pair| (pair[0].as_str(), pair[1].as_str())).collect();
    assert_eq!(pairs["dlock.max-ttl-ms"], "60000");
    assert_eq!(pairs["dlock.max-hold-ms"], "120000");
    assert_eq!(pairs["dlock.restart-grant-delay-ms"], "0");
    for name in ["dlock.max-ttl-ms", "dlock.max-hold-ms", "dlock.restart-grant-delay-ms"] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(5_000)
            .query(&mut con)
            .expect("CONFIG SET");
        let value: Vec<String> =
            redis::cmd("CONFIG").arg("GET").arg(name).query(&mut con).expect("GET");
        assert_eq!(value[1], "5000", "{name}");
    }
}

#[test]
fn acquire_and_release_cycles_leave_nothing_in_the_expiry_index() {
    let server = Server::start();
    let mut con = server.client();
    for _ in 0..3_000 {
        acquire(&mut con, "cycled", "worker", 20_000).expect("granted");
        assert_eq!(release(&mut con, "cycled", "worker"), 1);
    }
    assert_eq!(dbsize(&mut con), 0);
    let entries = info_line(&mut con, "dlock", "dlock_index_entries");
    assert_eq!(entries.as_deref(), Some("0"), "released grants gave their entries back");
    acquire(&mut con, "held", "worker", 20_000).expect("granted");
    assert_eq!(info_line(&mut con, "dlock", "dlock_index_entries").as_deref(), Some("1"));
}

#[test]
fn every_wait_ends_in_exactly_one_counter_even_when_its_key_is_reloaded_away() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "job", "a", 60_000).expect("granted");
    let mut waiter = send_wait(&server, "job", "b", 60_000, &[]);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut con, "job", "waiters").as_deref() == Some("1")
    }));
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).expect("DEBUG RELOAD");
    let answer: Option<i64> =
        redis::from_redis_value(&waiter.recv_response().expect("reply")).expect("nil");
    assert_eq!(answer, None, "the reload ended the wait");
    let stats = dlock_counters(&mut con);
    let ended = stats["waits_granted"] + stats["waits_timed_out"] + stats["waits_abandoned"];
    assert_eq!((stats["waits_started"], ended), (1, 1), "{stats:?}");
}

/// Every RENEW and RELEASE answered 0 is counted, whether or not its resource has a key: a
/// refusal on a missing key goes through the same decision as any other, creates no key and
/// propagates nothing.
#[test]
fn every_refused_renew_and_release_is_counted_even_on_a_missing_key() {
    let server = Server::start_with(AOF_ALWAYS);
    let mut con = server.client();
    let fence = acquire(&mut con, "held", "worker-b", 60_000).expect("granted");
    let aof_before = server.aof_contents();
    assert_eq!(release(&mut con, "held", "worker-a"), 0, "another token holds it");
    assert_eq!(release(&mut con, "missing", "worker-a"), 0, "no key");
    let fenced_release: i64 = redis::cmd("DLOCK.RELEASE")
        .arg("missing")
        .arg("worker-a")
        .arg("FENCE")
        .arg(fence)
        .query(&mut con)
        .expect("RELEASE FENCE");
    assert_eq!(fenced_release, 0, "no key, with FENCE");
    assert_eq!(renew(&mut con, "held", "worker-a", 30_000), 0, "another token holds it");
    assert_eq!(renew(&mut con, "missing", "worker-a", 30_000), 0, "no key");
    let fenced_renew: i64 = redis::cmd("DLOCK.RENEW")
        .arg("missing")
        .arg("worker-a")
        .arg(30_000)
        .arg("FENCE")
        .arg(fence)
        .query(&mut con)
        .expect("RENEW FENCE");
    assert_eq!(fenced_renew, 0, "no key, with FENCE");
    let stats = dlock_counters(&mut con);
    assert_eq!(stats["release_not_owner"], 3, "{stats:?}");
    assert_eq!(stats["renew_refused"], 3, "{stats:?}");
    assert_eq!((stats["release_ok"], stats["renew_ok"]), (0, 0), "{stats:?}");
    assert!(!exists(&mut con, "missing"), "a refusal creates no key");
    assert_eq!((dbsize(&mut con), stats["lock_keys"]), (1, 1));
    assert_eq!(info_field(&mut con, "held", "owner").as_deref(), Some("worker-b"));
    assert!(server.aof_contents() == aof_before, "a refusal propagates nothing");
}
