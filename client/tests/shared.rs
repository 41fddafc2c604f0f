//! Read-write locks and semaphores through the client, against a real redis-server with the
//! module: shared leases with a mutex's lifecycle (renewal tied to the work, loss cancels it,
//! release with FENCE, claim windows, the release after a failed wait).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlock_client::{
    AcquireError, AcquireOptions, Client, ClientOptions, LossReason, Mode, RunError,
};
use dlock_testkit::*;

/// Room for a slow test machine.
const SLACK: Duration = Duration::from_secs(5);

async fn client(server: &Server) -> Client {
    Client::connect(&server.url()).await.expect("connect")
}

/// Waits until `resource` has `n` clients in its queue (blocked or holding tickets).
fn until_waiting(con: &mut redis::Connection, resource: &str, n: usize) {
    let queued = eventually(SLACK, || {
        info(con, resource).is_some_and(|fields| {
            fields.iter().any(|(name, value)| name == "waiters" && value == &n.to_string())
        })
    });
    assert!(queued, "expected {n} waiters: {:?}", info(con, resource));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_hold_together_and_a_writer_waits_for_all_of_them() {
    let server = Server::start();
    let dlock = client(&server).await;
    let ttl = Duration::from_secs(10);
    let first = dlock.read("report", ttl, None).await.expect("first reader");
    let second = dlock.read("report", ttl, None).await.expect("second reader, beside the first");
    assert_eq!((first.mode(), second.mode()), (Mode::Shared, Mode::Shared));
    assert!(second.fence() > first.fence(), "each reader has a fence of its own");
    let mut con = server.client();
    assert_eq!(info_field(&mut con, "report", "mode").as_deref(), Some("shared"));
    assert_eq!(info_field(&mut con, "report", "holders").as_deref(), Some("2"));
    assert!(matches!(dlock.write("report", ttl, None).await, Err(AcquireError::Held)));

    let waiting = {
        let dlock = dlock.clone();
        tokio::spawn(async move { dlock.write("report", ttl, Some(Duration::from_secs(10))).await })
    };
    until_waiting(&mut con, "report", 1);
    let (first_fence, second_fence) = (first.fence(), second.fence());
    first.run(|_| async {}).await.expect("first reader released");
    assert_eq!(info_field(&mut con, "report", "holders").as_deref(), Some("1"));
    assert!(!waiting.is_finished(), "the writer still waits for the second reader");
    assert!(second.release().await.expect("second reader released"));
    let writer = waiting.await.expect("task").expect("the writer, once both readers left");
    assert_eq!(writer.mode(), Mode::Exclusive);
    assert!(writer.fence() > first_fence.max(second_fence), "a writer's fence tops the readers'");
    assert_eq!(info_field(&mut con, "report", "mode").as_deref(), Some("exclusive"));
    assert!(matches!(dlock.read("report", ttl, None).await, Err(AcquireError::Held)));
    // The hand-over was claimed: the writer's full ttl runs, not the claim window.
    let ttl_ms: u64 = info_field(&mut con, "report", "ttl-ms").expect("held").parse().expect("ms");
    assert!(ttl_ms > 5_000, "claimed: {ttl_ms} ms left");
    assert!(writer.release().await.expect("writer released"));
    assert!(!exists(&mut con, "report"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_goes_before_the_readers_that_come_after_it() {
    let server = Server::start();
    let dlock = client(&server).await;
    let ttl = Duration::from_secs(10);
    let wait = Some(Duration::from_secs(10));
    let mut con = server.client();
    let reader = dlock.read("doc", ttl, None).await.expect("reader");
    let (tx, mut grants) = tokio::sync::mpsc::unbounded_channel();
    let writer = {
        let (dlock, tx) = (dlock.clone(), tx.clone());
        tokio::spawn(async move {
            let lease = dlock.write("doc", ttl, wait).await.expect("writer");
            let _ = tx.send(("writer", lease.fence()));
            lease.run(|_| tokio::time::sleep(Duration::from_millis(300))).await.expect("released");
        })
    };
    until_waiting(&mut con, "doc", 1);
    // A reader that comes after the waiting writer is not let in beside the first reader.
    assert!(matches!(dlock.read("doc", ttl, None).await, Err(AcquireError::Held)));
    let later_reader = {
        let dlock = dlock.clone();
        tokio::spawn(async move {
            let lease = dlock.read("doc", ttl, wait).await.expect("later reader");
            let _ = tx.send(("later reader", lease.fence()));
            lease.release().await.expect("released");
        })
    };
    until_waiting(&mut con, "doc", 2);
    assert!(reader.release().await.expect("first reader released"));
    let (first, writer_fence) = grants.recv().await.expect("a grant");
    let (second, reader_fence) = grants.recv().await.expect("another grant");
    assert_eq!((first, second), ("writer", "later reader"), "first in, first out across modes");
    assert!(reader_fence > writer_fence);
    writer.await.expect("writer task");
    later_reader.await.expect("reader task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_never_runs_more_bodies_at_once_than_it_has_permits() {
    const PERMITS: u32 = 3;
    const TASKS: usize = 12;
    const ROUNDS: usize = 4;
    let server = Server::start();
    let dlock = client(&server).await;
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (dlock, running, most) = (dlock.clone(), running.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let mut fences = Vec::new();
            for _ in 0..ROUNDS {
                let permit = dlock
                    .semaphore(
                        "pool",
                        PERMITS,
                        Duration::from_secs(10),
                        Some(Duration::from_secs(30)),
                    )
                    .await
                    .expect("a permit in turn");
                assert_eq!(permit.mode(), Mode::Permit(PERMITS));
                fences.push(permit.fence());
                let (running, most) = (running.clone(), most.clone());
                permit
                    .run(|_| async move {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                    .expect("ran and released");
            }
            fences
        }));
    }
    let mut fences = Vec::new();
    for task in tasks {
        let mine = task.await.expect("task");
        assert!(mine.windows(2).all(|pair| pair[0] < pair[1]), "a task's fences increase");
        fences.extend(mine);
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= PERMITS as usize, "{most} bodies ran at once with {PERMITS} permits");
    assert_eq!(most, PERMITS as usize, "the contention filled every permit");
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), TASKS * ROUNDS, "every permit had a fence of its own");
    let mut con = server.client();
    assert!(!exists(&mut con, "pool"), "every permit was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphores_permits_are_refused_while_all_are_out_and_fences_increase() {
    let server = Server::start();
    let dlock = client(&server).await;
    let ttl = Duration::from_secs(10);
    let first = dlock.semaphore("slots", 2, ttl, None).await.expect("first permit");
    let second = dlock.semaphore("slots", 2, ttl, None).await.expect("second permit");
    assert!(matches!(dlock.semaphore("slots", 2, ttl, None).await, Err(AcquireError::Held)));
    let waiting = {
        let dlock = dlock.clone();
        tokio::spawn(async move { dlock.semaphore("slots", 2, ttl, Some(SLACK)).await })
    };
    let mut con = server.client();
    until_waiting(&mut con, "slots", 1);
    let released_fence = first.fence();
    assert!(first.release().await.expect("released"));
    let third = waiting.await.expect("task").expect("the waiter gets the permit given back");
    assert!(third.fence() > second.fence() && second.fence() > released_fence);
    // The claim repeated SHARED LIMIT: the permit runs its full ttl.
    let leases = info_field(&mut con, "slots", "holders");
    assert_eq!(leases.as_deref(), Some("2"));
    assert!(dlock.fence_is_live("slots", third.fence()).await.expect("FENCECHECK"));
    assert!(!dlock.fence_is_live("slots", released_fence).await.expect("FENCECHECK"));
    assert!(second.release().await.expect("released"));
    let ttl_ms: u64 = info_field(&mut con, "slots", "ttl-ms").expect("held").parse().expect("ms");
    assert!(ttl_ms > 5_000, "claimed: the full ttl, {ttl_ms} ms left");
    assert!(third.release().await.expect("released"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_shared_lease_cancels_its_work_and_leaves_the_other_readers_alone() {
    let server = Server::start();
    let dlock = client(&server).await;
    let ttl = Duration::from_millis(600);
    let lost = dlock.read("feed", ttl, None).await.expect("reader");
    let kept = dlock.read("feed", ttl, None).await.expect("another reader");
    let mut con = server.client();
    // An operator frees one reader's lease; the other lives on.
    assert_eq!(release(&mut con, "feed", lost.token()), 1);
    let saw_cancel = Arc::new(AtomicBool::new(false));
    let observed = saw_cancel.clone();
    let started = Instant::now();
    let (lost_run, kept_run) = tokio::join!(
        lost.run(|cancelled| async move {
            cancelled.cancelled().await;
            observed.store(true, Ordering::SeqCst);
        }),
        // More than three ttls: only renewals keep it.
        kept.run(|_| tokio::time::sleep(Duration::from_millis(2_000))),
    );
    assert!(
        matches!(lost_run, Err(RunError::LockLost(LossReason::RenewalRefused))),
        "{lost_run:?}"
    );
    assert!(saw_cancel.load(Ordering::SeqCst), "the lost reader's work saw the cancellation");
    assert!(kept_run.is_ok(), "the other reader kept its lease: {kept_run:?}");
    assert!(started.elapsed() >= Duration::from_millis(2_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_events_watched_another_holders_expiry_leaves_a_shared_lease_running() {
    let server = Server::start_with(&["--save", "", "--notify-keyspace-events", "KA"]);
    let options = ClientOptions { watch_events: true, ..ClientOptions::default() };
    let dlock = Client::connect_with(&server.url(), options).await.expect("connect");
    let reader = dlock.read("feed", Duration::from_secs(6), None).await.expect("reader");
    let port = server.port;
    let token = reader.token().to_owned();
    let started = Instant::now();
    let result = reader
        .run(|cancelled| async move {
            // Another reader whose lease expires (dlock.expired on the same key) …
            let dlock =
                Client::connect(&format!("redis://127.0.0.1:{port}/")).await.expect("connect");
            let other = dlock.read("feed", Duration::from_millis(200), None).await.expect("reader");
            tokio::time::sleep(Duration::from_millis(600)).await;
            let _ = other;
            assert!(!cancelled.is_cancelled(), "another reader's expiry ended this one");
            // … then this reader's own lease is freed by an operator: noticed from its event.
            let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                .and_then(|c| c.get_connection())
                .expect("connect");
            assert_eq!(release(&mut con, "feed", &token), 1);
            cancelled.cancelled().await;
        })
        .await;
    match result {
        Err(RunError::LockLost(LossReason::Ended(event))) => assert_eq!(event, "dlock.released"),
        other => panic!("expected the release event to end the lease, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_millis(1_900),
        "noticed from the event, before the first renewal (2 s): {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_describes_the_holder_in_dlock_info() {
    let server = Server::start();
    let dlock = client(&server).await;
    let options = AcquireOptions { meta: Some("host=a pid=7".into()), ..AcquireOptions::default() };
    let lease = dlock.acquire_with("job", Duration::from_secs(10), &options).await.expect("lease");
    let mut con = server.client();
    assert_eq!(info_field(&mut con, "job", "meta").as_deref(), Some("host=a pid=7"));
    assert!(lease.release().await.expect("released"));

    let shared = AcquireOptions {
        mode: Mode::Shared,
        meta: Some("host=b".into()),
        ..AcquireOptions::default()
    };
    let reader = dlock.acquire_with("doc", Duration::from_secs(10), &shared).await.expect("reader");
    let value: redis::Value = redis::cmd("DLOCK.INFO").arg("doc").query(&mut con).expect("INFO");
    assert!(format!("{value:?}").contains("host=b"), "{value:?}");
    assert!(reader.release().await.expect("released"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_wait_the_caller_drops_as_the_lease_is_handed_over_is_released() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    let mut con = server.client();
    assert!(acquire(&mut con, "doc", "writer", 30_000).is_some());
    let dlock =
        Client::connect(&format!("redis://127.0.0.1:{}/", proxy.port)).await.expect("connect");
    let waiting = tokio::spawn(async move {
        let wait = dlock.read("doc", Duration::from_secs(30), Some(Duration::from_secs(10)));
        tokio::time::timeout(Duration::from_millis(800), wait).await
    });
    until_waiting(&mut con, "doc", 1);
    proxy.silence_open_connections();
    assert_eq!(release(&mut con, "doc", "writer"), 1);
    assert_eq!(info_field(&mut con, "doc", "mode").as_deref(), Some("shared"), "handed over");
    assert!(waiting.await.expect("task").is_err(), "the caller's timeout fired");
    let gone = eventually(SLACK, || !exists(&mut con, "doc"));
    assert!(
        gone,
        "a shared grant the client never learned is still held: {:?}",
        info(&mut con, "doc")
    );
}
