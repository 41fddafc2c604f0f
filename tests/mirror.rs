//! A replica and a server restarted from the AOF hold exactly what the primary holds.
//!
//! Seeded random sequences of acquires, re-acquires, waits, renewals, releases, `DEL`s, short
//! leases expiring and primary restarts (with a grant delay) run against a primary with a
//! replica and `appendfsync always`. After each batch the replica, and a server loaded from a
//! copy of the primary's AOF, must show the primary's live leases: same owner, same fence, the
//! same deadline within a few milliseconds. `MIRROR_SEED` replays a run, `MIRROR_BATCHES`
//! lengthens it (the seed is printed).

use std::thread::{self, JoinHandle, sleep};
use std::time::{Duration, Instant};

use dlock_testkit::*;

const RESOURCES: [&str; 4] = ["m:a", "m:b", "m:c", "m:d"];
const TOKENS: [&str; 3] = ["t1", "t2", "t3"];
/// Short leases end within a batch; long ones outlive it.
const SHORT_MS: (u64, u64) = (50, 400);
const LONG_MS: (u64, u64) = (30_000, 120_000);
/// Leases with less left than this may end between two reads: compared in a later batch.
const SETTLING_MS: i64 = 1_500;
/// How far two copies' remaining times may differ (reads taken a moment apart).
const TTL_SLACK_MS: i64 = 250;
/// Long enough that the rest of a batch often runs while grants are held after a restart.
const GRANT_DELAY: [&str; 2] = ["--dlock.restart-grant-delay-ms", "3000"];

type Leases = Vec<Option<(String, i64, i64)>>;

/// Owner, fence and remaining ms of the live lease on every resource.
fn leases(con: &mut redis::Connection) -> Leases {
    RESOURCES
        .iter()
        .map(|resource| {
            let fields = info(con, resource)?;
            let field = |name: &str| {
                fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_default()
            };
            let owner = field("owner");
            (owner != "nil").then(|| {
                (owner, field("fence").parse().unwrap_or(0), field("ttl-ms").parse().unwrap_or(0))
            })
        })
        .collect()
}

fn assert_mirrors(what: &str, primary: &Leases, copy: &Leases, seed: u64, batch: usize) {
    for (i, (want, got)) in primary.iter().zip(copy).enumerate() {
        if want.as_ref().is_some_and(|(_, _, ttl)| *ttl < SETTLING_MS)
            || (want.is_none() && got.as_ref().is_some_and(|(_, _, ttl)| *ttl < TTL_SLACK_MS))
        {
            continue; // the lease may end between the two reads
        }
        let same = match (want, got) {
            (None, None) => true,
            (Some((o1, f1, t1)), Some((o2, f2, t2))) => {
                o1 == o2 && f1 == f2 && (t1 - t2).abs() <= TTL_SLACK_MS
            }
            _ => false,
        };
        assert!(
            same,
            "{what} differs from the primary on {} after batch {batch} (MIRROR_SEED={seed}): \
             primary {want:?}, {what} {got:?}",
            RESOURCES[i]
        );
    }
}

fn sync(primary: &mut redis::Connection) {
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(primary).expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged");
}

/// `ACQUIRE … WAIT` on a connection of its own; returns once the server has run it (it
/// answered, or it blocked), so that what it changed is part of the next comparison.
fn wait_in_background(
    primary: &mut redis::Connection,
    port: u16,
    resource: &str,
    token: &str,
    ttl: u64,
    timeout: u64,
) -> JoinHandle<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!("waiter-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let url = format!("redis://127.0.0.1:{port}/");
    let (resource, token, client_name) = (resource.to_owned(), token.to_owned(), name.clone());
    let handle = thread::spawn(move || {
        let Ok(mut con) = redis::Client::open(url).and_then(|c| c.get_connection()) else { return };
        let named: redis::RedisResult<()> =
            redis::cmd("CLIENT").arg("SETNAME").arg(&client_name).query(&mut con);
        if named.is_err() {
            return;
        }
        let _ = redis::cmd("DLOCK.ACQUIRE")
            .arg(&resource)
            .arg(&token)
            .arg(ttl)
            .arg("WAIT")
            .arg(timeout)
            .query::<redis::Value>(&mut con);
    });
    let ran = eventually(Duration::from_secs(5), || {
        let clients: String = redis::cmd("CLIENT").arg("LIST").query(primary).unwrap_or_default();
        let line = clients.lines().find(|line| line.contains(&format!(" name={name} ")));
        match line {
            Some(line) => line.contains(" cmd=dlock.acquire "),
            None => handle.is_finished(),
        }
    });
    assert!(ran, "the waiter's ACQUIRE reached the server");
    handle
}

/// The primary after a restart holds grants back for a moment, then serves again.
fn reconnect(primary: &Server) -> redis::Connection {
    let mut con = primary.client();
    assert!(eventually(Duration::from_secs(10), || {
        info_line(&mut con, "replication", "connected_slaves").as_deref() == Some("1")
    }));
    con
}

#[test]
fn replica_and_aof_hold_the_primarys_leases_after_random_sequences() {
    let seed = seed_from_env("MIRROR_SEED");
    let batches: usize =
        std::env::var("MIRROR_BATCHES").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let mut rng = Rng::new(seed);
    let mut primary_args = vec!["--appendonly", "yes", "--appendfsync", "always"];
    primary_args.extend_from_slice(&GRANT_DELAY);
    let (mut primary, replica) = primary_and_replica_with(&primary_args, &[]);
    let mut p = primary.client();
    let mut r = replica.client();
    let mut waiting = Vec::new();
    for batch in 1..=batches {
        for _ in 0..rng.between(8, 20) {
            let resource = *rng.pick(&RESOURCES);
            // Half the time the holder acts (renews, releases, re-acquires), else anyone.
            let holder = info_field(&mut p, resource, "owner").filter(|owner| owner != "nil");
            let token = match holder {
                Some(holder) if rng.between(0, 1) == 0 => holder,
                _ => rng.pick(&TOKENS).to_string(),
            };
            let token = token.as_str();
            let ttl = if rng.between(0, 2) == 0 {
                rng.between(LONG_MS.0, LONG_MS.1)
            } else {
                rng.between(SHORT_MS.0, SHORT_MS.1)
            };
            let choice = rng.between(0, 10);
            match choice {
                0..=2 => {
                    acquire(&mut p, resource, token, ttl);
                }
                3 | 4 => {
                    // Some waits end within the batch, some stand while the copies are compared.
                    let timeout = if rng.between(0, 1) == 0 {
                        rng.between(50, 400)
                    } else {
                        rng.between(3_000, 8_000)
                    };
                    let port = primary.port;
                    waiting.push(wait_in_background(&mut p, port, resource, token, ttl, timeout));
                }
                5 => {
                    renew(&mut p, resource, token, ttl);
                }
                6 | 7 => {
                    release(&mut p, resource, token);
                }
                8 => {
                    let _: i64 = redis::cmd("DEL").arg(resource).query(&mut p).expect("DEL");
                }
                9 if rng.between(0, 2) == 0 => {
                    // A crash: the primary comes back from its AOF, with its grant delay.
                    primary.crash_and_restart();
                    p = reconnect(&primary);
                }
                _ => sleep(Duration::from_millis(rng.between(0, 150))),
            }
            sync(&mut p);
            assert_mirrors("the replica", &leases(&mut p), &leases(&mut r), seed, batch);
        }
        // Short waits and short leases end; every effect reaches the replica and the AOF.
        sleep(Duration::from_millis(SHORT_MS.1 + 1_100));
        sync(&mut p);
        let started = Instant::now();
        let on_primary = leases(&mut p);
        assert_mirrors("the replica", &on_primary, &leases(&mut r), seed, batch);
        let from_aof = primary.start_from_aof_copy(&[]);
        let elapsed = started.elapsed().as_millis() as i64;
        let mut copy = leases(&mut from_aof.client());
        // The copy was read later: its leases have run down by about that long.
        for (_, _, ttl) in copy.iter_mut().flatten() {
            *ttl += elapsed;
        }
        assert_mirrors("a server restarted from the AOF", &on_primary, &copy, seed, batch);
    }
    drop(primary); // the long waits end with their server
    for waiter in waiting {
        let _ = waiter.join();
    }
}

#[test]
fn a_release_while_grants_are_held_after_a_restart_reaches_the_replica_and_the_aof() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let (mut primary, replica) = primary_and_replica_with(&aof, &[]);
    let mut p = primary.client();
    acquire(&mut p, "lk", "A", 120_000).expect("granted");
    // The AOF brings A's lease back; new grants are held for 8 s.
    let mut restart = vec!["--save", "", "--repl-diskless-sync-delay", "0"];
    restart.extend_from_slice(&aof);
    restart.extend_from_slice(&["--dlock.restart-grant-delay-ms", "8000"]);
    primary.crash_and_restart_with(&restart);
    let mut p = reconnect(&primary);
    let port = primary.port;
    let b = wait_in_background(&mut p, port, "lk", "B", 60_000, 20_000);
    assert!(eventually(Duration::from_secs(5), || {
        info_field(&mut p, "lk", "waiters").as_deref() == Some("1")
    }));
    assert_eq!(release(&mut p, "lk", "A"), 1);
    assert_eq!(info_field(&mut p, "lk", "owner").as_deref(), Some("nil"), "grants still held");
    sync(&mut p);
    let mut r = replica.client();
    assert_eq!(info_field(&mut r, "lk", "owner"), None, "the replica dropped A's lease");
    let from_aof = primary.start_from_aof_copy(&[]);
    assert_eq!(info_field(&mut from_aof.client(), "lk", "owner"), None, "so did the AOF");
    drop(b); // the waiter keeps waiting; the servers stop with the test
}
