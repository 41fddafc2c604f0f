//! A replica and a server restarted from the AOF hold exactly what the primary holds.
//!
//! Seeded random sequences of acquires (exclusive, shared, semaphore permits, with metadata),
//! re-acquires, waits and tickets with and without claim windows, renewals and releases (with
//! and without `FENCE`), `DEL`s, short leases expiring, primary restarts, promotions and
//! failovers there and back with renewals on the other side (each with a grant delay) run against
//! a primary with a replica and `appendfsync always`. After
//! every command the replica, and after each batch a server loaded from a copy of the primary's
//! AOF, must show the primary's live leases: each fence with the same owner, mode and metadata,
//! and the same deadline within a few milliseconds; and at the end of a batch no line may stand
//! on the primary with no live lease ahead of it (outside a grant delay), and no key may linger
//! with neither lease nor waiter. `MIRROR_SEED` replays a run, `MIRROR_BATCHES`
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
/// Long enough that a batch often runs on while grants are held after a restart or promotion,
/// short enough that most of it runs with grants.
const GRANT_DELAY: [&str; 2] = ["--dlock.restart-grant-delay-ms", "1500"];

/// One live lease as DLOCK.INFO shows it: owner, fence, remaining ms, mode and metadata.
#[derive(Clone, Debug)]
struct Holder {
    owner: String,
    fence: i64,
    ttl: i64,
    shared: bool,
    meta: Option<String>,
}

/// Every live lease on every resource, oldest grant first.
type Leases = Vec<Vec<Holder>>;

/// The live leases of one resource, read from the raw DLOCK.INFO reply.
fn holders(con: &mut redis::Connection, resource: &str) -> Vec<Holder> {
    let reply: redis::Value = redis::cmd("DLOCK.INFO").arg(resource).query(con).expect("INFO");
    let redis::Value::Array(items) = reply else { return Vec::new() };
    let field = |name: &str| {
        items
            .chunks(2)
            .find(|pair| value_text(&pair[0]).as_deref() == Some(name))
            .map(|pair| &pair[1])
    };
    if let Some(redis::Value::Array(leases)) = field("leases") {
        return leases
            .iter()
            .filter_map(|lease| match lease {
                redis::Value::Array(parts) if parts.len() == 4 => Some(Holder {
                    owner: value_text(&parts[0]).unwrap_or_default(),
                    fence: value_number(&parts[1]),
                    ttl: value_number(&parts[2]),
                    shared: true,
                    meta: value_text(&parts[3]),
                }),
                _ => None,
            })
            .collect();
    }
    match field("owner").and_then(value_text) {
        Some(owner) => vec![Holder {
            owner,
            fence: field("fence").map_or(0, value_number),
            ttl: field("ttl-ms").map_or(0, value_number),
            shared: false,
            meta: field("meta").and_then(value_text),
        }],
        None => Vec::new(),
    }
}

fn leases(con: &mut redis::Connection) -> Leases {
    RESOURCES.iter().map(|resource| holders(con, resource)).collect()
}

/// Leases of `primary` and `copy` may differ only where one may have ended between the two
/// reads; the first difference otherwise.
fn mirrors(what: &str, primary: &Leases, copy: &Leases) -> Result<(), String> {
    for (i, (want, got)) in primary.iter().zip(copy).enumerate() {
        let settling = |holder: &Holder, slack: i64| holder.ttl < slack;
        let want: Vec<&Holder> = want.iter().collect();
        let got: Vec<&Holder> = got.iter().collect();
        // Compare by fence: each lease on its own, as the copy must hold it.
        let mut fences: Vec<i64> = want.iter().chain(&got).map(|h| h.fence).collect();
        fences.sort_unstable();
        fences.dedup();
        for fence in fences {
            let a = want.iter().find(|h| h.fence == fence);
            let b = got.iter().find(|h| h.fence == fence);
            let same = match (a, b) {
                (Some(a), _) if settling(a, SETTLING_MS) => true,
                (None, Some(b)) if settling(b, TTL_SLACK_MS) => true,
                (Some(a), Some(b)) => {
                    a.owner == b.owner
                        && a.shared == b.shared
                        && a.meta == b.meta
                        && (a.ttl - b.ttl).abs() <= TTL_SLACK_MS
                }
                _ => false,
            };
            if !same {
                return Err(format!(
                    "{what} differs from the primary on {}: primary {want:?}, {what} {got:?}",
                    RESOURCES[i]
                ));
            }
        }
    }
    Ok(())
}

/// The replica holds the primary's leases. The timer may hand a lease over or end one between
/// the two reads (a waiter served as a grant delay ends): a difference must outlast a few fresh
/// reads, each after the replica caught up, to count.
fn assert_replica_mirrors(
    p: &mut redis::Connection,
    r: &mut redis::Connection,
    seed: u64,
    batch: usize,
) -> Leases {
    let mut verdict = Ok(());
    for _ in 0..4 {
        sync(p);
        let on_primary = leases(p);
        verdict = mirrors("the replica", &on_primary, &leases(r));
        if verdict.is_ok() {
            return on_primary;
        }
        sleep(Duration::from_millis(30));
    }
    panic!("after batch {batch} (MIRROR_SEED={seed}): {}", verdict.unwrap_err());
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
    options: &[String],
) -> JoinHandle<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!("waiter-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let url = format!("redis://127.0.0.1:{port}/");
    let (resource, token, client_name) = (resource.to_owned(), token.to_owned(), name.clone());
    let options = options.to_vec();
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
            .arg(&options)
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

/// Options for one ACQUIRE: a mode, a way to wait and a claim window, metadata, at random.
fn acquire_options(rng: &mut Rng) -> Vec<String> {
    let mut options = Vec::new();
    // Half the requests shared, so that readers and permits often stand side by side.
    match rng.between(0, 3) {
        0 => options.push("SHARED".to_owned()),
        1 => options.extend(["SHARED", "LIMIT", "3"].map(String::from)),
        _ => {}
    }
    if rng.between(0, 3) == 0 {
        options.extend(["QUEUE".to_owned(), rng.between(200, 4_000).to_string()]);
    }
    if rng.between(0, 3) == 0 {
        options.extend(["CLAIM".to_owned(), rng.between(100, 2_000).to_string()]);
    }
    if rng.between(0, 2) == 0 {
        options.extend(["META".to_owned(), format!("host=h{}", rng.between(1, 3))]);
    }
    options
}

/// The fence `token` holds on `resource` (any mode), if it holds a live lease there.
fn fence_of(con: &mut redis::Connection, resource: &str, token: &str) -> Option<i64> {
    holders(con, resource).into_iter().find(|h| h.owner == token).map(|h| h.fence)
}

/// The arguments the primary restarts with: its own, never `--replicaof` (a promoted replica
/// restarts as the primary it now is).
fn primary_restart_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> =
        ["--save", "", "--repl-diskless-sync-delay", "0"].map(String::from).to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

#[test]
fn replica_and_aof_hold_the_primarys_leases_after_random_sequences() {
    let seed = seed_from_env("MIRROR_SEED");
    let batches: usize =
        std::env::var("MIRROR_BATCHES").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let mut rng = Rng::new(seed);
    let mut server_args = vec!["--appendonly", "yes", "--appendfsync", "always"];
    server_args.extend_from_slice(&GRANT_DELAY);
    let mut replica_args = server_args.clone();
    replica_args.extend_from_slice(&["--repl-diskless-sync-delay", "0"]);
    let (mut primary, mut replica) = primary_and_replica_with(&server_args, &replica_args);
    let restart_args = primary_restart_args(&server_args);
    let restart_args: Vec<&str> = restart_args.iter().map(String::as_str).collect();
    let mut p = primary.client();
    let mut r = replica.client();
    let mut waiting = Vec::new();
    // What the run went through, printed at the end, so a run that never got there shows it.
    let (mut shared_seen, mut meta_seen, mut restarts, mut promotions) = (0, 0, 0, 0);
    let mut failbacks = 0;
    // When grants were last held back (a restart or a promotion): lines may stand until then.
    let mut held_since = Instant::now();
    let mut queued_seen = 0;
    for batch in 1..=batches {
        for _ in 0..rng.between(8, 20) {
            let resource = *rng.pick(&RESOURCES);
            // Half the time a holder acts (renews, releases, re-acquires), else anyone.
            let current = holders(&mut p, resource);
            let token = match current.get(rng.between(0, 3) as usize) {
                Some(holder) if rng.between(0, 1) == 0 => holder.owner.clone(),
                _ => rng.pick(&TOKENS).to_string(),
            };
            let token = token.as_str();
            let ttl = if rng.between(0, 1) == 0 {
                rng.between(LONG_MS.0, LONG_MS.1)
            } else {
                rng.between(SHORT_MS.0, SHORT_MS.1)
            };
            match rng.between(0, 13) {
                2 => {
                    // A set of two resources: granted, renewed or released whole (errors, a
                    // holder of one member in the other mode, change nothing: ignored).
                    let other = *rng.pick(&RESOURCES);
                    let members: Vec<&str> =
                        if other == resource { vec![resource] } else { vec![resource, other] };
                    let command =
                        *rng.pick(&["DLOCK.ACQUIREALL", "DLOCK.RENEWALL", "DLOCK.RELEASEALL"]);
                    // Sets have tokens of their own: a line behind no lease is theirs.
                    let token = format!("set-{}", rng.between(0, 2));
                    let mut set = redis::cmd(command);
                    set.arg(members.len()).arg(&members).arg(&token);
                    if command != "DLOCK.RELEASEALL" {
                        set.arg(ttl);
                    }
                    if command == "DLOCK.ACQUIREALL" && rng.between(0, 2) == 0 {
                        set.arg("SHARED");
                    }
                    if command == "DLOCK.ACQUIREALL" && rng.between(0, 1) == 0 {
                        // In line: a later call of the same set may be granted from its tickets.
                        set.arg("QUEUE").arg(rng.between(200, 3_000));
                    }
                    let _: redis::RedisResult<redis::Value> = set.query(&mut p);
                }
                0 | 1 => {
                    // Errors (a holder asking for the other mode) change nothing: ignored.
                    let _: redis::RedisResult<redis::Value> = redis::cmd("DLOCK.ACQUIRE")
                        .arg(resource)
                        .arg(token)
                        .arg(ttl)
                        .arg(acquire_options(&mut rng))
                        .query(&mut p);
                }
                3 | 4 => {
                    // Some waits end within the batch, some stand while the copies are compared.
                    let timeout = if rng.between(0, 1) == 0 {
                        rng.between(50, 400)
                    } else {
                        rng.between(3_000, 8_000)
                    };
                    let port = primary.port;
                    let mut options = vec!["WAIT".to_owned(), timeout.to_string()];
                    options.extend(acquire_options(&mut rng).into_iter().filter(|o| o != "QUEUE"));
                    // A QUEUE value left behind by the filter would be read as a bad option:
                    // drop options that lost their keyword.
                    let options = well_formed(options);
                    waiting.push(wait_in_background(&mut p, port, resource, token, ttl, &options));
                }
                5 | 6 => {
                    // With the holder's fence half the time (FENCE), else without.
                    let fence =
                        fence_of(&mut p, resource, token).filter(|_| rng.between(0, 1) == 0);
                    let mut renew = redis::cmd("DLOCK.RENEW");
                    renew.arg(resource).arg(token).arg(ttl);
                    if let Some(fence) = fence {
                        renew.arg("FENCE").arg(fence);
                    }
                    let _: i64 = renew.query(&mut p).expect("RENEW");
                }
                7 | 8 => {
                    let fence =
                        fence_of(&mut p, resource, token).filter(|_| rng.between(0, 1) == 0);
                    let mut release = redis::cmd("DLOCK.RELEASE");
                    release.arg(resource).arg(token);
                    if let Some(fence) = fence {
                        release.arg("FENCE").arg(fence);
                    }
                    let _: i64 = release.query(&mut p).expect("RELEASE");
                }
                9 if rng.between(0, 1) == 0 => {
                    let _: i64 = redis::cmd("DEL").arg(resource).query(&mut p).expect("DEL");
                }
                9 => {
                    // An operator's revocation: of the token's grant, or of every live lease.
                    let mut revoke = redis::cmd("DLOCK.REVOKE");
                    revoke.arg(resource);
                    if let Some(fence) = fence_of(&mut p, resource, token) {
                        revoke.arg("FENCE").arg(fence);
                    }
                    let _: i64 = revoke.arg("REASON").arg("mirror").query(&mut p).expect("REVOKE");
                }
                10 if rng.between(0, 2) == 0 => {
                    // A crash: the primary comes back from its AOF, with its grant delay.
                    primary.crash_and_restart_with(&restart_args);
                    held_since = Instant::now();
                    // After the full resync, Valkey acknowledges WAIT before the replica has
                    // applied what followed the snapshot: wait until writes show there.
                    assert!(wait_until_replica_streams(&primary, &replica), "after restart");
                    p = reconnect(&primary);
                    restarts += 1;
                }
                11 if rng.between(0, 3) == 0 => {
                    // A promotion: the replica becomes the primary (with its grant delay), the
                    // old primary its replica. Waiters on the old primary lose their queue.
                    (p, r) = fail_over(&mut primary, &mut replica, &mut p, &mut r);
                    promotions += 1;
                    held_since = Instant::now();
                }
                12 if rng.between(0, 2) == 0 => {
                    // A failover and a failback, neither server restarted: the holders renew on
                    // the other side (each keeps its memory of its earlier term as primary).
                    for _ in 0..2 {
                        (p, r) = fail_over(&mut primary, &mut replica, &mut p, &mut r);
                        for resource in RESOURCES {
                            for holder in holders(&mut p, resource) {
                                let ttl = if rng.between(0, 1) == 0 {
                                    rng.between(LONG_MS.0, LONG_MS.1)
                                } else {
                                    rng.between(SHORT_MS.0, SHORT_MS.1)
                                };
                                let _: i64 = redis::cmd("DLOCK.RENEW")
                                    .arg(resource)
                                    .arg(&holder.owner)
                                    .arg(ttl)
                                    .query(&mut p)
                                    .expect("RENEW");
                            }
                        }
                    }
                    promotions += 2;
                    failbacks += 1;
                    held_since = Instant::now();
                }
                _ => sleep(Duration::from_millis(rng.between(0, 150))),
            }
            let on_primary = assert_replica_mirrors(&mut p, &mut r, seed, batch);
            shared_seen += on_primary.iter().flatten().filter(|h| h.shared).count();
            meta_seen += on_primary.iter().flatten().filter(|h| h.meta.is_some()).count();
            queued_seen += RESOURCES
                .iter()
                .filter(|resource| {
                    let mut field = |name| info_field(&mut p, resource, name).unwrap_or_default();
                    let (waiters, tickets) = (field("waiters"), field("tickets"));
                    !matches!(waiters.as_str(), "" | "0") || !matches!(tickets.as_str(), "" | "0")
                })
                .count();
        }
        // Short waits and short leases end; every effect reaches the replica and the AOF.
        sleep(Duration::from_millis(SHORT_MS.1 + 1_100));
        assert_replica_mirrors(&mut p, &mut r, seed, batch);
        assert_nothing_stands_still(&mut p, held_since, seed, batch);
        let mut verdict = Ok(());
        for _ in 0..3 {
            sync(&mut p);
            let started = Instant::now();
            let on_primary = leases(&mut p);
            let from_aof = primary.start_from_aof_copy(&[]);
            let elapsed = started.elapsed().as_millis() as i64;
            let mut copy = leases(&mut from_aof.client());
            // The copy was read later: its leases have run down by about that long.
            for holder in copy.iter_mut().flatten() {
                holder.ttl += elapsed;
            }
            verdict = mirrors("a server restarted from the AOF", &on_primary, &copy);
            if verdict.is_ok() {
                break;
            }
        }
        if let Err(difference) = verdict {
            panic!("after batch {batch} (MIRROR_SEED={seed}): {difference}");
        }
    }
    eprintln!(
        "mirror: seed {seed}, {batches} batches: {shared_seen} shared and {meta_seen} \
         META leases compared, {queued_seen} lines with waiters or tickets, {restarts} restarts, \
         {promotions} promotions ({failbacks} there and back)"
    );
    drop(primary); // the long waits end with their servers
    drop(replica);
    for waiter in waiting {
        let _ = waiter.join();
    }
}

/// At the end of a batch, on the primary: a line (blocked waiters or tickets) stands only behind a
/// live lease, or while grants are held (up to the grant delay after `held_since`, and a second
/// for the timer), or behind a set's ticket (which keeps the member for its set); a key with
/// neither lease nor line is gone. A lease that never ended after a failover and a failback left
/// its waiter in line behind nobody.
fn assert_nothing_stands_still(
    p: &mut redis::Connection,
    held_since: Instant,
    seed: u64,
    batch: usize,
) {
    let grants_held = held_since.elapsed() < Duration::from_millis(1_500 + 1_000);
    for resource in RESOURCES {
        if !exists(p, resource) || !holders(p, resource).is_empty() {
            continue;
        }
        let mut field = |name| info_field(p, resource, name).unwrap_or_default();
        let (waiters, tickets) = (field("waiters"), field("tickets"));
        let in_line =
            !matches!(waiters.as_str(), "" | "0") || !matches!(tickets.as_str(), "" | "0");
        assert!(
            in_line,
            "after batch {batch} (MIRROR_SEED={seed}): {resource} lingers with no lease and no line"
        );
        let info: redis::Value =
            redis::cmd("DLOCK.INFO").arg(resource).query(p).unwrap_or(redis::Value::Nil);
        // A set's ticket heading the line keeps the member for its set (set tokens only).
        let head_is_set = match &info {
            redis::Value::Array(items) => items.chunks(2).any(|pair| {
                value_text(&pair[0]).as_deref() == Some("next-waiters")
                    && matches!(pair.get(1), Some(redis::Value::Array(next))
                        if next.first().and_then(value_text).is_some_and(|t| t.starts_with("set-")))
            }),
            _ => false,
        };
        assert!(
            grants_held || head_is_set,
            "after batch {batch} (MIRROR_SEED={seed}): {resource} has {waiters} waiters and \
             {tickets} tickets in line behind no lease, {:?} after grants were last held: {info:?}",
            held_since.elapsed()
        );
    }
}

/// The replica becomes the primary and the primary its replica, neither restarted (waiters on
/// the old primary lose their queue); returns connections to the new primary and replica.
fn fail_over(
    primary: &mut Server,
    replica: &mut Server,
    p: &mut redis::Connection,
    r: &mut redis::Connection,
) -> (redis::Connection, redis::Connection) {
    sync(p);
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(r).expect("promote");
    let _: () =
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(replica.port).query(p).expect("demote");
    std::mem::swap(primary, replica);
    assert!(wait_until_replica_streams(primary, replica), "after a failover");
    (reconnect(primary), replica.client())
}

/// `options` without a trailing value whose keyword was filtered out.
fn well_formed(options: Vec<String>) -> Vec<String> {
    let takes_value = |o: &str| matches!(o, "WAIT" | "QUEUE" | "CLAIM" | "META" | "LIMIT");
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < options.len() {
        let option = &options[i];
        if takes_value(option) {
            if let Some(value) = options.get(i + 1) {
                out.push(option.clone());
                out.push(value.clone());
            }
            i += 2;
        } else if option == "SHARED" {
            out.push(option.clone());
            i += 1;
        } else {
            i += 1; // a value whose keyword was dropped
        }
    }
    out
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
    assert!(wait_until_replica_streams(&primary, &replica), "after restart");
    let mut p = reconnect(&primary);
    let port = primary.port;
    let b = wait_in_background(&mut p, port, "lk", "B", 60_000, &["WAIT".into(), "20000".into()]);
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
