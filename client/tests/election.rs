//! Leader election through the client, against a real redis-server with the module: campaigns,
//! terms and their fences, resigning, a leader that dies, and observers of the leader.

use std::time::{Duration, Instant};

use dlock_client::{Client, ClientOptions, Leader};
use dlock_testkit::*;

/// Room for a slow test machine.
const SLACK: Duration = Duration::from_secs(5);

async fn client(server: &Server) -> Client {
    Client::connect(&server.url()).await.expect("connect")
}

/// Waits until `name` has `n` candidates in its queue.
fn until_waiting(con: &mut redis::Connection, name: &str, n: usize) {
    let n = n.to_string();
    let queued = eventually(SLACK, || info_field(con, name, "waiters").as_deref() == Some(&n));
    assert!(queued, "expected {n} waiting candidates: {:?}", info(con, name));
}

/// Campaigns for `name` in a task of its own.
fn candidate(
    dlock: &Client,
    name: &'static str,
    address: &'static str,
    ttl: Duration,
) -> tokio::task::JoinHandle<dlock_client::Leadership> {
    let dlock = dlock.clone();
    tokio::spawn(async move { dlock.campaign(name, address, ttl).await.expect("leads in the end") })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_candidates_one_leads_and_the_other_leads_with_a_larger_fence_once_it_resigns() {
    let server = Server::start();
    let dlock = client(&server).await;
    let ttl = Duration::from_millis(600);
    let a = dlock.campaign("scheduler", "10.0.0.1:8080", ttl).await.expect("a leads");
    let b = candidate(&dlock, "scheduler", "10.0.0.2:8080", ttl);
    let mut con = server.client();
    until_waiting(&mut con, "scheduler", 1);
    assert_eq!(info_field(&mut con, "scheduler", "meta").as_deref(), Some("10.0.0.1:8080"));
    let leader = dlock.leader("scheduler").await.expect("INFO");
    assert_eq!(
        leader,
        Some(Leader {
            token: a.lease().token().to_owned(),
            fence: a.fence(),
            address: Some("10.0.0.1:8080".into())
        })
    );
    let (a_fence, a_name) = (a.fence(), a.name().to_owned());
    assert_eq!((a_name.as_str(), a.address()), ("scheduler", "10.0.0.1:8080"));
    // a leads for several ttls (renewed while its work runs), then resigns by ending its work.
    let (resign, resigned) = tokio::sync::oneshot::channel::<()>();
    let leading = tokio::spawn(a.lead(|_| async move {
        let _ = resigned.await;
    }));
    tokio::time::sleep(ttl * 3).await;
    assert!(!b.is_finished(), "b took over while a still led");
    let resigning = Instant::now();
    let _ = resign.send(());
    leading.await.expect("task").expect("a led and resigned");
    let b = b.await.expect("task");
    assert!(resigning.elapsed() < SLACK, "b led at once after the resignation");
    assert!(b.fence() > a_fence, "a later term has a larger fence");
    assert_eq!(b.address(), "10.0.0.2:8080");
    assert_eq!(info_field(&mut con, "scheduler", "meta").as_deref(), Some("10.0.0.2:8080"));
    assert_eq!(fencecheck(&mut con, "scheduler", a_fence as i64), 0, "a's epoch is over");
    assert_eq!(fencecheck(&mut con, "scheduler", b.fence() as i64), 1);
    assert!(b.resign().await.expect("answered"));
    assert_eq!(dlock.leader("scheduler").await.expect("INFO"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_dies_is_replaced_within_its_ttl_by_the_waiting_candidate() {
    let server = Server::start();
    let dlock = client(&server).await;
    let ttl = Duration::from_millis(600);
    let a = dlock.campaign("primary", "10.0.0.1:5432", ttl).await.expect("a leads");
    let a_fence = a.fence();
    let leading = tokio::spawn(a.lead(|_| std::future::pending::<()>()));
    let b = candidate(&dlock, "primary", "10.0.0.2:5432", ttl);
    let mut con = server.client();
    until_waiting(&mut con, "primary", 1);
    // a's process dies: nothing renews its lease and nothing releases it.
    leading.abort();
    let died = Instant::now();
    let b = b.await.expect("task");
    assert!(died.elapsed() < ttl + SLACK, "replaced within the ttl: {:?}", died.elapsed());
    assert!(b.fence() > a_fence);
    let leader = dlock.leader("primary").await.expect("INFO").expect("b leads");
    assert_eq!((leader.fence, leader.address.as_deref()), (b.fence(), Some("10.0.0.2:5432")));
    let text: String = redis::cmd("INFO").arg("dlock").query(&mut con).expect("INFO");
    assert_eq!(info_value(&text, "dlock_leases_expired"), Some("1"), "a's lease expired:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_leader_a_then_no_leader_then_leader_b_in_order() {
    let server = Server::start();
    let dlock = client(&server).await;
    let ttl = Duration::from_secs(10);
    let mut changes = dlock.observe("election");
    assert_eq!(changes.changed().await, None, "nobody leads at first");
    let a = dlock.campaign("election", "a.example:1", ttl).await.expect("a leads");
    let seen_a = changes.changed().await.expect("a leads");
    assert_eq!((seen_a.fence, seen_a.address.as_deref()), (a.fence(), Some("a.example:1")));
    assert!(a.resign().await.expect("answered"));
    assert_eq!(changes.changed().await, None, "no leader once a resigned");
    let b = dlock.campaign("election", "b.example:1", ttl).await.expect("b leads");
    let seen_b = changes.changed().await.expect("b leads");
    assert_eq!((seen_b.fence, seen_b.address.as_deref()), (b.fence(), Some("b.example:1")));
    assert!(seen_b.fence > seen_a.fence);
    assert_ne!(seen_b.token, seen_a.token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_a_dead_leader_replaced_by_the_next_candidate() {
    let server = Server::start();
    let dlock = client(&server).await;
    let ttl = Duration::from_millis(600);
    let a = dlock.campaign("election", "a.example:1", ttl).await.expect("a leads");
    let a_fence = a.fence();
    let mut changes = dlock.observe("election");
    assert_eq!(changes.changed().await.map(|leader| leader.fence), Some(a_fence));
    let b = candidate(&dlock, "election", "b.example:1", ttl);
    let mut con = server.client();
    until_waiting(&mut con, "election", 1);
    drop(a); // never led, never resigned: its lease runs out
    let b = b.await.expect("task");
    // The hand-over happens as a's lease expires: no moment without a leader lasts to be seen.
    let next = tokio::time::timeout(SLACK, changes.changed()).await.expect("a change");
    assert_eq!(next.map(|leader| leader.fence), Some(b.fence()));
    assert!(b.fence() > a_fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_reads_the_leader_again_when_it_reconnects_after_a_restart() {
    let mut server = Server::start();
    let dlock = client(&server).await;
    let mut con = server.client();
    let meta = ["META", "a.example:1"];
    let a_fence: i64 = redis::cmd("DLOCK.ACQUIRE")
        .arg("election")
        .arg("a")
        .arg(60_000)
        .arg(&meta)
        .query(&mut con)
        .expect("a leads");
    let mut changes = dlock.observe("election");
    let seen = changes.changed().await.expect("a leads");
    assert_eq!((seen.token.as_str(), seen.fence), ("a", a_fence as u64));
    // Without persistence the restarted server has no lease: nobody leads, and no message says so.
    server.crash_and_restart();
    let next = tokio::time::timeout(SLACK, changes.changed()).await.expect("a change");
    assert_eq!(next, None, "read again on reconnecting: no leader");
    let mut con = server.client();
    let b = dlock.campaign("election", "b.example:1", Duration::from_secs(10)).await.expect("b");
    let next = tokio::time::timeout(SLACK, changes.changed()).await.expect("a change");
    assert_eq!(next.map(|leader| leader.fence), Some(b.fence()));
    assert_eq!(info_field(&mut con, "election", "owner").as_deref(), Some(b.lease().token()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_whose_connections_went_silent_still_sees_the_change_within_seconds() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    let options =
        ClientOptions { request_timeout: Duration::from_millis(300), ..ClientOptions::default() };
    let url = format!("redis://127.0.0.1:{}/", proxy.port);
    let dlock = Client::connect_with(&url, options).await.expect("connect");
    let mut con = server.client();
    assert!(acquire(&mut con, "election", "a", 60_000).is_some());
    let mut changes = dlock.observe("election");
    assert_eq!(changes.changed().await.map(|leader| leader.token), Some("a".into()));
    // The subscription and the shared connection go silent: the release's message never
    // arrives, and nothing tells the observer its connections are gone.
    proxy.silence_open_connections();
    assert_eq!(release(&mut con, "election", "a"), 1);
    let released = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(5) + SLACK, changes.changed()).await;
    assert_eq!(next.expect("noticed in the end"), None);
    assert!(released.elapsed() >= Duration::from_secs(4), "no message could have told it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_notices_a_leader_an_operator_deleted_without_a_message_at_its_next_read() {
    // DEL ends the lease without a message on the channel (the server publishes grants,
    // hand-overs, releases and expiries): the observer's periodic read finds it gone.
    let server = Server::start();
    let dlock = client(&server).await;
    let a = dlock.campaign("election", "a.example:1", Duration::from_secs(60)).await.expect("a");
    let mut changes = dlock.observe("election");
    assert_eq!(changes.changed().await.map(|leader| leader.fence), Some(a.fence()));
    let mut con = server.client();
    let _: i64 = redis::cmd("DEL").arg("election").query(&mut con).expect("DEL");
    let next = tokio::time::timeout(Duration::from_secs(5) + SLACK, changes.changed()).await;
    assert_eq!(next.expect("noticed within seconds"), None);
}
