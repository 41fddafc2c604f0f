//! `DLOCK.REVOKE`: an operator takes a lease from a stuck holder; the holder hears why on the
//! resource's channel, its fence is never current again, and the lock passes on.

use std::time::Duration;

use dlock_testkit::*;

fn revoke(
    con: &mut redis::Connection,
    resource: &str,
    options: &[&str],
) -> redis::RedisResult<i64> {
    redis::cmd("DLOCK.REVOKE").arg(resource).arg(options).query(con)
}

fn acquire_shared(con: &mut redis::Connection, resource: &str, token: &str) -> i64 {
    redis::cmd("DLOCK.ACQUIRE")
        .arg(resource)
        .arg(token)
        .arg(60_000)
        .arg("SHARED")
        .query(con)
        .expect("shared grant")
}

#[test]
fn a_revoked_holder_hears_why_its_fence_is_stale_and_the_waiter_is_granted() {
    let server = Server::start();
    let mut con = server.client();
    let mut subscriber = server.client();
    subscriber.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe("dlock:{job}").expect("SUBSCRIBE");
    let stuck = acquire(&mut con, "job", "stuck", 60_000).expect("granted");
    let mut waiter = send_wait_for(&server, "job", "next", 60_000, 10_000, &[]);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut con, "job", "waiters").as_deref() == Some("1")
    }));

    assert_eq!(revoke(&mut con, "job", &["REASON", "stuck since 03:00"]), Ok(1));

    let granted: Option<i64> =
        redis::from_redis_value(&waiter.recv_response().expect("reply")).expect("fence or nil");
    let next = granted.expect("the waiter is granted at once");
    assert!(next > stuck);
    let messages: Vec<String> = (0..3)
        .map(|_| pubsub.get_message().expect("a message").get_payload().expect("text"))
        .collect();
    assert_eq!(
        messages[..2],
        [format!("acquired {stuck}"), format!("revoked {stuck} stuck since 03:00")]
    );
    assert!(messages[2].starts_with(&format!("handoff {next} ")), "{messages:?}");
    // The revoked fence is never current again: every check refuses it.
    assert_eq!(fencecheck(&mut con, "job", stuck), 0);
    let fenced: redis::RedisResult<redis::Value> = redis::cmd("DLOCK.FENCED")
        .arg("job")
        .arg(stuck)
        .arg("SET")
        .arg("job:out")
        .arg("late")
        .query(&mut con);
    assert!(error_text(fenced).starts_with("STALE"));
    assert_eq!(renew(&mut con, "job", "stuck", 60_000), 0);
    assert_eq!(release(&mut con, "job", "stuck"), 0);
    assert_eq!(info_field(&mut con, "job", "owner").as_deref(), Some("next"));
    assert_eq!(dlock_counters(&mut con)["leases_revoked"], 1);
    assert!(eventually(Duration::from_secs(2), || server
        .log()
        .contains("lease revoked resource=job owner=stuck")));
}

#[test]
fn revoke_with_a_fence_ends_one_shared_lease_and_without_one_at_most_512_a_call() {
    let server = Server::start();
    let mut con = server.client();
    let fences: Vec<i64> =
        ["r1", "r2", "r3"].iter().map(|token| acquire_shared(&mut con, "doc", token)).collect();
    assert_eq!(revoke(&mut con, "doc", &["FENCE", &fences[1].to_string()]), Ok(1));
    assert_eq!(info_field(&mut con, "doc", "holders").as_deref(), Some("2"));
    assert_eq!(fencecheck(&mut con, "doc", fences[1]), 0);
    assert_eq!(fencecheck(&mut con, "doc", fences[0]), 1);
    assert_eq!(revoke(&mut con, "doc", &["FENCE", &fences[1].to_string()]), Ok(0), "gone");
    assert_eq!(revoke(&mut con, "doc", &[]), Ok(2));
    assert!(!exists(&mut con, "doc"), "a lock with nothing left goes");

    let mut pipe = redis::pipe();
    for i in 0..600 {
        pipe.cmd("DLOCK.ACQUIRE").arg("crowd").arg(format!("reader-{i}")).arg(60_000);
        pipe.arg("SHARED").ignore();
    }
    let _: () = pipe.query(&mut con).expect("readers");
    assert_eq!(revoke(&mut con, "crowd", &[]), Ok(512), "a call is bounded");
    assert_eq!(info_field(&mut con, "crowd", "holders").as_deref(), Some("88"));
    assert_eq!(revoke(&mut con, "crowd", &[]), Ok(88));
    assert_eq!(revoke(&mut con, "crowd", &[]), Ok(0));
    assert_eq!(dlock_counters(&mut con)["leases_revoked"], 603);
}

#[test]
fn bad_revokes_change_nothing_and_name_the_argument() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "job", "A", 60_000).expect("granted");
    let long = "x".repeat(257);
    for (options, expected) in [
        (&["FENCE", "0"][..], "ERR fence must be a positive integer"),
        (&["REASON", ""], "ERR REASON must be between 1 and 256 bytes long"),
        (&["REASON", long.as_str()], "ERR REASON must be between 1 and 256 bytes long"),
        (&["REASON"], "ERR REASON needs a reason argument"),
        (&["FENCE", "5", "FENCE", "6"], "ERR syntax error: FENCE given more than once"),
        (&["NOW"], "ERR syntax error: unexpected argument 'NOW'"),
    ] {
        let reply = error_text(revoke(&mut con, "job", options).map(redis::Value::Int));
        assert_eq!(reply, expected, "{options:?}");
    }
    let _: () = redis::cmd("SET").arg("text").arg("x").query(&mut con).expect("SET");
    assert!(
        error_text(revoke(&mut con, "text", &[]).map(redis::Value::Int)).starts_with("WRONGTYPE")
    );
    assert_eq!(revoke(&mut con, "nothing", &[]), Ok(0));
    assert!(!exists(&mut con, "nothing"), "no key is created");
    assert_eq!(fencecheck(&mut con, "job", fence), 1, "unchanged");
    assert_eq!(dlock_counters(&mut con)["leases_revoked"], 0);
}

/// REVOKE is a command of its own: an operator may be given it without ACQUIRE, and a client
/// given ACQUIRE is not given it.
#[test]
fn revoke_is_granted_by_acl_on_its_own() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "job", "A", 60_000).expect("granted");
    let mut operator = server.client_as("operator", &["~*", "+dlock.revoke", "+dlock.info"]);
    let mut worker = server.client_as("worker", &["~*", "+dlock.acquire", "+dlock.release"]);
    let denied = error_text(revoke(&mut worker, "job", &[]).map(redis::Value::Int));
    assert!(denied.starts_with("NOPERM") || denied.contains("permission"), "{denied}");
    assert_eq!(revoke(&mut operator, "job", &["REASON", "incident 42"]), Ok(1));
    let refused: redis::RedisResult<redis::Value> =
        redis::cmd("DLOCK.ACQUIRE").arg("job").arg("B").arg(1_000).query(&mut operator);
    assert!(refused.is_err(), "the operator cannot acquire");
}

/// A revocation reaches the replica and the AOF like a release: every copy holds what the
/// primary holds.
#[test]
fn a_revocation_is_replicated_like_a_release() {
    let (primary, replica) = primary_and_replica_with(&[], &[]);
    let mut con = primary.client();
    acquire(&mut con, "job", "A", 60_000).expect("granted");
    let shared: Vec<i64> =
        ["r1", "r2"].iter().map(|token| acquire_shared(&mut con, "doc", token)).collect();
    assert_eq!(revoke(&mut con, "doc", &["FENCE", &shared[0].to_string()]), Ok(1));
    assert_eq!(revoke(&mut con, "job", &[]), Ok(1));
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(&mut con).expect("WAIT");
    let mut copy = replica.client();
    assert!(!exists(&mut copy, "job"), "the replica dropped the revoked lock");
    let digest = |con: &mut redis::Connection| -> String {
        redis::cmd("DEBUG").arg("DIGEST").query(con).expect("DEBUG DIGEST")
    };
    assert_eq!(digest(&mut con), digest(&mut copy));
    let refused = error_text(revoke(&mut copy, "doc", &[]).map(redis::Value::Int));
    assert!(refused.starts_with("READONLY"), "{refused}");
}
