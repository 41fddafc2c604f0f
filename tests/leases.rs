//! The failure modes users fear, each against a real redis-server.

use std::thread::sleep;
use std::time::{Duration, Instant};

use dlock_testkit::*;

/// Sleeps until `ttl` after `granted_at`, plus a small margin, so the lease has certainly ended.
fn wait_past(granted_at: Instant, ttl: Duration) {
    let until = granted_at + ttl + Duration::from_millis(20);
    sleep(until.saturating_duration_since(Instant::now()));
}

#[test]
fn the_holder_crashes_and_never_releases_so_the_lease_expires_and_another_acquires() {
    let server = Server::start();
    let mut a = server.client();
    let mut b = server.client();
    let granted_at = Instant::now();
    let fence_a = acquire(&mut a, "invoice:1", "worker-a", 300).expect("granted");
    drop(a); // worker-a crashes: its connection is gone and it never releases
    assert_eq!(acquire(&mut b, "invoice:1", "worker-b", 300), None, "still held while live");
    wait_past(granted_at, Duration::from_millis(300));
    let fence_b = acquire(&mut b, "invoice:1", "worker-b", 300).expect("granted after expiry");
    assert!(fence_b > fence_a);
}

#[test]
fn the_lease_expires_while_the_holder_works_and_its_late_release_returns_0() {
    let server = Server::start();
    let (mut a, mut b) = (server.client(), server.client());
    let granted_at = Instant::now();
    acquire(&mut a, "invoice:2", "worker-a", 200).expect("granted");
    wait_past(granted_at, Duration::from_millis(200)); // worker-a is paused (GC, swap, …)
    let fence_b = acquire(&mut b, "invoice:2", "worker-b", 10_000).expect("granted");
    assert_eq!(release(&mut a, "invoice:2", "worker-a"), 0, "the late DEL frees nothing");
    assert_eq!(info_field(&mut b, "invoice:2", "owner").as_deref(), Some("worker-b"));
    assert_eq!(info_field(&mut b, "invoice:2", "fence"), Some(fence_b.to_string()));
}

#[test]
fn a_late_renew_returns_0_and_never_revives_the_lease() {
    let server = Server::start();
    let mut a = server.client();
    let granted_at = Instant::now();
    acquire(&mut a, "invoice:3", "worker-a", 400).expect("granted");
    sleep(Duration::from_millis(150));
    assert_eq!(renew(&mut a, "invoice:3", "worker-a", 400), 1, "renewal while live");
    let renewed_at = Instant::now();
    wait_past(granted_at, Duration::from_millis(400));
    assert_eq!(
        info_field(&mut a, "invoice:3", "owner").as_deref(),
        Some("worker-a"),
        "the renewal carried the lease past its first deadline"
    );
    wait_past(renewed_at, Duration::from_millis(400));
    assert_eq!(renew(&mut a, "invoice:3", "worker-a", 10_000), 0);
    assert_eq!(info(&mut a, "invoice:3"), None);
    assert!(!exists(&mut a, "invoice:3"), "the refused renewal also removed the dead key");
}

#[test]
fn a_stale_fence_fails_fencecheck_and_the_new_one_passes() {
    let server = Server::start();
    let mut con = server.client();
    let granted_at = Instant::now();
    let stale = acquire(&mut con, "invoice:4", "worker-a", 200).expect("granted");
    assert_eq!(fencecheck(&mut con, "invoice:4", stale), 1);
    wait_past(granted_at, Duration::from_millis(200));
    assert_eq!(fencecheck(&mut con, "invoice:4", stale), 0, "an expired lease's fence is stale");
    let fresh = acquire(&mut con, "invoice:4", "worker-b", 10_000).expect("granted");
    assert_eq!(fencecheck(&mut con, "invoice:4", stale), 0);
    assert_eq!(fencecheck(&mut con, "invoice:4", fresh), 1);
    assert_eq!(fencecheck(&mut con, "invoice:4", 1), 0, "a never-issued fence");
    assert_eq!(fencecheck(&mut con, "no-such-lock", fresh), 0);
}

#[test]
fn a_lost_acquire_reply_is_retried_with_the_same_token_and_gets_the_same_fence() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "invoice:5", "worker-a", 1_000).expect("granted");
    // The reply was "lost": the client retries with the same token.
    assert_eq!(acquire(&mut con, "invoice:5", "worker-a", 10_000), Some(fence));
    let ttl: i64 = info_field(&mut con, "invoice:5", "ttl-ms").expect("live").parse().expect("int");
    assert!(ttl > 9_000, "the retry reset the deadline to now + ttl-ms, got {ttl}");
    assert_eq!(acquire(&mut con, "invoice:5", "worker-b", 10_000), None);
}

#[test]
fn release_frees_the_lock_for_the_next_owner_and_owner_checks_are_exact() {
    let server = Server::start();
    let mut con = server.client();
    let first = acquire(&mut con, "invoice:6", "worker-a", 10_000).expect("granted");
    assert_eq!(release(&mut con, "invoice:6", "worker-b"), 0);
    assert_eq!(release(&mut con, "invoice:6", "worker-"), 0, "no prefix match");
    assert_eq!(release(&mut con, "invoice:6", "worker-a"), 1);
    assert_eq!(release(&mut con, "invoice:6", "worker-a"), 0, "releasing twice");
    let second = acquire(&mut con, "invoice:6", "worker-b", 10_000).expect("free again");
    assert!(second > first);
}

#[test]
fn del_and_flushall_do_not_make_fences_repeat() {
    let server = Server::start();
    let mut con = server.client();
    let mut last = 0;
    for round in 0..20 {
        let fence = acquire(&mut con, "invoice:7", "worker", 10_000).expect("granted");
        assert!(fence > last, "round {round}: {fence} after {last}");
        last = fence;
        let reset = if round % 2 == 0 { "DEL" } else { "FLUSHALL" };
        let mut cmd = redis::cmd(reset);
        if reset == "DEL" {
            cmd.arg("invoice:7");
        }
        let _: redis::Value = cmd.query(&mut con).expect("reset");
    }
}

#[test]
fn fences_increase_across_resources_in_grant_order() {
    let server = Server::start();
    let mut con = server.client();
    let fences: Vec<i64> = (0..50)
        .map(|i| acquire(&mut con, &format!("r:{i}"), "t", 10_000).expect("granted"))
        .collect();
    assert!(fences.windows(2).all(|w| w[1] > w[0]), "{fences:?}");
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as i64;
    assert!((fences[0] - now_us).abs() < 60_000_000, "fences read as Unix microseconds");
}

#[test]
fn the_key_is_gone_after_release() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "invoice:8", "worker", 10_000).expect("granted");
    assert!(exists(&mut con, "invoice:8"));
    let kind: String = redis::cmd("TYPE").arg("invoice:8").query(&mut con).expect("TYPE");
    assert_eq!(kind, "dlocklock");
    let ttl: i64 = redis::cmd("PTTL").arg("invoice:8").query(&mut con).expect("PTTL");
    assert_eq!(ttl, -1, "the lease lives in the value, the key has no Redis TTL");
    assert_eq!(release(&mut con, "invoice:8", "worker"), 1);
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn expired_keys_are_removed_without_anyone_touching_them() {
    let server = Server::start();
    let mut con = server.client();
    let granted_at = Instant::now();
    for i in 0..100 {
        acquire(&mut con, &format!("batch:{i}"), "worker", 300).expect("granted");
    }
    acquire(&mut con, "long", "worker", 60_000).expect("granted");
    assert_eq!(dbsize(&mut con), 101);
    // DBSIZE does not run the module, so only active expiry can empty the keyspace.
    assert!(
        eventually(Duration::from_secs(5), || dbsize(&mut con) == 1),
        "expired keys still present: {}",
        dbsize(&mut con)
    );
    assert!(granted_at.elapsed() >= Duration::from_millis(300), "nothing expired early");
    assert!(exists(&mut con, "long"), "a live lease is never swept");
}

#[test]
fn a_renewed_lease_is_not_swept_at_its_first_deadline() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "invoice:9", "worker", 300).expect("granted");
    let renewed_at = Instant::now();
    assert_eq!(renew(&mut con, "invoice:9", "worker", 1_500), 1);
    sleep(Duration::from_millis(600)); // past the first deadline, well before the renewed one
    if renewed_at.elapsed() < Duration::from_millis(1_400) {
        assert_eq!(info_field(&mut con, "invoice:9", "owner").as_deref(), Some("worker"));
    }
    assert!(eventually(Duration::from_secs(5), || !exists(&mut con, "invoice:9")));
    assert!(renewed_at.elapsed() >= Duration::from_millis(1_500));
}

#[test]
fn info_reports_owner_fence_remaining_ttl_hold_time_renewals_and_waiters() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(info(&mut con, "invoice:10"), None);
    let granted_at = Instant::now();
    let fence = acquire(&mut con, "invoice:10", "worker-a", 5_000).expect("granted");
    assert_eq!(renew(&mut con, "invoice:10", "worker-a", 5_000), 1);
    assert_eq!(renew(&mut con, "invoice:10", "worker-a", 5_000), 1);
    sleep(Duration::from_millis(50));
    let fields = info(&mut con, "invoice:10").expect("live");
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "owner",
            "fence",
            "ttl-ms",
            "held-ms",
            "renewals",
            "waiters",
            "next-waiters",
            "tickets",
            "mode",
            "holders",
            "meta",
            "handovers",
            "wait-p50-us",
            "wait-p99-us",
            "hold-p50-us",
            "hold-p99-us"
        ]
    );
    assert_eq!(fields[0].1, "worker-a");
    assert_eq!(fields[1].1, fence.to_string());
    let ttl: i64 = fields[2].1.parse().expect("int");
    assert!((1..=5_000).contains(&ttl), "{ttl}");
    let held: u128 = fields[3].1.parse().expect("int");
    // The grant time is kept to the millisecond (the one it fell in): up to 1 ms more.
    assert!(held >= 50 && held <= granted_at.elapsed().as_millis() + 1, "{held}");
    assert_eq!(fields[4].1, "2", "two renewals");
    assert_eq!(fields[5].1, "0");
    assert_eq!((fields[8].1.as_str(), fields[9].1.as_str()), ("exclusive", "1"));
    assert_eq!(fields[10].1, "nil", "no META given");

    let mut resp3 = server.client_resp3();
    let value: redis::Value =
        redis::cmd("DLOCK.INFO").arg("invoice:10").query(&mut resp3).expect("INFO");
    assert!(matches!(value, redis::Value::Map(ref pairs) if pairs.len() == 16), "{value:?}");
    assert_eq!(info_field(&mut resp3, "invoice:10", "owner").as_deref(), Some("worker-a"));
}

#[test]
fn binary_tokens_round_trip_byte_for_byte() {
    let server = Server::start();
    let mut con = server.client();
    let token: &[u8] = b"w\x00\xff\r\n1";
    let fence: i64 = redis::cmd("DLOCK.ACQUIRE")
        .arg("bin")
        .arg(token)
        .arg(5_000)
        .query(&mut con)
        .expect("granted");
    let other: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
        .arg("bin")
        .arg(&b"w\x00\xff\r\n2"[..])
        .arg(5_000)
        .query(&mut con)
        .expect("reply");
    assert_eq!(other, None);
    let again: i64 =
        redis::cmd("DLOCK.ACQUIRE").arg("bin").arg(token).arg(5_000).query(&mut con).expect("same");
    assert_eq!(again, fence);
    let value: redis::Value = redis::cmd("DLOCK.INFO").arg("bin").query(&mut con).expect("INFO");
    let redis::Value::Array(items) = value else { panic!("array") };
    assert_eq!(items[1], redis::Value::BulkString(token.to_vec()));
}

#[test]
fn a_late_release_or_renew_of_an_earlier_grant_never_touches_a_later_grant_of_the_same_token() {
    let server = Server::start();
    let mut con = server.client();
    let first = acquire(&mut con, "r", "worker", 60_000).expect("granted");
    let fenced = |con: &mut redis::Connection, command: &str, extra: &[&str], fence: i64| -> i64 {
        redis::cmd(command)
            .arg("r")
            .arg("worker")
            .arg(extra)
            .arg("FENCE")
            .arg(fence)
            .query(con)
            .expect(command)
    };
    assert_eq!(fenced(&mut con, "DLOCK.RELEASE", &[], first), 1);
    let second = acquire(&mut con, "r", "worker", 60_000).expect("granted again");
    // The first RELEASE, retried or duplicated, arrives late; so does a RENEW of the first grant.
    assert_eq!(fenced(&mut con, "DLOCK.RELEASE", &[], first), 0);
    assert_eq!(fenced(&mut con, "DLOCK.RENEW", &["1000"], first), 0);
    assert_eq!(fencecheck(&mut con, "r", second), 1, "the second grant stands, untouched");
    assert!(info_field(&mut con, "r", "ttl-ms").and_then(|t| t.parse::<i64>().ok()) > Some(50_000));
    assert_eq!(fenced(&mut con, "DLOCK.RENEW", &["60000"], second), 1);
    assert_eq!(fenced(&mut con, "DLOCK.RELEASE", &[], second), 1);
    assert!(!exists(&mut con, "r"));
}

/// Sixteen clients acquire and release distinct keys at once, so each release finds other
/// clients' grants after its own in the index: the released keys' entries are reclaimed all the
/// same, instead of waiting for their old deadlines (nearly every one of them stayed when only
/// the newest entry could go).
#[test]
fn released_keys_give_back_their_index_entries_under_concurrent_cycles() {
    let server = Server::start();
    std::thread::scope(|scope| {
        for client in 0..16 {
            let server = &server;
            scope.spawn(move || {
                let mut con = server.client();
                for i in 0..300 {
                    let key = format!("cycle:{client}:{i}");
                    acquire(&mut con, &key, "t", 600_000).expect("granted");
                    assert_eq!(release(&mut con, &key, "t"), 1);
                }
            });
        }
    });
    let mut con = server.client();
    assert_eq!(dbsize(&mut con), 0);
    let entries: usize = info_line(&mut con, "dlock", "dlock_index_entries")
        .and_then(|entries| entries.parse().ok())
        .expect("index_entries");
    assert!(entries < 48, "{entries} index entries left by 4,800 released keys");
}
