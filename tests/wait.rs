//! `DLOCK.ACQUIRE … WAIT`: the server holds a FIFO queue and hands the lease over itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use dlock_testkit::*;

/// A client blocked in ACQUIRE WAIT on its own connection: its reply and when it came.
fn wait_in_thread(
    server: &Server,
    resource: &str,
    token: &str,
    ttl_ms: u64,
    timeout_ms: u64,
) -> JoinHandle<(redis::RedisResult<Option<i64>>, Instant)> {
    let mut con = server.client();
    let (resource, token) = (resource.to_owned(), token.to_owned());
    thread::spawn(move || {
        let reply = redis::cmd("DLOCK.ACQUIRE")
            .arg(resource)
            .arg(token)
            .arg(ttl_ms)
            .arg("WAIT")
            .arg(timeout_ms)
            .query(&mut con);
        (reply, Instant::now())
    })
}

fn waiters(con: &mut redis::Connection, resource: &str) -> i64 {
    info_field(con, resource, "waiters").map_or(0, |n| n.parse().expect("integer"))
}

/// Blocks until `n` clients wait on `resource`.
fn until_waiting(con: &mut redis::Connection, resource: &str, n: i64) {
    assert!(
        eventually(Duration::from_secs(5), || waiters(con, resource) == n),
        "{n} waiters expected"
    );
}

#[test]
fn release_hands_the_lease_straight_to_the_waiter() {
    let server = Server::start();
    let mut a = server.client();
    let first = acquire(&mut a, "job", "worker-a", 60_000).expect("granted");
    let b = wait_in_thread(&server, "job", "worker-b", 10_000, 0);
    until_waiting(&mut a, "job", 1);
    let released_at = Instant::now();
    assert_eq!(release(&mut a, "job", "worker-a"), 1);
    let (reply, answered_at) = b.join().expect("waiter");
    let fence = reply.expect("reply").expect("granted");
    assert!(fence > first);
    assert_eq!(info_field(&mut a, "job", "owner").as_deref(), Some("worker-b"));
    assert_eq!(fencecheck(&mut a, "job", fence), 1);
    let latency = answered_at.duration_since(released_at);
    eprintln!("hand-over on release answered the waiter after {latency:?}");
    assert!(latency < Duration::from_secs(2), "answered at once, not on some later event");
}

#[test]
fn an_expiring_lease_is_handed_over_on_time_without_any_other_command() {
    let server = Server::start();
    let mut a = server.client();
    let granted_at = Instant::now();
    acquire(&mut a, "job", "worker-a", 500).expect("granted");
    let b = wait_in_thread(&server, "job", "worker-b", 10_000, 0);
    let (reply, answered_at) = b.join().expect("waiter");
    assert!(reply.expect("reply").is_some());
    let after = answered_at.duration_since(granted_at);
    eprintln!("hand-over at expiry answered {after:?} after a 500 ms grant");
    assert!(after >= Duration::from_millis(500), "never before the deadline");
    assert!(after < Duration::from_millis(2_500), "on time, by the timer");
}

#[test]
fn a_wait_that_times_out_answers_nil_and_leaves_the_queue() {
    let server = Server::start();
    let mut a = server.client();
    acquire(&mut a, "job", "worker-a", 60_000).expect("granted");
    let started = Instant::now();
    let (reply, answered_at) =
        wait_in_thread(&server, "job", "worker-b", 10_000, 300).join().expect("waiter");
    assert_eq!(reply.expect("reply"), None);
    let waited = answered_at.duration_since(started);
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(2_300),
        "{waited:?}"
    );
    assert_eq!(waiters(&mut a, "job"), 0);
    assert_eq!(release(&mut a, "job", "worker-a"), 1);
    assert_eq!(dbsize(&mut a), 0, "nobody left: the key is gone");
}

#[test]
fn waiters_are_served_in_arrival_order_with_increasing_fences() {
    let server = Server::start();
    let mut con = server.client();
    let mut last = acquire(&mut con, "job", "holder", 60_000).expect("granted");
    let mut queue = Vec::new();
    for (i, token) in ["w1", "w2", "w3", "w4"].iter().enumerate() {
        queue.push((*token, wait_in_thread(&server, "job", token, 60_000, 0)));
        until_waiting(&mut con, "job", i as i64 + 1);
    }
    let mut holder = "holder".to_owned();
    for (token, waiter) in queue {
        assert_eq!(release(&mut con, "job", &holder), 1);
        let fence = waiter.join().expect("waiter").0.expect("reply").expect("granted");
        assert!(fence > last, "{token}: {fence} after {last}");
        assert_eq!(info_field(&mut con, "job", "owner").as_deref(), Some(token));
        last = fence;
        holder = token.to_owned();
    }
    assert_eq!(release(&mut con, "job", &holder), 1);
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn a_killed_or_unblocked_waiter_leaves_the_queue_and_never_owns_the_lock() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "job", "holder", 60_000).expect("granted");
    let ids: Vec<i64> = (0..3)
        .map(|_| {
            let mut waiter = server.client();
            let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut waiter).expect("CLIENT ID");
            let _ = redis::cmd("DLOCK.ACQUIRE")
                .arg("job")
                .arg(format!("w{id}"))
                .arg(60_000)
                .arg("WAIT")
                .arg(0);
            thread::spawn(move || {
                redis::cmd("DLOCK.ACQUIRE")
                    .arg("job")
                    .arg(format!("w{id}"))
                    .arg(60_000)
                    .arg("WAIT")
                    .arg(0)
                    .query::<Option<i64>>(&mut waiter)
            });
            id
        })
        .collect();
    until_waiting(&mut con, "job", 3);
    let killed: i64 =
        redis::cmd("CLIENT").arg("KILL").arg("ID").arg(ids[0]).query(&mut con).expect("KILL");
    assert_eq!(killed, 1);
    let unblocked: i64 =
        redis::cmd("CLIENT").arg("UNBLOCK").arg(ids[1]).query(&mut con).expect("UNBLOCK");
    assert_eq!(unblocked, 1);
    let unblocked: i64 = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(ids[2])
        .arg("ERROR")
        .query(&mut con)
        .expect("UNBLOCK");
    assert_eq!(unblocked, 1);
    until_waiting(&mut con, "job", 0);
    assert_eq!(release(&mut con, "job", "holder"), 1);
    assert_eq!(dbsize(&mut con), 0, "no ghost owner: the lock is free");
    assert!(acquire(&mut con, "job", "newcomer", 1_000).is_some());
}

#[test]
fn a_token_waiting_again_takes_over_its_place_and_the_older_wait_answers_nil() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "job", "holder", 60_000).expect("granted");
    let first = wait_in_thread(&server, "job", "retrying", 60_000, 0);
    until_waiting(&mut con, "job", 1);
    let second = wait_in_thread(&server, "job", "retrying", 60_000, 0);
    assert_eq!(first.join().expect("first").0.expect("reply"), None, "superseded");
    until_waiting(&mut con, "job", 1);
    assert_eq!(release(&mut con, "job", "holder"), 1);
    assert!(second.join().expect("second").0.expect("reply").is_some());
}

#[test]
fn wait_does_not_block_inside_multi_or_a_script() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "job", "holder", 60_000).expect("granted");
    let started = Instant::now();
    let (busy, free): (Option<i64>, Option<i64>) = redis::pipe()
        .atomic()
        .cmd("DLOCK.ACQUIRE")
        .arg("job")
        .arg("other")
        .arg(1_000)
        .arg("WAIT")
        .arg(0)
        .cmd("DLOCK.ACQUIRE")
        .arg("free")
        .arg("other")
        .arg(1_000)
        .arg("WAIT")
        .arg(0)
        .query(&mut con)
        .expect("EXEC");
    assert_eq!(busy, None);
    assert!(free.is_some());
    let scripted: Option<i64> = redis::cmd("EVAL")
        .arg("return redis.call('DLOCK.ACQUIRE', KEYS[1], 'other', 1000, 'WAIT', 0)")
        .arg(1)
        .arg("job")
        .query(&mut con)
        .expect("EVAL");
    assert_eq!(scripted, None);
    assert!(started.elapsed() < Duration::from_secs(5), "nothing blocked");
    assert_eq!(waiters(&mut con, "job"), 0);
}

#[test]
fn sixteen_clients_cycling_on_one_resource_lose_no_grant_and_never_overlap() {
    let server = Server::start();
    let inside = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..16)
        .map(|worker| {
            let mut con = server.client();
            let (inside, grants) = (inside.clone(), grants.clone());
            thread::spawn(move || {
                let mut fences = Vec::new();
                for cycle in 0..25 {
                    let token = format!("w{worker}-{cycle}");
                    let fence: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
                        .arg("hot")
                        .arg(&token)
                        .arg(10_000)
                        .arg("WAIT")
                        .arg(20_000)
                        .query(&mut con)
                        .expect("ACQUIRE");
                    let fence = fence.expect("granted within the wait");
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    let valid: i64 = redis::cmd("DLOCK.FENCECHECK")
                        .arg("hot")
                        .arg(fence)
                        .query(&mut con)
                        .expect("FENCECHECK");
                    assert_eq!(valid, 1, "the fence is current inside the critical section");
                    grants.fetch_add(1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    let released: i64 = redis::cmd("DLOCK.RELEASE")
                        .arg("hot")
                        .arg(&token)
                        .query(&mut con)
                        .expect("RELEASE");
                    assert_eq!(released, 1);
                    fences.push(fence);
                }
                fences
            })
        })
        .collect();
    let mut fences: Vec<i64> =
        workers.into_iter().flat_map(|w| w.join().expect("worker")).collect();
    assert_eq!(grants.load(Ordering::SeqCst), 16 * 25);
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), 16 * 25, "every grant had its own fence");
    let mut con = server.client();
    assert_eq!(dbsize(&mut con), 0);
}

#[test]
fn a_hand_over_is_propagated_once_to_the_replica_and_the_aof() {
    let (primary, replica) =
        primary_and_replica_with(&["--appendonly", "yes", "--appendfsync", "always"], &[]);
    let (mut p, mut r) = (primary.client(), replica.client());
    acquire(&mut p, "job", "worker-a", 60_000).expect("granted");
    let b = wait_in_thread(&primary, "job", "worker-b", 60_000, 0);
    until_waiting(&mut p, "job", 1);
    assert_eq!(release(&mut p, "job", "worker-a"), 1);
    let fence = b.join().expect("waiter").0.expect("reply").expect("granted");
    assert!(
        eventually(Duration::from_secs(5), || fencecheck(&mut r, "job", fence) == 1),
        "replica sees B"
    );
    assert_eq!(info_field(&mut r, "job", "owner").as_deref(), Some("worker-b"));
    let aof = String::from_utf8_lossy(&primary.aof_contents()).into_owned();
    assert_eq!(aof.matches("worker-b").count(), 1, "one grant to B:\n{aof}");
    assert!(aof.contains(&fence.to_string()), "with B's fence:\n{aof}");
}

#[test]
fn waiters_of_a_demoted_primary_get_an_error_instead_of_hanging() {
    let primary = Server::start();
    let other = Server::start();
    let mut p = primary.client();
    acquire(&mut p, "job", "holder", 60_000).expect("granted");
    let b = wait_in_thread(&primary, "job", "worker-b", 60_000, 0);
    until_waiting(&mut p, "job", 1);
    let _: () =
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(other.port).query(&mut p).expect("demote");
    let (reply, _) = b.join().expect("waiter");
    let error = reply.expect_err("an error, not a hang");
    assert!(error.to_string().contains("UNBLOCKED"), "{error}");
}

#[test]
fn a_wait_during_the_grant_delay_is_granted_when_the_delay_ends() {
    let started = Instant::now();
    let server = Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--dlock.restart-grant-delay-ms",
        "1500",
    ]);
    let mut con = server.client();
    assert_eq!(acquire(&mut con, "job", "impatient", 1_000), None, "held back");
    let (reply, answered_at) =
        wait_in_thread(&server, "job", "patient", 1_000, 10_000).join().expect("waiter");
    assert!(reply.expect("reply").is_some(), "granted once the delay ended");
    assert!(answered_at.duration_since(started) >= Duration::from_millis(1_500));
}

#[test]
fn a_wait_timing_out_while_the_lease_is_handed_over_gets_one_consistent_answer() {
    let server = Server::start();
    let mut con = server.client();
    for round in 0..10 {
        let resource = format!("race:{round}");
        acquire(&mut con, &resource, "holder", 60_000).expect("granted");
        let waiter = wait_in_thread(&server, &resource, "waiter", 60_000, 40);
        until_waiting(&mut con, &resource, 1);
        thread::sleep(Duration::from_millis(25));
        // The hand-over and a slow command share one turn of the event loop with the timeout.
        let _: (i64, String) = redis::pipe()
            .cmd("DLOCK.RELEASE")
            .arg(&resource)
            .arg("holder")
            .cmd("DEBUG")
            .arg("SLEEP")
            .arg("0.05")
            .query(&mut con)
            .expect("pipeline");
        let reply = waiter.join().expect("waiter").0.expect("a reply, never silence");
        let owner = info_field(&mut con, &resource, "owner");
        match reply {
            Some(fence) => {
                assert_eq!(owner.as_deref(), Some("waiter"), "round {round}");
                assert_eq!(fencecheck(&mut con, &resource, fence), 1);
            }
            None => {
                assert_ne!(owner.as_deref(), Some("waiter"), "round {round}: told nil but owns it")
            }
        }
    }
}

#[test]
fn a_waiter_that_leaves_between_hand_over_and_reply_does_not_keep_the_lock() {
    let server = Server::start();
    let mut con = server.client();
    for (round, ending) in ["KILL", "UNBLOCK_ERROR"].iter().enumerate() {
        let resource = format!("ghost:{round}");
        acquire(&mut con, &resource, "holder", 60_000).expect("granted");
        let mut waiter = server.client();
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut waiter).expect("CLIENT ID");
        let resource_for_waiter = resource.clone();
        let blocked = thread::spawn(move || {
            redis::cmd("DLOCK.ACQUIRE")
                .arg(resource_for_waiter)
                .arg("leaver")
                .arg(60_000)
                .arg("WAIT")
                .arg(0)
                .query::<Option<i64>>(&mut waiter)
        });
        until_waiting(&mut con, &resource, 1);
        // Hand over and end the waiter in one transaction: the reply can never reach it.
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("DLOCK.RELEASE").arg(&resource).arg("holder");
        match *ending {
            "KILL" => pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(id),
            _ => pipe.cmd("CLIENT").arg("UNBLOCK").arg(id).arg("ERROR"),
        };
        let _: redis::Value = pipe.query(&mut con).expect("EXEC");
        let _ = blocked.join();
        assert!(
            eventually(Duration::from_secs(5), || !exists(&mut con, &resource)),
            "{ending}: the lease handed to a client that never learned of it is released"
        );
        assert!(acquire(&mut con, &resource, "next", 1_000).is_some());
    }
}

#[test]
fn waiters_of_a_deleted_lock_are_answered_nil_and_newcomers_do_not_jump_them() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "job", "holder", 60_000).expect("granted");
    let waiter = wait_in_thread(&server, "job", "waiter", 60_000, 0);
    until_waiting(&mut con, "job", 1);
    let _: i64 = redis::cmd("DEL").arg("job").query(&mut con).expect("DEL");
    assert_eq!(waiter.join().expect("waiter").0.expect("reply"), None, "its queue is gone");
    let stats: String = redis::cmd("INFO").arg("dlock").query(&mut con).expect("INFO");
    assert!(stats.contains("dlock_waiters:0"), "{stats}");
    assert!(acquire(&mut con, "job", "newcomer", 1_000).is_some());
}

#[test]
fn memory_usage_counts_the_waiters_of_a_lock() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "one", "holder", 60_000).expect("granted");
    let usage = |con: &mut redis::Connection| -> i64 {
        redis::cmd("MEMORY").arg("USAGE").arg("one").query(con).expect("MEMORY USAGE")
    };
    let alone = usage(&mut con);
    let mut waiting = Vec::new();
    for i in 0..200 {
        waiting.push(send_wait(&server, "one", &format!("waiter-{i:04}"), 60_000, &[]));
    }
    assert!(eventually(Duration::from_secs(10), || {
        info_field(&mut con, "one", "waiters").as_deref() == Some("200")
    }));
    let queued = usage(&mut con);
    assert!(queued >= alone + 200 * 64, "200 waiters are counted: {alone} -> {queued} bytes");
    drop(waiting); // the waiters disconnect and leave the line
    assert!(eventually(Duration::from_secs(10), || usage(&mut con) == alone), "freed again");
}

#[test]
fn a_waiter_that_never_reads_blocks_the_resource_only_for_its_claim_window() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "one", "holder", 60_000).expect("granted");
    let _ghost = send_wait(&server, "one", "ghost", 60_000, &["CLAIM", "300"]);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut con, "one", "waiters").as_deref() == Some("1")
    }));
    assert_eq!(release(&mut con, "one", "holder"), 1);
    assert_eq!(info_field(&mut con, "one", "owner").as_deref(), Some("ghost"), "handed over");
    let ttl: i64 = info_field(&mut con, "one", "ttl-ms").and_then(|t| t.parse().ok()).unwrap_or(0);
    assert!(ttl <= 300, "the grant runs its claim window, not its 60 s ttl: {ttl} ms");
    // Nobody claims it: it lapses and the resource is free again long before 60 s.
    assert!(
        eventually(Duration::from_secs(5), || acquire(&mut con, "one", "next", 1_000).is_some())
    );
    assert_eq!(info_line(&mut con, "dlock", "dlock_claims_lapsed").as_deref(), Some("1"));
}

#[test]
fn a_waiter_that_claims_its_grant_keeps_it_for_its_full_ttl() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "one", "holder", 60_000).expect("granted");
    let mut waiter = send_wait(&server, "one", "claimer", 60_000, &["CLAIM", "300"]);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut con, "one", "waiters").as_deref() == Some("1")
    }));
    assert_eq!(release(&mut con, "one", "holder"), 1);
    let fence: i64 =
        redis::from_redis_value(&waiter.recv_response().expect("reply")).expect("fence");
    let claimed: i64 = redis::cmd("DLOCK.RENEW")
        .arg("one")
        .arg("claimer")
        .arg(60_000)
        .arg("FENCE")
        .arg(fence)
        .query(&mut waiter)
        .expect("RENEW");
    assert_eq!(claimed, 1);
    std::thread::sleep(Duration::from_millis(500)); // past the window
    assert_eq!(fencecheck(&mut con, "one", fence), 1, "claimed: the window no longer applies");
    assert_eq!(info_line(&mut con, "dlock", "dlock_grants_claimed").as_deref(), Some("1"));
    assert_eq!(info_line(&mut con, "dlock", "dlock_claims_lapsed").as_deref(), Some("0"));
}

/// A waiter is handed the lease, its connection drops before the reply, and the same token's
/// retry (sent in the same write as the hand-over) is answered the fence. The clean-up of the
/// lost reply runs after that answer: it must leave the confirmed lease alone.
#[test]
fn a_retry_answered_after_a_lost_hand_over_keeps_its_lease() {
    let server = Server::start();
    let mut con = server.client();
    for (round, claim) in [None, Some(5_000u64)].into_iter().enumerate() {
        for atomic in [false, true] {
            let resource = format!("job:{round}:{atomic}");
            acquire(&mut con, &resource, "A", 60_000).expect("granted");
            let mut waiter = server.client();
            let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut waiter).expect("CLIENT ID");
            let resource_for_waiter = resource.clone();
            let blocked = thread::spawn(move || {
                let mut wait = redis::cmd("DLOCK.ACQUIRE");
                wait.arg(resource_for_waiter).arg("tokW").arg(30_000).arg("WAIT").arg(0);
                if let Some(claim) = claim {
                    wait.arg("CLAIM").arg(claim);
                }
                wait.query::<Option<i64>>(&mut waiter)
            });
            until_waiting(&mut con, &resource, 1);
            let mut pipe = redis::pipe();
            if atomic {
                pipe.atomic();
            }
            pipe.cmd("DLOCK.RELEASE").arg(&resource).arg("A");
            pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(id);
            pipe.cmd("DLOCK.ACQUIRE").arg(&resource).arg("tokW").arg(30_000);
            let (released, killed, fence): (i64, i64, Option<i64>) =
                pipe.query(&mut con).expect("the write");
            let _ = blocked.join();
            assert_eq!((released, killed), (1, 1));
            let fence = fence.expect("the retry is answered the handed-over fence");
            // Give the lost reply's clean-up its turns of the event loop.
            thread::sleep(Duration::from_millis(400));
            let _: String = redis::cmd("PING").query(&mut con).expect("PING");
            let label = format!("claim {claim:?}, atomic {atomic}");
            assert_eq!(
                info_field(&mut con, &resource, "owner").as_deref(),
                Some("tokW"),
                "{label}: the retried holder still holds"
            );
            let renewed: i64 = redis::cmd("DLOCK.RENEW")
                .arg(&resource)
                .arg("tokW")
                .arg(30_000)
                .arg("FENCE")
                .arg(fence)
                .query(&mut con)
                .expect("RENEW");
            assert_eq!(renewed, 1, "{label}: its fence is current");
            assert_eq!(acquire(&mut con, &resource, "C", 1_000), None, "{label}: nobody else");
        }
    }
}

/// Median of a few measurements, in ms.
fn median_ms(mut samples: Vec<Duration>) -> u128 {
    samples.sort();
    samples[samples.len() / 2].as_millis()
}

/// At `hz 1` the server's cron ticks once a second. Redis 7.0 computes how long to sleep before
/// it calls the module's before-sleep hook, so a timer armed there waited for that tick: a
/// 20 ms wait answered up to a second late, and a 300 ms lease was handed over as late.
#[test]
fn time_outs_and_hand_overs_are_on_time_whatever_hz() {
    let server = Server::start_with(&["--hz", "1"]);
    let mut con = server.client();
    acquire(&mut con, "held", "A", 60_000).expect("granted");
    let mut time_outs = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let reply: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
            .arg("held")
            .arg("B")
            .arg(1_000)
            .arg("WAIT")
            .arg(20)
            .query(&mut con)
            .expect("WAIT");
        assert_eq!(reply, None, "the holder keeps it");
        time_outs.push(started.elapsed().saturating_sub(Duration::from_millis(20)));
    }
    let mut hand_overs = Vec::new();
    for round in 0..5 {
        let resource = format!("short:{round}");
        let granted = Instant::now();
        acquire(&mut con, &resource, "A", 300).expect("granted");
        let waiter = wait_in_thread(&server, &resource, "B", 1_000, 5_000);
        let (reply, answered) = waiter.join().expect("waiter");
        assert!(reply.expect("WAIT").is_some(), "handed over");
        hand_overs
            .push(answered.duration_since(granted).saturating_sub(Duration::from_millis(300)));
    }
    let (late_time_out, late_hand_over) = (median_ms(time_outs), median_ms(hand_overs));
    assert!(late_time_out < 150, "a 20 ms wait answered {late_time_out} ms late (median)");
    assert!(late_hand_over < 150, "a 300 ms lease handed over {late_hand_over} ms late (median)");
}

/// `SWAPDB 0 0` changes nothing for Redis, and nothing for the waiters of database 0.
#[test]
fn swapdb_of_a_database_with_itself_leaves_its_waiters_waiting() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "swapped", "A", 60_000).expect("granted");
    let waiter = wait_in_thread(&server, "swapped", "B", 1_000, 10_000);
    until_waiting(&mut con, "swapped", 1);
    let _: () = redis::cmd("SWAPDB").arg(0).arg(0).query(&mut con).expect("SWAPDB");
    thread::sleep(Duration::from_millis(200));
    assert_eq!(waiters(&mut con, "swapped"), 1, "still in line");
    assert_eq!(release(&mut con, "swapped", "A"), 1);
    let (reply, _) = waiter.join().expect("waiter");
    assert!(reply.expect("WAIT").is_some(), "handed the lease, not dismissed");
}
