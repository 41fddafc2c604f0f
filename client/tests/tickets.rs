//! Waiting with `QUEUE` tickets ([`WaitStrategy::Tickets`]) against a real redis-server with the
//! module: many waiters share the client's two connections, are granted in line order, wake on
//! the resource's channel, and leave no place in line and no grant when they give up or are
//! dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_client::{AcquireError, AcquireOptions, Client, ClientOptions, Mode, WaitStrategy};
use dlock_testkit::*;

/// Room for a slow test machine.
const SLACK: Duration = Duration::from_secs(5);

async fn client(server: &Server) -> Client {
    Client::connect(&server.url()).await.expect("connect")
}

async fn ticket_client(server: &Server, ticket: Duration) -> Client {
    let options = ClientOptions {
        wait_strategy: WaitStrategy::Tickets { ticket },
        ..ClientOptions::default()
    };
    Client::connect_with(&server.url(), options).await.expect("connect")
}

async fn watcher(server: &Server) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).expect("url");
    client.get_multiplexed_async_connection().await.expect("connect")
}

/// A field of `DLOCK.INFO resource` (`None`: no such key or field).
async fn field(
    con: &mut redis::aio::MultiplexedConnection,
    resource: &str,
    name: &str,
) -> Option<String> {
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

/// Waits until `resource` has `n` tickets in its line.
async fn until_tickets(con: &mut redis::aio::MultiplexedConnection, resource: &str, n: usize) {
    let started = Instant::now();
    loop {
        let tickets = field(con, resource, "tickets").await;
        if tickets.as_deref() == Some(&n.to_string()) {
            return;
        }
        assert!(started.elapsed() < SLACK, "expected {n} tickets, {tickets:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until `channel` has `n` subscribers.
async fn until_subscribers(con: &mut redis::aio::MultiplexedConnection, channel: &str, n: i64) {
    let started = Instant::now();
    loop {
        let subscribers: Vec<(String, i64)> =
            redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query_async(con).await.expect("NUMSUB");
        if subscribers.first().is_some_and(|(_, now)| *now == n) {
            return;
        }
        assert!(started.elapsed() < SLACK, "{n} subscribers of {channel}: {subscribers:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `n` channels matching `pattern` have subscribers.
async fn until_channels(con: &mut redis::aio::MultiplexedConnection, pattern: &str, n: usize) {
    let started = Instant::now();
    loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(pattern)
            .query_async(con)
            .await
            .expect("CHANNELS");
        if channels.len() == n {
            return;
        }
        assert!(started.elapsed() < SLACK, "{n} channels like {pattern}: {channels:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many clients the server has connected.
async fn connections(con: &mut redis::aio::MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(con).await.expect("LIST");
    list.lines().count()
}

fn waiting(wait: Duration) -> AcquireOptions {
    AcquireOptions { wait: Some(wait), ..AcquireOptions::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_ticket_waiters_share_two_connections_and_are_granted_in_line_order() {
    const WAITERS: usize = 1_000;
    let server = Server::start();
    let mut con = watcher(&server).await;
    let holder = client(&server).await;
    let held = holder.acquire("batch", Duration::from_secs(60)).await.expect("holder");
    let dlock = ticket_client(&server, Duration::from_secs(6)).await;
    // The holder's subscriber (it listens for a revocation) is counted before the waiters come.
    until_subscribers(&mut con, "dlock:{batch}", 1).await;
    let before = connections(&mut con).await;

    let granted = Arc::new(Mutex::new(Vec::with_capacity(WAITERS)));
    let mut tasks = Vec::with_capacity(WAITERS);
    let options = waiting(Duration::from_secs(300));
    for i in 0..WAITERS {
        let (dlock, granted, options) = (dlock.clone(), granted.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            let lease = dlock.acquire_with("batch", Duration::from_secs(30), &options).await?;
            granted.lock().expect("order").push(i);
            lease.release().await.map_err(AcquireError::Server)?;
            Ok::<u64, AcquireError>(0)
        }));
        // One at a time, so that the line's order is the order of the tasks.
        until_tickets(&mut con, "batch", i + 1).await;
    }
    let during = connections(&mut con).await;
    println!(
        "{WAITERS} ticket waiters: {} connections of theirs ({before} before, {during} with them in line)",
        during - before + 1
    );
    assert!(
        during <= before + 1,
        "one subscriber beside the shared connection: {before} → {during}"
    );

    // The most connections seen while the line is handed down (the sampler's own not counted).
    let most = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (mut con, most) = (watcher(&server).await, most.clone());
        tokio::spawn(async move {
            loop {
                most.fetch_max(connections(&mut con).await - 1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let started = Instant::now();
    assert!(held.release().await.expect("holder released"));
    for task in tasks {
        task.await.expect("task").expect("granted");
    }
    println!("{WAITERS} grants handed down the line in {:?}", started.elapsed());
    let granted = granted.lock().expect("order").clone();
    assert_eq!(granted, (0..WAITERS).collect::<Vec<_>>(), "first in, first out");
    sampler.abort();
    let most = most.load(Ordering::Relaxed);
    println!("at most {most} connections while the line was handed down ({before} before)");
    // A request that timed out on a loaded machine opens a new shared connection: a handful.
    assert!(most <= before + 3, "{before} before, {most} at most");
    assert_eq!(field(&mut con, "batch", "owner").await, None, "every grant was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_waiter_wakes_on_the_release_long_before_its_refresh() {
    let server = Server::start();
    let mut con = watcher(&server).await;
    let holder = client(&server).await;
    // Tickets of 9 s: refreshed every 3 s.
    let dlock = ticket_client(&server, Duration::from_secs(9)).await;
    let mut worst = Duration::ZERO;
    for round in 0..3 {
        let held = holder.acquire("door", Duration::from_secs(30)).await.expect("holder");
        let waiter = {
            let dlock = dlock.clone();
            tokio::spawn(async move {
                let lease =
                    dlock.acquire_with("door", Duration::from_secs(30), &waiting(SLACK * 4)).await;
                (lease, Instant::now())
            })
        };
        until_tickets(&mut con, "door", 1).await;
        // Well into the refresh interval: only the channel can wake it now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        assert!(held.release().await.expect("released"));
        let (lease, granted_at) = waiter.await.expect("task");
        let lease = lease.expect("granted");
        let woke = granted_at - released;
        println!("round {round}: granted {woke:?} after the release");
        worst = worst.max(woke);
        assert!(lease.release().await.expect("waiter released"));
    }
    assert!(worst < Duration::from_secs(1), "woken by the channel, not the 3 s refresh: {worst:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_waiter_whose_wait_ends_leaves_the_line_and_no_grant() {
    let server = Server::start();
    let mut con = watcher(&server).await;
    let holder = client(&server).await;
    let dlock = ticket_client(&server, Duration::from_secs(6)).await;
    let held = holder.acquire("gate", Duration::from_secs(30)).await.expect("holder");
    let started = Instant::now();
    let gave_up = dlock
        .acquire_with("gate", Duration::from_secs(30), &waiting(Duration::from_millis(700)))
        .await;
    let took = started.elapsed();
    assert!(matches!(gave_up, Err(AcquireError::Held)), "{gave_up:?}");
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_millis(700) + SLACK,
        "{took:?}"
    );
    until_tickets(&mut con, "gate", 0).await;
    assert!(held.release().await.expect("released"));
    // Nobody is in line: the release frees the key, and no grant waits for a gone waiter.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(field(&mut con, "gate", "owner").await, None);
    let again = holder.acquire("gate", Duration::from_secs(1)).await.expect("free at once");
    assert!(again.release().await.expect("released"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_ticket_wait_leaves_the_line_and_no_grant() {
    let server = Server::start();
    let mut con = watcher(&server).await;
    let holder = client(&server).await;
    let dlock = client(&server).await;
    let held = holder.acquire("hatch", Duration::from_secs(30)).await.expect("holder");
    // The strategy of one acquire, on a client whose default is to block.
    let options = AcquireOptions {
        wait: Some(Duration::from_secs(60)),
        strategy: Some(WaitStrategy::TICKETS),
        ..AcquireOptions::default()
    };
    let waiter = {
        let (dlock, options) = (dlock.clone(), options.clone());
        tokio::spawn(
            async move { dlock.acquire_with("hatch", Duration::from_secs(30), &options).await },
        )
    };
    until_tickets(&mut con, "hatch", 1).await;
    waiter.abort();
    assert!(waiter.await.is_err(), "cancelled");
    until_tickets(&mut con, "hatch", 0).await;
    assert!(held.release().await.expect("released"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(field(&mut con, "hatch", "owner").await, None, "no grant for the dropped waiter");

    // Dropped just as its turn comes: the grant it may have been given is released.
    let held = holder.acquire("hatch", Duration::from_secs(30)).await.expect("holder again");
    let waiter = {
        let (dlock, options) = (dlock.clone(), options.clone());
        tokio::spawn(
            async move { dlock.acquire_with("hatch", Duration::from_secs(30), &options).await },
        )
    };
    until_tickets(&mut con, "hatch", 1).await;
    assert!(held.release().await.expect("released"));
    waiter.abort();
    let outcome = waiter.await;
    let started = Instant::now();
    loop {
        let owner = field(&mut con, "hatch", "owner").await;
        match &outcome {
            // Granted before the abort came: the caller has its lease.
            Ok(Ok(lease)) => {
                assert_eq!(owner.as_deref(), Some(lease.token()));
                break;
            }
            _ if owner.is_none() => break,
            _ => assert!(started.elapsed() < SLACK, "the dropped waiter's grant stays: {owner:?}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if let Ok(Ok(lease)) = outcome {
        assert!(lease.release().await.expect("released"));
    }
    assert!(matches!(field(&mut con, "hatch", "tickets").await.as_deref(), None | Some("0")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticket_readers_hold_together_and_a_ticket_writer_waits_behind_them() {
    let server = Server::start();
    let mut con = watcher(&server).await;
    let dlock = ticket_client(&server, Duration::from_secs(6)).await;
    let ttl = Duration::from_secs(30);
    let wait = Some(SLACK * 2);
    let writer = dlock.write("report", ttl, None).await.expect("first writer");
    let mut readers = Vec::new();
    for i in 0..3 {
        let dlock = dlock.clone();
        readers.push(tokio::spawn(async move { dlock.read("report", ttl, wait).await }));
        until_tickets(&mut con, "report", i + 1).await;
    }
    let second_writer = {
        let dlock = dlock.clone();
        tokio::spawn(async move { dlock.write("report", ttl, wait).await })
    };
    until_tickets(&mut con, "report", 4).await;
    let writer_fence = writer.fence();
    assert!(writer.release().await.expect("writer released"));
    let mut leases = Vec::new();
    for reader in readers {
        let lease = reader.await.expect("task").expect("reader granted");
        assert_eq!(lease.mode(), Mode::Shared);
        assert!(lease.fence() > writer_fence);
        leases.push(lease);
    }
    assert_eq!(field(&mut con, "report", "holders").await.as_deref(), Some("3"), "together");
    assert!(!second_writer.is_finished(), "the writer waits for the readers");
    for lease in leases {
        assert!(lease.release().await.expect("reader released"));
    }
    let second = second_writer.await.expect("task").expect("writer granted after the readers");
    assert_eq!(second.mode(), Mode::Exclusive);
    assert_eq!(field(&mut con, "report", "tickets").await.as_deref(), Some("0"));
    assert!(second.release().await.expect("released"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticket_waiters_outlive_a_killed_subscriber_connection() {
    let server = Server::start();
    let mut con = watcher(&server).await;
    // Refreshed every 3 s: a grant well before that came through a (new) subscription.
    let dlock = ticket_client(&server, Duration::from_secs(9)).await;
    // Held by a plain connection: the waiters' subscriber is then the only one.
    let mut holder = server.client();
    assert!(acquire(&mut holder, "valve", "holder", 30_000).is_some(), "held");
    let waiter = {
        let dlock = dlock.clone();
        tokio::spawn(async move {
            dlock.acquire_with("valve", Duration::from_secs(30), &waiting(SLACK * 4)).await
        })
    };
    until_tickets(&mut con, "valve", 1).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con)
        .await
        .expect("KILL");
    assert_eq!(killed, 1, "the one subscriber connection");
    // Woken by the end of its subscription, the waiter subscribes again (to its own channel).
    until_channels(&mut con, "dlock:{valve}:*", 1).await;
    let released = Instant::now();
    assert_eq!(release(&mut holder, "valve", "holder"), 1, "released");
    let lease = waiter.await.expect("task").expect("granted");
    let woke = released.elapsed();
    println!("after the subscriber was killed: granted {woke:?} after the release");
    assert!(woke < Duration::from_secs(1), "by the channel, not the refresh: {woke:?}");
    assert!(lease.release().await.expect("released"));
}

/// How many `DLOCK.ACQUIRE` calls the server has run (`INFO commandstats`).
async fn acquire_calls(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    calls(con, "dlock.acquire").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_with_two_hundred_tickets_standing_costs_a_few_acquires_not_one_each() {
    const WAITERS: usize = 200;
    let server = Server::start();
    let mut con = watcher(&server).await;
    let holder = client(&server).await;
    let held = holder.acquire("herd", Duration::from_secs(60)).await.expect("holder");
    // Tickets of 60 s: refreshed every 20 s, so only the channel wakes them during the test.
    let dlock = ticket_client(&server, Duration::from_secs(60)).await;
    let granted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(WAITERS);
    for _ in 0..WAITERS {
        let (dlock, granted) = (dlock.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let lease =
                dlock.acquire_with("herd", Duration::from_secs(30), &waiting(SLACK * 6)).await;
            granted.fetch_add(1, Ordering::SeqCst);
            lease
        }));
    }
    until_tickets(&mut con, "herd", WAITERS).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // every first ACQUIRE answered
    let before = acquire_calls(&mut con).await;
    assert!(held.release().await.expect("released"));
    let started = Instant::now();
    while granted.load(Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < SLACK, "the head of the line was never granted");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Room for the waiters that would wake on the messages to ask.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = acquire_calls(&mut con).await - before;
    println!("{WAITERS} tickets standing: {calls} ACQUIREs for one hand-over");
    assert_eq!(granted.load(Ordering::SeqCst), 1, "one grant");
    assert!(calls <= 5, "only the new holder asks: {calls} ACQUIREs");
    for task in tasks {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reader_granted_by_one_shared_hand_over_is_woken_by_its_own_handoff() {
    let server = Server::start();
    let mut con = watcher(&server).await;
    // Tickets of 60 s: refreshed every 20 s, so only the channel can wake them in time.
    let dlock = ticket_client(&server, Duration::from_secs(60)).await;
    let ttl = Duration::from_secs(30);
    let writer = dlock.write("pages", ttl, None).await.expect("writer");
    let mut readers = Vec::new();
    for i in 0..3 {
        let dlock = dlock.clone();
        readers.push(tokio::spawn(async move { dlock.read("pages", ttl, Some(SLACK * 4)).await }));
        until_tickets(&mut con, "pages", i + 1).await;
    }
    let released = Instant::now();
    assert!(writer.release().await.expect("writer released"));
    for reader in readers {
        let lease = reader.await.expect("task").expect("reader granted");
        assert_eq!(lease.mode(), Mode::Shared);
        assert!(lease.release().await.expect("reader released"));
    }
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "woken by their handoffs, not the 20 s refresh: {took:?}"
    );
}

/// How many calls of `command` the server has run (`INFO commandstats`).
async fn calls(con: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let stats: String =
        redis::cmd("INFO").arg("commandstats").query_async(con).await.expect("INFO");
    command_calls(&stats, command)
}

/// A ticket told of its grant on its own channel starts on that message: no ACQUIRE follows
/// to claim it (the claim is one RENEW, sent at once), and until that claim's answer is read
/// the lease's local expiry is the claim window counted from a request sent before the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_starts_on_its_own_message_and_claims_with_one_renewal() {
    let server = Server::start();
    let mut con = watcher(&server).await;
    let mut holder = server.client();
    assert!(acquire(&mut holder, "gate", "holder", 30_000).is_some(), "held");
    let ticket = Duration::from_secs(9);
    let dlock = ticket_client(&server, ticket).await;
    let ttl = Duration::from_secs(60);
    let waiter = {
        let dlock = dlock.clone();
        tokio::spawn(async move { dlock.acquire_with("gate", ttl, &waiting(SLACK * 4)).await })
    };
    until_tickets(&mut con, "gate", 1).await;
    until_channels(&mut con, "dlock:{gate}:*", 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await; // the first ACQUIRE answered
    let acquires = calls(&mut con, "dlock.acquire").await;
    let released = Instant::now();
    assert_eq!(release(&mut holder, "gate", "holder"), 1, "released");
    let mut lease = waiter.await.expect("task").expect("granted");
    assert_eq!(calls(&mut con, "dlock.acquire").await, acquires, "no ACQUIRE to claim the turn");
    let window = lease.local_expiry() - released;
    assert!(window <= ticket, "the claim window, not the ttl, until the claim is read: {window:?}");
    assert!(window > ticket - SLACK, "{window:?}");
    // The claim went out without being asked for: the server's lease runs the full ttl.
    let started = Instant::now();
    loop {
        let left: u64 =
            field(&mut con, "gate", "ttl-ms").await.and_then(|t| t.parse().ok()).unwrap_or(0);
        if left > ticket.as_millis() as u64 {
            break;
        }
        assert!(started.elapsed() < SLACK, "never claimed: {left} ms left");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(field(&mut con, "gate", "fence").await, Some(lease.fence().to_string()));
    // The first renewal reads the claim's answer: the full ttl from the claim's send.
    assert!(lease.renew().await.expect("claim answered"));
    assert!(lease.local_expiry() > Instant::now() + ttl - SLACK, "the ttl counts now");
    assert_eq!(calls(&mut con, "dlock.renew").await, 1, "the claim was the one renewal");
    assert!(lease.release().await.expect("released"));
}

/// A server that does not know `NOTIFY` (played by a proxy that renames the option on its way
/// in and the server's complaint on its way out) is waited on through the resource's channel:
/// the waiter subscribes there, is woken by the `handoff` naming its tag and claims with an
/// ACQUIRE, as before the option; the client asks no more with `NOTIFY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_notify_is_waited_on_through_the_resources_channel() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    proxy.rewrite(false, b"$6\r\nNOTIFY\r\n", b"$6\r\nXOTIFY\r\n");
    proxy.rewrite(true, b"'XOTIFY'", b"'NOTIFY'");
    let mut con = watcher(&server).await;
    let mut holder = server.client();
    let options = ClientOptions {
        wait_strategy: WaitStrategy::Tickets { ticket: Duration::from_secs(9) },
        ..ClientOptions::default()
    };
    let url = format!("redis://127.0.0.1:{}/", proxy.port);
    let dlock = Client::connect_with(&url, options).await.expect("connect");
    for round in 0..2 {
        assert!(acquire(&mut holder, "old", "holder", 30_000).is_some(), "held");
        let waiter = {
            let dlock = dlock.clone();
            let ttl = Duration::from_secs(30);
            tokio::spawn(async move { dlock.acquire_with("old", ttl, &waiting(SLACK * 4)).await })
        };
        until_tickets(&mut con, "old", 1).await;
        until_subscribers(&mut con, "dlock:{old}", 1).await;
        until_channels(&mut con, "dlock:{old}:*", 0).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        assert_eq!(release(&mut holder, "old", "holder"), 1, "released");
        let lease = waiter.await.expect("task").expect("granted");
        let woke = released.elapsed();
        assert!(
            woke < Duration::from_secs(1),
            "round {round}: by the channel, not the refresh: {woke:?}"
        );
        assert!(
            lease.local_expiry() > Instant::now() + Duration::from_secs(20),
            "claimed by ACQUIRE"
        );
        assert!(lease.release().await.expect("released"));
    }
}
