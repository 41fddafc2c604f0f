//! Sets of resources ([`Client::acquire_all`]) against a real redis-server with the module: a set
//! is granted whole or not at all, waits in every member's line holding nothing (a later single
//! request waits behind it), is renewed, lost and released whole, and an operator's `DEL` or
//! `DLOCK.REVOKE` of one member loses all of it.

use std::time::{Duration, Instant};

use dlock_client::{AcquireError, AcquireOptions, Client, LossReason, Mode, RunError, channel_of};
use dlock_testkit::*;
use redis::aio::MultiplexedConnection;

/// Room for a slow test machine (a bound on polling loops).
const SLACK: Duration = Duration::from_secs(5);

async fn client(server: &Server) -> Client {
    Client::connect(&server.url()).await.expect("connect")
}

async fn operator(server: &Server) -> MultiplexedConnection {
    let client = redis::Client::open(server.url()).expect("url");
    client.get_multiplexed_async_connection().await.expect("connect")
}

/// A field of `DLOCK.INFO resource` (`None`: no such key or field).
async fn field(con: &mut MultiplexedConnection, resource: &str, name: &str) -> Option<String> {
    let info: redis::Value =
        redis::cmd("DLOCK.INFO").arg(resource).query_async(con).await.expect("INFO");
    let redis::Value::Array(items) = info else { return None };
    items.chunks_exact(2).find_map(|pair| {
        let key: String = redis::from_redis_value(&pair[0]).ok()?;
        if key != name {
            return None;
        }
        match &pair[1] {
            redis::Value::Int(n) => Some(n.to_string()),
            redis::Value::Nil => None,
            other => redis::from_redis_value(other).ok(),
        }
    })
}

/// Waits until `DLOCK.INFO resource` shows `name` as `value`.
async fn until_field(con: &mut MultiplexedConnection, resource: &str, name: &str, value: &str) {
    let started = Instant::now();
    loop {
        let now = field(con, resource, name).await;
        if now.as_deref() == Some(value) {
            return;
        }
        assert!(started.elapsed() < SLACK, "{resource}: {name} is {now:?}, not {value}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn exists(con: &mut MultiplexedConnection, key: &str) -> bool {
    let n: i64 = redis::cmd("EXISTS").arg(key).query_async(con).await.expect("EXISTS");
    n == 1
}

/// Waits until `key` is gone.
async fn until_gone(con: &mut MultiplexedConnection, key: &str) {
    let started = Instant::now();
    while exists(con, key).await {
        assert!(started.elapsed() < SLACK, "{key} still exists");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits until `resource`'s channel has `n` subscribers.
async fn until_listeners(con: &mut MultiplexedConnection, resource: &str, n: i64) {
    let started = Instant::now();
    loop {
        let numsub: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel_of(resource))
            .query_async(con)
            .await
            .expect("NUMSUB");
        if numsub.first().is_some_and(|(_, now)| *now == n) {
            return;
        }
        assert!(started.elapsed() < SLACK, "{resource}: not {n} subscribers");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_is_granted_whole_a_fence_per_member_in_the_order_asked_and_released_whole() {
    let server = Server::start();
    let dlock = client(&server).await;
    let mut con = operator(&server).await;
    // Not in key order: the fences follow the order asked.
    let members = ["{acct}:bob", "{acct}:alice", "{acct}:carol"];
    let set = dlock.acquire_all(&members, Duration::from_secs(30), None).await.expect("granted");
    assert_eq!(set.resources(), &members[..]);
    let fences = set.fences().to_vec();
    assert_eq!(fences.len(), 3);
    assert!(fences.windows(2).all(|pair| pair[0] < pair[1]), "granted in order: {fences:?}");
    for (member, fence) in members.iter().zip(&fences) {
        assert_eq!(set.fence(member), Some(*fence));
        assert_eq!(field(&mut con, member, "owner").await.as_deref(), Some(set.token()));
        assert_eq!(field(&mut con, member, "fence").await, Some(fence.to_string()));
    }
    assert_eq!(set.fence("{acct}:dave"), None);
    assert!(set.fencing("{acct}:dave").is_none());
    // A member's fenced write goes under that member's fence.
    let alice = set.fencing("{acct}:alice").expect("a member");
    assert_eq!(alice.fence(), fences[1]);
    let mut write = redis::cmd("SET");
    write.arg("{acct}:alice:balance").arg("90");
    alice.fenced::<()>(&write).await.expect("fenced write");

    assert!(set.release().await.expect("released"));
    for member in members {
        assert!(!exists(&mut con, member).await, "{member} released");
    }
    // The released set's fence is stale now.
    let stale = alice.fenced::<()>(&write).await;
    assert!(matches!(stale, Err(dlock_client::FencedError::Stale(_))), "{stale:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_with_a_held_member_is_not_granted_and_takes_nothing() {
    let server = Server::start();
    let dlock = client(&server).await;
    let mut con = operator(&server).await;
    let held = dlock.acquire("{job}:2", Duration::from_secs(30)).await.expect("single");
    let refused = dlock.acquire_all(&["{job}:1", "{job}:2"], Duration::from_secs(30), None).await;
    assert!(matches!(refused, Err(AcquireError::Held)), "{refused:?}");
    assert!(!exists(&mut con, "{job}:1").await, "the free member was not taken");
    assert_eq!(field(&mut con, "{job}:2", "fence").await, Some(held.fence().to_string()));
    // A set the server would refuse never leaves.
    let twice = dlock.acquire_all(&["{job}:1", "{job}:1"], Duration::from_secs(30), None).await;
    match twice {
        Err(AcquireError::Server(error)) => {
            assert_eq!(error.kind(), redis::ErrorKind::ClientError, "{error}");
        }
        other => panic!("expected a refusal before sending, got {other:?}"),
    }
    let none: [&str; 0] = [];
    let empty = dlock.acquire_all(&none, Duration::from_secs(30), None).await;
    assert!(matches!(empty, Err(AcquireError::Server(_))), "{empty:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_set_keeps_its_place_and_is_granted_as_the_member_frees_a_single_behind_it() {
    let server = Server::start();
    let dlock = client(&server).await;
    let mut con = operator(&server).await;
    let held = dlock.acquire("{line}:2", Duration::from_secs(30)).await.expect("single");
    // A wait of 30 s: a ticket of 30 s, refreshed every 10 s; only the channel can wake the set
    // within the bound below.
    let waiting = {
        let dlock = dlock.clone();
        tokio::spawn(async move {
            let members = ["{line}:1", "{line}:2"];
            let set = dlock.acquire_all(&members, Duration::from_secs(30), Some(SLACK * 6)).await;
            (set, Instant::now())
        })
    };
    until_field(&mut con, "{line}:1", "tickets", "1").await;
    assert_eq!(field(&mut con, "{line}:1", "owner").await, None, "the set holds nothing yet");
    // A single request that comes later waits behind the set, though the member is free.
    let single = {
        let dlock = dlock.clone();
        tokio::spawn(async move {
            let lease =
                dlock.acquire_waiting("{line}:1", Duration::from_secs(30), Some(SLACK)).await;
            (lease, Instant::now())
        })
    };
    until_field(&mut con, "{line}:1", "waiters", "1").await;
    assert_eq!(field(&mut con, "{line}:1", "owner").await, None, "kept for the set");
    // Into the refresh interval: the release's message is what wakes the set.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (held_fence, released) = (held.fence(), Instant::now());
    assert!(held.release().await.expect("released"));
    let (set, granted_at) = waiting.await.expect("task");
    let set = set.expect("the set is granted");
    let woke = granted_at - released;
    println!("the set was granted {woke:?} after the member's release");
    assert!(woke < Duration::from_secs(3), "woken by the channel, not the 10 s refresh: {woke:?}");
    assert!(set.fences()[1] > held_fence);
    assert_eq!(field(&mut con, "{line}:1", "owner").await.as_deref(), Some(set.token()));
    assert!(!single.is_finished(), "the single waits behind the set");
    let set_fence = set.fences()[0];
    assert!(set.release().await.expect("set released"));
    let (lease, _) = single.await.expect("task");
    let lease = lease.expect("the single is granted after the set");
    assert!(lease.fence() > set_fence);
    assert!(lease.release().await.expect("released"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_whose_wait_ends_withdraws_its_tickets() {
    let server = Server::start();
    let dlock = client(&server).await;
    let mut con = operator(&server).await;
    let held = dlock.acquire("{gate}:2", Duration::from_secs(30)).await.expect("single");
    let members = ["{gate}:1", "{gate}:2"];
    // A wait of 300 ms: its tickets (1 s at least) would outlive it by 700 ms unless withdrawn.
    let gave_up = dlock
        .acquire_all(&members, Duration::from_secs(30), Some(Duration::from_millis(300)))
        .await;
    assert!(matches!(gave_up, Err(AcquireError::Held)), "{gave_up:?}");
    assert!(!exists(&mut con, "{gate}:1").await, "out of the free member's line");
    assert_eq!(field(&mut con, "{gate}:2", "tickets").await.as_deref(), Some("0"));
    // The line is free for the next at once.
    assert!(held.release().await.expect("released"));
    let next = dlock.acquire("{gate}:1", Duration::from_secs(30)).await.expect("granted");
    assert!(next.release().await.expect("released"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_one_member_loses_the_whole_set_and_the_rest_is_released() {
    let server = Server::start();
    let dlock = client(&server).await;
    let mut con = operator(&server).await;
    let ttl = Duration::from_millis(900);
    let set = dlock.acquire_all(&["{gone}:1", "{gone}:2"], ttl, None).await.expect("granted");
    let fencing = set.fencing("{gone}:1").expect("a member");
    let run = tokio::spawn(set.run(|cancelled| async move { cancelled.cancelled().await }));
    // A renewal or two first: the set is kept while whole.
    tokio::time::sleep(ttl).await;
    assert!(!run.is_finished(), "renewed while whole");
    let _: i64 = redis::cmd("DEL").arg("{gone}:2").query_async(&mut con).await.expect("DEL");
    let deleted = Instant::now();
    let outcome = tokio::time::timeout(SLACK, run).await.expect("in time").expect("task");
    match outcome {
        Err(RunError::LockLost(LossReason::RenewalRefused)) => {}
        other => panic!("expected the set lost as renewal_refused, got {other:?}"),
    }
    assert!(deleted.elapsed() < ttl / 3 + Duration::from_secs(1), "{:?}", deleted.elapsed());
    until_gone(&mut con, "{gone}:1").await;
    let mut write = redis::cmd("SET");
    write.arg("{gone}:data").arg("a");
    let stale = fencing.fenced::<()>(&write).await;
    assert!(matches!(stale, Err(dlock_client::FencedError::Stale(_))), "{stale:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_one_member_loses_the_set_at_once_as_revoked() {
    let server = Server::start();
    let dlock = client(&server).await;
    let mut con = operator(&server).await;
    // A ttl far above the test: only the channel can end the set in time.
    let members = ["{rev}:1", "{rev}:2"];
    let set = dlock.acquire_all(&members, Duration::from_secs(60), None).await.expect("granted");
    let run = tokio::spawn(set.run(|cancelled| async move { cancelled.cancelled().await }));
    until_listeners(&mut con, "{rev}:2", 1).await;
    let ended: i64 = redis::cmd("DLOCK.REVOKE")
        .arg("{rev}:2")
        .arg("REASON")
        .arg("stuck batch")
        .query_async(&mut con)
        .await
        .expect("REVOKE");
    assert_eq!(ended, 1);
    let outcome = tokio::time::timeout(SLACK, run).await.expect("in time").expect("task");
    match outcome {
        Err(RunError::LockLost(LossReason::Revoked(reason))) => assert_eq!(reason, "stuck batch"),
        other => panic!("expected the set revoked, got {other:?}"),
    }
    // The member still held is released.
    until_gone(&mut con, "{rev}:1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_runs_renewed_and_is_released_at_the_end_and_a_member_gone_is_not_released() {
    let server = Server::start();
    let dlock = client(&server).await;
    let mut con = operator(&server).await;
    let ttl = Duration::from_millis(600);
    let members = ["{run}:1", "{run}:2"];
    let set = dlock.acquire_all(&members, ttl, None).await.expect("granted");
    // Twice the ttl: only renewals keep it.
    let done = set.run(|_| async { tokio::time::sleep(ttl * 2).await }).await;
    assert!(done.is_ok(), "{done:?}");
    for member in members {
        assert!(!exists(&mut con, member).await, "{member} released");
    }
    // A member that ended before the end: the release finds it gone, the loss `ended`.
    let set = dlock.acquire_all(&members, Duration::from_secs(30), None).await.expect("granted");
    let done = set
        .run(|_| async {
            let mut del = redis::cmd("DEL");
            del.arg("{run}:1");
            let _: i64 = del.query_async(&mut operator(&server).await).await.expect("DEL");
        })
        .await;
    assert!(matches!(done, Err(RunError::NotReleased { .. })), "{done:?}");
    assert!(!exists(&mut con, "{run}:2").await, "the rest released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquireall_reply_is_recovered_with_the_same_token_and_fences() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    let dlock =
        Client::connect(&format!("redis://127.0.0.1:{}/", proxy.port)).await.expect("connect");
    let mut con = operator(&server).await;
    let members = ["{lost}:1", "{lost}:2"];
    proxy.drop_next_reply(); // the server grants the set, the reply never arrives
    // Without a wait: a retry under another token would find the members held, and be `Held`.
    let set = dlock.acquire_all(&members, Duration::from_secs(30), None).await.expect("recovered");
    for (member, fence) in members.iter().zip(set.fences()) {
        assert_eq!(field(&mut con, member, "owner").await.as_deref(), Some(set.token()));
        assert_eq!(field(&mut con, member, "fence").await, Some(fence.to_string()));
    }
    assert!(set.release().await.expect("released"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_sets_live_beside_each_other_with_their_metadata_and_keep_a_writer_out() {
    let server = Server::start();
    let dlock = client(&server).await;
    let mut con = operator(&server).await;
    let (members, ttl) = (["{rw}:1", "{rw}:2"], Duration::from_secs(30));
    let reading = AcquireOptions {
        mode: Mode::Shared,
        meta: Some("reader-a".into()),
        ..AcquireOptions::default()
    };
    let a = dlock.acquire_all_with(&members, ttl, &reading).await.expect("a reader");
    let reading = AcquireOptions { meta: Some("reader-b".into()), ..reading };
    let b = dlock.acquire_all_with(&members, ttl, &reading).await.expect("a second reader");
    assert_eq!(a.mode(), Mode::Shared);
    for member in members {
        assert_eq!(field(&mut con, member, "holders").await.as_deref(), Some("2"));
        // The META of the lease the first fields show (one of the two).
        let meta = field(&mut con, member, "meta").await;
        assert!(matches!(meta.as_deref(), Some("reader-a" | "reader-b")), "{meta:?}");
    }
    let writer = dlock.acquire_all(&members, ttl, None).await;
    assert!(matches!(writer, Err(AcquireError::Held)), "{writer:?}");
    assert!(a.release().await.expect("released"));
    assert!(b.release().await.expect("released"));
    let writer = dlock.acquire_all(&members, ttl, None).await.expect("the writer, once alone");
    assert!(writer.release().await.expect("released"));
}
