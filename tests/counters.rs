//! Every blocked wait ends in exactly one of `waits_granted`, `waits_timed_out` and
//! `waits_abandoned`, and every ticket in exactly one of `tickets_granted`, `tickets_lapsed`,
//! `tickets_withdrawn` and `tickets_dismissed`, however it ends: the identities of
//! docs/operations.md, checked after scripted endings and after every step of random sequences
//! that rename, move, delete, flush, swap and reload keys and kill or unblock clients.

use std::thread::sleep;
use std::time::Duration;

use dlock_testkit::*;

/// `DLOCK.ACQUIRE resource token ttl-ms QUEUE ticket-ms`: the fence, or `None` (a ticket).
fn queue(con: &mut redis::Connection, resource: &str, token: &str, ticket_ms: u64) -> Option<i64> {
    redis::cmd("DLOCK.ACQUIRE")
        .arg(resource)
        .arg(token)
        .arg(60_000)
        .arg("QUEUE")
        .arg(ticket_ms)
        .query(con)
        .expect("ACQUIRE QUEUE")
}

/// `DLOCK.INFO resource`'s `field` as a number (0 when the resource has no lock).
fn info_number(con: &mut redis::Connection, resource: &str, field: &str) -> i64 {
    info_field(con, resource, field).map_or(0, |n| n.parse().expect("integer"))
}

/// Waits until `n` clients are blocked on `resource`.
fn until_waiting(con: &mut redis::Connection, resource: &str, n: i64) {
    assert!(
        eventually(Duration::from_secs(5), || info_number(con, resource, "waiters") == n),
        "{n} waiters expected on {resource}"
    );
}

/// The client id of a fresh connection, and the connection.
fn client_with_id(server: &Server) -> (i64, redis::Connection) {
    let mut con = server.client();
    let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut con).expect("CLIENT ID");
    (id, con)
}

/// Sends `ACQUIRE resource token ttl-ms WAIT timeout-ms` on `con` without reading the reply.
fn send_wait_on(con: &mut redis::Connection, resource: &str, token: &str, ttl_ms: u64, wait: u64) {
    let request = redis::cmd("DLOCK.ACQUIRE")
        .arg(resource)
        .arg(token)
        .arg(ttl_ms)
        .arg("WAIT")
        .arg(wait)
        .get_packed_command();
    con.send_packed_command(&request).expect("send ACQUIRE WAIT");
}

fn assert_counters_add_up(con: &mut redis::Connection) -> std::collections::BTreeMap<String, u64> {
    let stats = dlock_counters(con);
    if let Err(why) = counters_add_up(&stats) {
        panic!("{why}");
    }
    stats
}

/// A token holding a ticket sends ACQUIRE … WAIT: its blocked wait takes the ticket's place (the
/// ticket is dismissed, one wait starts). A RENAME then ends that wait and dismisses the four
/// other tickets: one wait ended, five tickets dismissed (the tickets were counted as timed-out
/// waits: 6 against 1 started).
#[test]
fn a_wait_by_a_tickets_token_then_a_rename_ends_one_wait_and_dismisses_every_ticket() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "job", "A", 60_000).expect("granted");
    for token in ["B", "C", "D", "E", "T"] {
        assert_eq!(queue(&mut con, "job", token, 30_000), None, "{token} takes a ticket");
    }
    let mut waiter = send_wait(&server, "job", "T", 60_000, &[]);
    until_waiting(&mut con, "job", 1);
    assert_eq!(info_number(&mut con, "job", "tickets"), 4, "T's wait took its ticket's place");
    let _: () = redis::cmd("RENAME").arg("job").arg("job:moved").query(&mut con).expect("RENAME");
    let answer: Option<i64> =
        redis::from_redis_value(&waiter.recv_response().expect("reply")).expect("nil");
    assert_eq!(answer, None, "the rename ended the wait");
    let stats = assert_counters_add_up(&mut con);
    let counted = |name: &str| stats[name];
    assert_eq!((counted("waits_started"), counted("waits_timed_out")), (1, 1), "{stats:?}");
    assert_eq!((counted("tickets_queued"), counted("tickets_dismissed")), (5, 5), "{stats:?}");
    assert_eq!((counted("waiters"), counted("tickets")), (0, 0), "{stats:?}");
}

/// Tickets that leave their line with no turn, no lapse and no withdrawal, because their key was
/// renamed, moved, deleted, overwritten or flushed, or because their token's blocked wait took
/// their place, are each counted once in `tickets_dismissed`.
#[test]
fn tickets_of_a_renamed_moved_deleted_overwritten_or_flushed_key_are_counted_as_dismissed() {
    let server = Server::start();
    let mut con = server.client();
    let line = |con: &mut redis::Connection, resource: &str, tickets: &[&str]| {
        acquire(con, resource, "holder", 60_000).expect("granted");
        for token in tickets {
            assert_eq!(queue(con, resource, token, 30_000), None);
        }
    };
    let dismissed = |con: &mut redis::Connection| assert_counters_add_up(con)["tickets_dismissed"];
    line(&mut con, "renamed", &["a", "b"]);
    let _: () =
        redis::cmd("RENAME").arg("renamed").arg("elsewhere").query(&mut con).expect("RENAME");
    assert_eq!(dismissed(&mut con), 2, "RENAME");
    line(&mut con, "moved", &["a"]);
    let moved: i64 = redis::cmd("MOVE").arg("moved").arg(1).query(&mut con).expect("MOVE");
    assert_eq!(moved, 1);
    assert_eq!(dismissed(&mut con), 3, "MOVE");
    line(&mut con, "deleted", &["a", "b", "c"]);
    let _: i64 = redis::cmd("DEL").arg("deleted").query(&mut con).expect("DEL");
    assert_eq!(dismissed(&mut con), 6, "DEL");
    line(&mut con, "source", &["a"]);
    line(&mut con, "target", &["b", "c"]);
    let _: () = redis::cmd("RENAME").arg("source").arg("target").query(&mut con).expect("RENAME");
    assert_eq!(dismissed(&mut con), 9, "RENAME over a lock with tickets: both lines");
    line(&mut con, "flushed", &["a", "b"]);
    // SYNC: with `lazyfree-lazy-user-flush yes` (Valkey's default) a plain FLUSHALL frees the
    // values in the background, after its reply.
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(&mut con).expect("FLUSHALL");
    assert_eq!(dismissed(&mut con), 11, "FLUSHALL");
    line(&mut con, "requeued", &["a"]);
    let mut waiter = send_wait(&server, "requeued", "a", 60_000, &[]);
    until_waiting(&mut con, "requeued", 1);
    let stats = assert_counters_add_up(&mut con);
    assert_eq!(stats["tickets_dismissed"], 12, "a blocked wait took the ticket's place");
    assert_eq!((stats["waits_started"], stats["waiters"], stats["tickets"]), (1, 1, 0));
    assert_eq!(release(&mut con, "requeued", "holder"), 1);
    let answer: Option<i64> =
        redis::from_redis_value(&waiter.recv_response().expect("reply")).expect("fence");
    assert!(answer.is_some(), "the wait that took the ticket's place is granted");
    let stats = assert_counters_add_up(&mut con);
    assert_eq!(
        (stats["tickets_queued"], stats["waits_granted"], stats["tickets_granted"]),
        (12, 1, 0)
    );
}

/// A token blocked in WAIT sends ACQUIRE … QUEUE: the wait ends (nil, timed out) and the token
/// takes a new ticket, counted in `tickets_queued` (it was reported as a refresh of a ticket the
/// token never had: the `tickets` gauge stood at 1 with no ticket queued).
#[test]
fn a_queue_by_a_blocked_token_ends_its_wait_and_counts_a_new_ticket() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "job", "A", 60_000).expect("granted");
    let mut waiter = send_wait(&server, "job", "T", 60_000, &[]);
    until_waiting(&mut con, "job", 1);
    assert_eq!(queue(&mut con, "job", "T", 30_000), None, "T takes a ticket");
    let answer: Option<i64> =
        redis::from_redis_value(&waiter.recv_response().expect("reply")).expect("nil");
    assert_eq!(answer, None, "the ticket took the wait's place");
    let stats = assert_counters_add_up(&mut con);
    assert_eq!((stats["waits_started"], stats["waits_timed_out"]), (1, 1), "{stats:?}");
    assert_eq!((stats["tickets_queued"], stats["tickets"]), (1, 1), "{stats:?}");
}

/// A blocked client killed in the same write as a RENAME of its key, or as a QUEUE of its token,
/// still stands in its line when the rename or the queue meets it (the timer prunes it on its
/// next turn). Its wait was counted as abandoned when its client went: the rename or the queue
/// must not count it again (they counted it as timed out too: two ends for one wait).
#[test]
fn a_wait_whose_client_is_gone_is_not_counted_again_by_a_rename_or_a_queue_of_its_token() {
    let server = Server::start();
    let mut con = server.client();
    for (round, then) in ["RENAME", "QUEUE"].iter().enumerate() {
        let resource = format!("job:{round}");
        acquire(&mut con, &resource, "A", 60_000).expect("granted");
        let (id, mut waiter) = client_with_id(&server);
        send_wait_on(&mut waiter, &resource, "W", 60_000, 0);
        until_waiting(&mut con, &resource, 1);
        let mut pipe = redis::pipe();
        pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(id);
        match *then {
            "RENAME" => pipe.cmd("RENAME").arg(&resource).arg(format!("{resource}:moved")),
            _ => pipe
                .cmd("DLOCK.ACQUIRE")
                .arg(&resource)
                .arg("W")
                .arg(60_000)
                .arg("QUEUE")
                .arg(30_000),
        };
        let _: redis::Value = pipe.query(&mut con).expect("one write");
        drop(waiter);
        let stats = assert_counters_add_up(&mut con);
        assert_eq!(
            (stats["waits_started"], stats["waits_abandoned"], stats["waits_timed_out"]),
            (round as u64 + 1, round as u64 + 1, 0),
            "{then}: {stats:?}"
        );
    }
}

/// A hand-over whose reply never reaches its client (RELEASE and CLIENT KILL in one
/// transaction): the wait was granted, and its lease is taken back (`grants_undone`). It was
/// counted twice: granted at the hand-over, abandoned when the reply was found lost.
#[test]
fn a_hand_over_whose_reply_is_lost_ends_its_wait_once_and_is_undone() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "job", "holder", 60_000).expect("granted");
    let (id, mut waiter) = client_with_id(&server);
    send_wait_on(&mut waiter, "job", "leaver", 60_000, 0);
    until_waiting(&mut con, "job", 1);
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("DLOCK.RELEASE").arg("job").arg("holder");
    pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(id);
    let _: redis::Value = pipe.query(&mut con).expect("EXEC");
    drop(waiter);
    assert!(
        eventually(Duration::from_secs(5), || !exists(&mut con, "job")),
        "the lease handed to a client that never learned of it is taken back"
    );
    let stats = assert_counters_add_up(&mut con);
    assert_eq!(
        (stats["waits_started"], stats["waits_granted"], stats["waits_abandoned"]),
        (1, 1, 0),
        "{stats:?}"
    );
    assert_eq!(stats.get("grants_undone"), Some(&1), "{stats:?}");
}

/// A blocked client of the random sequence: its id, resource, token and connection.
struct Blocked {
    id: i64,
    resource: String,
    token: String,
    con: redis::Connection,
}

/// Random sequences of grants, waits (with and without time-outs), tickets, releases, renewals,
/// renames, moves, copies, deletes, flushes, swaps and reloads, with clients killed, unblocked
/// (with and without an error) or dropped, alone or in the same write as a rename, a queue of
/// their token or a hand-over: after every step both identities hold, and once every client
/// is gone and every ticket lapsed, nothing is left waiting. `COUNTERS_SEED=n` replays a run.
#[test]
fn random_sequences_end_every_wait_and_every_ticket_in_exactly_one_counter() {
    let seed = seed_from_env("COUNTERS_SEED");
    let mut rng = Rng::new(seed);
    let server = Server::start();
    let mut con = server.client();
    let resources = ["r0", "r1", "r2"];
    let tokens = ["t0", "t1", "t2", "t3"];
    let mut blocked: Vec<Blocked> = Vec::new();
    for step in 0..400 {
        let resource = rng.pick(&resources).to_string();
        let token = rng.pick(&tokens).to_string();
        let ttl_ms = rng.between(20, 300);
        let roll = rng.below(100);
        let action = match roll {
            0..=14 => {
                let _: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
                    .arg(&resource)
                    .arg(&token)
                    .arg(ttl_ms)
                    .query(&mut con)
                    .expect("ACQUIRE");
                format!("ACQUIRE {resource} {token} {ttl_ms}")
            }
            15..=32 if blocked.len() < 8 => {
                let (id, mut waiter) = client_with_id(&server);
                let wait_ms = if rng.below(3) == 0 { 0 } else { rng.between(10, 300) };
                send_wait_on(&mut waiter, &resource, &token, ttl_ms, wait_ms);
                blocked.push(Blocked {
                    id,
                    resource: resource.clone(),
                    token: token.clone(),
                    con: waiter,
                });
                format!("WAIT {resource} {token} {ttl_ms} {wait_ms}")
            }
            15..=47 => {
                let ticket_ms = rng.between(20, 300);
                let _: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
                    .arg(&resource)
                    .arg(&token)
                    .arg(ttl_ms)
                    .arg("QUEUE")
                    .arg(ticket_ms)
                    .query(&mut con)
                    .expect("ACQUIRE QUEUE");
                format!("QUEUE {resource} {token} {ticket_ms}")
            }
            48..=57 => {
                release(&mut con, &resource, &token);
                format!("RELEASE {resource} {token}")
            }
            58..=61 => {
                renew(&mut con, &resource, &token, ttl_ms);
                format!("RENEW {resource} {token}")
            }
            62..=67 => {
                let to = rng.pick(&resources);
                let _: redis::RedisResult<()> =
                    redis::cmd("RENAME").arg(&resource).arg(to).query(&mut con);
                format!("RENAME {resource} {to}")
            }
            68..=69 => {
                let _: redis::RedisResult<i64> =
                    redis::cmd("MOVE").arg(&resource).arg(1).query(&mut con);
                format!("MOVE {resource} 1")
            }
            70 => {
                let to = rng.pick(&resources);
                let _: redis::RedisResult<i64> =
                    redis::cmd("COPY").arg(&resource).arg(to).arg("REPLACE").query(&mut con);
                format!("COPY {resource} {to} REPLACE")
            }
            71..=73 => {
                let _: i64 = redis::cmd("DEL").arg(&resource).query(&mut con).expect("DEL");
                format!("DEL {resource}")
            }
            74 => {
                // SYNC: freed before the reply, whatever `lazyfree-lazy-user-flush` says.
                let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(&mut con).expect("FLUSHALL");
                "FLUSHALL SYNC".to_owned()
            }
            75 => {
                let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut con).expect("SWAPDB");
                "SWAPDB 0 1".to_owned()
            }
            76 => {
                let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).expect("RELOAD");
                "DEBUG RELOAD".to_owned()
            }
            77..=92 if !blocked.is_empty() => {
                let gone = blocked.swap_remove(rng.below(blocked.len() as u64) as usize);
                // 0, 1: CLIENT KILL; 2: CLIENT UNBLOCK; 3: … ERROR; else the connection drops.
                let how = rng.below(6);
                let mut pipe = redis::pipe();
                let mut then = String::new();
                if how < 4 && rng.below(4) == 0 {
                    // The hand-over and the end of its waiter in one transaction.
                    if let Some(owner) = info_field(&mut con, &gone.resource, "owner") {
                        pipe.atomic().cmd("DLOCK.RELEASE").arg(&gone.resource).arg(&owner);
                        then = format!(" after RELEASE {} {owner} in MULTI", gone.resource);
                    }
                }
                match how {
                    0 | 1 => pipe.cmd("CLIENT").arg("KILL").arg("ID").arg(gone.id),
                    2 => pipe.cmd("CLIENT").arg("UNBLOCK").arg(gone.id),
                    3 => pipe.cmd("CLIENT").arg("UNBLOCK").arg(gone.id).arg("ERROR"),
                    _ => pipe.cmd("PING"),
                };
                match rng.below(3) {
                    // In the same write: the line still holds the waiter that just ended.
                    0 => {
                        let to = rng.pick(&resources);
                        pipe.cmd("RENAME").arg(&gone.resource).arg(to);
                        then += &format!(" then RENAME {} {to}", gone.resource);
                    }
                    1 => {
                        let ticket_ms = rng.between(20, 300);
                        let (resource, token) = (&gone.resource, &gone.token);
                        pipe.cmd("DLOCK.ACQUIRE").arg(resource).arg(token).arg(ttl_ms);
                        pipe.arg("QUEUE").arg(ticket_ms);
                        then += &format!(" then QUEUE {resource} {token} {ticket_ms}");
                    }
                    _ => {}
                }
                let _: redis::RedisResult<redis::Value> = pipe.query(&mut con);
                drop(gone.con);
                format!("end waiter {} (how {how}){then}", gone.id)
            }
            _ => {
                let ms = rng.between(1, 40);
                sleep(Duration::from_millis(ms));
                format!("sleep {ms}")
            }
        };
        let stats = dlock_counters(&mut con);
        if let Err(why) = counters_add_up(&stats) {
            panic!("COUNTERS_SEED={seed}, step {step} ({action}): {why}");
        }
    }
    drop(blocked);
    let settled = eventually(Duration::from_secs(10), || {
        let stats = dlock_counters(&mut con);
        stats["waiters"] == 0 && stats["tickets"] == 0 && stats["lock_keys"] == 0
    });
    let stats = dlock_counters(&mut con);
    assert!(settled, "COUNTERS_SEED={seed}: something still waits: {stats:?}");
    if let Err(why) = counters_add_up(&stats) {
        panic!("COUNTERS_SEED={seed}, at the end: {why}");
    }
}

/// `FLUSHALL ASYNC`, and a plain `FLUSHALL` (asynchronous by default on Valkey), may free the
/// lock values on a background thread, where their free callback answers the waiters and counts
/// the tickets: every blocked waiter is still answered nil, the counters add up, nothing is left
/// in line and the server lives on.
#[test]
fn an_asynchronous_flushall_answers_every_waiter_and_keeps_the_counters() {
    let server = Server::start();
    let mut con = server.client();
    for flush in [&["FLUSHALL", "ASYNC"][..], &["FLUSHALL"][..]] {
        let mut blocked = Vec::new();
        for i in 0..40 {
            let resource = format!("flushed:{i}");
            acquire(&mut con, &resource, "holder", 60_000).expect("the holder");
            let mut waiter = server.client();
            send_wait_on(&mut waiter, &resource, "waiter", 60_000, 30_000);
            blocked.push(waiter);
            assert_eq!(queue(&mut con, &resource, "ticket", 30_000), None, "a ticket in line");
        }
        for i in 0..40 {
            until_waiting(&mut con, &format!("flushed:{i}"), 1);
        }
        let _: () = redis::cmd(flush[0]).arg(&flush[1..]).query(&mut con).expect("FLUSHALL");
        for mut waiter in blocked {
            let answer = waiter.recv_response().expect("every waiter is answered");
            assert_eq!(answer, redis::Value::Nil, "{flush:?}: answered nil");
        }
        let stats = assert_counters_add_up(&mut con);
        assert_eq!((stats["waiters"], stats["tickets"]), (0, 0), "{flush:?}: nothing in line");
        assert!(
            eventually(Duration::from_secs(5), || dlock_counters(&mut con)["lock_keys"] == 0),
            "{flush:?}: every lock freed"
        );
        assert_eq!(dbsize(&mut con), 0);
    }
}
