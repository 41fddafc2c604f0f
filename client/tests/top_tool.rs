//! `dlock top` against a real server: a live view of the contended and renewed locks, its
//! frames refreshed, and clear refusals of bad options and unreachable servers.

use std::process::Command;

use dlock_testkit::*;

fn dlock(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dlock")).args(args).output().expect("run dlock")
}

#[test]
fn top_shows_the_contended_lock_with_its_holder_line_and_hand_overs_in_every_frame() {
    let server = Server::start();
    let mut con = server.client();
    let acquire = |con: &mut redis::Connection, args: &[&str]| -> Option<i64> {
        redis::cmd("DLOCK.ACQUIRE").arg(args).query(con).expect("ACQUIRE")
    };
    assert!(acquire(&mut con, &["invoice:7", "worker-a", "60000", "META", "host=a"]).is_some());
    assert!(acquire(&mut con, &["invoice:7", "worker-b", "60000", "QUEUE", "20000"]).is_none());
    assert!(acquire(&mut con, &["invoice:7", "worker-c", "60000", "QUEUE", "20000"]).is_none());
    assert!(acquire(&mut con, &["quiet:1", "worker-q", "60000"]).is_some());
    let url = server.url();

    let output = dlock(&["top", "--url", &url, "--iterations", "2", "--interval", "0.1"]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let frames: Vec<&str> = stdout.split(&format!("dlock top - {url} - by waiters\n")).collect();
    assert_eq!(frames.len(), 3, "two frames: {stdout}");
    for frame in &frames[1..] {
        let lines: Vec<&str> = frame.lines().collect();
        assert!(lines[0].starts_with("locks 2  waiters 0  tickets 2  granted 2"), "{frame}");
        let header: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(header[..4], ["RESOURCE", "MODE", "HOLDERS", "OWNER"], "{frame}");
        let row: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(row[..5], ["invoice:7", "exclusive", "1", "worker-a", "host=a"], "{frame}");
        assert_eq!(row[8..], ["2", "0", "-", "-"], "line 2, no hand-over yet: {frame}");
        assert!(!frame.contains("quiet:1"), "an uncontended lock is not shown: {frame}");
    }

    // The holder releases: worker-b is handed the lock; the hand-over and both percentiles show.
    let _: i64 =
        redis::cmd("DLOCK.RELEASE").arg(&["invoice:7", "worker-a"]).query(&mut con).unwrap();
    let output = dlock(&["top", "--url", &url, "--by", "handovers", "--iterations", "1"]);
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let row: Vec<&str> = stdout.lines().nth(4).unwrap_or("").split_whitespace().collect();
    assert_eq!(row[..4], ["invoice:7", "exclusive", "1", "worker-b"], "{stdout}");
    assert_eq!(row[8..10], ["1", "1"], "one in line, one hand-over: {stdout}");
    assert!(row[10] != "-" && row[11] != "-", "wait and hold recorded: {stdout}");
}

#[test]
fn top_refuses_bad_options_and_an_unreachable_server_with_a_message_naming_them() {
    let cases: [(&[&str], &str); 5] = [
        (&["top", "--by", "fences"], "--by must be waiters, held-ms or handovers"),
        (&["top", "--count", "0"], "--count must be 1 to 1000"),
        (&["top", "--interval"], "--interval needs a value"),
        (&["top", "--frobnicate"], "unknown option \"--frobnicate\""),
        (&["stop"], "unknown command \"stop\""),
    ];
    for (args, message) in cases {
        let output = dlock(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    let output = dlock(&["top", "--url", "redis://127.0.0.1:1/", "--iterations", "1"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot reach redis://127.0.0.1:1/"));
}
