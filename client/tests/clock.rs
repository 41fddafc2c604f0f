//! Clocks that step under the client: the server's wall clock (testkit's clock shim in the
//! server), and the client's own (the same shim preloaded into a child run of this test binary).
//! The client times leases by the monotonic clock only, so neither moves a lease.

use std::time::{Duration, Instant};

use dlock_client::Client;
use dlock_testkit::*;

/// Set in the child process: the server's URL, and the file that holds the child's clock offset.
const CHILD_URL: &str = "DLOCK_CLOCK_CHILD_URL";
const CHILD_CLOCK: &str = "DLOCK_CLOCK_OFFSET_FILE";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_renewed_and_released_while_the_servers_clock_steps_both_ways() {
    let clock = Clock::new();
    let server = Launch::new().clock(&clock).args(&["--save", "", "--appendonly", "no"]).start();
    let dlock = Client::connect(&server.url()).await.expect("connect");
    let lease = dlock.acquire("report", Duration::from_secs(1)).await.expect("granted");
    let fence = lease.fence();
    let started = Instant::now();
    let result = lease
        .run(|cancelled| async move {
            // 3 s of work on a 1 s lease: nine renewals, across a step of 10 minutes each way.
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            clock.forward(Duration::from_secs(600));
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            clock.backward(Duration::from_secs(1_200));
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            (cancelled.is_cancelled(), clock)
        })
        .await;
    let (cancelled, clock) = result.expect("the lease was kept and released");
    assert!(!cancelled, "the work was never cancelled");
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert_eq!(clock.offset_us(), -600_000_000);
    // Ten minutes behind its last fence, the server still mints a larger one.
    let next = dlock.acquire("report", Duration::from_secs(1)).await.expect("free again");
    assert!(next.fence() > fence, "fence {} after, {fence} before", next.fence());
}

#[test]
fn a_client_whose_own_clock_is_an_hour_off_and_steps_keeps_and_releases_its_lease() {
    if let Ok(url) = std::env::var(CHILD_URL) {
        return skewed_child(&url);
    }
    let server = Server::start();
    let clock = Clock::new();
    clock.backward(Duration::from_secs(3_600));
    let exe = std::env::current_exe().expect("this test binary");
    let output = std::process::Command::new(exe)
        .args([
            "--exact",
            "a_client_whose_own_clock_is_an_hour_off_and_steps_keeps_and_releases_its_lease",
            "--nocapture",
        ])
        .envs(clock.env())
        .env(CHILD_URL, server.url())
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the skewed child failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let fence: i64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("skewed client released fence "))
        .expect("the child reports its fence")
        .trim()
        .parse()
        .expect("a fence");
    let mut con = server.client();
    assert_eq!(dbsize(&mut con), 0, "the child released its lease");
    assert!(acquire(&mut con, "ledger", "parent", 1_000).expect("free") > fence);
}

/// The child: its wall clock starts an hour behind, then steps forward two hours mid-lease.
fn skewed_child(url: &str) {
    let file = std::env::var(CHILD_CLOCK).expect("the child runs on the shim");
    let skew = now_us() - server_clock(url);
    assert!(skew < -3_500_000_000, "the child's wall clock is not an hour behind: {skew} µs");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fence = runtime.block_on(async {
        let dlock = Client::connect(url).await.expect("connect");
        let lease = dlock.acquire("ledger", Duration::from_secs(1)).await.expect("granted");
        let fence = lease.fence();
        lease
            .run(|cancelled| async move {
                tokio::time::sleep(Duration::from_millis(1_000)).await;
                std::fs::write(&file, "3600000000").expect("step the child's clock");
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                assert!(!cancelled.is_cancelled(), "a step of the client's clock lost the lease");
            })
            .await
            .expect("kept and released");
        fence
    });
    assert!(now_us() - server_clock(url) > 3_500_000_000, "the child's clock stepped forward");
    println!("skewed client released fence {fence}");
}

/// The server's wall clock, in microseconds.
fn server_clock(url: &str) -> i64 {
    let mut con = redis::Client::open(url).and_then(|c| c.get_connection()).expect("connect");
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut con).expect("TIME");
    secs * 1_000_000 + micros
}
