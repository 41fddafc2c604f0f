//! Shared leases (`SHARED [LIMIT n]`) and holder metadata (`META`) against a real server:
//! readers together, writers alone, strict FIFO across modes, semaphore permits, fences for every
//! holder, and every holder mirrored by replicas, the AOF and RDB.

use std::time::Duration;

use dlock_testkit::*;
use redis::Value;

/// `DLOCK.ACQUIRE resource token ttl-ms options…`: the fence, or `None` (nil).
fn acquire_with(
    con: &mut redis::Connection,
    resource: &str,
    token: &str,
    ttl_ms: u64,
    options: &[&str],
) -> redis::RedisResult<Option<i64>> {
    redis::cmd("DLOCK.ACQUIRE").arg(resource).arg(token).arg(ttl_ms).arg(options).query(con)
}

fn shared(
    con: &mut redis::Connection,
    resource: &str,
    token: &str,
    options: &[&str],
) -> Option<i64> {
    let mut all = vec!["SHARED"];
    all.extend_from_slice(options);
    acquire_with(con, resource, token, 30_000, &all).expect("ACQUIRE SHARED")
}

fn field(con: &mut redis::Connection, resource: &str, name: &str) -> Option<String> {
    info_field(con, resource, name)
}

/// A shared lease as `DLOCK.INFO` lists it: token, fence, meta.
type Listed = (String, i64, Option<String>);

/// The `leases` field of `DLOCK.INFO`: `(token, fence, meta)` of every live shared lease.
fn shared_leases(con: &mut redis::Connection, resource: &str) -> Vec<Listed> {
    let reply: Value = redis::cmd("DLOCK.INFO").arg(resource).query(con).expect("INFO");
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Map(pairs) => pairs,
        Value::Array(items) => items.chunks(2).map(|kv| (kv[0].clone(), kv[1].clone())).collect(),
        Value::Nil => return Vec::new(),
        other => panic!("unexpected INFO reply {other:?}"),
    };
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        _ => None,
    };
    let Some((_, Value::Array(leases))) =
        pairs.into_iter().find(|(name, _)| text(name).as_deref() == Some("leases"))
    else {
        return Vec::new();
    };
    leases
        .iter()
        .map(|lease| match lease {
            Value::Array(fields) => match &fields[..] {
                [token, Value::Int(fence), Value::Int(_ttl), meta] => {
                    (text(token).expect("token"), *fence, text(meta))
                }
                other => panic!("unexpected lease {other:?}"),
            },
            other => panic!("unexpected lease {other:?}"),
        })
        .collect()
}

#[test]
fn readers_share_a_writer_waits_for_them_and_later_readers_wait_behind_the_writer() {
    let server = Server::start();
    let mut con = server.client();
    let r1 = shared(&mut con, "doc", "r1", &[]).expect("first reader");
    let r2 = shared(&mut con, "doc", "r2", &[]).expect("second reader, beside the first");
    assert!(r2 > r1, "every grant mints a larger fence");
    assert_eq!(acquire(&mut con, "doc", "w", 30_000), None, "a writer waits for readers");
    assert_eq!(field(&mut con, "doc", "mode").as_deref(), Some("shared"));
    assert_eq!(field(&mut con, "doc", "holders").as_deref(), Some("2"));
    // The writer queues; a later reader must not pass it (no writer starvation).
    let mut writer = send_wait(&server, "doc", "w", 30_000, &[]);
    assert!(eventually(Duration::from_secs(5), || {
        field(&mut con, "doc", "waiters").as_deref() == Some("1")
    }));
    assert_eq!(shared(&mut con, "doc", "r3", &[]), None, "a reader waits behind the writer");
    assert_eq!(release(&mut con, "doc", "r1"), 1);
    assert_eq!(field(&mut con, "doc", "holders").as_deref(), Some("1"), "r2 still reads");
    assert_eq!(release(&mut con, "doc", "r2"), 1);
    let w: Option<i64> =
        redis::from_redis_value(&writer.recv_response().expect("granted")).expect("a fence");
    let w = w.expect("the writer got the lease");
    assert!(w > r2, "the writer's fence is larger than every reader's before it");
    assert_eq!(field(&mut con, "doc", "mode").as_deref(), Some("exclusive"));
    assert_eq!(shared(&mut con, "doc", "r3", &[]), None, "no reader beside a writer");
    assert_eq!(fencecheck(&mut con, "doc", r2), 0, "a released reader's fence is stale");
    assert_eq!(fencecheck(&mut con, "doc", w), 1);
}

#[test]
fn queued_readers_at_the_head_are_granted_together_when_the_writer_leaves() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "doc", "w", 30_000).expect("the writer");
    let mut readers: Vec<_> = ["r1", "r2", "r3"]
        .iter()
        .map(|r| send_wait(&server, "doc", r, 30_000, &["SHARED"]))
        .collect();
    let mut writer2 = send_wait(&server, "doc", "w2", 30_000, &[]);
    assert!(eventually(Duration::from_secs(5), || {
        field(&mut con, "doc", "waiters").as_deref() == Some("4")
    }));
    assert_eq!(release(&mut con, "doc", "w"), 1);
    let fences: Vec<i64> = readers
        .iter_mut()
        .map(|reader| {
            let fence: Option<i64> =
                redis::from_redis_value(&reader.recv_response().expect("reply")).expect("int");
            fence.expect("granted")
        })
        .collect();
    assert!(fences.windows(2).all(|pair| pair[0] < pair[1]), "FIFO: {fences:?}");
    assert_eq!(field(&mut con, "doc", "holders").as_deref(), Some("3"));
    assert_eq!(field(&mut con, "doc", "waiters").as_deref(), Some("1"), "the second writer waits");
    let tokens: Vec<String> = shared_leases(&mut con, "doc").into_iter().map(|l| l.0).collect();
    assert_eq!(tokens, ["r1", "r2", "r3"]);
    for reader in ["r1", "r2", "r3"] {
        assert_eq!(release(&mut con, "doc", reader), 1);
    }
    let w2: Option<i64> =
        redis::from_redis_value(&writer2.recv_response().expect("reply")).expect("int");
    assert!(w2.expect("granted") > fences[2]);
}

#[test]
fn a_semaphore_admits_at_most_its_limit_and_each_permit_is_fenced_on_its_own() {
    let server = Server::start();
    let mut con = server.client();
    let permits: Vec<i64> = ["p1", "p2", "p3"]
        .iter()
        .map(|token| shared(&mut con, "pool", token, &["LIMIT", "3"]).expect("a permit"))
        .collect();
    assert_eq!(shared(&mut con, "pool", "p4", &["LIMIT", "3"]), None, "the fourth waits");
    for fence in &permits {
        assert_eq!(fencecheck(&mut con, "pool", *fence), 1, "every live permit's fence passes");
        let ok: String = redis::cmd("DLOCK.FENCED")
            .arg("pool")
            .arg(*fence)
            .arg("SET")
            .arg("pool:data")
            .arg(fence)
            .query(&mut con)
            .expect("FENCED with a live permit");
        assert_eq!(ok, "OK");
    }
    // A permit renews and releases by its own fence; another's fence changes nothing.
    let renewed: i64 = redis::cmd("DLOCK.RENEW")
        .arg("pool")
        .arg("p2")
        .arg(30_000)
        .arg("FENCE")
        .arg(permits[0])
        .query(&mut con)
        .expect("RENEW");
    assert_eq!(renewed, 0, "p2 with p1's fence");
    let released: i64 = redis::cmd("DLOCK.RELEASE")
        .arg("pool")
        .arg("p2")
        .arg("FENCE")
        .arg(permits[1])
        .query(&mut con)
        .expect("RELEASE");
    assert_eq!(released, 1);
    let stale = error_text(
        redis::cmd("DLOCK.FENCED")
            .arg("pool")
            .arg(permits[1])
            .arg("SET")
            .arg("pool:data")
            .arg(0)
            .query(&mut con),
    );
    assert!(stale.starts_with("STALE"), "{stale}");
    let p4 = shared(&mut con, "pool", "p4", &["LIMIT", "3"]).expect("a freed permit");
    assert!(p4 > permits[2]);
    assert_eq!(field(&mut con, "pool", "holders").as_deref(), Some("3"));
}

#[test]
fn one_permit_expiring_touches_no_other() {
    let server = Server::start();
    let mut con = server.client();
    let short = acquire_with(&mut con, "pool", "short", 200, &["SHARED", "LIMIT", "2"])
        .expect("ACQUIRE")
        .expect("granted");
    let long = shared(&mut con, "pool", "long", &["LIMIT", "2"]).expect("granted");
    assert!(eventually(Duration::from_secs(5), || {
        field(&mut con, "pool", "holders").as_deref() == Some("1")
    }));
    assert_eq!(fencecheck(&mut con, "pool", short), 0);
    assert_eq!(fencecheck(&mut con, "pool", long), 1, "the other permit lives on");
    let leases = shared_leases(&mut con, "pool");
    assert_eq!(leases.iter().map(|l| l.0.as_str()).collect::<Vec<_>>(), ["long"]);
}

#[test]
fn a_holder_cannot_change_its_mode_and_bad_options_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let fence = shared(&mut con, "doc", "r", &[]).expect("reader");
    let conflict =
        error_text(redis::cmd("DLOCK.ACQUIRE").arg("doc").arg("r").arg(1000).query(&mut con));
    assert!(conflict.starts_with("LOCKMODE"), "{conflict}");
    acquire(&mut con, "mtx", "w", 30_000).expect("writer");
    let conflict = error_text(
        redis::cmd("DLOCK.ACQUIRE").arg("mtx").arg("w").arg(1000).arg("SHARED").query(&mut con),
    );
    assert!(conflict.starts_with("LOCKMODE"), "{conflict}");
    assert_eq!(field(&mut con, "mtx", "mode").as_deref(), Some("exclusive"));
    for (options, named) in [
        (&["LIMIT", "2"][..], "LIMIT"),
        (&["SHARED", "LIMIT", "0"], "LIMIT"),
        (&["SHARED", "LIMIT", "1000001"], "LIMIT"),
        (&["SHARED", "SHARED"], "SHARED"),
        (&["META", ""], "META"),
        (&["META", "a", "META", "b"], "META"),
    ] {
        let text = error_text(
            redis::cmd("DLOCK.ACQUIRE").arg("doc").arg("x").arg(1000).arg(options).query(&mut con),
        );
        assert!(text.starts_with("ERR") && text.contains(named), "{options:?}: {text}");
    }
    assert_eq!(field(&mut con, "doc", "holders").as_deref(), Some("1"));
    assert_eq!(shared(&mut con, "doc", "r", &[]), Some(fence), "a reader re-acquires its grant");
}

#[test]
fn metadata_is_shown_replaced_by_a_new_meta_and_kept_without_one() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire_with(&mut con, "job", "w", 30_000, &["META", "host=a pid=1"])
        .expect("ACQUIRE")
        .expect("granted");
    assert_eq!(field(&mut con, "job", "meta").as_deref(), Some("host=a pid=1"));
    assert_eq!(acquire_with(&mut con, "job", "w", 30_000, &[]).expect("again"), Some(fence));
    assert_eq!(field(&mut con, "job", "meta").as_deref(), Some("host=a pid=1"), "kept");
    acquire_with(&mut con, "job", "w", 30_000, &["META", "host=b"]).expect("again");
    assert_eq!(field(&mut con, "job", "meta").as_deref(), Some("host=b"), "replaced");
    acquire(&mut con, "plain", "w", 30_000).expect("granted");
    assert_eq!(field(&mut con, "plain", "meta").as_deref(), Some("nil"), "no META, no metadata");
    shared(&mut con, "doc", "r1", &["META", "reader one"]);
    shared(&mut con, "doc", "r2", &[]);
    let metas: Vec<Option<String>> =
        shared_leases(&mut con, "doc").into_iter().map(|lease| lease.2).collect();
    assert_eq!(metas, [Some("reader one".to_string()), None]);
}

/// What a copy must hold: every shared lease's token, fence and meta, or the exclusive owner.
fn holders_of(con: &mut redis::Connection, resource: &str) -> (Option<String>, Vec<Listed>) {
    (field(con, resource, "owner"), shared_leases(con, resource))
}

#[test]
fn replicas_the_aof_and_rdb_hold_every_shared_lease_and_its_metadata() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let (primary, replica) = primary_and_replica_with(&aof, &[]);
    let mut p = primary.client();
    let mut r = replica.client();
    shared(&mut p, "doc", "r1", &["META", "one"]).expect("r1");
    shared(&mut p, "doc", "r2", &[]).expect("r2");
    shared(&mut p, "doc", "r3", &["LIMIT", "5"]).expect("r3");
    acquire_with(&mut p, "job", "w", 60_000, &["META", "host=a"]).expect("ACQUIRE").expect("w");
    assert_eq!(release(&mut p, "doc", "r2"), 1, "one reader leaves; the others stay");
    let sync = |p: &mut redis::Connection| {
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(p).expect("WAIT");
        assert_eq!(acked, 1);
    };
    sync(&mut p);
    let want = holders_of(&mut p, "doc");
    assert_eq!(want.1.len(), 2);
    assert_eq!(holders_of(&mut r, "doc"), want, "the replica mirrors every shared lease");
    assert_eq!(field(&mut r, "job", "meta").as_deref(), Some("host=a"));
    assert_eq!(digest(&mut p, "doc"), digest(&mut r, "doc"));
    assert_eq!(digest(&mut p, "job"), digest(&mut r, "job"));
    // The AOF replays the same leases; so does an AOF rewrite, and an RDB reload.
    let from_aof = primary.start_from_aof_copy(&[]);
    assert_eq!(holders_of(&mut from_aof.client(), "doc"), want);
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut p).expect("BGREWRITEAOF");
    wait_for_background_persistence(&mut p);
    let rewritten = primary.start_from_aof_copy(&[]);
    assert_eq!(holders_of(&mut rewritten.client(), "doc"), want);
    assert_eq!(field(&mut rewritten.client(), "job", "meta").as_deref(), Some("host=a"));
    let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut p).expect("DEBUG RELOAD");
    assert_eq!(holders_of(&mut p, "doc"), want, "RDB keeps every shared lease");
    // The last readers leave: the copies drop the key.
    assert_eq!(release(&mut p, "doc", "r1"), 1);
    assert_eq!(release(&mut p, "doc", "r3"), 1);
    sync(&mut p);
    assert!(!exists(&mut r, "doc"), "the replica dropped the key with its last lease");
    assert!(!exists(&mut primary.start_from_aof_copy(&[]).client(), "doc"));
}

#[test]
fn restore_leaves_no_shared_lease_and_memory_usage_counts_every_holder() {
    let server = Server::start();
    let mut con = server.client();
    shared(&mut con, "doc", "r1", &[]).expect("r1");
    let one: i64 = redis::cmd("MEMORY").arg("USAGE").arg("doc").query(&mut con).expect("USAGE");
    for reader in ["r2", "r3", "r4"] {
        shared(&mut con, "doc", reader, &["META", &"m".repeat(200)]).expect("reader");
    }
    let four: i64 = redis::cmd("MEMORY").arg("USAGE").arg("doc").query(&mut con).expect("USAGE");
    assert!(four >= one + 3 * 200, "every holder and its metadata count: {one} then {four}");
    let payload: Vec<u8> = redis::cmd("DUMP").arg("doc").query(&mut con).expect("DUMP");
    let _: String =
        redis::cmd("RESTORE").arg("doc2").arg(0).arg(payload).query(&mut con).expect("RESTORE");
    // A lease belongs to the name it was granted under, shared ones included.
    assert!(eventually(Duration::from_secs(5), || !exists(&mut con, "doc2")));
    assert_eq!(field(&mut con, "doc", "holders").as_deref(), Some("4"));
}

#[test]
fn verbose_log_lines_name_the_mode_and_the_metadata() {
    let server = Server::start_with(&["--loglevel", "verbose"]);
    let mut con = server.client();
    shared(&mut con, "doc", "r1", &["META", "host=a pid=7"]).expect("r1");
    acquire_with(&mut con, "job", "w", 30_000, &[]).expect("ACQUIRE").expect("w");
    assert!(eventually(Duration::from_secs(5), || {
        server.log().contains("lease acquired resource=doc owner=r1")
    }));
    let log = server.log();
    let line = log.lines().find(|l| l.contains("lease acquired resource=doc")).expect("logged");
    assert!(line.ends_with("mode=shared meta=host=a pid=7"), "{line}");
    let plain = log.lines().find(|l| l.contains("lease acquired resource=job")).expect("logged");
    assert!(!plain.contains("mode=") && !plain.contains("meta="), "{plain}");
}

/// A writer leaves with 600 readers' tickets in line and a writer's ticket behind them: the
/// release grants the first 256 (a bounded settle), the timer grants the rest on its next turns,
/// and the writer behind them still waits for every reader, none passing the line (all 600 were
/// granted in the one RELEASE before, in one long step).
#[test]
fn a_crowd_of_readers_is_granted_over_several_turns_and_keeps_its_place() {
    let server = Server::start();
    let mut con = server.client();
    acquire(&mut con, "crowd", "writer-1", 60_000).expect("granted");
    let mut pipe = redis::pipe();
    for i in 0..600 {
        pipe.cmd("DLOCK.ACQUIRE").arg("crowd").arg(format!("reader-{i}")).arg(60_000);
        pipe.arg("SHARED").arg("QUEUE").arg(60_000).ignore();
    }
    pipe.cmd("DLOCK.ACQUIRE").arg("crowd").arg("writer-2").arg(60_000);
    pipe.arg("QUEUE").arg(60_000).ignore();
    let _: () = pipe.query(&mut con).expect("tickets");
    assert_eq!(field(&mut con, "crowd", "tickets").as_deref(), Some("601"));
    let (released, holders): (i64, Value) = redis::pipe()
        .cmd("DLOCK.RELEASE")
        .arg("crowd")
        .arg("writer-1")
        .cmd("DLOCK.INFO")
        .arg("crowd")
        .query(&mut con)
        .expect("RELEASE and INFO in one write");
    assert_eq!(released, 1);
    let at_once = match &holders {
        Value::Array(fields) => fields
            .chunks(2)
            .find(|pair| pair[0] == Value::BulkString(b"holders".to_vec()))
            .and_then(|pair| if let Value::Int(n) = pair[1] { Some(n) } else { None }),
        _ => None,
    };
    assert_eq!(at_once, Some(256), "the release grants one slice: {holders:?}");
    assert!(
        eventually(Duration::from_secs(5), || field(&mut con, "crowd", "holders").as_deref()
            == Some("600")),
        "the timer grants the rest"
    );
    assert_eq!(field(&mut con, "crowd", "tickets").as_deref(), Some("1"), "the writer waits");
    assert_eq!(field(&mut con, "crowd", "mode").as_deref(), Some("shared"));
}

/// `readers` shared leases of `resource`, each for `ttl_ms`, granted in one pipeline.
fn crowd_of_readers(con: &mut redis::Connection, resource: &str, readers: usize, ttl_ms: u64) {
    let mut pipe = redis::pipe();
    for i in 0..readers {
        pipe.cmd("DLOCK.ACQUIRE").arg(resource).arg(format!("reader-{i}")).arg(ttl_ms);
        pipe.arg("SHARED").ignore();
    }
    let _: () = pipe.query(con).expect("readers");
}

/// 1,200 readers' leases end together (a write pause outlasts them all) with no one waiting:
/// the key stays until the last slice has ended its leases (deleting it once the first slice left nothing live ended the other
/// 688 unannounced and uncounted, and freed them in one step), and the replica drops it too.
#[test]
fn a_crowd_of_shared_leases_ending_together_with_no_one_waiting_ends_every_lease() {
    let (primary, replica) = primary_and_replica_with(&[], &[]);
    let mut con = primary.client();
    crowd_of_readers(&mut con, "ending", 1_200, 300);
    let _: () =
        redis::cmd("CLIENT").arg("PAUSE").arg(600).arg("WRITE").query(&mut con).expect("PAUSE");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while redis::cmd("EXISTS").arg("ending").query::<i64>(&mut con).expect("EXISTS") == 1 {
        assert!(std::time::Instant::now() < deadline, "the key outlived its leases");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let stats = dlock_counters(&mut con);
    assert_eq!(stats["leases_expired"], 1_200, "each end counted once");
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(&mut con).expect("WAIT");
    let exists: i64 =
        redis::cmd("EXISTS").arg("ending").query(&mut replica.client()).expect("EXISTS");
    assert_eq!(exists, 0, "the replica dropped the key too");
}

/// 1,200 readers' leases end together with a writer waiting behind them: a settle ends at most
/// 512 of them, the timer the rest over its next turns, and only then is the writer granted;
/// every end reaches the replica (equal digests), and each is counted once.
#[test]
fn a_crowd_of_shared_leases_ending_together_ends_in_slices_before_the_writer_behind_it() {
    let (primary, replica) = primary_and_replica_with(&[], &[]);
    let mut con = primary.client();
    crowd_of_readers(&mut con, "ending", 1_200, 400);
    assert_eq!(field(&mut con, "ending", "holders").as_deref(), Some("1200"));
    let mut writer = send_wait_for(&primary, "ending", "writer", 60_000, 10_000, &[]);
    let granted: Option<i64> =
        redis::from_redis_value(&writer.recv_response().expect("reply")).expect("fence or nil");
    assert!(granted.is_some(), "the writer is granted once every reader's lease has ended");
    assert_eq!(field(&mut con, "ending", "holders").as_deref(), Some("1"));
    assert_eq!(field(&mut con, "ending", "mode").as_deref(), Some("exclusive"));
    let stats = dlock_counters(&mut con);
    assert_eq!(stats["leases_expired"], 1_200, "each end counted once");
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(&mut con).expect("WAIT");
    let digest = |con: &mut redis::Connection| -> String {
        redis::cmd("DEBUG").arg("DIGEST").query(con).expect("DEBUG DIGEST")
    };
    assert_eq!(digest(&mut con), digest(&mut replica.client()), "the replica holds the same");
}
