//! `DLOCK.LIST`: every lock of the database in view, a cursor step at a time.

use std::collections::{BTreeMap, BTreeSet};

use dlock_testkit::*;

/// One step of a listing: the next cursor and each lock's fields.
fn list(
    con: &mut redis::Connection,
    cursor: &str,
    options: &[&str],
) -> (String, Vec<BTreeMap<String, String>>) {
    let (next, entries): (String, Vec<Vec<redis::Value>>) =
        redis::cmd("DLOCK.LIST").arg(cursor).arg(options).query(con).expect("DLOCK.LIST");
    let entries = entries.iter().map(|fields| field_map(fields)).collect();
    (next, entries)
}

/// The resources of a whole iteration, each as often as it was listed.
fn every(con: &mut redis::Connection, options: &[&str]) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    let mut cursor = "0".to_owned();
    loop {
        let (next, entries) = list(con, &cursor, options);
        for entry in entries {
            *seen.entry(entry["resource"].clone()).or_insert(0) += 1;
        }
        if next == "0" {
            return seen;
        }
        cursor = next;
    }
}

#[test]
fn a_whole_iteration_lists_every_lock_and_nothing_else() {
    let server = Server::start();
    let mut con = server.client();
    let mut pipe = redis::pipe();
    for i in 0..2_000 {
        pipe.cmd("DLOCK.ACQUIRE").arg(format!("job:{i}")).arg("worker").arg(60_000).ignore();
        pipe.cmd("SET").arg(format!("data:{i}")).arg("x").ignore();
    }
    let _: () = pipe.query(&mut con).expect("locks and other keys");
    let seen = every(&mut con, &["COUNT", "100"]);
    let expected: BTreeSet<String> = (0..2_000).map(|i| format!("job:{i}")).collect();
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(seen.values().all(|&n| n >= 1));
    let matched = every(&mut con, &["MATCH", "job:1??", "COUNT", "1000"]);
    assert_eq!(matched.len(), 100, "job:100 to job:199");
}

#[test]
fn each_lock_shows_its_holders_and_line_and_the_filters_pick_them() {
    let server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "job:held", "worker-a", 60_000).expect("granted");
    for reader in ["r1", "r2"] {
        let _: i64 = redis::cmd("DLOCK.ACQUIRE")
            .arg("doc")
            .arg(reader)
            .arg(60_000)
            .arg("SHARED")
            .query(&mut con)
            .expect("reader");
    }
    let _: Option<i64> = redis::cmd("DLOCK.ACQUIRE")
        .arg("job:held")
        .arg("worker-b")
        .arg(60_000)
        .arg("QUEUE")
        .arg(60_000)
        .query(&mut con)
        .expect("ticket");
    let (_, entries) = list(&mut con, "0", &["COUNT", "1000"]);
    let by_name: BTreeMap<&str, &BTreeMap<String, String>> =
        entries.iter().map(|entry| (entry["resource"].as_str(), entry)).collect();
    let held = by_name["job:held"];
    assert_eq!(held["mode"], "exclusive");
    assert_eq!(held["holders"], "1");
    assert_eq!(held["owner"], "worker-a");
    assert_eq!(held["fence"], fence.to_string());
    assert_eq!(held["line"], "1");
    assert!(held["ttl-ms"].parse::<u64>().expect("ttl") > 50_000);
    let doc = by_name["doc"];
    assert_eq!((doc["mode"].as_str(), doc["holders"].as_str()), ("shared", "2"));
    assert_eq!(doc["line"], "0");
    assert_eq!(
        every(&mut con, &["COUNT", "1000", "WAITING"]).into_keys().collect::<Vec<_>>(),
        ["job:held"]
    );
    assert_eq!(every(&mut con, &["COUNT", "1000", "HELD"]).len(), 2);
}

/// A caller sees only the locks its ACL key patterns let it read, as with `DLOCK.INFO`.
#[test]
fn a_listing_shows_only_the_keys_the_caller_may_read() {
    let server = Server::start();
    let mut con = server.client();
    for resource in ["team-a:1", "team-a:2", "team-b:1"] {
        acquire(&mut con, resource, "worker", 60_000).expect("granted");
    }
    let mut team_a = server.client_as("team-a", &["%R~team-a:*", "+dlock.list"]);
    let seen = every(&mut team_a, &["COUNT", "1000"]);
    assert_eq!(seen.into_keys().collect::<Vec<_>>(), ["team-a:1", "team-a:2"]);
}

#[test]
fn bad_listings_name_the_argument() {
    let server = Server::start();
    let mut con = server.client();
    for (args, expected) in [
        (&["0", "COUNT", "0"][..], "ERR COUNT must be an integer between 1 and 10000"),
        (&["0", "COUNT", "10001"], "ERR COUNT must be an integer between 1 and 10000"),
        (&["0", "COUNT"], "ERR COUNT needs a count argument"),
        (&["0", "HELD", "WAITING"], "ERR syntax error: HELD and WAITING cannot be combined"),
        (&["0", "HELD", "HELD"], "ERR syntax error: HELD given more than once"),
        (&["0", "SORT"], "ERR syntax error: unexpected argument 'SORT'"),
        (&["abc"], "ERR invalid cursor"),
    ] {
        let reply: redis::RedisResult<redis::Value> =
            redis::cmd("DLOCK.LIST").arg(args).query(&mut con);
        assert_eq!(error_text(reply), expected, "{args:?}");
    }
}
