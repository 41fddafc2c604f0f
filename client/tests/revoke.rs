//! An operator's `DLOCK.REVOKE` against a real redis-server with the module: the holder hears of
//! it on the resource's channel and loses the lease at once, with the operator's reason; a
//! revocation of another lease leaves it alone; and where the channel cannot be heard, the next
//! renewal still reports the loss.

use std::time::{Duration, Instant};

use dlock_client::{Client, LossReason, RunError, channel_of};
use dlock_testkit::*;
use redis::aio::MultiplexedConnection;
use tokio::sync::oneshot;

/// Room for a slow test machine (a bound on polling loops, never an assertion on latency).
const SLACK: Duration = Duration::from_secs(5);

async fn client(server: &Server) -> Client {
    Client::connect(&server.url()).await.expect("connect")
}

async fn operator(server: &Server) -> MultiplexedConnection {
    let client = redis::Client::open(server.url()).expect("url");
    client.get_multiplexed_async_connection().await.expect("connect")
}

/// Subscribers of `resource`'s channel.
async fn listeners(con: &mut MultiplexedConnection, resource: &str) -> i64 {
    let numsub: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel_of(resource))
        .query_async(con)
        .await
        .expect("NUMSUB");
    numsub.first().map_or(0, |(_, n)| *n)
}

/// Waits until `resource`'s channel has `n` subscribers (the holder subscribes in the
/// background, after its grant returned).
async fn until_listeners(con: &mut MultiplexedConnection, resource: &str, n: i64) {
    let started = Instant::now();
    loop {
        let now = listeners(con, resource).await;
        if now == n {
            return;
        }
        assert!(started.elapsed() < SLACK, "{resource}: {now} subscribers, not {n}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// `DLOCK.REVOKE resource [FENCE fence] [REASON reason]`: how many leases it ended.
async fn revoke(
    con: &mut MultiplexedConnection,
    resource: &str,
    fence: Option<u64>,
    reason: Option<&str>,
) -> i64 {
    let mut cmd = redis::cmd("DLOCK.REVOKE");
    cmd.arg(resource);
    if let Some(fence) = fence {
        cmd.arg("FENCE").arg(fence);
    }
    if let Some(reason) = reason {
        cmd.arg("REASON").arg(reason);
    }
    cmd.query_async(con).await.expect("REVOKE")
}

/// How many times the server ran `command` (`INFO commandstats`).
async fn calls(con: &mut MultiplexedConnection, command: &str) -> u64 {
    let stats: String =
        redis::cmd("INFO").arg("commandstats").query_async(con).await.expect("INFO");
    command_calls(&stats, command)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_holder_loses_its_lease_at_once_with_the_operators_reason() {
    const REVOCATIONS: usize = 20;
    let server = Server::start();
    let dlock = client(&server).await;
    let mut con = operator(&server).await;
    let mut latencies = Vec::with_capacity(REVOCATIONS);
    for i in 0..REVOCATIONS {
        let resource = format!("report:{i}");
        // A ttl far above the test: only the channel can end these leases in time.
        let lease = dlock.acquire(&resource, Duration::from_secs(60)).await.expect("granted");
        let (told, heard) = oneshot::channel();
        let run = tokio::spawn(lease.run(|cancelled| async move {
            cancelled.cancelled().await;
            let _ = told.send(Instant::now());
        }));
        until_listeners(&mut con, &resource, 1).await;
        // Every other revocation without a reason: the loss then has an empty one.
        let reason = (i % 2 == 0).then(|| format!("stuck since 03:00, incident {i}"));
        let sent = Instant::now();
        assert_eq!(revoke(&mut con, &resource, None, reason.as_deref()).await, 1);
        let answered = Instant::now();
        let cancelled_at = heard.await.expect("the work was told");
        // From the REVOKE's reply to the work's cancellation, in µs: negative when the loss came
        // first (the server publishes before it replies), and from the REVOKE's send.
        let micros = |from: Instant, to: Instant| {
            if to >= from {
                (to - from).as_micros() as i64
            } else {
                -((from - to).as_micros() as i64)
            }
        };
        latencies.push((micros(answered, cancelled_at), micros(sent, cancelled_at)));
        match run.await.expect("task") {
            Err(RunError::LockLost(LossReason::Revoked(said))) => {
                assert_eq!(said, reason.unwrap_or_default(), "the operator's reason");
            }
            other => panic!("expected a revocation, got {other:?}"),
        }
    }
    let (mut from_reply, mut from_send): (Vec<i64>, Vec<i64>) = latencies.into_iter().unzip();
    from_reply.sort();
    from_send.sort();
    // Measured, not asserted: a loaded machine may be slow, never wrong.
    println!(
        "{REVOCATIONS} revocations, REVOKE reply to work cancelled: median {} µs, max {} µs \
         (from the REVOKE's send: median {} µs, max {} µs)",
        from_reply[REVOCATIONS / 2],
        from_reply[REVOCATIONS - 1],
        from_send[REVOCATIONS / 2],
        from_send[REVOCATIONS - 1],
    );
    assert_eq!(calls(&mut con, "dlock.release").await, 0, "nothing to release after a revocation");
    // Each lease left its channel when it ended.
    for i in 0..REVOCATIONS {
        until_listeners(&mut con, &format!("report:{i}"), 0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_another_readers_lease_leaves_this_one_held() {
    let server = Server::start();
    let dlock = client(&server).await;
    let mut con = operator(&server).await;
    let ttl = Duration::from_secs(60);
    let kept = dlock.read("report", ttl, None).await.expect("first reader");
    let revoked = dlock.read("report", ttl, None).await.expect("second reader");
    let revoked_fence = revoked.fence();
    let (finish, finished) = oneshot::channel::<()>();
    let kept_run = tokio::spawn(kept.run(|cancelled| async move {
        tokio::select! {
            _ = finished => "finished",
            () = cancelled.cancelled() => "cancelled",
        }
    }));
    let revoked_run =
        tokio::spawn(revoked.run(|cancelled| async move { cancelled.cancelled().await }));
    until_listeners(&mut con, "report", 1).await;
    assert_eq!(revoke(&mut con, "report", Some(revoked_fence), Some("one reader")).await, 1);
    match revoked_run.await.expect("task") {
        Err(RunError::LockLost(LossReason::Revoked(reason))) => assert_eq!(reason, "one reader"),
        other => panic!("expected a revocation, got {other:?}"),
    }
    // The same subscriber read the message for both readers: the other one was not told.
    finish.send(()).expect("still working");
    assert_eq!(kept_run.await.expect("task").expect("held to the end and released"), "finished");
}

/// Every entry of `ACL LOG` as its fields' text, name then value.
fn acl_log(con: &mut redis::Connection) -> Vec<Vec<String>> {
    let log: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query(con).expect("ACL LOG");
    log.iter()
        .map(|entry| match entry {
            redis::Value::Array(fields) => {
                fields.iter().map(|field| value_text(field).unwrap_or_default()).collect()
            }
            other => panic!("unexpected ACL LOG entry {other:?}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_the_holder_cannot_hear_is_reported_by_the_next_renewal() {
    let server = Server::start();
    // A user allowed the commands but no channel: the holder's subscription is refused.
    drop(server.client_as("worker", &["~*", "+@all", "resetchannels"]));
    let url = format!("redis://worker:secret@127.0.0.1:{}/", server.port);
    let dlock = Client::connect(&url).await.expect("connect as the worker");
    let lease = dlock.acquire("report", Duration::from_millis(600)).await.expect("granted");
    let channel = channel_of("report");
    let mut admin = server.client();
    // The holder did try to listen, and was refused.
    assert!(
        eventually(SLACK, || acl_log(&mut admin).iter().any(|entry| {
            entry.windows(2).any(|pair| pair[0] == "reason" && pair[1] == "channel")
                && entry.windows(2).any(|pair| pair[0] == "object" && pair[1] == channel)
        })),
        "no refused subscription to {channel} in the ACL LOG"
    );
    let mut con = operator(&server).await;
    assert_eq!(revoke(&mut con, "report", None, Some("unheard")).await, 1);
    let result = lease.run(|cancelled| async move { cancelled.cancelled().await }).await;
    assert!(
        matches!(result, Err(RunError::LockLost(LossReason::RenewalRefused))),
        "the renewal tells: {result:?}"
    );
}
