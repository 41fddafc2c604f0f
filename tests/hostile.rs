//! Hostile conditions: memory pressure, eviction, and a barrage of random command lines.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use dlock_testkit::*;

/// Fills memory with plain strings until the server refuses writes. Small values: a large
/// argument sits in the query buffer and counts as used memory only while it is read.
fn fill_until_oom(con: &mut redis::Connection) {
    let blob = vec![b'x'; 1024];
    for i in 0.. {
        let reply: redis::RedisResult<()> =
            redis::cmd("SET").arg(format!("fill:{i}")).arg(&blob).query(con);
        if let Err(error) = reply {
            assert_eq!(error.code(), Some("OOM"), "{error}");
            // Settle well above the limit, not at its edge where a freed buffer tips it back.
            let used: u64 = info_line(con, "memory", "used_memory")
                .and_then(|v| v.parse().ok())
                .expect("used_memory");
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg(used - 256 * 1024)
                .query(con)
                .expect("CONFIG");
            return;
        }
        assert!(i < 100_000, "maxmemory never reached");
    }
}

/// A server with 4 MB of memory and `policy` for when it is full.
fn small_server(policy: &str) -> Server {
    Server::start_with(&[
        "--save",
        "",
        "--appendonly",
        "no",
        "--maxmemory",
        "4mb",
        "--maxmemory-policy",
        policy,
    ])
}

#[test]
fn when_memory_is_full_acquire_is_refused_but_renew_and_release_still_work() {
    let server = small_server("noeviction");
    let mut con = server.client();
    let fence =
        acquire(&mut con, "lock:held", "worker", 60_000).expect("granted before the pressure");
    fill_until_oom(&mut con);
    let refused = error_text(
        redis::cmd("DLOCK.ACQUIRE")
            .arg("lock:new")
            .arg("w")
            .arg(1_000)
            .query::<redis::Value>(&mut con),
    );
    assert!(refused.starts_with("OOM"), "{refused}");
    assert_eq!(renew(&mut con, "lock:held", "worker", 60_000), 1, "the holder keeps its lease");
    assert_eq!(fencecheck(&mut con, "lock:held", fence), 1);
    assert_eq!(release(&mut con, "lock:held", "worker"), 1, "and can free it");
    assert!(!server.log().contains("maxmemory-policy is"), "no eviction warning under noeviction");
}

#[test]
fn an_evicting_policy_is_warned_about_and_evicted_locks_never_repeat_a_fence() {
    let server = small_server("allkeys-random");
    assert!(server.log().contains("maxmemory-policy is allkeys-random"), "warned at load");
    let mut con = server.client();
    let mut fences: Vec<i64> = (0..200)
        .map(|i| acquire(&mut con, &format!("lock:{i}"), "w", 600_000).expect("granted"))
        .collect();
    let blob = vec![b'x'; 64 * 1024];
    for i in 0..200 {
        let _: () = redis::cmd("SET")
            .arg(format!("fill:{i}"))
            .arg(&blob)
            .query(&mut con)
            .expect("evicting SET");
    }
    let survivors = (0..200).filter(|i| exists(&mut con, &format!("lock:{i}"))).count();
    assert!(survivors < 200, "eviction took some locks");
    let highest = fences.iter().copied().max().unwrap_or_default();
    for i in 0..200 {
        if let Some(fence) = acquire(&mut con, &format!("lock:{i}"), "newcomer", 600_000) {
            assert!(fence > highest, "a re-granted evicted lock got fence {fence} <= {highest}");
            fences.push(fence);
        }
    }
    let total = fences.len();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), total, "no fence was minted twice");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query(&mut con)
        .expect("CONFIG");
    assert!(server.log().contains("maxmemory-policy is allkeys-lru"), "warned again on change");
}

/// One random command line: a dlock command (any case) and arguments from every boundary.
fn command_line() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let name = prop_oneof![
        Just("DLOCK.ACQUIRE"),
        Just("dlock.renew"),
        Just("DLOCK.RELEASE"),
        Just("DlOcK.FeNcEcHeCk"),
        Just("DLOCK.INFO"),
        Just("DLOCK.FENCED"),
        Just("DLOCK.SETLEASE"),
        Just("DLOCK.SETFENCE"),
    ]
    .prop_map(|name| name.as_bytes().to_vec());
    let arg = prop_oneof![
        Just(b"lock:real".to_vec()),
        "[a-z:]{1,12}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..600),
        prop_oneof![
            Just("0"),
            Just("1"),
            Just("-1"),
            Just("86400000"),
            Just("86400001"),
            Just("9223372036854775807"),
            Just("9223372036854775808"),
            Just("-9223372036854775808"),
            Just("+5"),
            Just("05"),
            Just("1e3"),
            Just(" 1"),
            Just("WAIT"),
            Just("wait"),
            Just("NX"),
            Just(""),
            Just("%s%n"),
            Just("SET"),
            Just("BLPOP"),
        ]
        .prop_map(|s| s.as_bytes().to_vec()),
        any::<u64>().prop_map(|n| n.to_string().into_bytes()),
    ];
    (name, proptest::collection::vec(arg, 0..7)).prop_map(|(name, args)| {
        let mut line = vec![name];
        line.extend(args);
        line
    })
}

#[test]
fn a_barrage_of_random_command_lines_leaves_the_server_up_and_real_leases_intact() {
    let mut server = Server::start();
    let mut con = server.client();
    let fence = acquire(&mut con, "lock:real", "the-real-owner-token-0123456789abcdef", 600_000)
        .expect("granted");
    let mut runner =
        TestRunner::new(Config { cases: 3_000, failure_persistence: None, ..Config::default() });
    let barrage = std::cell::RefCell::new(server.client());
    runner
        .run(&command_line(), |line| {
            let mut cmd = redis::cmd(std::str::from_utf8(&line[0]).expect("ASCII name"));
            for arg in &line[1..] {
                cmd.arg(arg.as_slice());
            }
            // Any reply is fine, an error included; only a dead server is not.
            let reply: redis::RedisResult<redis::Value> = cmd.query(&mut *barrage.borrow_mut());
            if let Err(error) = &reply {
                prop_assert!(!error.is_io_error(), "the connection died: {}", error);
            }
            Ok(())
        })
        .expect("no command line may break the server");
    assert!(server.is_alive());
    assert_eq!(
        info_field(&mut con, "lock:real", "owner").as_deref(),
        Some("the-real-owner-token-0123456789abcdef")
    );
    assert_eq!(fencecheck(&mut con, "lock:real", fence), 1, "the real lease is intact");
}
