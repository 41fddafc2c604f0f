//! A real primary and replica: the replica applies the primary's effects and decides nothing.

use std::thread::sleep;
use std::time::{Duration, Instant};

use dlock_testkit::*;

fn primary_and_replica() -> (Server, Server) {
    primary_and_replica_with(&[], &[])
}

/// Blocks until the replica acknowledged everything written so far.
fn sync(primary: &mut redis::Connection) {
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(primary).expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged");
}

/// A grant travels as the client's own command rewritten to its effect: made inside a script or
/// a transaction (whose client and argument vector are the server's own), it reaches the replica
/// as the primary made it, and the script and the transaction go on with their own arguments.
#[test]
fn grants_made_inside_a_script_or_a_transaction_reach_the_replica_as_made() {
    let (primary, replica) = primary_and_replica();
    let (mut p, mut r) = (primary.client(), replica.client());
    let script = r"local fence = redis.call('DLOCK.ACQUIRE', KEYS[1], ARGV[1], ARGV[2])
        redis.call('DLOCK.RENEW', KEYS[1], ARGV[1], ARGV[2])
        return {fence, redis.call('DLOCK.ACQUIRE', KEYS[2], ARGV[1], ARGV[2]), ARGV[1], KEYS[1]}";
    let (scripted, other, token, key): (i64, i64, String, String) = redis::cmd("EVAL")
        .arg(script)
        .arg(2)
        .arg(&["job:1", "job:2", "worker-a", "60000"])
        .query(&mut p)
        .expect("EVAL");
    assert_eq!((token.as_str(), key.as_str()), ("worker-a", "job:1"), "the script's own");
    let (in_multi, renewed): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("DLOCK.ACQUIRE")
        .arg(&["job:3", "worker-b", "60000"])
        .cmd("DLOCK.RENEW")
        .arg(&["job:3", "worker-b", "60000"])
        .query(&mut p)
        .expect("MULTI");
    assert_eq!(renewed, 1);
    sync(&mut p);
    for (key, fence) in [("job:1", scripted), ("job:2", other), ("job:3", in_multi)] {
        assert_eq!(fencecheck(&mut r, key, fence), 1, "{key}");
        assert_eq!(digest(&mut p, key), digest(&mut r, key), "{key}");
    }
    assert_eq!(info_field(&mut r, "job:1", "renewals").as_deref(), Some("1"));
    assert_eq!(info_field(&mut r, "job:3", "renewals").as_deref(), Some("1"));
}

#[test]
fn the_replica_mirrors_grants_renewals_and_releases_with_equal_digests() {
    let (primary, replica) = primary_and_replica();
    let (mut p, mut r) = (primary.client(), replica.client());
    let fence = acquire(&mut p, "invoice:1", "worker-a", 60_000).expect("granted");
    acquire(&mut p, "invoice:2", "worker-b", 60_000).expect("granted");
    assert_eq!(renew(&mut p, "invoice:2", "worker-b", 30_000), 1);
    sync(&mut p);
    assert_eq!(info_field(&mut r, "invoice:1", "owner").as_deref(), Some("worker-a"));
    assert_eq!(fencecheck(&mut r, "invoice:1", fence), 1);
    assert_eq!(
        info_field(&mut r, "invoice:2", "renewals").as_deref(),
        Some("1"),
        "renewal mirrored"
    );
    for key in ["invoice:1", "invoice:2"] {
        assert_eq!(digest(&mut p, key), digest(&mut r, key), "{key}");
    }
    let refused = error_text(
        redis::cmd("DLOCK.ACQUIRE")
            .arg("invoice:3")
            .arg("w")
            .arg(1_000)
            .query::<redis::Value>(&mut r),
    );
    assert!(refused.starts_with("READONLY"), "{refused}");
    assert_eq!(release(&mut p, "invoice:1", "worker-a"), 1);
    sync(&mut p);
    assert!(!exists(&mut r, "invoice:1"), "the release removed the key on the replica");
    assert_eq!(digest(&mut p, "invoice:2"), digest(&mut r, "invoice:2"), "the other lease stays");
}

#[test]
fn a_release_reaches_the_replica_as_sent_and_only_deletes_the_key_there() {
    let (primary, replica) = primary_and_replica();
    let (mut p, mut r) = (primary.client(), replica.client());
    acquire(&mut p, "invoice:1", "worker-a", 60_000).expect("granted");
    sync(&mut p);
    let dels = || info_line(&mut replica.client(), "commandstats", "cmdstat_del");
    let dels_before = dels();
    assert_eq!(release(&mut p, "invoice:1", "worker-a"), 1);
    sync(&mut p);
    assert!(!exists(&mut r, "invoice:1"), "the replayed release deleted the key");
    // The replica took the primary's word: it decided nothing and counted nothing.
    for counter in ["dlock_release_ok", "dlock_release_not_owner", "dlock_leases_expired"] {
        assert_eq!(info_line(&mut r, "dlock", counter).as_deref(), Some("0"), "{counter}");
    }
    let calls = info_line(&mut r, "commandstats", "cmdstat_dlock.release").unwrap_or_default();
    assert!(calls.starts_with("calls=1,"), "the RELEASE itself reached the replica: {calls}");
    assert_eq!(dels(), dels_before, "no DEL travelled with it");
}

#[test]
fn expiry_decided_by_the_primary_removes_the_key_on_the_replica() {
    let (primary, replica) = primary_and_replica();
    let (mut p, mut r) = (primary.client(), replica.client());
    acquire(&mut p, "invoice:1", "worker", 500).expect("granted");
    // Polled rather than WAITed for: a replica may take up to a second to acknowledge.
    assert!(eventually(Duration::from_secs(5), || exists(&mut r, "invoice:1")), "replicated");
    assert!(eventually(Duration::from_secs(5), || !exists(&mut r, "invoice:1")), "removed");
}

#[test]
fn a_replica_never_expires_on_its_own_but_reads_a_passed_deadline_as_gone() {
    let (primary, replica) = primary_and_replica();
    let (mut p, mut r) = (primary.client(), replica.client());
    let granted_at = Instant::now();
    let fence = acquire(&mut p, "invoice:1", "worker", 1_000).expect("granted");
    assert!(eventually(Duration::from_secs(5), || exists(&mut r, "invoice:1")), "replicated");
    primary.pause(); // the primary cannot decide anything now
    assert!(granted_at.elapsed() < Duration::from_millis(1_000), "paused before the deadline");
    assert_eq!(
        fencecheck(&mut r, "invoice:1", fence),
        1,
        "live on the replica before its deadline"
    );
    sleep((granted_at + Duration::from_millis(1_300)).saturating_duration_since(Instant::now()));
    assert_eq!(info(&mut r, "invoice:1"), None, "the replicated deadline has passed");
    assert_eq!(fencecheck(&mut r, "invoice:1", fence), 0);
    assert!(exists(&mut r, "invoice:1"), "but the key waits for the primary's decision");
    primary.resume();
    assert!(eventually(Duration::from_secs(5), || !exists(&mut r, "invoice:1")));
}

#[test]
fn a_promoted_replica_keeps_replicated_leases_sweeps_them_on_time_and_mints_larger_fences() {
    let (mut primary, replica) = primary_and_replica();
    let (mut p, mut r) = (primary.client(), replica.client());
    let granted_at = Instant::now();
    let held = acquire(&mut p, "invoice:held", "worker-a", 60_000).expect("granted");
    let expiring = acquire(&mut p, "invoice:expiring", "worker-b", 1_500).expect("granted");
    assert!(
        eventually(Duration::from_secs(5), || exists(&mut r, "invoice:expiring")),
        "replicated"
    );
    primary.kill();
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).expect("promote");
    assert_eq!(info_line(&mut r, "replication", "role").as_deref(), Some("master"));
    // The leases it received keep their owners, fences and deadlines.
    assert_eq!(acquire(&mut r, "invoice:held", "intruder", 1_000), None);
    assert_eq!(fencecheck(&mut r, "invoice:held", held), 1);
    if granted_at.elapsed() < Duration::from_millis(1_400) {
        assert_eq!(fencecheck(&mut r, "invoice:expiring", expiring), 1);
    }
    // The new primary decides expiry now: nobody touches the key, yet it goes.
    assert!(eventually(Duration::from_secs(5), || !exists(&mut r, "invoice:expiring")));
    assert!(granted_at.elapsed() >= Duration::from_millis(1_500));
    let next = acquire(&mut r, "invoice:new", "worker-c", 1_000).expect("granted");
    assert!(next > held && next > expiring);
}

#[test]
fn a_replica_cut_off_from_grants_mints_larger_fences_than_all_of_them_once_promoted() {
    let mut primary = Server::start_with(PRIMARY_NO_PERSISTENCE);
    let link = LinkProxy::start(primary.port);
    let replica = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--replicaof",
        "127.0.0.1",
        &link.port.to_string(),
    ]);
    let (mut p, mut r) = (primary.client(), replica.client());
    let seen = acquire(&mut p, "invoice:seen", "worker", 60_000).expect("granted");
    assert!(eventually(Duration::from_secs(20), || exists(&mut r, "invoice:seen")), "replicated");
    link.cut(); // from here on nothing the primary grants reaches the replica
    let unseen: Vec<i64> = (0..50)
        .map(|i| acquire(&mut p, &format!("invoice:{i}"), "worker", 60_000).expect("granted"))
        .collect();
    primary.kill();
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).expect("promote");
    for i in 0..50 {
        assert!(!exists(&mut r, &format!("invoice:{i}")), "the replica never saw grant {i}");
    }
    assert_eq!(fencecheck(&mut r, "invoice:seen", seen), 1);
    let next = acquire(&mut r, "invoice:0", "someone-else", 60_000).expect("granted");
    let highest = unseen.iter().max().copied().unwrap_or_default();
    assert!(next > highest, "promoted fence {next} must exceed every unseen fence ({highest})");
}

#[test]
fn killing_the_primary_mid_stream_then_promoting_never_repeats_a_fence() {
    let (mut primary, replica) = primary_and_replica();
    let url = primary.url();
    let writer = std::thread::spawn(move || {
        let mut con = redis::Client::open(url).and_then(|c| c.get_connection()).expect("connect");
        let mut acknowledged = Vec::new();
        for i in 0.. {
            let reply: redis::RedisResult<Option<i64>> = redis::cmd("DLOCK.ACQUIRE")
                .arg(format!("r:{}", i % 20))
                .arg(format!("t{i}"))
                .arg(50)
                .query(&mut con);
            match reply {
                Ok(Some(fence)) => acknowledged.push(fence),
                Ok(None) => {}
                Err(_) => break, // the primary died
            }
        }
        acknowledged
    });
    sleep(Duration::from_millis(300));
    primary.kill();
    let acknowledged = writer.join().expect("writer thread");
    assert!(acknowledged.len() > 10, "the writer got grants before the crash");
    let mut r = replica.client();
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).expect("promote");
    let highest = acknowledged.iter().max().copied().unwrap_or_default();
    for i in 0..20 {
        if let Some(fence) = acquire(&mut r, &format!("r:{i}"), "after-failover", 60_000) {
            assert!(fence > highest, "fence {fence} repeats or precedes {highest}");
        }
    }
    let fresh = acquire(&mut r, "fresh", "after-failover", 60_000).expect("granted");
    assert!(fresh > highest);
}

#[test]
fn a_promoted_replica_holds_new_grants_for_the_restart_grant_delay() {
    let (primary, replica) =
        primary_and_replica_with(&[], &["--dlock.restart-grant-delay-ms", "1500"]);
    let (mut p, mut r) = (primary.client(), replica.client());
    let held = acquire(&mut p, "invoice:held", "worker-a", 60_000).expect("granted");
    assert!(eventually(Duration::from_secs(5), || exists(&mut r, "invoice:held")), "replicated");
    drop(primary);
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).expect("promote");
    let promoted_at = Instant::now();
    // A resource it has no record of: held back, since its lease may have died with the primary.
    assert_eq!(acquire(&mut r, "invoice:unknown", "worker-b", 60_000), None);
    // A resource with a record follows the usual rules: the owner re-acquires with its fence.
    assert_eq!(acquire(&mut r, "invoice:held", "worker-a", 60_000), Some(held));
    assert_eq!(acquire(&mut r, "invoice:held", "worker-b", 60_000), None);
    assert!(promoted_at.elapsed() < Duration::from_millis(1_500), "checked within the delay");
    sleep((promoted_at + Duration::from_millis(1_600)).saturating_duration_since(Instant::now()));
    let granted =
        acquire(&mut r, "invoice:unknown", "worker-b", 60_000).expect("granted after the delay");
    assert!(granted > held);
}

#[test]
fn a_storm_of_expiries_drains_in_slices_hands_over_on_the_way_and_every_del_reaches_the_replica() {
    const LEASES: usize = 30_000;
    let (primary, replica) = primary_and_replica();
    let (mut p, mut r) = (primary.client(), replica.client());
    let mut pipe = redis::pipe();
    for i in 0..LEASES {
        pipe.cmd("DLOCK.ACQUIRE").arg(format!("storm:{i}")).arg("worker").arg(2_000);
    }
    pipe.query::<redis::Value>(&mut p).expect("acquired");
    // One of them has a waiter: it is handed the lease when the sweep meets that key.
    let mut waiter = primary.client();
    let handed: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
        .arg("storm:12345")
        .arg("waiter")
        .arg(60_000)
        .arg("WAIT")
        .arg(20_000)
        .query(&mut waiter)
        .expect("ACQUIRE WAIT");
    assert!(handed.is_some(), "the waiter got the lease");
    assert!(
        eventually(Duration::from_secs(30), || dbsize(&mut p) == 1),
        "every expired lease was swept; the handed-over one stays"
    );
    assert_eq!(
        info_line(&mut p, "dlock", "dlock_leases_expired"),
        Some(LEASES.to_string()),
        "each expiry counted once"
    );
    sync(&mut p);
    assert_eq!(dbsize(&mut r), 1, "one DEL per expired key reached the replica");
    assert_eq!(info_field(&mut r, "storm:12345", "owner").as_deref(), Some("waiter"));
}

#[test]
fn expiries_in_two_databases_reach_the_replica_batched_and_remove_only_what_expired() {
    let (primary, replica) = primary_and_replica();
    let (mut p, mut r) = (primary.client(), replica.client());
    let mut pipe = redis::pipe();
    for db in [0, 5] {
        pipe.cmd("SELECT").arg(db).ignore();
        for i in 0..500 {
            pipe.cmd("DLOCK.ACQUIRE").arg(format!("job:{i}")).arg("w").arg(300).ignore();
        }
        pipe.cmd("DLOCK.ACQUIRE").arg("kept").arg("w").arg(60_000).ignore();
    }
    pipe.cmd("SELECT").arg(0).ignore();
    pipe.query::<()>(&mut p).expect("acquired");
    assert!(eventually(Duration::from_secs(10), || dbsize_in(&mut p, 0) == 1
        && dbsize_in(&mut p, 5) == 1));
    sync(&mut p);
    assert_eq!(
        (dbsize_in(&mut r, 0), dbsize_in(&mut r, 5)),
        (1, 1),
        "each database lost its expired keys"
    );
    let dels = info_line(&mut r, "commandstats", "cmdstat_del").unwrap_or_default();
    let calls: u64 = dels
        .strip_prefix("calls=")
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!((2..=100).contains(&calls), "1,000 expiries in a few DELs: {dels}");
    for db in [0, 5] {
        let _: () = redis::cmd("SELECT").arg(db).query(&mut p).expect("SELECT");
        let _: () = redis::cmd("SELECT").arg(db).query(&mut r).expect("SELECT");
        assert_eq!(digest(&mut p, "kept"), digest(&mut r, "kept"), "db {db}");
    }
}

#[test]
fn a_rename_ends_the_lease_on_the_replica_too_and_both_lose_the_key() {
    let (primary, replica) = primary_and_replica();
    let (mut p, mut r) = (primary.client(), replica.client());
    acquire(&mut p, "lock:old", "worker", 60_000).expect("granted");
    sync(&mut p);
    let _: () = redis::cmd("RENAME").arg("lock:old").arg("lock:new").query(&mut p).expect("RENAME");
    sync(&mut p);
    assert_eq!(info(&mut r, "lock:new"), None, "no lease under the new name on the replica");
    assert!(eventually(Duration::from_secs(5), || !exists(&mut p, "lock:new")));
    assert!(eventually(Duration::from_secs(5), || !exists(&mut r, "lock:new")), "DEL replicated");
}

#[test]
fn max_hold_and_held_ms_count_from_the_grant_across_a_promotion() {
    let cap = ["--dlock.max-hold-ms", "3000"];
    let (mut primary, replica) = primary_and_replica_with(&cap, &cap);
    let (mut p, mut r) = (primary.client(), replica.client());
    let before_grant = Instant::now();
    acquire(&mut p, "r", "w", 1_000).expect("granted");
    let after_grant = Instant::now();
    for _ in 0..2 {
        sleep(Duration::from_millis(600));
        assert_eq!(renew(&mut p, "r", "w", 1_000), 1);
    }
    sync(&mut p); // the grant and both renewals reached the replica
    primary.kill();
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).expect("promote");
    assert_eq!(info_line(&mut r, "replication", "role").as_deref(), Some("master"));
    let checked_from = after_grant.elapsed().as_millis() as u64;
    let held: u64 = info_field(&mut r, "r", "held-ms").expect("held").parse().expect("integer");
    let checked_until = before_grant.elapsed().as_millis() as u64;
    // Whole milliseconds on both sides, and the replica turns the grant's wall-clock time back
    // into its own monotonic clock: 50 ms of slack either way (a restarted clock is 1.2 s off).
    assert!(
        held + 50 >= checked_from && held <= checked_until + 50,
        "held-ms {held} continues from the grant ({checked_from}..={checked_until} ms ago)"
    );
    assert_eq!(info_field(&mut r, "r", "renewals").as_deref(), Some("2"));
    // Renewing every 300 ms on the new primary: the first renewal that would end past 3 s after
    // the grant on the old one is refused.
    while renew(&mut r, "r", "w", 1_000) == 1 {
        sleep(Duration::from_millis(300));
        assert!(before_grant.elapsed() < Duration::from_millis(2_900), "renewed past max-hold-ms");
    }
    assert!(after_grant.elapsed() >= Duration::from_millis(2_000), "refused only near the cap");
    assert_eq!(info_line(&mut r, "dlock", "dlock_renew_refused_max_hold").as_deref(), Some("1"));
    assert_eq!(info_field(&mut r, "r", "owner").as_deref(), Some("w"), "refused, not expired");
}

/// `DEBUG DIGEST` of the whole data set.
fn dataset_digest(con: &mut redis::Connection) -> String {
    redis::cmd("DEBUG").arg("DIGEST").query(con).expect("DEBUG DIGEST")
}

#[test]
fn digests_differ_only_while_the_primary_keeps_a_lease_less_key_for_its_waiters() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let (mut primary, replica) = primary_and_replica_with(&aof, &[]);
    let (mut p, mut r) = (primary.client(), replica.client());
    acquire(&mut p, "kept", "A", 600_000).expect("granted");
    acquire(&mut p, "lk", "A", 600_000).expect("granted");
    // Someone waiting behind a live lease: the queue is not part of the value's digest.
    let behind_a_lease = send_wait(&primary, "kept", "W", 60_000, &[]);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut p, "kept", "waiters").as_deref() == Some("1")
    }));
    sync(&mut p);
    let digest = dataset_digest(&mut p);
    assert_ne!(digest, "0".repeat(40), "the data set holds the locks");
    assert_eq!(dataset_digest(&mut r), digest, "equal with a waiter behind a lease");
    drop(behind_a_lease);

    // After a restart with a grant delay, a lease released with a waiter in line passes to
    // nobody until the delay ends: the primary keeps the key for its waiter, replicas drop it.
    let mut restart = vec!["--save", "", "--repl-diskless-sync-delay", "0"];
    restart.extend_from_slice(&aof);
    restart.extend_from_slice(&["--dlock.restart-grant-delay-ms", "30000"]);
    primary.crash_and_restart_with(&restart);
    let restarted_at = Instant::now();
    let mut p = primary.client();
    assert!(eventually(Duration::from_secs(10), || {
        info_line(&mut p, "replication", "connected_slaves").as_deref() == Some("1")
    }));
    // The replica's full sync done (it acknowledges only then): a snapshot forked later, after
    // the release below, would hand it the key the primary keeps for B.
    sync(&mut p);
    let waiter = send_wait(&primary, "lk", "B", 60_000, &[]);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut p, "lk", "waiters").as_deref() == Some("1")
    }));
    assert_eq!(release(&mut p, "lk", "A"), 1);
    sync(&mut p);
    assert!(restarted_at.elapsed() < Duration::from_secs(30), "checked within the grant delay");
    assert_eq!(info_field(&mut p, "lk", "owner").as_deref(), Some("nil"), "kept for B");
    assert!(!exists(&mut r, "lk"), "the replica dropped the key");
    assert_ne!(dataset_digest(&mut p), dataset_digest(&mut r), "differ while B waits");

    // Once nobody waits, the primary removes the key too and the digests agree again.
    drop(waiter);
    assert!(eventually(Duration::from_secs(5), || !exists(&mut p, "lk")), "B left the line");
    sync(&mut p);
    assert_eq!(dataset_digest(&mut p), dataset_digest(&mut r), "equal once no one waits");
    assert_eq!((dbsize(&mut p), dbsize(&mut r)), (1, 1), "both hold kept alone");
}

/// Makes `server` a replica of `primary` and waits until writes reach it.
fn follow(server: &Server, primary: &Server) {
    let mut con = server.client();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut con)
        .expect("REPLICAOF");
    assert!(wait_until_replica_streams(primary, server), "streams from the new primary");
}

fn promote(server: &Server) {
    let _: () =
        redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut server.client()).expect("promote");
}

/// A fails over to B and back, the holder renewing on each side: the lease still ends on time
/// on A and its waiter is handed the lease (the expiry bookkeeping of A's first term was stale).
#[test]
fn a_lease_renewed_across_a_failover_and_a_failback_still_ends_on_time() {
    let (a, b) = primary_and_replica();
    let mut on_a = a.client();
    acquire(&mut on_a, "job", "t", 3_000).expect("granted on A");
    sync(&mut on_a);
    promote(&b);
    follow(&a, &b);
    let mut on_b = b.client();
    assert_eq!(renew(&mut on_b, "job", "t", 500), 1, "renewed on B");
    sync(&mut on_b);
    promote(&a);
    follow(&b, &a);
    let mut on_a = a.client();
    assert_eq!(renew(&mut on_a, "job", "t", 4_000), 1, "renewed on A");
    let renewed_at = Instant::now();
    let mut waiter = a.client();
    let granted: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
        .arg("job")
        .arg("w")
        .arg(1_000)
        .arg("WAIT")
        .arg(9_000)
        .query(&mut waiter)
        .expect("WAIT");
    assert!(granted.is_some(), "the waiter is handed the lease when it ends");
    assert!(renewed_at.elapsed() >= Duration::from_millis(3_900), "not before its deadline");
    assert!(renewed_at.elapsed() < Duration::from_millis(6_000), "on time");
}

/// A primary is paused (SIGSTOP) with an ACQUIRE queued on an open connection, its replica is
/// promoted and grants the same resource, and the old primary resumes `resume_after` later and
/// answers the queued ACQUIRE before anyone tells it it was deposed. Returns the deposed
/// primary's fence and its successor's. `lead_ms` sets `dlock.fence-lead-ms` on both.
fn deposed_and_successor_fences(lead_ms: Option<u64>, resume_after: Duration) -> (i64, i64) {
    let lead = lead_ms.map(|ms| ms.to_string());
    let args: Vec<&str> =
        lead.as_deref().map(|ms| vec!["--dlock.fence-lead-ms", ms]).unwrap_or_default();
    let (a, b) = primary_and_replica_with(&args, &args);
    let mut on_a = a.client();
    acquire(&mut on_a, "other", "t", 60_000).expect("granted on A");
    sync(&mut on_a);
    let mut queued = a.client();
    a.pause();
    let stale =
        redis::cmd("DLOCK.ACQUIRE").arg("job").arg("stale").arg(10_000).get_packed_command();
    queued.send_packed_command(&stale).expect("queued on the paused A");
    promote(&b);
    let successor = acquire(&mut b.client(), "job", "current", 10_000).expect("granted on B");
    sleep(resume_after);
    a.resume();
    let reply = queued.recv_response().expect("A answers once resumed");
    let deposed: i64 = redis::from_redis_value(&reply).expect("A granted the queued ACQUIRE");
    (deposed, successor)
}

/// The paused-primary case of docs/guarantees.md: resumed 1.1 s after its replica took over, the
/// old primary still grants, and a store keeping the highest fence must side with the new one.
#[test]
fn a_primary_paused_past_its_failover_mints_below_its_successor() {
    let (deposed, successor) = deposed_and_successor_fences(None, Duration::from_millis(1_100));
    assert!(deposed < successor, "deposed {deposed} must stay below successor {successor}");
}

/// The assumption as a number, at its edge: a deposed primary that goes on granting for less
/// than `dlock.fence-lead-ms` after its successor's promotion stays below it; past the lead it
/// does not (docs/guarantees.md says so).
#[test]
fn the_fence_lead_bounds_how_long_a_deposed_primary_may_go_on_granting() {
    let (deposed, successor) =
        deposed_and_successor_fences(Some(1_000), Duration::from_millis(300));
    assert!(deposed < successor, "within the lead: {deposed} < {successor}");
    let (deposed, successor) =
        deposed_and_successor_fences(Some(1_000), Duration::from_millis(1_800));
    assert!(deposed > successor, "past the lead: {deposed} > {successor}");
}

/// A promoted server mints ahead of its clock; restarted without persistence right after, it
/// leads again from its new start, so it never mints a fence at or below its last run's.
#[test]
fn a_restart_without_persistence_after_a_promotion_mints_above_the_last_run() {
    let (_a, mut b) = primary_and_replica();
    promote(&b);
    let before = acquire(&mut b.client(), "job", "t", 10_000).expect("granted on B");
    b.crash_and_restart_with(PRIMARY_NO_PERSISTENCE);
    let after = acquire(&mut b.client(), "job", "t", 10_000).expect("granted after restart");
    assert!(after > before, "{after} must be above {before}");
}
