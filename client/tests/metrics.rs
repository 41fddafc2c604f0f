//! The client's figures move through the `metrics` facade (one recorder per process, so these
//! checks live in a test binary of their own).

use std::time::Duration;

use dlock_client::{AcquireError, Client, LossReason, RunError};
use dlock_testkit::*;
use metrics::{SharedString, Unit};
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

type Snapshot = Vec<(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)>;

fn counter(snapshot: &Snapshot, name: &str, label: Option<(&str, &str)>) -> u64 {
    snapshot
        .iter()
        .filter(|(key, ..)| {
            key.key().name() == name
                && label
                    .is_none_or(|(k, v)| key.key().labels().any(|l| l.key() == k && l.value() == v))
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

fn histogram_samples(snapshot: &Snapshot, name: &str) -> usize {
    snapshot
        .iter()
        .filter(|(key, ..)| key.key().name() == name)
        .map(|(.., value)| match value {
            DebugValue::Histogram(samples) => samples.len(),
            _ => 0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_counts_attempts_failures_latencies_losses_and_stale_writes() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the only recorder of this test binary");

    let server = Server::start();
    let dlock = Client::connect(&server.url()).await.expect("connect");
    let mut con = server.client();

    let lease = dlock.acquire("job", Duration::from_secs(10)).await.expect("granted");
    assert!(matches!(dlock.acquire("job", Duration::from_secs(10)).await, Err(AcquireError::Held)));
    lease.run(|_| async {}).await.expect("ran and released");
    // A lease lost mid-work, whose late fenced write is refused.
    let lease = dlock.acquire("job", Duration::from_millis(300)).await.expect("granted");
    let _: i64 = redis::cmd("DEL").arg("job").query(&mut con).expect("DEL");
    let mut write = redis::cmd("SET");
    write.arg("{job}:data").arg("late");
    assert!(lease.fenced::<String>(&write).await.is_err(), "stale");
    let lost = lease.run(|cancelled| async move { cancelled.cancelled().await }).await;
    assert!(matches!(lost, Err(RunError::LockLost(_))));
    // A release that finds the lease gone: the loss `ended`, not a release failure.
    let lease = dlock.acquire("job", Duration::from_secs(10)).await.expect("granted");
    let _: i64 = redis::cmd("DEL").arg("job").query(&mut con).expect("DEL");
    assert!(!lease.release().await.expect("answered"));
    // A set counts as one lease: one attempt, one grant or one `held`, one refused renewal and
    // one loss when a member is deleted mid-work.
    let members = ["{set}:1", "{set}:2"];
    let set = dlock.acquire_all(&members, Duration::from_millis(300), None).await.expect("granted");
    let other = dlock.acquire_all(&["{set}:2", "{set}:3"], Duration::from_secs(10), None).await;
    assert!(matches!(other, Err(AcquireError::Held)), "{other:?}");
    let _: i64 = redis::cmd("DEL").arg("{set}:2").query(&mut con).expect("DEL");
    let lost = set.run(|cancelled| async move { cancelled.cancelled().await }).await;
    assert!(matches!(lost, Err(RunError::LockLost(LossReason::RenewalRefused))), "{lost:?}");
    // A holder that did not run in time to renew (this thread, which polls `run`, blocked past
    // the ttl): the loss `stalled`; its best-effort RELEASE is not a release failure either.
    let ttl = Duration::from_millis(300);
    let lease = dlock.acquire("job", ttl).await.expect("granted");
    let stalled = lease
        .run(|cancelled| async move {
            std::thread::sleep(ttl + Duration::from_millis(200));
            cancelled.cancelled().await;
        })
        .await;
    assert!(matches!(stalled, Err(RunError::LockLost(LossReason::Stalled))), "{stalled:?}");
    // The best-effort RELEASEs after the losses run in the background: let them answer.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // One snapshot: taking one drains the histograms.
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(counter(&snapshot, "dlock_client_acquire_attempts_total", None), 7);
    assert_eq!(
        counter(&snapshot, "dlock_client_acquire_failures_total", Some(("reason", "held"))),
        2
    );
    assert_eq!(histogram_samples(&snapshot, "dlock_client_acquire_seconds"), 5);
    assert_eq!(histogram_samples(&snapshot, "dlock_client_hold_seconds"), 5);
    assert_eq!(
        counter(&snapshot, "dlock_client_renewal_failures_total", Some(("reason", "refused"))),
        2
    );
    assert_eq!(
        counter(&snapshot, "dlock_client_leases_lost_total", Some(("reason", "renewal_refused"))),
        2
    );
    assert_eq!(counter(&snapshot, "dlock_client_leases_lost_total", Some(("reason", "ended"))), 1);
    assert_eq!(
        counter(&snapshot, "dlock_client_leases_lost_total", Some(("reason", "stalled"))),
        1
    );
    assert_eq!(counter(&snapshot, "dlock_client_leases_lost_total", None), 4);
    assert_eq!(counter(&snapshot, "dlock_client_release_failures_total", None), 0);
    assert_eq!(counter(&snapshot, "dlock_client_stale_writes_total", None), 1);
}
