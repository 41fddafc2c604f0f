//! While writes are paused (`CLIENT PAUSE … WRITE`, `FAILOVER`, a `SHUTDOWN` waiting for its
//! replicas) the module, like Redis's own expiry, neither expires, hands over nor propagates:
//! a propagated write during a pause aborts the server when an AOF or a replica is attached.
//! Once writes resume it catches up, and the replica and the AOF hold what the primary holds.

use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use dlock_testkit::*;

const AOF: [&str; 4] = ["--appendonly", "yes", "--appendfsync", "always"];

fn pause_writes(con: &mut redis::Connection, ms: u64) {
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(ms).arg("WRITE").query(con).expect("PAUSE");
}

fn unpause(con: &mut redis::Connection) {
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(con).expect("UNPAUSE");
}

fn ping(con: &mut redis::Connection) -> String {
    redis::cmd("PING").query(con).expect("the server answers PING")
}

/// `DLOCK.ACQUIRE … WAIT wait_ms` sent on a connection of its own, its reply read later (within
/// 10 s) with `recv_response`.
fn send_acquire_wait(
    server: &Server,
    resource: &str,
    token: &str,
    ttl_ms: u64,
    wait_ms: u64,
) -> redis::Connection {
    let con = send_wait_for(server, resource, token, ttl_ms, wait_ms, &[]);
    con.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
    con
}

/// A lease's ttl in these tests: long enough that the pause surely begins before it ends, even
/// on a loaded machine.
const TTL_MS: u64 = 1_000;

/// When a lease granted just before `granted_at` ends, checked to lie after `paused_at`: the
/// scenario is a lease that ends inside the pause.
fn ends_inside_the_pause(granted_at: Instant, paused_at: Instant) -> Instant {
    let ends = granted_at + Duration::from_millis(TTL_MS);
    assert!(paused_at < ends, "the setup took longer than the lease's {TTL_MS} ms");
    ends
}

/// Sleeps until `deadline` and `extra` more.
fn sleep_past(deadline: Instant, extra: Duration) {
    sleep((deadline + extra).saturating_duration_since(Instant::now()));
}

/// Blocks until the replica acknowledged everything written so far.
fn sync(primary: &mut redis::Connection) {
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(primary).expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged");
}

/// A lease of `ttl_ms` expires inside a write pause on `server`: nothing is deleted or
/// propagated during the pause, the server survives it, and the key goes once writes resume.
fn expiry_waits_for_the_pause(server: &mut Server, replica: Option<&Server>) {
    let mut con = server.client();
    let granted_at = Instant::now();
    acquire(&mut con, "lk", "A", TTL_MS).expect("granted");
    if replica.is_some() {
        sync(&mut con);
    }
    pause_writes(&mut con, 10_000);
    let ends = ends_inside_the_pause(granted_at, Instant::now());
    sleep_past(ends, Duration::from_millis(400)); // the lease ended 400 ms ago, inside the pause
    assert_eq!(ping(&mut con), "PONG");
    assert!(server.is_alive(), "the server survived an expiry during the pause");
    assert!(exists(&mut con, "lk"), "nothing is deleted while writes are paused");
    assert_eq!(info(&mut con, "lk"), None, "but the expired lease no longer reads as held");
    if let Some(replica) = replica {
        assert!(exists(&mut replica.client(), "lk"), "nothing reached the replica");
    }
    unpause(&mut con);
    assert!(eventually(Duration::from_secs(5), || !exists(&mut con, "lk")), "caught up");
    if let Some(replica) = replica {
        let mut r = replica.client();
        assert!(eventually(Duration::from_secs(5), || !exists(&mut r, "lk")), "replicated");
    }
    assert!(server.is_alive());
}

#[test]
fn a_lease_expiring_during_a_write_pause_with_an_aof_waits_for_the_pause_to_end() {
    let mut server = Server::start_with(&AOF);
    expiry_waits_for_the_pause(&mut server, None);
    assert!(
        String::from_utf8_lossy(&server.aof_contents()).contains("DEL\r\n$2\r\nlk"),
        "the AOF records the expiry"
    );
}

#[test]
fn a_lease_expiring_during_a_write_pause_with_a_replica_waits_for_the_pause_to_end() {
    let (mut primary, replica) = primary_and_replica_with(&[], &[]);
    expiry_waits_for_the_pause(&mut primary, Some(&replica));
}

#[test]
fn without_persistence_or_replicas_a_pause_still_holds_expiry_back() {
    let mut server = Server::start();
    expiry_waits_for_the_pause(&mut server, None);
}

#[test]
fn a_waiter_is_handed_the_lease_only_after_the_pause_and_every_copy_agrees() {
    let (mut primary, replica) = primary_and_replica_with(&AOF, &[]);
    let mut p = primary.client();
    let granted_at = Instant::now();
    let first = acquire(&mut p, "lk", "A", TTL_MS).expect("granted");
    let mut waiting = primary.client();
    let b = thread::spawn(move || -> Option<i64> {
        redis::cmd("DLOCK.ACQUIRE")
            .arg("lk")
            .arg("B")
            .arg(60_000)
            .arg("WAIT")
            .arg(20_000)
            .query(&mut waiting)
            .expect("ACQUIRE WAIT")
    });
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut p, "lk", "waiters").as_deref() == Some("1")
    }));
    pause_writes(&mut p, 20_000);
    let ends = ends_inside_the_pause(granted_at, Instant::now());
    sleep_past(ends, Duration::from_millis(400)); // A's lease ended inside the pause
    assert!(primary.is_alive(), "the server survived the expiry during the pause");
    assert!(!b.is_finished(), "no hand-over while writes are paused");
    assert_eq!(info_field(&mut p, "lk", "owner").as_deref(), Some("nil"), "no owner yet");
    unpause(&mut p);
    let fence = b.join().expect("waiter thread").expect("B was handed the lease");
    assert!(fence > first);
    sync(&mut p);
    let mut r = replica.client();
    assert_eq!(info_field(&mut r, "lk", "owner").as_deref(), Some("B"));
    assert_eq!(fencecheck(&mut r, "lk", fence), 1, "the replica holds B's grant");
    drop(r);
    primary.crash_and_restart();
    let mut p = primary.client();
    assert_eq!(info_field(&mut p, "lk", "owner").as_deref(), Some("B"), "so does the AOF");
    assert_eq!(fencecheck(&mut p, "lk", fence), 1);
}

#[test]
fn a_fork_during_a_write_pause_records_the_fence_counter_after_the_pause() {
    let (mut primary, replica) = primary_and_replica_with(&AOF, &[]);
    let mut p = primary.client();
    acquire(&mut p, "lk", "A", 60_000).expect("granted");
    assert_eq!(release(&mut p, "lk", "A"), 1);
    sync(&mut p);
    let setfences = |server: &Server| {
        String::from_utf8_lossy(&server.aof_contents()).matches("dlock.setfence").count()
    };
    let before = setfences(&primary);
    pause_writes(&mut p, 20_000);
    // No other fork may be running (Redis 8 may still be writing the replica's snapshot).
    wait_for_background_persistence(&mut p);
    let _: String = redis::cmd("BGSAVE").query(&mut p).expect("BGSAVE");
    wait_for_background_persistence(&mut p);
    sleep(Duration::from_millis(100)); // the counter would be propagated on the next turn
    assert!(primary.is_alive(), "the server survived the fork during the pause");
    assert_eq!(setfences(&primary), before, "nothing propagated during the pause");
    unpause(&mut p);
    assert!(eventually(Duration::from_secs(5), || setfences(&primary) > before));
    sync(&mut p);
    assert_eq!(ping(&mut replica.client()), "PONG");
}

#[test]
fn a_failover_that_times_out_while_a_lease_expires_leaves_a_working_primary() {
    let (mut primary, replica) = primary_and_replica_with(&AOF, &[]);
    let mut p = primary.client();
    let granted_at = Instant::now();
    acquire(&mut p, "lk", "A", TTL_MS).expect("granted");
    sync(&mut p);
    replica.pause(); // the replica never catches up: the failover pauses writes until it gives up
    let _: () = redis::cmd("FAILOVER").arg("TIMEOUT").arg(2_500).query(&mut p).expect("FAILOVER");
    // The pause lasts the failover's 2.5 s; the lease ends at most 1 s into it.
    let ends = ends_inside_the_pause(granted_at, Instant::now());
    sleep_past(ends, Duration::from_millis(400)); // the lease ended inside the failover's pause
    assert!(primary.is_alive(), "the server survived the expiry during the failover");
    assert!(exists(&mut p, "lk"), "nothing deleted during the failover's pause");
    let aborted = eventually(Duration::from_secs(10), || {
        info_line(&mut p, "replication", "master_failover_state").as_deref() == Some("no-failover")
    });
    assert!(aborted, "the failover timed out");
    replica.resume();
    assert!(eventually(Duration::from_secs(5), || !exists(&mut p, "lk")), "caught up");
    assert_eq!(info_line(&mut p, "replication", "role").as_deref(), Some("master"));
    let mut r = replica.client();
    assert!(eventually(Duration::from_secs(5), || !exists(&mut r, "lk")), "replicated");
    assert!(primary.is_alive());
}

#[test]
fn a_shutdown_waiting_for_a_lagging_replica_survives_an_expiry_and_saves() {
    let (mut primary, replica) =
        primary_and_replica_with(&["--save", "3600 1", "--shutdown-timeout", "2"], &[]);
    let mut p = primary.client();
    acquire(&mut p, "kept", "A", 600_000).expect("granted");
    acquire(&mut p, "lk", "A", TTL_MS).expect("granted");
    sync(&mut p);
    replica.pause(); // SHUTDOWN pauses writes and waits for it, up to shutdown-timeout
    let _ = redis::cmd("SHUTDOWN").query::<redis::Value>(&mut p); // the connection closes
    let status = primary.wait_exit(Duration::from_secs(20)).expect("the server exited");
    replica.resume();
    assert!(status.success(), "a clean exit, not an abort: {status:?}\n{}", primary.log());
    assert!(primary.log().contains("DB saved on disk"), "the final save happened");
    assert!(primary.dir().join("dump.rdb").exists());
}

#[test]
fn a_shutdown_during_a_write_pause_with_an_aof_exits_cleanly_and_the_aof_keeps_what_was_acked() {
    // appendfsync everysec (the default): a clean shutdown writes and fsyncs the rest.
    let mut server = Server::start_with(&["--appendonly", "yes", "--save", ""]);
    let mut con = server.client();
    let kept = acquire(&mut con, "kept", "A", 600_000).expect("granted");
    assert_eq!(renew(&mut con, "kept", "A", 600_000), 1);
    acquire(&mut con, "released", "A", 600_000).expect("granted");
    assert_eq!(release(&mut con, "released", "A"), 1);
    let granted_at = Instant::now();
    let first = acquire(&mut con, "lk", "A", 1_000).expect("granted");
    // B would be handed lk at its deadline; C gives up half a second after that deadline.
    let mut b = send_acquire_wait(&server, "lk", "B", 60_000, 0);
    let mut c = send_acquire_wait(&server, "lk", "C", 60_000, 1_500);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut con, "lk", "waiters").as_deref() == Some("2")
    }));
    pause_writes(&mut con, 60_000);
    assert!(granted_at.elapsed() < Duration::from_millis(1_000), "paused before lk's deadline");
    // C's nil comes from the module's timer, after lk's deadline, inside the pause.
    let timed_out: Option<i64> =
        redis::from_redis_value(&c.recv_response().expect("C's reply")).expect("nil");
    assert_eq!(timed_out, None);
    assert!(granted_at.elapsed() >= Duration::from_millis(1_000));
    assert!(server.is_alive(), "the server survived the expiry during the pause");
    assert!(exists(&mut con, "lk"), "nothing is deleted while writes are paused");
    assert_eq!(info_field(&mut con, "lk", "owner").as_deref(), Some("nil"), "nor handed over");
    assert_eq!(info_field(&mut con, "lk", "waiters").as_deref(), Some("1"), "B still waits");

    let _ = redis::cmd("SHUTDOWN").query::<redis::Value>(&mut con); // the connection closes
    let status = server.wait_exit(Duration::from_secs(20)).expect("the server exited");
    assert!(status.success(), "a clean exit, not an abort: {status:?}\n{}", server.log());
    let told_b = b.recv_response();
    assert!(!matches!(told_b, Ok(redis::Value::Int(_))), "B was never granted: {told_b:?}");

    server.crash_and_restart(); // the AOF loads, or the server would not start
    let mut con = server.client();
    assert_eq!(info_field(&mut con, "kept", "owner").as_deref(), Some("A"));
    assert_eq!(info_field(&mut con, "kept", "fence"), Some(kept.to_string()));
    assert_eq!(info_field(&mut con, "kept", "renewals").as_deref(), Some("1"), "renewal kept");
    assert!(!exists(&mut con, "released"), "the release is kept");
    // A's lease on lk ended while the server was paused; nobody was granted it since.
    assert!(eventually(Duration::from_secs(5), || !exists(&mut con, "lk")), "loads as expired");
    let next = acquire(&mut con, "lk", "D", 60_000).expect("lk is free");
    assert!(next > first && next > kept);
}
