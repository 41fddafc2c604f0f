//! The lock data type under Redis's generic key commands: COPY, RENAME, MOVE, DUMP/RESTORE,
//! MEMORY USAGE, DEBUG DIGEST-VALUE, and corrupted RESTORE payloads.

use std::time::Duration;

use dlock_testkit::*;

fn fenced_set(con: &mut redis::Connection, resource: &str, fence: i64) -> redis::RedisResult<()> {
    redis::cmd("DLOCK.FENCED").arg(resource).arg(fence).arg("SET").arg("data").arg("x").query(con)
}

#[test]
fn a_copy_carries_no_lease_so_an_old_fence_never_comes_back() {
    let server = Server::start();
    let mut con = server.client();
    let first = acquire(&mut con, "lock:src", "A", 60_000).expect("granted");
    // One transaction: the timer cannot sweep the empty copy before it is copied back, so each
    // step acts on a copy that exists.
    let (copied, kind, copy_info, original, released, second, copied_back, back_info): (
        i64,
        String,
        redis::Value,
        i64,
        i64,
        Option<i64>,
        i64,
        redis::Value,
    ) = redis::pipe()
        .atomic()
        .cmd("COPY")
        .arg("lock:src")
        .arg("lock:bak")
        .cmd("TYPE")
        .arg("lock:bak")
        .cmd("DLOCK.INFO")
        .arg("lock:bak")
        .cmd("DLOCK.FENCECHECK")
        .arg("lock:src")
        .arg(first)
        .cmd("DLOCK.RELEASE")
        .arg("lock:src")
        .arg("A")
        .cmd("DLOCK.ACQUIRE")
        .arg("lock:src")
        .arg("B")
        .arg(60_000)
        .cmd("COPY")
        .arg("lock:bak")
        .arg("lock:src")
        .arg("REPLACE")
        .cmd("DLOCK.INFO")
        .arg("lock:src")
        .query(&mut con)
        .expect("EXEC");
    assert_eq!(copied, 1, "COPY made the copy");
    assert_eq!(kind, "dlocklock", "the copy is a lock value");
    assert_eq!(copy_info, redis::Value::Nil, "the copy holds no lease");
    assert_eq!(original, 1, "the original keeps A's lease");
    assert_eq!(released, 1);
    let second = second.expect("B granted");
    assert!(second > first);
    // Copying the saved copy back over the resource (a forced release of B's lease) never
    // makes A's fence current again.
    assert_eq!(copied_back, 1, "the copy still existed when it was copied back");
    assert_eq!(back_info, redis::Value::Nil, "the copied-back value holds no lease");
    assert!(fenced_set(&mut con, "lock:src", first).is_err(), "A's fence stays stale");
    assert_eq!(fencecheck(&mut con, "lock:src", first), 0);
    assert!(eventually(Duration::from_secs(5), || dbsize(&mut con) == 0), "both empty keys go");
    let third = acquire(&mut con, "lock:src", "C", 60_000).expect("the resource is free");
    assert!(third > second);
}

#[test]
fn a_renamed_lock_loses_its_lease_and_its_waiters_are_answered_nil() {
    let server = Server::start();
    let mut con = server.client();
    let first = acquire(&mut con, "lock:old", "A", 60_000).expect("granted");
    let mut waiter = send_wait(&server, "lock:old", "B", 60_000, &[]);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut con, "lock:old", "waiters").as_deref() == Some("1")
    }));
    let _: () =
        redis::cmd("RENAME").arg("lock:old").arg("lock:new").query(&mut con).expect("RENAME");
    let answer: Option<i64> = redis::from_redis_value(&waiter.recv_response().expect("reply"))
        .expect("an integer or nil");
    assert_eq!(answer, None, "B asked for lock:old and is never granted lock:new");
    assert_eq!(
        info(&mut con, "lock:new"),
        None,
        "a lease belongs to the name it was granted under"
    );
    assert_eq!(fencecheck(&mut con, "lock:new", first), 0);
    assert_eq!(renew(&mut con, "lock:new", "A", 60_000), 0);
    assert!(eventually(Duration::from_secs(5), || dbsize(&mut con) == 0), "the empty key goes");
    let later = acquire(&mut con, "lock:old", "C", 60_000).expect("the old name is free");
    assert!(later > first);
}

#[test]
fn a_lock_moved_to_another_database_loses_its_lease_there_and_after_a_swapdb() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "lock:m", "worker", 60_000).expect("granted");
    let moved: i64 = redis::cmd("MOVE").arg("lock:m").arg(3).query(&mut con).expect("MOVE");
    assert_eq!(moved, 1);
    let _: () = redis::cmd("SWAPDB").arg(0).arg(3).query(&mut con).expect("SWAPDB");
    assert_eq!(info(&mut con, "lock:m"), None, "the moved value came back without its lease");
    assert!(fenced_set(&mut con, "lock:m", fence).is_err());
    assert!(eventually(Duration::from_secs(5), || dbsize(&mut con) == 0), "moved key swept");
}

#[test]
fn a_moved_lock_answers_its_waiter_nil_and_grants_it_nothing_in_either_database() {
    let server = Server::start();
    let mut con = server.client();
    let first = acquire(&mut con, "R1", "A", 60_000).expect("granted");
    let mut waiter = send_wait(&server, "R1", "B", 60_000, &[]);
    // B waits without a timeout of its own: a nil can only come from the move.
    waiter.set_read_timeout(Some(Duration::from_secs(10))).expect("read timeout");
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut con, "R1", "waiters").as_deref() == Some("1")
    }));
    // One transaction: db 1 is read before the timer can sweep the moved value.
    let mut mover = server.client();
    let (moved, (), moved_info, moved_kind): (i64, (), redis::Value, String) = redis::pipe()
        .atomic()
        .cmd("MOVE")
        .arg("R1")
        .arg(1)
        .cmd("SELECT")
        .arg(1)
        .cmd("DLOCK.INFO")
        .arg("R1")
        .cmd("TYPE")
        .arg("R1")
        .query(&mut mover)
        .expect("EXEC");
    assert_eq!(moved, 1);
    assert_eq!(moved_kind, "dlocklock", "the value arrived in db 1");
    assert_eq!(moved_info, redis::Value::Nil, "no lease and no waiter under the new name");
    let answer: Option<i64> = redis::from_redis_value(&waiter.recv_response().expect("reply"))
        .expect("an integer or nil");
    assert_eq!(answer, None, "B asked for R1 of db 0 and is never granted the moved value");
    // db 1: nothing of A's or B's, and the empty value goes.
    assert_eq!(fencecheck(&mut mover, "R1", first), 0);
    // Redis tells the module which database a value moved to; Valkey, for a MOVE inside
    // MULTI, names the database the transaction started in, so the empty value stays in db 1
    // until something touches it (docs/servers.md). Either way it holds no lease and no waiter.
    let valkey = info_line(&mut mover, "server", "valkey_version").is_some();
    if !valkey {
        assert!(eventually(Duration::from_secs(5), || dbsize(&mut mover) == 0), "moved key swept");
    }
    assert_eq!(info(&mut mover, "R1"), None);
    // db 0: the name is free, nobody waits there.
    assert!(!exists(&mut con, "R1"));
    assert_eq!(info(&mut con, "R1"), None);
    let text: String = redis::cmd("INFO").arg("dlock").query(&mut con).expect("INFO");
    assert_eq!(info_value(&text, "dlock_waits_timed_out"), Some("1"), "{text}");
    assert_eq!(info_value(&text, "dlock_waits_granted"), Some("0"), "{text}");
    assert_eq!(info_value(&text, "dlock_waiters"), Some("0"), "{text}");
    let later = acquire(&mut con, "R1", "C", 60_000).expect("the old name is free");
    assert!(later > first);
    assert_eq!(info_field(&mut con, "R1", "owner").as_deref(), Some("C"));
}

#[test]
fn a_swapdb_answers_the_waiters_of_both_databases_nil_and_leases_move_with_their_data() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "lock:w", "A", 60_000).expect("granted");
    let mut waiter = send_wait(&server, "lock:w", "B", 60_000, &[]);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut con, "lock:w", "waiters").as_deref() == Some("1")
    }));
    let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut con).expect("SWAPDB");
    let answer: Option<i64> = redis::from_redis_value(&waiter.recv_response().expect("reply"))
        .expect("an integer or nil");
    assert_eq!(answer, None, "B waited on lock:w of database 0");
    let _: () = redis::cmd("SELECT").arg(1).query(&mut con).expect("SELECT");
    assert_eq!(info_field(&mut con, "lock:w", "fence"), Some(fence.to_string()));
    assert_eq!(info_field(&mut con, "lock:w", "waiters").as_deref(), Some("0"));
}

#[test]
fn a_restored_lock_carries_no_lease_outside_cluster_and_memory_usage_is_reported() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "lock:d", "worker-with-a-36-byte-token-0000000", 60_000)
        .expect("granted");
    let payload: Vec<u8> = redis::cmd("DUMP").arg("lock:d").query(&mut con).expect("DUMP");
    let _: () =
        redis::cmd("RESTORE").arg("lock:r").arg(0).arg(&payload).query(&mut con).expect("RESTORE");
    // Outside Cluster a restored lock holds no lease: an old DUMP replayed over a resource
    // must not make an old fence current again (in Cluster, MIGRATE carries it: tests/cluster.rs).
    assert_eq!(info(&mut con, "lock:r"), None);
    assert_eq!(fencecheck(&mut con, "lock:r", fence), 0);
    assert_eq!(info_field(&mut con, "lock:d", "fence"), Some(fence.to_string()), "original kept");
    let usage: i64 =
        redis::cmd("MEMORY").arg("USAGE").arg("lock:d").query(&mut con).expect("MEMORY USAGE");
    assert!(usage > 36 && usage < 1_000, "{usage}");
}

/// CRC-64/Jones as Redis computes DUMP checksums (reflected, polynomial 0xad93d23594c935a9).
fn crc64(bytes: &[u8]) -> u64 {
    const REFLECTED_POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    bytes.iter().fold(0u64, |mut crc, byte| {
        crc ^= u64::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ REFLECTED_POLY } else { crc >> 1 };
        }
        crc
    })
}

/// Re-seals a DUMP body (object bytes + 2-byte RDB version) with a fresh checksum.
fn seal(body_and_version: &[u8]) -> Vec<u8> {
    let mut payload = body_and_version.to_vec();
    payload.extend_from_slice(&crc64(body_and_version).to_le_bytes());
    payload
}

#[test]
fn the_checksum_helper_matches_redis() {
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
}

#[test]
fn truncated_and_corrupted_restore_payloads_never_crash_the_server() {
    for sanitize in ["no", "yes"] {
        let mut server = Server::start_with(&[
            "--save",
            "",
            "--appendonly",
            "no",
            "--sanitize-dump-payload",
            sanitize,
        ]);
        let mut con = server.client();
        let fence = acquire(&mut con, "lock:ok", "worker", 60_000).expect("granted");
        let dump: Vec<u8> = redis::cmd("DUMP").arg("lock:ok").query(&mut con).expect("DUMP");
        let (object, version) = dump[..dump.len() - 8].split_at(dump.len() - 10);
        assert_eq!(seal(&dump[..dump.len() - 8]), dump, "re-sealing an intact dump is a no-op");

        // Every truncation and every single-byte change either is refused or, when the bytes
        // happen to spell another well-formed value, yields a valid lease. Nothing crashes.
        let mut candidates: Vec<Vec<u8>> =
            (1..object.len()).map(|cut| object[..cut].to_vec()).collect();
        for position in 0..object.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut mutated = object.to_vec();
                mutated[position] ^= flip;
                candidates.push(mutated);
            }
        }
        let mut refused = 0;
        for candidate in &candidates {
            let body = [&candidate[..], version].concat();
            let reply: redis::RedisResult<redis::Value> = redis::cmd("RESTORE")
                .arg("lock:bad")
                .arg(0)
                .arg(seal(&body))
                .arg("REPLACE")
                .query(&mut con);
            if reply.is_err() {
                refused += 1;
                assert!(!exists(&mut con, "lock:bad"), "a refused payload created a key");
                continue;
            }
            let kind: String = redis::cmd("TYPE").arg("lock:bad").query(&mut con).expect("TYPE");
            if kind == "dlocklock" {
                // A lease that loads answers like any lease (an expired one reads as absent).
                if let Some(fields) = info(&mut con, "lock:bad") {
                    assert_eq!(fields.len(), 8);
                    assert!(!fields[0].1.is_empty(), "owner");
                    assert!(fields[1].1.parse::<i64>().is_ok_and(|f| f > 0), "fence");
                }
            }
            let _: i64 = redis::cmd("DEL").arg("lock:bad").query(&mut con).expect("DEL");
        }
        assert!(
            refused * 2 > candidates.len(),
            "only {refused} of {} bad payloads refused",
            candidates.len()
        );
        assert!(server.is_alive(), "the server survived every payload (sanitize {sanitize})");
        assert_eq!(info_field(&mut con, "lock:ok", "fence"), Some(fence.to_string()), "untouched");
    }
}

#[test]
fn swapdb_carries_locks_to_the_other_database_and_expiry_follows_them() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "lock:s", "worker", 400).expect("granted");
    let _: () = redis::cmd("SWAPDB").arg(0).arg(5).query(&mut con).expect("SWAPDB");
    assert!(!exists(&mut con, "lock:s"));
    let _: () = redis::cmd("SELECT").arg(5).query(&mut con).expect("SELECT");
    assert_eq!(info_field(&mut con, "lock:s", "fence"), Some(fence.to_string()));
    assert!(eventually(Duration::from_secs(5), || dbsize(&mut con) == 0), "swept in its new db");
}

#[test]
fn flushall_drops_locks_and_later_grants_still_expire_on_time() {
    let server = Server::start();
    let mut con = server.client();
    let first = acquire(&mut con, "lock:f", "worker", 60_000).expect("granted");
    let _: () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
    let second = acquire(&mut con, "lock:f", "other", 300).expect("free after FLUSHALL");
    assert!(second > first);
    assert!(eventually(Duration::from_secs(5), || dbsize(&mut con) == 0));
}

/// RESTOREs a DUMP of a held lock whose 64-bit field `after_token` bytes past the end of the
/// token (the fence at 2, the deadline at 12: each is opcode 2, 0x81, 8 big-endian bytes) is
/// replaced by `value`; the server's reply.
fn restore_forged(
    con: &mut redis::Connection,
    after_token: usize,
    value: u64,
) -> redis::RedisResult<redis::Value> {
    acquire(con, "lock:ok", "worker", 60_000).expect("granted");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("lock:ok").query(con).expect("DUMP");
    let (object, version) = dump[..dump.len() - 8].split_at(dump.len() - 10);
    let mut forged = object.to_vec();
    let token_at = forged.windows(6).position(|w| w == b"worker").expect("token in the dump");
    let at = token_at + 6 + after_token;
    assert_eq!(forged[at - 1], 0x81, "a 64-bit length");
    forged[at..at + 8].copy_from_slice(&value.to_be_bytes());
    redis::cmd("RESTORE")
        .arg("lock:forged")
        .arg(0)
        .arg(seal(&[&forged[..], version].concat()))
        .query(con)
}

#[test]
fn a_restore_payload_with_a_deadline_beyond_the_signed_range_is_refused() {
    let server = Server::start();
    let mut con = server.client();
    let reply = restore_forged(&mut con, 12, u64::MAX);
    assert!(reply.is_err(), "{reply:?}");
    assert!(!exists(&mut con, "lock:forged"));
}

#[test]
fn a_restore_payload_with_a_fence_no_clock_could_reach_is_refused() {
    let server = Server::start();
    let mut con = server.client();
    let reply = restore_forged(&mut con, 2, i64::MAX as u64);
    assert!(reply.is_err(), "{reply:?}");
    assert!(!exists(&mut con, "lock:forged"));
    assert!(acquire(&mut con, "lock:next", "w", 1_000).is_some(), "fences are not exhausted");
}

#[test]
fn an_old_dump_restored_over_a_resource_never_makes_its_old_fence_current() {
    let server = Server::start();
    let mut con = server.client();
    let first = acquire(&mut con, "lock:x", "A", 60_000).expect("granted");
    let payload: Vec<u8> = redis::cmd("DUMP").arg("lock:x").query(&mut con).expect("DUMP");
    assert_eq!(release(&mut con, "lock:x", "A"), 1);
    let second = acquire(&mut con, "lock:x", "B", 60_000).expect("granted");
    let _: () = redis::cmd("RESTORE")
        .arg("lock:x")
        .arg(0)
        .arg(&payload)
        .arg("REPLACE")
        .query(&mut con)
        .expect("RESTORE REPLACE");
    assert!(fenced_set(&mut con, "lock:x", first).is_err(), "A's old fence stays stale");
    assert_eq!(info(&mut con, "lock:x"), None, "the replayed value holds no lease");
    assert!(second > first);
}
