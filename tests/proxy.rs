//! The test proxy keeps no descriptor of a connection that has ended, however it ended: the chaos
//! harness sends hundreds of thousands of connections through one proxy in a ten-minute run.
//! One test in this file: it counts this process's open descriptors.

use std::time::{Duration, Instant};

use dlock_testkit::{LinkProxy, Server};

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

/// Waits (the proxy's threads end on their own time) until at most `most` descriptors are open.
fn settles_to(most: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_descriptors() > most {
        assert!(
            Instant::now() < deadline,
            "{what}: {} descriptors open, at most {most} expected",
            open_descriptors()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn through(proxy: &LinkProxy) -> redis::Connection {
    let url = format!("redis://127.0.0.1:{}/", proxy.port);
    redis::Client::open(url).expect("url").get_connection().expect("connect through the proxy")
}

#[test]
fn the_proxy_closes_what_ended_however_it_ended() {
    let server = Server::start();
    let proxy = LinkProxy::start(server.port);
    let ping = |con: &mut redis::Connection| redis::cmd("PING").query::<String>(con);
    // One connection first: whatever the process opens once (the resolver, thread stacks) is
    // then counted in the baseline.
    drop(through(&proxy));
    settles_to(usize::MAX, "warm-up");
    std::thread::sleep(Duration::from_millis(100));
    let baseline = open_descriptors();
    // A little room for descriptors the test harness itself may open meanwhile; a leak is two
    // (the proxy's ends) or more per connection, so 300 connections leave far more.
    let most = baseline + 8;

    for _ in 0..300 {
        let mut con = through(&proxy);
        assert_eq!(ping(&mut con).expect("PING"), "PONG");
    }
    settles_to(most, "after 300 connections the client closed");

    for _ in 0..100 {
        let mut con = through(&proxy);
        // QUIT: the server closes the connection.
        let _ = redis::cmd("QUIT").query::<String>(&mut con);
    }
    settles_to(most, "after 100 connections the server closed");

    for _ in 0..50 {
        let mut con = through(&proxy);
        proxy.drop_next_reply();
        assert!(ping(&mut con).is_err(), "the swallowed reply reaches no one");
    }
    settles_to(most, "after 50 swallowed replies");

    let held: Vec<_> = (0..50).map(|_| through(&proxy)).collect();
    proxy.cut();
    proxy.heal();
    drop(held);
    settles_to(most, "after a cut of 50 open connections");

    let mut con = through(&proxy);
    assert_eq!(ping(&mut con).expect("PING after all that"), "PONG");
}
