//! `DLOCK.TOP` and the per-resource history in `DLOCK.INFO`: the contended and long-held locks
//! in view, and an uncontended lock not noted at all.

use std::collections::BTreeMap;
use std::thread::sleep;
use std::time::Duration;

use dlock_testkit::*;

type Fields = BTreeMap<String, String>;

fn fields(items: &[redis::Value]) -> Fields {
    field_map(items)
}

fn top(con: &mut redis::Connection, options: &[&str]) -> Vec<Fields> {
    let rows: Vec<Vec<redis::Value>> =
        redis::cmd("DLOCK.TOP").arg(options).query(con).expect("DLOCK.TOP");
    rows.iter().map(|row| fields(row)).collect()
}

fn resources(rows: &[Fields]) -> Vec<&str> {
    rows.iter().map(|row| row["resource"].as_str()).collect()
}

fn info(con: &mut redis::Connection, resource: &str) -> Fields {
    let items: Vec<redis::Value> =
        redis::cmd("DLOCK.INFO").arg(resource).query(con).expect("DLOCK.INFO");
    fields(&items)
}

fn number(fields: &Fields, name: &str) -> u64 {
    fields[name].parse().unwrap_or_else(|_| panic!("{name} = {:?}", fields[name]))
}

#[test]
fn top_shows_contended_locks_in_order_and_never_an_uncontended_one() {
    let server = Server::start();
    let mut con = server.client();
    let acquire = |con: &mut redis::Connection, args: &[&str]| -> Option<i64> {
        redis::cmd("DLOCK.ACQUIRE").arg(args).query(con).expect("ACQUIRE")
    };
    // Held longest, renewed, and waited for later: watched from the wait.
    assert!(acquire(&mut con, &["job:long", "L", "60000", "META", "host-a"]).is_some());
    sleep(Duration::from_millis(60));
    let renewed: i64 =
        redis::cmd("DLOCK.RENEW").arg(&["job:long", "L", "60000"]).query(&mut con).unwrap();
    assert_eq!(renewed, 1);
    // Held and renewed, never waited for: not watched.
    assert!(acquire(&mut con, &["job:quiet", "Q", "60000"]).is_some());
    let renewed: i64 =
        redis::cmd("DLOCK.RENEW").arg(&["job:quiet", "Q", "60000"]).query(&mut con).unwrap();
    assert_eq!(renewed, 1);
    assert!(acquire(&mut con, &["job:long", "M", "60000", "QUEUE", "10000"]).is_none());
    // Two tickets behind a holder on one lock, one on another.
    assert!(acquire(&mut con, &["job:busy", "A", "60000"]).is_some());
    assert!(acquire(&mut con, &["job:busy", "B", "60000", "QUEUE", "10000"]).is_none());
    assert!(acquire(&mut con, &["job:busy", "C", "60000", "QUEUE", "10000"]).is_none());
    assert!(acquire(&mut con, &["job:some", "S", "60000"]).is_some());
    assert!(acquire(&mut con, &["job:some", "T", "60000", "QUEUE", "10000"]).is_none());

    let by_waiters = top(&mut con, &[]);
    assert_eq!(resources(&by_waiters), ["job:busy", "job:long", "job:some"], "{by_waiters:?}");
    assert_eq!(number(&by_waiters[0], "line"), 2);
    assert_eq!(by_waiters[0]["owner"], "A");
    assert_eq!(by_waiters[0]["mode"], "exclusive");
    let by_held = top(&mut con, &["BY", "held-ms"]);
    assert_eq!(resources(&by_held)[0], "job:long", "{by_held:?}");
    assert_eq!(by_held[0]["meta"], "host-a");
    assert!(number(&by_held[0], "held-ms") >= 60);
    assert!(!resources(&by_held).contains(&"job:quiet"), "an uncontended lease");
    assert_eq!(resources(&top(&mut con, &["BY", "held-ms", "COUNT", "1"])), ["job:long"]);
    assert!(top(&mut con, &["BY", "handovers"]).is_empty(), "no hand-over yet");

    // A's lease ends with two in line: its hold is recorded, B is handed the lock.
    sleep(Duration::from_millis(20));
    let released: i64 =
        redis::cmd("DLOCK.RELEASE").arg(&["job:busy", "A"]).query(&mut con).unwrap();
    assert_eq!(released, 1);
    let by_handovers = top(&mut con, &["by", "HANDOVERS"]);
    assert_eq!(resources(&by_handovers), ["job:busy"]);
    assert_eq!(number(&by_handovers[0], "handovers"), 1);
    assert_eq!(by_handovers[0]["owner"], "B");
    assert!(number(&by_handovers[0], "wait-p99-us") >= 20_000, "{by_handovers:?}");
    assert!(number(&by_handovers[0], "hold-p99-us") >= 20_000, "{by_handovers:?}");

    let busy = info(&mut con, "job:busy");
    assert_eq!(number(&busy, "handovers"), 1);
    assert!(number(&busy, "wait-p50-us") >= 20_000, "{busy:?}");
    assert!(number(&busy, "hold-p50-us") >= 20_000, "{busy:?}");
    let quiet = info(&mut con, "job:quiet");
    for name in ["handovers", "wait-p50-us", "wait-p99-us", "hold-p50-us", "hold-p99-us"] {
        assert_eq!(number(&quiet, name), 0, "{name} of an uncontended lock");
    }

    // A user who may not read job:busy does not see it.
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "viewer", "on", "nopass", "+dlock.top", "~job:some"])
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("AUTH").arg(&["viewer", "x"]).query(&mut con).unwrap();
    assert_eq!(resources(&top(&mut con, &[])), ["job:some"]);
    let mut con = server.client();

    // CONFIG RESETSTAT forgets the histories.
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut con).unwrap();
    assert!(top(&mut con, &["BY", "handovers"]).is_empty());
    assert_eq!(number(&info(&mut con, "job:busy"), "handovers"), 0);
}

#[test]
fn bad_arguments_name_the_option_and_the_rule() {
    let server = Server::start();
    let mut con = server.client();
    let error = |con: &mut redis::Connection, args: &[&str]| {
        redis::cmd("DLOCK.TOP").arg(args).query::<redis::Value>(con).unwrap_err().to_string()
    };
    assert!(
        error(&mut con, &["BY", "fences"]).contains("BY must be waiters, held-ms or handovers")
    );
    assert!(
        error(&mut con, &["COUNT", "0"]).contains("COUNT must be an integer between 1 and 1000")
    );
    assert!(
        error(&mut con, &["COUNT", "1001"]).contains("COUNT must be an integer between 1 and 1000")
    );
    assert!(error(&mut con, &["BY"]).contains("BY needs"));
    assert!(error(&mut con, &["HELD"]).contains("HELD"));
}

#[test]
fn past_its_capacity_the_watch_drops_the_lock_least_recently_contended() {
    let server = Server::start();
    let mut con = server.client();
    let capacity = 4_096;
    let mut pipe = redis::pipe();
    for i in 0..=capacity {
        let name = format!("crowd:{i}");
        pipe.cmd("DLOCK.ACQUIRE").arg(&name).arg("holder").arg(60_000).ignore();
        pipe.cmd("DLOCK.ACQUIRE")
            .arg(&name)
            .arg("next")
            .arg(60_000)
            .arg("QUEUE")
            .arg(30_000)
            .ignore();
    }
    let _: () = pipe.query(&mut con).expect("a crowd of contended locks");
    let shown = top(&mut con, &["COUNT", "1000"]);
    assert_eq!(shown.len(), 1_000);
    // crowd:0 was noted first and dropped: the end of its holder's lease is not recorded (its
    // hand-over makes it watched again, dropping the least recent then); crowd:1's is.
    for name in ["crowd:1", "crowd:0"] {
        let _: () = redis::cmd("DLOCK.RELEASE").arg(&[name, "holder"]).query(&mut con).unwrap();
        assert_eq!(number(&info(&mut con, name), "handovers"), 1);
    }
    assert_eq!(number(&info(&mut con, "crowd:0"), "hold-p50-us"), 0, "dropped, so not recorded");
    assert!(number(&info(&mut con, "crowd:1"), "hold-p50-us") > 0, "still watched");
}
