//! Leases and fences across DEBUG RELOAD, RDB and AOF restarts; effects in the AOF.

use std::time::{Duration, Instant};

use dlock_testkit::*;

fn ttl_ms(con: &mut redis::Connection, resource: &str) -> i64 {
    info_field(con, resource, "ttl-ms").expect("live lease").parse().expect("integer")
}

/// Asserts `resource` is held by `owner` with `fence` and a remaining ttl in `ttl_range`.
fn assert_held(con: &mut redis::Connection, resource: &str, owner: &str, fence: i64, max_ttl: i64) {
    assert_eq!(info_field(con, resource, "owner").as_deref(), Some(owner), "{resource} owner");
    assert_eq!(info_field(con, resource, "fence"), Some(fence.to_string()), "{resource} fence");
    let ttl = ttl_ms(con, resource);
    assert!(ttl > 0 && ttl <= max_ttl, "{resource} ttl {ttl} not in 1..={max_ttl}");
    assert_eq!(acquire(con, resource, "intruder", 1_000), None, "{resource} still exclusive");
}

#[test]
fn debug_reload_keeps_leases_fences_and_deadlines() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "invoice:1", "worker-a", 60_000).expect("granted");
    assert_eq!(renew(&mut con, "invoice:1", "worker-a", 60_000), 1);
    assert_eq!(renew(&mut con, "invoice:1", "worker-a", 60_000), 1);
    std::thread::sleep(Duration::from_millis(100));
    let digest_before = digest(&mut con, "invoice:1");
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).expect("DEBUG RELOAD");
    assert_held(&mut con, "invoice:1", "worker-a", fence, 60_000);
    let digest_after = digest(&mut con, "invoice:1");
    assert_eq!(digest_before, digest_after, "the value survives the round trip bit for bit");
    assert_eq!(info_field(&mut con, "invoice:1", "renewals").as_deref(), Some("2"), "history kept");
    let held: u64 =
        info_field(&mut con, "invoice:1", "held-ms").expect("held").parse().expect("int");
    assert!(held >= 100, "held-ms counts from the original grant: {held}");
    assert!(acquire(&mut con, "invoice:2", "worker-b", 1_000).expect("granted") > fence);
}

#[test]
fn restart_from_rdb_keeps_leases_and_deadlines() {
    let mut server = Server::start_with(&["--appendonly", "no"]);
    let mut con = server.client();
    let fence = acquire(&mut con, "invoice:1", "worker-a", 30_000).expect("granted");
    let short = acquire(&mut con, "invoice:2", "worker-b", 200).expect("granted");
    let _: () = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    let saved_at = Instant::now();
    server.crash_and_restart();
    let mut con = server.client();
    let elapsed = saved_at.elapsed().as_millis() as i64;
    assert_held(&mut con, "invoice:1", "worker-a", fence, 30_000 - elapsed);
    // A lease whose saved deadline passed while the server was down is gone after load.
    assert!(eventually(Duration::from_secs(5), || !exists(&mut con, "invoice:2")));
    assert!(acquire(&mut con, "invoice:2", "worker-c", 1_000).expect("free") > short);
    assert_eq!(release(&mut con, "invoice:1", "worker-a"), 1);
}

#[test]
fn restart_from_aof_with_fsync_always_keeps_every_acknowledged_lease() {
    let mut server = Server::start_with(AOF_ALWAYS);
    let mut con = server.client();
    let kept = acquire(&mut con, "held", "worker-a", 60_000).expect("granted");
    acquire(&mut con, "released", "worker-b", 60_000).expect("granted");
    assert_eq!(release(&mut con, "released", "worker-b"), 1);
    acquire(&mut con, "renewed", "worker-c", 1_000).expect("granted");
    assert_eq!(renew(&mut con, "renewed", "worker-c", 60_000), 1);
    let last = acquire(&mut con, "expiring", "worker-d", 200).expect("granted");
    let killed_at = Instant::now();
    server.crash_and_restart(); // SIGKILL: nothing but the fsynced AOF survives
    let mut con = server.client();
    let elapsed = killed_at.elapsed().as_millis() as i64;
    assert_held(&mut con, "held", "worker-a", kept, 60_000 - elapsed);
    assert_eq!(info_field(&mut con, "renewed", "owner").as_deref(), Some("worker-c"));
    assert!(ttl_ms(&mut con, "renewed") > 1_000, "the renewal was durable");
    assert_eq!(info(&mut con, "released"), None);
    assert!(eventually(Duration::from_secs(5), || !exists(&mut con, "expiring")));
    assert!(acquire(&mut con, "fresh", "worker-e", 1_000).expect("granted") > last);
}

#[test]
fn aof_rewrite_without_rdb_preamble_keeps_leases() {
    let mut server = Server::start_with(&aof_always_without_preamble());
    let mut con = server.client();
    let fence = acquire(&mut con, "invoice:1", "worker-a", 60_000).expect("granted");
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut con).expect("BGREWRITEAOF");
    wait_for_background_persistence(&mut con);
    let base = server.aof_contents();
    assert!(
        base.windows(14).any(|w| w.eq_ignore_ascii_case(b"DLOCK.SETLEASE")),
        "the rewritten AOF recreates the lock with DLOCK.SETLEASE"
    );
    server.crash_and_restart();
    let mut con = server.client();
    assert_held(&mut con, "invoice:1", "worker-a", fence, 60_000);
}

#[test]
fn aof_rewrite_with_rdb_preamble_keeps_leases() {
    let mut server = Server::start_with(AOF_ALWAYS);
    let mut con = server.client();
    let fence = acquire(&mut con, "invoice:1", "worker-a", 60_000).expect("granted");
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut con).expect("BGREWRITEAOF");
    wait_for_background_persistence(&mut con);
    server.crash_and_restart();
    let mut con = server.client();
    assert_held(&mut con, "invoice:1", "worker-a", fence, 60_000);
}

#[test]
fn the_aof_records_effects_never_a_rerun_of_acquire() {
    let server = Server::start_with(AOF_ALWAYS);
    let mut con = server.client();
    let fence = acquire(&mut con, "invoice:1", "worker-a", 60_000).expect("granted");
    assert_eq!(renew(&mut con, "invoice:1", "worker-a", 60_000), 1);
    assert_eq!(release(&mut con, "invoice:1", "worker-a"), 1);
    acquire(&mut con, "invoice:2", "worker-b", 100).expect("granted");
    assert!(eventually(Duration::from_secs(5), || !exists(&mut con, "invoice:2")));
    assert_eq!(
        acquire(&mut con, "invoice:3", "worker-c", 60_000),
        acquire(&mut con, "invoice:3", "worker-c", 60_000)
    );
    let aof = String::from_utf8_lossy(&server.aof_contents()).to_lowercase();
    assert!(!aof.contains("dlock.acquire"), "ACQUIRE is never re-run from the AOF:\n{aof}");
    assert!(!aof.contains("dlock.renew"), "nor RENEW:\n{aof}");
    // The RELEASE that took the key with it is recorded as it was sent: replayed, it deletes the
    // key (the server passes a command on without looking it up by name, unlike a DEL).
    assert_eq!(aof.matches("dlock.release").count(), 1, "the release, as sent:\n{aof}");
    // A plain grant and its renewal travel in the compact form (`fence:deadline:granted:0`,
    // `fence:deadline`): the client's own command rewritten, not a command looked up by name.
    let grant = "dlock.setlease\r\n$9\r\ninvoice:1\r\n$8\r\nworker-a\r\n";
    let effects: Vec<Vec<&str>> = aof
        .match_indices(&grant)
        .map(|(at, _)| aof[at + grant.len()..].split("\r\n").nth(1).expect("effect"))
        .map(|effect| effect.split(':').collect())
        .collect();
    assert_eq!(effects.len(), 2, "the grant and its renewal:\n{aof}");
    assert_eq!((effects[0][0], effects[0].len(), effects[0][3]), (&*fence.to_string(), 4, "0"));
    assert_eq!((effects[1][0], effects[1].len()), (&*fence.to_string(), 2), "renewal");
    assert_eq!(
        aof.matches("dlock.setlease").count(),
        5,
        "grant, renewal, grant, grant, re-grant:\n{aof}"
    );
    let deletes = aof.matches("\r\ndel\r\n").count();
    assert_eq!(deletes, 1, "one DEL, for the active expiry:\n{aof}");
}

/// A grant propagated as the client's own command rewritten for the moment of propagation is
/// put back at once: what the server records of the call afterwards (the slow log) is the
/// command as the client sent it.
#[test]
fn a_grant_propagated_in_place_leaves_the_clients_command_as_sent() {
    let server = Server::start_with(AOF_ALWAYS);
    let mut con = server.client();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "slowlog-log-slower-than", "0"])
        .query(&mut con)
        .expect("CONFIG");
    acquire(&mut con, "invoice:1", "worker-a", 60_000).expect("granted");
    assert_eq!(renew(&mut con, "invoice:1", "worker-a", 60_000), 1);
    let log: Vec<redis::Value> =
        redis::cmd("SLOWLOG").arg(&["GET", "10"]).query(&mut con).expect("SLOWLOG");
    let commands: Vec<Vec<String>> = log
        .into_iter()
        .map(|entry| match entry {
            redis::Value::Array(fields) => redis::from_redis_value(&fields[3]).expect("arguments"),
            entry => panic!("a slow log entry: {entry:?}"),
        })
        // The test's own set-up and the module's account of subscriptions (`PUBSUB`) aside.
        .filter(|command: &Vec<String>| command[0].starts_with("DLOCK."))
        .collect();
    assert_eq!(
        commands,
        [
            vec!["DLOCK.RENEW", "invoice:1", "worker-a", "60000"],
            vec!["DLOCK.ACQUIRE", "invoice:1", "worker-a", "60000"],
        ]
    );
    let aof = String::from_utf8_lossy(&server.aof_contents()).to_lowercase();
    assert_eq!(aof.matches("dlock.setlease").count(), 2, "both propagated as effects:\n{aof}");
}

/// A lease in the long form (`fence deadline GRANTED granted RENEWALS n`), as earlier versions
/// and every shared or described lease write it, loads from the AOF with its history.
#[test]
fn the_long_form_of_a_lease_still_loads_with_its_history() {
    let granted = (now_us() - 5_000_000).to_string();
    let fence = 1_000_000_000_000_000_i64;
    let history = [&b"GRANTED"[..], granted.as_bytes(), b"RENEWALS", b"3"];
    let aof = legacy_aof_with_a_lease(fence, now_us() + 600_000_000, &history);
    let server = Server::start_with_files(&[("appendonly.aof", &aof)], &["--appendonly", "yes"]);
    let mut con = server.client();
    assert_eq!(info_field(&mut con, "lock:x", "owner").as_deref(), Some("tok"));
    assert_eq!(info_field(&mut con, "lock:x", "fence"), Some(fence.to_string()));
    assert_eq!(info_field(&mut con, "lock:x", "renewals").as_deref(), Some("3"));
    let held: i64 = info_field(&mut con, "lock:x", "held-ms").expect("held").parse().expect("ms");
    assert!((5_000..60_000).contains(&held), "held from the grant: {held} ms");
    assert!(ttl_ms(&mut con, "lock:x") > 500_000);
}

#[test]
fn expiries_reach_the_aof_as_few_dels_of_many_keys_in_each_database() {
    let mut server = Server::start_with(AOF_ALWAYS);
    let mut con = server.client();
    let mut pipe = redis::pipe();
    for db in [0, 3] {
        pipe.cmd("SELECT").arg(db).ignore();
        for i in 0..200 {
            pipe.cmd("DLOCK.ACQUIRE").arg(format!("job:{i}")).arg("w").arg(300).ignore();
        }
    }
    pipe.cmd("SELECT").arg(3).ignore();
    pipe.cmd("DLOCK.ACQUIRE").arg("kept").arg("w").arg(60_000).ignore();
    pipe.cmd("SELECT").arg(0).ignore();
    pipe.query::<()>(&mut con).expect("acquired");
    assert!(eventually(Duration::from_secs(10), || dbsize_in(&mut con, 0) == 0
        && dbsize_in(&mut con, 3) == 1));
    let aof = String::from_utf8_lossy(&server.aof_contents()).to_lowercase();
    let dels = aof.matches("\r\ndel\r\n").count();
    assert!(
        (2..=40).contains(&dels),
        "400 expiries in a few DELs, one database each: {dels}\n{aof}"
    );
    server.crash_and_restart();
    let mut con = server.client();
    assert_eq!(dbsize_in(&mut con, 0), 0, "the replayed DELs removed every expired lease");
    assert_eq!(dbsize_in(&mut con, 3), 1, "and only those");
}

#[test]
fn a_release_replayed_from_the_aof_deletes_its_key_and_nothing_else() {
    let mut server = Server::start_with(AOF_ALWAYS);
    let mut con = server.client();
    acquire(&mut con, "invoice:1", "worker-a", 60_000).expect("granted");
    let kept = acquire(&mut con, "invoice:2", "worker-b", 60_000).expect("granted");
    assert_eq!(release(&mut con, "invoice:1", "worker-a"), 1);
    // A refused RELEASE (not the holder) changes nothing and is not recorded.
    assert_eq!(release(&mut con, "invoice:2", "worker-a"), 0);
    let aof = String::from_utf8_lossy(&server.aof_contents()).to_lowercase();
    assert_eq!(aof.matches("dlock.release").count(), 1, "only the release that deleted:\n{aof}");
    server.crash_and_restart();
    let mut con = server.client();
    assert!(!exists(&mut con, "invoice:1"), "the replayed release deleted the key");
    assert_held(&mut con, "invoice:2", "worker-b", kept, 60_000);
    // The restarted server grants the released resource again, with a larger fence.
    let again = acquire(&mut con, "invoice:1", "worker-c", 60_000).expect("granted");
    assert!(again > kept, "fences keep rising across the restart");
}

#[test]
fn a_lock_loaded_from_the_aof_raises_the_fence_counter_even_after_its_key_is_gone() {
    // A hand-written legacy AOF whose lease carries a fence far ahead of the wall clock.
    let future_fence = now_us() + 1_000_000_000_000;
    let deadline = now_us() + 60_000_000;
    let aof = legacy_aof_with_a_deleted_lock(future_fence, deadline);
    let mut server = Server::start_with_files(
        &[("appendonly.aof", &aof)],
        &["--appendonly", "yes", "--appendfsync", "always", "--save", ""],
    );
    let mut con = server.client();
    assert_eq!(dbsize(&mut con), 0);
    let next = acquire(&mut con, "lock:y", "worker", 60_000).expect("granted");
    assert_eq!(next, future_fence + 1, "the loaded fence is the floor, not the wall clock");

    // The counter alone (no key holds it) also survives an RDB restart, as module aux data.
    assert_eq!(release(&mut con, "lock:y", "worker"), 1);
    let _: () = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("no")
        .query(&mut con)
        .expect("CONFIG SET");
    let _: () = redis::cmd("SAVE").query(&mut con).expect("SAVE");
    server.crash_and_restart_with(&["--appendonly", "no", "--save", ""]);
    let mut con = server.client();
    assert_eq!(dbsize(&mut con), 0);
    assert_eq!(acquire(&mut con, "lock:z", "worker", 60_000), Some(future_fence + 2));
}

/// Grants many fences, SIGKILLs the server and restarts it; the next fences are all larger.
fn fences_never_repeat_across_a_crash(args: &[&str]) {
    let mut server = Server::start_with(args);
    let mut con = server.client();
    let mut minted = Vec::new();
    for i in 0..200 {
        minted.push(
            acquire(&mut con, &format!("r:{}", i % 10), &format!("t{i}"), 50).unwrap_or_default(),
        );
        if i % 10 == 9 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let highest = minted.iter().max().copied().unwrap_or_default();
    server.crash_and_restart();
    let mut con = server.client();
    for i in 0..10 {
        if let Some(fence) = acquire(&mut con, &format!("r:{i}"), "after-crash", 60_000) {
            assert!(fence > highest, "{args:?}: fence {fence} after crash, {highest} before");
        }
    }
    assert!(acquire(&mut con, "fresh", "after-crash", 60_000).expect("granted") > highest);
}

#[test]
fn fences_never_repeat_after_kill_9_without_persistence() {
    fences_never_repeat_across_a_crash(&["--save", "", "--appendonly", "no"]);
}

#[test]
fn fences_never_repeat_after_kill_9_with_appendfsync_everysec() {
    fences_never_repeat_across_a_crash(&[
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
    ]);
}

#[test]
fn fences_never_repeat_after_kill_9_with_appendfsync_always() {
    fences_never_repeat_across_a_crash(&[
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ]);
}

#[test]
fn a_restarted_server_holds_new_grants_for_the_restart_grant_delay_then_lifts_it() {
    let args = [
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dlock.restart-grant-delay-ms",
        "1500",
    ];
    let mut server = Server::start_with(&args);
    std::thread::sleep(Duration::from_millis(1_600)); // past the delay of the first start
    let mut con = server.client();
    let held = acquire(&mut con, "invoice:held", "worker-a", 60_000).expect("granted");
    server.crash_and_restart();
    let restarted_at = Instant::now();
    let mut con = server.client();
    assert_eq!(
        acquire(&mut con, "invoice:new", "worker-b", 60_000),
        None,
        "held back after restart"
    );
    assert_eq!(
        acquire(&mut con, "invoice:held", "worker-a", 60_000),
        Some(held),
        "a known lease is unaffected"
    );
    assert_eq!(renew(&mut con, "invoice:held", "worker-a", 60_000), 1);
    assert!(restarted_at.elapsed() < Duration::from_millis(1_500), "checked within the delay");
    std::thread::sleep(
        (restarted_at + Duration::from_millis(1_600)).saturating_duration_since(Instant::now()),
    );
    assert!(
        acquire(&mut con, "invoice:new", "worker-b", 60_000).expect("granted after the delay")
            > held
    );
}

#[test]
fn the_fence_counter_survives_an_aof_rewrite_without_preamble_and_without_any_lock_key() {
    // A legacy AOF puts the counter far ahead of the wall clock, then its only key is deleted.
    let future_fence = now_us() + 1_000_000_000_000;
    let aof = legacy_aof_with_a_deleted_lock(future_fence, now_us() + 60_000_000);
    let mut server =
        Server::start_with_files(&[("appendonly.aof", &aof)], &aof_always_without_preamble());
    let mut con = server.client();
    assert_eq!(dbsize(&mut con), 0);
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut con).expect("BGREWRITEAOF");
    wait_for_background_persistence(&mut con);
    let aof = String::from_utf8_lossy(&server.aof_contents()).to_lowercase();
    assert!(!aof.contains("dlock.setlease"), "the rewritten AOF holds no lock:\n{aof}");
    assert!(aof.contains("dlock.setfence"), "the counter is written next to the new base:\n{aof}");
    server.crash_and_restart();
    let mut con = server.client();
    assert_eq!(acquire(&mut con, "lock:y", "worker", 60_000), Some(future_fence + 1));
    let refused = error_text(redis::cmd("DLOCK.SETFENCE").arg(1).query::<redis::Value>(&mut con));
    assert!(refused.contains("internal"), "{refused}");
}

/// A legacy (single-file) AOF that grants `lock:x` with `fence`, then deletes the key: only the
/// fence counter remembers it.
fn legacy_aof_with_a_deleted_lock(fence: i64, deadline_us: i64) -> Vec<u8> {
    let mut aof = legacy_aof_with_a_lease(fence, deadline_us, &[]);
    aof.extend(resp_command(&[b"DEL", b"lock:x"]));
    aof
}

/// A legacy (single-file) AOF that grants `lock:x` to `tok` with `fence` until `deadline_us`, in
/// the long form of `DLOCK.SETLEASE` followed by `options`.
fn legacy_aof_with_a_lease(fence: i64, deadline_us: i64, options: &[&[u8]]) -> Vec<u8> {
    let mut aof = resp_command(&[b"SELECT", b"0"]);
    let (fence, deadline) = (fence.to_string(), deadline_us.to_string());
    let lease = [&b"DLOCK.SETLEASE"[..], b"lock:x", b"tok", fence.as_bytes(), deadline.as_bytes()];
    aof.extend(resp_command(&[&lease[..], options].concat()));
    aof
}

/// AOF with fsync before every reply, rewritten without an RDB preamble (so without aux data).
fn aof_always_without_preamble() -> Vec<&'static str> {
    [AOF_ALWAYS, &["--aof-use-rdb-preamble", "no"]].concat()
}

/// Found by the chaos harness (`CHAOS_SEED=11`, profile `always`): the fence counter was
/// replicated from inside the command that forked (a replica's PSYNC, BGSAVE), which made the
/// server append that command to the AOF; replaying PSYNC at the next start crashed the server.
#[test]
fn a_fork_inside_a_command_never_writes_that_command_to_the_aof_and_the_server_restarts() {
    let mut primary =
        Server::start_with(&[AOF_ALWAYS, &["--repl-diskless-sync-delay", "0"]].concat());
    let mut con = primary.client();
    let fence = acquire(&mut con, "invoice:1", "worker-a", 60_000).expect("granted");
    // A replica's full sync forks inside its PSYNC; BGSAVE forks inside itself.
    let port = primary.port.to_string();
    let replica = Server::start_with(&["--save", "", "--replicaof", "127.0.0.1", &port]);
    let mut on_replica = replica.client();
    assert!(eventually(Duration::from_secs(20), || exists(&mut on_replica, "invoice:1")));
    wait_for_background_persistence(&mut con);
    let _: String = redis::cmd("BGSAVE").query(&mut con).expect("BGSAVE");
    wait_for_background_persistence(&mut con);
    assert!(eventually(Duration::from_secs(5), || {
        // The counter is propagated on the next turn of the event loop.
        let aof = primary.aof_contents();
        aof.windows(14).any(|w| w == b"dlock.setfence")
    }));
    let aof = String::from_utf8_lossy(&primary.aof_contents()).to_uppercase();
    for command in ["PSYNC", "BGSAVE"] {
        assert!(!aof.contains(command), "{command} in the AOF:\n{aof}");
    }
    drop(on_replica);
    drop(replica);
    primary.crash_and_restart();
    let mut con = primary.client();
    assert_held(&mut con, "invoice:1", "worker-a", fence, 60_000);
}

#[test]
fn max_hold_counts_from_the_grant_across_a_restart_from_the_aof() {
    let args = [
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
        "--dlock.max-hold-ms",
        "3000",
    ];
    let mut server = Server::start_with(&args);
    let mut con = server.client();
    let granted = Instant::now();
    acquire(&mut con, "r", "w", 1_000).expect("granted");
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(renew(&mut con, "r", "w", 1_000), 1);
    }
    server.crash_and_restart(); // the AOF replays the grant and both renewals
    let mut con = server.client();
    let held: u64 = info_field(&mut con, "r", "held-ms").and_then(|h| h.parse().ok()).unwrap_or(0);
    assert!(held >= 1_100, "the hold clock kept running across the restart: {held} ms");
    assert_eq!(info_field(&mut con, "r", "renewals").as_deref(), Some("2"));
    // Renewing every 300 ms: the first renewal that would end past 3 s after the grant is refused.
    while renew(&mut con, "r", "w", 1_000) == 1 {
        std::thread::sleep(Duration::from_millis(300));
        assert!(granted.elapsed() < Duration::from_millis(2_900), "renewed past max-hold-ms");
    }
    assert!(granted.elapsed() >= Duration::from_millis(2_000), "refused only near the cap");
}

/// An RDB file saved by an earlier release of the module, and what was in it: encoding 1 by
/// 0.1.0 before held time and renewals were saved, encoding 2 by 0.1.0 with them. Each holds a
/// lease on `lock:long` (renewed twice, 26,000,000,000 ms), one on `lock:other` and one of 1 ms
/// on `lock:short`, saved on 2026-12-04.
struct OldRdb {
    file: &'static [u8],
    long_fence: i64,
    last_fence: i64,
    renewals_kept: bool,
}

const OLD_RDBS: [OldRdb; 2] = [
    OldRdb {
        file: include_bytes!("fixtures/encoding-1.rdb"),
        long_fence: 1_796_351_558_464_540,
        last_fence: 1_796_351_558_480_547,
        renewals_kept: false,
    },
    OldRdb {
        file: include_bytes!("fixtures/encoding-2.rdb"),
        long_fence: 1_796_351_559_522_569,
        last_fence: 1_796_351_559_556_506,
        renewals_kept: true,
    },
];

#[test]
fn rdb_files_saved_by_earlier_versions_load_with_their_leases_and_fences() {
    for old in OLD_RDBS {
        let args = ["--dlock.max-ttl-ms", "31536000000", "--enable-debug-command", "yes"];
        let server = Server::start_with_files(&[("dump.rdb", old.file)], &args);
        let mut con = server.client();
        // A fence is the grant's wall-clock time in µs: the lease ends 26,000,000,000 ms later.
        let deadline_us = old.long_fence + 26_000_000_000 * 1_000;
        if now_us() < deadline_us - 60_000_000 {
            assert_eq!(info_field(&mut con, "lock:long", "owner").as_deref(), Some("worker-a"));
            assert_eq!(fencecheck(&mut con, "lock:long", old.long_fence), 1);
            let expected_ttl = (deadline_us - now_us()) / 1_000;
            assert!((ttl_ms(&mut con, "lock:long") - expected_ttl).abs() < 60_000, "deadline kept");
            let renewals = if old.renewals_kept { "2" } else { "0" };
            assert_eq!(info_field(&mut con, "lock:long", "renewals").as_deref(), Some(renewals));
            assert_eq!(renew(&mut con, "lock:long", "worker-a", 30_000), 1, "its owner renews it");
            assert_eq!(acquire(&mut con, "lock:long", "intruder", 30_000), None);
        } else {
            // The fixture's lease has run out (after 2027-09-01): the file still loads.
            assert_eq!(info(&mut con, "lock:long"), None);
        }
        assert_eq!(info(&mut con, "lock:short"), None, "the 1 ms lease expired long ago");
        // `lock:other` was granted a moment after `lock:long`, for 25,000,000,000 ms.
        let other_held = now_us() < old.long_fence + 25_000_000_000 * 1_000 - 60_000_000;
        let other = info_field(&mut con, "lock:other", "owner");
        assert_eq!(other.as_deref(), other_held.then_some("worker-c"));
        // The counter saved with the data set: no grant repeats or undercuts a saved fence.
        let fresh = acquire(&mut con, "lock:new", "w", 30_000).expect("granted");
        assert!(fresh > old.last_fence);
        // Saved again (in today's encoding) and reloaded: the same leases.
        let before = info(&mut con, "lock:long");
        let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).expect("DEBUG RELOAD");
        let after = info(&mut con, "lock:long");
        let owner_and_fence = |fields: Option<Vec<(String, String)>>| {
            fields.map(|f| {
                f.into_iter().filter(|(k, _)| k == "owner" || k == "fence").collect::<Vec<_>>()
            })
        };
        assert_eq!(owner_and_fence(before), owner_and_fence(after));
    }
}

/// A ticket and a blocked waiter that join the line of a resource with no lease while grants are
/// held (just after start-up) are granted when the hold ends, not when their own deadlines come
/// (the entry the hold's end left in the index was taken for a stale one; the ticket stood there
/// until it lapsed). Found by the mirror test's check that no line stands behind nobody.
#[test]
fn a_line_that_formed_while_grants_were_held_is_served_when_the_hold_ends() {
    let server = Server::start_with(&["--dlock.restart-grant-delay-ms", "1000"]);
    let started = Instant::now();
    let mut con = server.client();
    let ticket: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
        .arg("queued")
        .arg("ticket-holder")
        .arg(60_000)
        .arg("QUEUE")
        .arg(30_000)
        .query(&mut con)
        .expect("QUEUE");
    assert_eq!(ticket, None, "held back at start-up");
    let mut waiter = send_wait_for(&server, "blocked", "waiter", 60_000, 30_000, &[]);
    assert!(started.elapsed() < Duration::from_millis(900), "both joined within the hold");
    let granted: Option<i64> =
        redis::from_redis_value(&waiter.recv_response().expect("reply")).expect("fence or nil");
    assert!(granted.is_some(), "the blocked waiter is granted");
    assert!(started.elapsed() < Duration::from_secs(3), "at the hold's end, not its timeout");
    assert!(
        eventually(Duration::from_secs(2), || info_field(&mut con, "queued", "owner").as_deref()
            == Some("ticket-holder")),
        "the ticket's turn came when the hold ended"
    );
}
