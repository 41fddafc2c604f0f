//! The client against a real redis-server with the module (started per test by the shared harness).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_client::{
    AcquireError, Client, ClientOptions, ConnectError, LossReason, Replicas, RunError,
};
use dlock_testkit::*;

/// Room for a slow test machine on top of a configured bound: failing within it shows the bound
/// holds, where the unbounded client took two minutes.
const SLACK: Duration = Duration::from_secs(5);

async fn client(server: &Server) -> Client {
    Client::connect(&server.url()).await.expect("connect")
}

fn renew_count(con: &mut redis::Connection) -> u64 {
    let text: String = redis::cmd("INFO").arg("dlock").query(con).expect("INFO");
    ["dlock_renew_ok:", "dlock_renew_refused:"]
        .iter()
        .map(|field| {
            text.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_run_release_happy_path() {
    let server = Server::start();
    let dlock = client(&server).await;
    let lease = dlock.acquire("invoice:1", Duration::from_secs(10)).await.expect("granted");
    let mut con = server.client();
    assert_eq!(info_field(&mut con, "invoice:1", "fence"), Some(lease.fence().to_string()));
    assert_eq!(info_field(&mut con, "invoice:1", "owner").as_deref(), Some(lease.token()));
    assert!(lease.local_expiry() <= Instant::now() + Duration::from_secs(10));
    let fence = lease.fence();
    let out = lease.run(|_| async move { fence + 1 }).await.expect("ran and released");
    assert_eq!(out, fence + 1);
    assert!(!exists(&mut con, "invoice:1"), "released when the work ended");
    assert!(dlock.acquire("invoice:1", Duration::from_secs(1)).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_is_reported_as_held_and_a_waiter_gets_it_in_turn() {
    let server = Server::start();
    let dlock = client(&server).await;
    let first = dlock.acquire("job", Duration::from_secs(10)).await.expect("granted");
    assert!(matches!(dlock.acquire("job", Duration::from_secs(10)).await, Err(AcquireError::Held)));
    let first_fence = first.fence();
    let holder = tokio::spawn(first.run(|_| tokio::time::sleep(Duration::from_millis(300))));
    let waiter =
        dlock.acquire_waiting("job", Duration::from_secs(10), Some(Duration::from_secs(5))).await;
    let second = waiter.expect("granted after the first holder finished");
    assert!(second.fence() > first_fence);
    // Handed over with a claim window (2 × request_timeout), then claimed: the full ttl runs.
    let mut con = server.client();
    let ttl_ms: u64 = info_field(&mut con, "job", "ttl-ms").expect("held").parse().expect("ms");
    assert!(ttl_ms > 5_000, "claimed: the full ttl from the claim, {ttl_ms} ms left");
    holder.await.expect("task").expect("first run released");
    second.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_mid_work_cancels_the_work_and_returns_lock_lost() {
    let server = Server::start();
    let dlock = client(&server).await;
    let lease = dlock.acquire("job", Duration::from_millis(600)).await.expect("granted");
    let saw_cancel = Arc::new(AtomicBool::new(false));
    let observed = saw_cancel.clone();
    let mut con = server.client();
    let _: i64 = redis::cmd("DEL").arg("job").query(&mut con).expect("DEL"); // an operator frees it
    let started = Instant::now();
    let result = lease
        .run(|cancelled| async move {
            cancelled.cancelled().await;
            observed.store(true, Ordering::SeqCst);
        })
        .await;
    assert!(matches!(result, Err(RunError::LockLost(LossReason::RenewalRefused))), "{result:?}");
    assert!(saw_cancel.load(Ordering::SeqCst), "the work saw the cancellation");
    assert!(
        started.elapsed() < Duration::from_millis(600),
        "lost at the first renewal, within the ttl"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_that_ignores_cancellation_is_dropped_and_the_renewal_stops_with_run() {
    let server = Server::start();
    let dlock = client(&server).await;
    let lease = dlock.acquire("job", Duration::from_millis(300)).await.expect("granted");
    let mut con = server.client();
    let _: i64 = redis::cmd("DEL").arg("job").query(&mut con).expect("DEL");
    let started = Instant::now();
    let result = lease.run(|_| tokio::time::sleep(Duration::from_secs(30))).await;
    assert!(matches!(result, Err(RunError::LockLost(_))));
    assert!(started.elapsed() < Duration::from_secs(2), "the stubborn work was dropped");
    let renewals = renew_count(&mut con);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(renew_count(&mut con), renewals, "no renewal after run returned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_a_lease_alive_past_its_ttl_while_the_work_runs() {
    let server = Server::start();
    let dlock = client(&server).await;
    let lease = dlock.acquire("job", Duration::from_millis(300)).await.expect("granted");
    let fence = lease.fence();
    let port = server.port;
    let out = lease
        .run(|_| async move {
            tokio::time::sleep(Duration::from_millis(1_000)).await; // more than three ttls
            let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .and_then(|c| c.get_connection())
                .expect("connect");
            fencecheck(&mut con, "job", fence as i64)
        })
        .await
        .expect("ran and released");
    assert_eq!(out, 1, "still the live fence after 1 s on a 300 ms ttl");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_is_reported_not_swallowed() {
    let server = Server::start();
    let dlock = client(&server).await;
    let lease = dlock.acquire("job", Duration::from_secs(10)).await.expect("granted");
    let port = server.port;
    let result = lease
        .run(|_| async move {
            let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .and_then(|c| c.get_connection())
                .expect("connect");
            let _: i64 = redis::cmd("DEL").arg("job").query(&mut con).expect("DEL");
            "done"
        })
        .await;
    assert!(matches!(result, Err(RunError::NotReleased { output: "done", .. })), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_not_mistaken_for_a_held_lock() {
    let mut server = Server::start();
    let options =
        ClientOptions { acquire_deadline: Duration::from_millis(500), ..ClientOptions::default() };
    let dlock = Client::connect_with(&server.url(), options).await.expect("connect");
    server.kill();
    match dlock.acquire("job", Duration::from_secs(1)).await {
        Err(AcquireError::Unreachable(_)) | Err(AcquireError::Unknown { .. }) => {}
        other => panic!("expected unreachable or unknown, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_is_recovered_with_the_same_token_and_fence() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    let dlock =
        Client::connect(&format!("redis://127.0.0.1:{}/", proxy.port)).await.expect("connect");
    proxy.drop_next_reply(); // the server grants, the reply never arrives
    let lease = dlock.acquire("invoice:9", Duration::from_secs(30)).await.expect("recovered");
    let mut con = server.client();
    assert_eq!(info_field(&mut con, "invoice:9", "owner").as_deref(), Some(lease.token()));
    assert_eq!(info_field(&mut con, "invoice:9", "fence"), Some(lease.fence().to_string()));
    let text: String = redis::cmd("INFO").arg("dlock").query(&mut con).expect("INFO");
    assert!(text.contains("dlock_acquire_granted:1"), "one grant:\n{text}");
    assert!(text.contains("dlock_acquire_reacquired:1"), "the retry re-acquired it:\n{text}");
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_apply_while_the_lease_lives_and_are_refused_as_stale_after() {
    let server = Server::start();
    let dlock = client(&server).await;
    let lease = dlock.acquire("invoice:{7}", Duration::from_secs(30)).await.expect("granted");
    let mut write = redis::cmd("HSET");
    write.arg("invoice:{7}:data").arg("status").arg("paid");
    let added: i64 = lease.fenced(&write).await.expect("fenced write");
    assert_eq!(added, 1);
    let mut con = server.client();
    let _: i64 = redis::cmd("DEL").arg("invoice:{7}").query(&mut con).expect("DEL"); // the lease is gone
    let mut late = redis::cmd("HSET");
    late.arg("invoice:{7}:data").arg("status").arg("failed");
    let refused = lease.fenced::<i64>(&late).await;
    assert!(matches!(refused, Err(dlock_client::FencedError::Stale(_))), "{refused:?}");
    let status: String =
        redis::cmd("HGET").arg("invoice:{7}:data").arg("status").query(&mut con).expect("HGET");
    assert_eq!(status, "paid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_is_noticed_from_its_keyspace_event_long_before_the_next_renewal() {
    let server = Server::start_with(&["--save", "", "--notify-keyspace-events", "KA"]);
    let options = ClientOptions { watch_events: true, ..ClientOptions::default() };
    let dlock = Client::connect_with(&server.url(), options).await.expect("connect");
    let lease = dlock.acquire("job", Duration::from_secs(6)).await.expect("granted");
    let port = server.port;
    let started = Instant::now();
    let result = lease
        .run(|cancelled| async move {
            tokio::time::sleep(Duration::from_millis(200)).await; // subscribed by now
            let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .and_then(|c| c.get_connection())
                .expect("connect");
            let _: i64 = redis::cmd("DEL").arg("job").query(&mut con).expect("DEL");
            cancelled.cancelled().await;
        })
        .await;
    match result {
        Err(RunError::LockLost(LossReason::Ended(event))) => assert_eq!(event, "del"),
        other => panic!("expected the DEL event to end the lease, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "noticed from the event, not at the first renewal (2 s): {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_side_expiry_is_noticed_from_the_dlock_expired_event() {
    // The server caps every lease at 400 ms (max-hold), while the client asked for 6 s: only
    // the server's dlock.expired event can tell the client before its local expiry.
    let server = Server::start_with(&["--save", "", "--notify-keyspace-events", "Kd"]);
    let mut con = server.client();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("dlock.max-hold-ms")
        .arg(400)
        .query(&mut con)
        .expect("CONFIG SET");
    let options = ClientOptions { watch_events: true, ..ClientOptions::default() };
    let dlock = Client::connect_with(&server.url(), options).await.expect("connect");
    let lease = dlock.acquire("job", Duration::from_secs(6)).await.expect("granted");
    let started = Instant::now();
    let result = lease.run(|cancelled| async move { cancelled.cancelled().await }).await;
    match result {
        Err(RunError::LockLost(LossReason::Ended(event))) => assert_eq!(event, "dlock.expired"),
        other => panic!("expected dlock.expired to end the lease, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_millis(1_500), "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replicas_asked_for_a_grant_counts_only_once_they_acknowledged_it() {
    let (primary, replica) = primary_and_replica_with(&[], &[]);
    let durable = |count| ClientOptions {
        replicas: Some(Replicas { count, timeout: Duration::from_millis(300) }),
        ..ClientOptions::default()
    };
    let one = Client::connect_with(&primary.url(), durable(1)).await.expect("connect");
    let mut lease = one.acquire("invoice:1", Duration::from_secs(30)).await.expect("granted");
    let mut on_replica = replica.client();
    assert_eq!(
        info_field(&mut on_replica, "invoice:1", "fence"),
        Some(lease.fence().to_string()),
        "the replica has the grant by the time acquire returns"
    );
    assert!(lease.renew().await.expect("renewed, acknowledged by the replica"));

    let two = Client::connect_with(&primary.url(), durable(2)).await.expect("connect");
    match two.acquire("invoice:2", Duration::from_secs(30)).await {
        Err(AcquireError::NotReplicated { acked: 1, wanted: 2, released: true, .. }) => {}
        other => panic!("expected NotReplicated (1 of 2), got {other:?}"),
    }
    let mut con = primary.client();
    assert!(!exists(&mut con, "invoice:2"), "the unacknowledged grant was released again");
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_connection_is_replaced_and_the_same_token_is_granted_on_the_new_one() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    let options = ClientOptions {
        request_timeout: Duration::from_millis(300),
        acquire_deadline: Duration::from_secs(3),
        ..ClientOptions::default()
    };
    let dlock = Client::connect_with(&format!("redis://127.0.0.1:{}/", proxy.port), options)
        .await
        .expect("connect");
    dlock.acquire("warm-up", Duration::from_secs(30)).await.expect("granted");
    // The shared connection goes silent: no error, no FIN, no reply, ever.
    proxy.silence_open_connections();
    let lease = dlock.acquire("invoice:3", Duration::from_secs(30)).await.expect("granted");
    let mut con = server.client();
    assert_eq!(info_field(&mut con, "invoice:3", "owner").as_deref(), Some(lease.token()));
    assert!(lease.release().await.expect("answered"), "released over the new connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_events_never_starves_the_renewals_of_a_healthy_lease() {
    // Every renewal publishes dlock.renewed on the channel the lease watches: those events must
    // not postpone the next renewal.
    let server = Server::start_with(&["--save", "", "--notify-keyspace-events", "KA"]);
    let options = ClientOptions { watch_events: true, ..ClientOptions::default() };
    let dlock = Client::connect_with(&server.url(), options).await.expect("connect");
    for round in 0..5 {
        let lease = dlock.acquire("job", Duration::from_millis(900)).await.expect("granted");
        let out = lease.run(|_| tokio::time::sleep(Duration::from_millis(2_000))).await;
        assert!(out.is_ok(), "round {round}: a healthy lease was reported lost: {out:?}");
    }
}

/// A local port nothing listens on: bound by the system, then released.
fn unused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_where_nothing_listens_fails_at_once_as_unreachable() {
    let options =
        ClientOptions { connect_timeout: Duration::from_secs(2), ..ClientOptions::default() };
    let url = format!("redis://127.0.0.1:{}/", unused_port());
    let started = Instant::now();
    let result = Client::connect_with(&url, options).await;
    assert!(matches!(result, Err(ConnectError::Unreachable(_))), "{:?}", result.err());
    assert!(
        started.elapsed() < Duration::from_secs(2) + SLACK,
        "refused, so not retried past the connect timeout: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_server_that_never_answers_gives_up_at_the_connect_timeout() {
    // The kernel accepts the connection into the listener's backlog; nothing ever answers the
    // handshake.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("redis://127.0.0.1:{}/", silent.local_addr().expect("addr").port());
    let options =
        ClientOptions { connect_timeout: Duration::from_secs(1), ..ClientOptions::default() };
    let started = Instant::now();
    let result = Client::connect_with(&url, options).await;
    assert!(matches!(result, Err(ConnectError::Unreachable(_))), "{:?}", result.err());
    assert!(started.elapsed() < Duration::from_secs(1) + SLACK, "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_the_client_cannot_use_is_a_config_error() {
    let result = Client::connect("http://127.0.0.1:6379/").await;
    assert!(matches!(result, Err(ConnectError::Config(_))), "{:?}", result.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_after_the_server_was_killed_is_unreachable_not_unknown() {
    let mut server = Server::start();
    let options =
        ClientOptions { acquire_deadline: Duration::from_secs(1), ..ClientOptions::default() };
    let dlock = Client::connect_with(&server.url(), options).await.expect("connect");
    server.kill();
    // Time for the client's socket to see the server's end of stream: the ACQUIRE is then never
    // sent on the dead connection, and every new connection is refused.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    match dlock.acquire("job", Duration::from_secs(10)).await {
        Err(AcquireError::Unreachable(_)) => {}
        other => panic!("expected unreachable (no request left this machine), got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(1) + SLACK,
        "retried refusals until the acquire deadline, no longer: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_reached_again_by_the_same_client() {
    let mut server = Server::start();
    let dlock = client(&server).await;
    dlock.acquire("before", Duration::from_secs(30)).await.expect("granted");
    server.crash_and_restart();
    let lease = dlock.acquire("after", Duration::from_secs(30)).await.expect("granted again");
    let mut con = server.client();
    assert_eq!(info_field(&mut con, "after", "owner").as_deref(), Some(lease.token()));
    assert!(lease.release().await.expect("answered"), "released over the new connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_and_release_name_their_grant_so_they_never_touch_a_later_grant_of_the_token() {
    let server = Server::start();
    let dlock = client(&server).await;
    let mut lease = dlock.acquire("job", Duration::from_secs(10)).await.expect("granted");
    let token = lease.token().to_owned();
    // The same token is granted again behind the lease's back (a reused token, a retried call).
    let mut con = server.client();
    assert_eq!(release(&mut con, "job", &token), 1);
    let later = acquire(&mut con, "job", &token, 60_000).expect("granted again");
    assert!(later > lease.fence() as i64);
    assert!(!lease.renew().await.expect("answered"), "the old grant's RENEW is refused");
    assert!(!lease.release().await.expect("answered"), "the old grant's RELEASE frees nothing");
    assert_eq!(fencecheck(&mut con, "job", later), 1, "the later grant stands");
}

/// Holds `resource` with a direct connection and returns it, and a client that talks through
/// `proxy` with `options`.
async fn held_and_a_client_behind(
    server: &Server,
    proxy: &LinkProxy,
    resource: &str,
    options: ClientOptions,
) -> (redis::Connection, Client) {
    let mut con = server.client();
    assert!(acquire(&mut con, resource, "holder", 30_000).is_some());
    let url = format!("redis://127.0.0.1:{}/", proxy.port);
    let dlock = Client::connect_with(&url, options).await.expect("connect");
    (con, dlock)
}

/// Waits until `resource` has a waiter in the server's queue.
fn until_queued(con: &mut redis::Connection, resource: &str) {
    let queued = eventually(SLACK, || info_field(con, resource, "waiters").as_deref() == Some("1"));
    assert!(queued, "the client never joined the queue: {:?}", info(con, resource));
}

/// The lease the server handed over is gone (released, not expired) well before its 30 s ttl.
fn handed_over_lease_is_gone(con: &mut redis::Connection, resource: &str) {
    let gone = eventually(SLACK, || info_field(con, resource, "owner").is_none());
    assert!(gone, "a grant the client never learned is still held: {:?}", info(con, resource));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_whose_reply_is_lost_is_learned_by_the_retry_with_the_same_token() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    let (mut con, dlock) =
        held_and_a_client_behind(&server, &proxy, "handed", ClientOptions::default()).await;
    let waiting = tokio::spawn(async move {
        dlock
            .acquire_waiting("handed", Duration::from_secs(30), Some(Duration::from_secs(10)))
            .await
    });
    until_queued(&mut con, "handed");
    // The server hands the lease over; the reply never arrives and the connection is cut.
    proxy.drop_next_reply();
    assert_eq!(release(&mut con, "handed", "holder"), 1);
    let lease = waiting.await.expect("task").expect("the retry learns the grant");
    assert_eq!(info_field(&mut con, "handed", "owner").as_deref(), Some(lease.token()));
    assert_eq!(info_field(&mut con, "handed", "fence"), Some(lease.fence().to_string()));
    assert!(lease.release().await.expect("answered"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_as_the_request_timeout_fires_is_released_from_a_new_connection() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    let options = ClientOptions {
        request_timeout: Duration::from_millis(300),
        acquire_deadline: Duration::ZERO,
        ..ClientOptions::default()
    };
    let (mut con, dlock) = held_and_a_client_behind(&server, &proxy, "late", options).await;
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        dlock
            .acquire_waiting("late", Duration::from_secs(30), Some(Duration::from_millis(700)))
            .await
    });
    until_queued(&mut con, "late");
    // Every open connection (the wait's and the shared one) goes silent, without a FIN: the
    // hand-over's reply is swallowed and the client gives up on its own timeout.
    proxy.silence_open_connections();
    assert_eq!(release(&mut con, "late", "holder"), 1);
    assert!(info_field(&mut con, "late", "owner").is_some_and(|owner| owner != "holder"));
    let outcome = waiting.await.expect("task");
    assert!(started.elapsed() < Duration::from_millis(700 + 300) + SLACK, "bounded");
    handed_over_lease_is_gone(&mut con, "late");
    match outcome {
        Err(AcquireError::Unknown { released: true, .. }) => {}
        // On a loaded machine the claim window (1 s) may end the grant before the release from
        // a new connection reaches it: gone either way, and the server says which.
        Err(AcquireError::Unknown { released: false, .. })
            if info_line(&mut con, "dlock", "dlock_claims_lapsed").as_deref() == Some("1") => {}
        other => panic!("expected an unknown outcome, released, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_the_caller_drops_as_the_lease_is_handed_over_is_released_in_the_background() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    let (mut con, dlock) =
        held_and_a_client_behind(&server, &proxy, "dropped", ClientOptions::default()).await;
    let waiting = tokio::spawn(async move {
        let wait = dlock.acquire_waiting(
            "dropped",
            Duration::from_secs(30),
            Some(Duration::from_secs(10)),
        );
        tokio::time::timeout(Duration::from_millis(800), wait).await
    });
    until_queued(&mut con, "dropped");
    proxy.silence_open_connections();
    assert_eq!(release(&mut con, "dropped", "holder"), 1);
    assert!(info_field(&mut con, "dropped", "owner").is_some_and(|owner| owner != "holder"));
    // The caller's own timeout drops the wait with the lease already handed over.
    assert!(waiting.await.expect("task").is_err(), "the caller's timeout fired");
    handed_over_lease_is_gone(&mut con, "dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_no_release_can_reach_lapses_with_its_claim_window() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    let options = ClientOptions {
        request_timeout: Duration::from_millis(300), // a claim window of 1 s (the least)
        connect_timeout: Duration::from_millis(300),
        acquire_deadline: Duration::ZERO,
        ..ClientOptions::default()
    };
    let (mut con, dlock) = held_and_a_client_behind(&server, &proxy, "cut", options).await;
    let waiting = tokio::spawn(async move {
        dlock
            .acquire_waiting("cut", Duration::from_secs(30), Some(Duration::from_millis(700)))
            .await
    });
    until_queued(&mut con, "cut");
    proxy.silence_open_connections();
    assert_eq!(release(&mut con, "cut", "holder"), 1);
    let handed_over = Instant::now();
    assert!(info_field(&mut con, "cut", "owner").is_some_and(|owner| owner != "holder"));
    // New connections are refused from now on: the client's RELEASE cannot reach the server.
    proxy.cut();
    match waiting.await.expect("task") {
        Err(AcquireError::Unknown { released: false, .. }) => {}
        other => panic!("expected an unknown outcome, not released, got {other:?}"),
    }
    let lapsed = eventually(SLACK, || info_field(&mut con, "cut", "owner").is_none());
    assert!(lapsed, "the unclaimed hand-over is still held: {:?}", info(&mut con, "cut"));
    assert!(handed_over.elapsed() < Duration::from_secs(1) + SLACK, "lapsed, not expired");
    // Counted when the server's timer ends it (DLOCK.INFO already shows it gone).
    let counted = eventually(SLACK, || {
        info_line(&mut con, "dlock", "dlock_claims_lapsed").as_deref() == Some("1")
    });
    assert!(counted, "counted as an unclaimed hand-over that lapsed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_of_run_writes_fenced_through_its_fencing_handle_and_is_refused_once_the_lease_is_gone()
 {
    let server = Server::start();
    let dlock = client(&server).await;
    let lease = dlock.acquire("invoice:{8}", Duration::from_secs(30)).await.expect("granted");
    let fencing = lease.fencing();
    assert_eq!(fencing.fence(), lease.fence());
    let mut con = server.client();
    let during = fencing.clone();
    let written = lease
        .run(|_cancelled| async move {
            let mut write = redis::cmd("SET");
            write.arg("invoice:{8}:status").arg("paid");
            during.fenced::<String>(&write).await
        })
        .await
        .expect("released");
    assert_eq!(written.expect("fenced write inside run"), "OK");
    // Released by run: the same handle's write is refused now, and nothing is written.
    let mut late = redis::cmd("SET");
    late.arg("invoice:{8}:status").arg("late");
    let refused = fencing.fenced::<String>(&late).await;
    assert!(matches!(refused, Err(dlock_client::FencedError::Stale(_))), "{refused:?}");
    let status: String = redis::cmd("GET").arg("invoice:{8}:status").query(&mut con).expect("GET");
    assert_eq!(status, "paid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_on_a_stopped_server_is_reported_lost_at_its_local_expiry_not_a_request_timeout_later()
 {
    let server = Server::start();
    let dlock = client(&server).await;
    let ttl = Duration::from_millis(900);
    let lease = dlock.acquire("invoice:{10}", ttl).await.expect("granted");
    let running = tokio::spawn(lease.run(|_cancelled| std::future::pending::<()>()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.pause();
    let paused = std::time::Instant::now();
    let outcome = running.await.expect("run");
    let after = paused.elapsed();
    server.resume();
    assert!(
        matches!(
            outcome,
            Err(dlock_client::RunError::LockLost(dlock_client::LossReason::Unreachable(_)))
        ),
        "{outcome:?}"
    );
    // The local expiry is at most a ttl after the pause; the RELEASE that follows (to a server
    // that does not answer) must not delay the news by the request timeout (2 s).
    assert!(after < ttl + Duration::from_millis(400), "reported {after:?} after the pause");
}

#[tokio::test(flavor = "current_thread")]
async fn a_holder_whose_thread_is_blocked_past_its_ttl_loses_the_lease_as_stalled_and_sends_no_late_renewal()
 {
    let server = Server::start();
    let dlock = client(&server).await;
    let ttl = Duration::from_millis(600);
    let lease = dlock.acquire("invoice:{11}", ttl).await.expect("granted");
    let outcome = lease
        .run(|cancelled| async move {
            // Blocks the runtime's only thread past the ttl: the renewal due at a third of it
            // never gets to run, while the server answers all along.
            std::thread::sleep(ttl + Duration::from_millis(300));
            cancelled.cancelled().await;
        })
        .await;
    assert!(matches!(outcome, Err(RunError::LockLost(LossReason::Stalled))), "{outcome:?}");
    // The renewal found due after the local expiry was not sent: the expiry was checked first.
    assert_eq!(renew_count(&mut server.client()), 0);
}
