//! A real primary and replica: the replica applies the primary's effects and decides nothing.

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

fn primary_and_replica() -> (Server, Server) {
    let primary = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--repl-diskless-sync-delay",
        "0",
    ]);
    let replica = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--replicaof",
        "127.0.0.1",
        &primary.port.to_string(),
    ]);
    let mut con = replica.client();
    let link_up = |con: &mut redis::Connection| {
        info_line(con, "replication", "master_link_status").as_deref() == Some("up")
    };
    assert!(eventually(Duration::from_secs(20), || link_up(&mut con)), "replica did not sync");
    // After a diskless sync the primary streams to the replica only once the replica has
    // acknowledged (up to a second later): wait until a marker write arrives.
    let mut p = primary.client();
    let _: () = redis::cmd("SET").arg("sync-marker").arg(1).query(&mut p).expect("SET");
    assert!(
        eventually(Duration::from_secs(20), || exists(&mut con, "sync-marker")),
        "not streaming"
    );
    let _: () = redis::cmd("DEL").arg("sync-marker").query(&mut p).expect("DEL");
    assert!(eventually(Duration::from_secs(5), || !exists(&mut con, "sync-marker")));
    (primary, replica)
}

/// Blocks until the replica acknowledged everything written so far.
fn sync(primary: &mut redis::Connection) {
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(primary).expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged");
}

fn digest(con: &mut redis::Connection, key: &str) -> String {
    let digests: Vec<String> =
        redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(con).expect("DIGEST-VALUE");
    digests.into_iter().next().expect("one digest")
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
