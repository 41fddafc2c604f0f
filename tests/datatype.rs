//! The lock data type under Redis's generic key commands: COPY, RENAME, MOVE, DUMP/RESTORE,
//! MEMORY USAGE, DEBUG DIGEST-VALUE, and corrupted RESTORE payloads.

use std::time::Duration;

use dlock_testkit::*;

#[test]
fn copy_duplicates_the_lease_and_both_keys_expire_on_time() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "lock:src", "worker", 400).expect("granted");
    let copied: i64 =
        redis::cmd("COPY").arg("lock:src").arg("lock:dst").query(&mut con).expect("COPY");
    assert_eq!(copied, 1);
    assert_eq!(info_field(&mut con, "lock:dst", "fence"), Some(fence.to_string()));
    assert_eq!(digest(&mut con, "lock:src"), digest(&mut con, "lock:dst"));
    assert!(eventually(Duration::from_secs(5), || dbsize(&mut con) == 0), "both swept");
}

#[test]
fn a_renamed_lock_keeps_its_lease_and_is_still_swept_when_it_expires() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "lock:old", "worker", 400).expect("granted");
    let _: () =
        redis::cmd("RENAME").arg("lock:old").arg("lock:new").query(&mut con).expect("RENAME");
    assert_eq!(info_field(&mut con, "lock:new", "fence"), Some(fence.to_string()));
    assert_eq!(renew(&mut con, "lock:new", "worker", 400), 1);
    assert!(eventually(Duration::from_secs(5), || dbsize(&mut con) == 0), "renamed key swept");
}

#[test]
fn a_lock_moved_to_another_database_is_still_swept() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "lock:m", "worker", 300).expect("granted");
    let moved: i64 = redis::cmd("MOVE").arg("lock:m").arg(3).query(&mut con).expect("MOVE");
    assert_eq!(moved, 1);
    let _: () = redis::cmd("SELECT").arg(3).query(&mut con).expect("SELECT");
    assert_eq!(info_field(&mut con, "lock:m", "owner").as_deref(), Some("worker"));
    assert!(eventually(Duration::from_secs(5), || dbsize(&mut con) == 0), "moved key swept");
}

#[test]
fn dump_and_restore_carry_the_lease_and_memory_usage_is_reported() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "lock:d", "worker-with-a-36-byte-token-0000000", 60_000)
        .expect("granted");
    let payload: Vec<u8> = redis::cmd("DUMP").arg("lock:d").query(&mut con).expect("DUMP");
    let _: () =
        redis::cmd("RESTORE").arg("lock:r").arg(0).arg(&payload).query(&mut con).expect("RESTORE");
    assert_eq!(info_field(&mut con, "lock:r", "fence"), Some(fence.to_string()));
    assert_eq!(digest(&mut con, "lock:d"), digest(&mut con, "lock:r"));
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
                    assert_eq!(fields.len(), 7);
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

#[test]
fn a_renamed_lock_renewed_to_a_shorter_deadline_is_swept_at_that_deadline() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "lock:k", "t", 1_000).expect("granted");
    assert_eq!(renew(&mut con, "lock:k", "t", 60_000), 1);
    let _: () = redis::cmd("RENAME").arg("lock:k").arg("lock:k2").query(&mut con).expect("RENAME");
    assert_eq!(renew(&mut con, "lock:k2", "t", 300), 1);
    assert!(eventually(Duration::from_secs(5), || !exists(&mut con, "lock:k2")), "swept at 300 ms");
}

#[test]
fn a_restore_payload_with_a_deadline_beyond_the_signed_range_is_refused() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "lock:ok", "worker", 60_000).expect("granted");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("lock:ok").query(&mut con).expect("DUMP");
    let (object, version) = dump[..dump.len() - 8].split_at(dump.len() - 10);
    // After the token come the fence and the deadline, each as opcode 2, 0x81, 8 big-endian bytes.
    let mut forged = object.to_vec();
    let token_at = forged.windows(6).position(|w| w == b"worker").expect("token in the dump");
    let at = token_at + 6 + 10 + 2;
    assert_eq!(forged[at - 1], 0x81, "the deadline is a 64-bit length");
    forged[at..at + 8].copy_from_slice(&u64::MAX.to_be_bytes());
    let reply: redis::RedisResult<redis::Value> = redis::cmd("RESTORE")
        .arg("lock:forged")
        .arg(0)
        .arg(seal(&[&forged[..], version].concat()))
        .query(&mut con);
    assert!(reply.is_err(), "{reply:?}");
    assert!(!exists(&mut con, "lock:forged"));
}
