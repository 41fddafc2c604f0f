//! Rules for `DLOCK.FENCED resource fence command [arg …]`: which inner commands may run under a
//! fence, and Redis Cluster's key slots (the inner keys must live in the resource's slot).

/// Why an inner command cannot run under a fence, or `None` when it can.
///
/// `name` is the inner command's name; `args` its arguments. Blocking commands would hold the
/// checked fence open across time, transactions and scripts would escape the one-command check,
/// and `DLOCK.*` commands would check fences inside fences.
pub fn refusal(name: &[u8], args: &[&[u8]]) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    let name = name.as_slice();
    const BLOCKING: &[&[u8]] = &[
        b"blpop",
        b"brpop",
        b"brpoplpush",
        b"blmove",
        b"blmpop",
        b"bzpopmin",
        b"bzpopmax",
        b"bzmpop",
        b"wait",
        b"waitaof",
    ];
    const TRANSACTIONS: &[&[u8]] = &[b"multi", b"exec", b"discard", b"watch", b"unwatch"];
    const SCRIPTS: &[&[u8]] = &[
        b"eval",
        b"evalsha",
        b"eval_ro",
        b"evalsha_ro",
        b"fcall",
        b"fcall_ro",
        b"function",
        b"script",
    ];
    const CONNECTION: &[&[u8]] = &[
        b"subscribe",
        b"psubscribe",
        b"ssubscribe",
        b"unsubscribe",
        b"punsubscribe",
        b"sunsubscribe",
        b"monitor",
        b"sync",
        b"psync",
        b"replicaof",
        b"slaveof",
        b"shutdown",
        b"failover",
        b"select",
        b"swapdb",
        b"auth",
        b"hello",
        b"reset",
        b"quit",
        b"client",
        b"debug",
        b"migrate",
    ];
    let blocking_read = matches!(name, b"xread" | b"xreadgroup")
        && args.iter().any(|arg| arg.eq_ignore_ascii_case(b"block"));
    if name.starts_with(b"dlock.") {
        Some("dlock commands do not nest")
    } else if BLOCKING.contains(&name) || blocking_read {
        Some("blocking commands cannot run under a fence")
    } else if TRANSACTIONS.contains(&name) {
        Some("transactions cannot run under a fence; put DLOCK.FENCED inside MULTI instead")
    } else if SCRIPTS.contains(&name) {
        Some("scripts and functions cannot run under a fence")
    } else if CONNECTION.contains(&name) {
        Some("connection, replication and server commands cannot run under a fence")
    } else {
        None
    }
}

/// The Redis Cluster slot of a key: the protocol crate's rule, which the clients route by.
pub use dlock_proto::slot::key_slot;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_shared_vectors_and_hold_a_resource_and_its_data_together() {
        for vector in dlock_testkit::vectors::load("slots.json").as_array().expect("a list") {
            let key = vector["key"].as_str().expect("key");
            assert_eq!(
                u64::from(key_slot(key.as_bytes())),
                vector["slot"].as_u64().expect("slot"),
                "{key}"
            );
        }
        assert_eq!(key_slot(b"{invoice:123}"), key_slot(b"{invoice:123}:data"));
    }

    #[test]
    fn unsafe_inner_commands_are_refused_with_a_reason_and_writes_pass() {
        for (name, args) in [
            (&b"BLPOP"[..], &[&b"q"[..], b"0"][..]),
            (b"multi", &[]),
            (b"EVAL", &[b"return 1", b"0"]),
            (b"dlock.acquire", &[b"r", b"t", b"1"]),
            (b"subscribe", &[b"ch"]),
            (b"XREAD", &[b"BLOCK", b"0", b"STREAMS", b"s", b"$"]),
        ] {
            assert!(refusal(name, args).is_some(), "{}", String::from_utf8_lossy(name));
        }
        for (name, args) in [
            (&b"SET"[..], &[&b"k"[..], b"v"][..]),
            (b"hset", &[b"h", b"f", b"v"]),
            (b"XADD", &[b"s", b"*", b"f", b"v"]),
            (b"xread", &[b"STREAMS", b"s", b"0"]),
            (b"INCR", &[b"counter"]),
        ] {
            assert_eq!(refusal(name, args), None, "{}", String::from_utf8_lossy(name));
        }
    }
}
