//! One-line forms of the commands tests send, and small helpers around replies and time.

use std::thread::sleep;
use std::time::{Duration, Instant};

/// The error reply of a command as the server sent it: `CODE detail`.
pub fn error_text(result: redis::RedisResult<redis::Value>) -> String {
    match result {
        Ok(value) => panic!("expected an error reply, got {value:?}"),
        Err(error) => match (error.code(), error.detail()) {
            (Some(code), Some(detail)) => format!("{code} {detail}"),
            (Some(code), None) => code.to_string(),
            _ => error.to_string(),
        },
    }
}

/// Polls `probe` every few milliseconds until it returns true or `deadline` passes.
pub fn eventually(deadline: Duration, mut probe: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < deadline {
        if probe() {
            return true;
        }
        sleep(Duration::from_millis(5));
    }
    probe()
}

/// `DLOCK.ACQUIRE resource token ttl_ms`: the fence, or `None` when refused.
pub fn acquire(
    con: &mut redis::Connection,
    resource: &str,
    token: &str,
    ttl_ms: u64,
) -> Option<i64> {
    redis::cmd("DLOCK.ACQUIRE").arg(resource).arg(token).arg(ttl_ms).query(con).expect("ACQUIRE")
}

/// `DLOCK.RENEW resource token ttl_ms`: 1 renewed, 0 not held.
pub fn renew(con: &mut redis::Connection, resource: &str, token: &str, ttl_ms: u64) -> i64 {
    redis::cmd("DLOCK.RENEW").arg(resource).arg(token).arg(ttl_ms).query(con).expect("RENEW")
}

/// `DLOCK.RELEASE resource token`: 1 released, 0 not held.
pub fn release(con: &mut redis::Connection, resource: &str, token: &str) -> i64 {
    redis::cmd("DLOCK.RELEASE").arg(resource).arg(token).query(con).expect("RELEASE")
}

/// `DLOCK.FENCECHECK resource fence`: 1 when `fence` is the live lease's.
pub fn fencecheck(con: &mut redis::Connection, resource: &str, fence: i64) -> i64 {
    redis::cmd("DLOCK.FENCECHECK").arg(resource).arg(fence).query(con).expect("FENCECHECK")
}

/// A reply's text: a bulk or simple string, or an integer written out; `None` for anything else.
pub fn value_text(value: &redis::Value) -> Option<String> {
    match value {
        redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A flat `[name, value, …]` reply (RESP2 fields) as a map of texts, `nil` for a nil value.
pub fn field_map(items: &[redis::Value]) -> std::collections::BTreeMap<String, String> {
    items
        .chunks(2)
        .filter_map(|pair| {
            let value = pair.get(1).and_then(value_text).unwrap_or_else(|| "nil".to_owned());
            Some((value_text(pair.first()?)?, value))
        })
        .collect()
}

/// A reply read as an integer ([`value_text`] parsed), 0 when it is none.
pub fn value_number(value: &redis::Value) -> i64 {
    value_text(value).and_then(|t| t.parse().ok()).unwrap_or(0)
}

/// DLOCK.INFO as (field, value) pairs rendered as strings, or None for nil.
pub fn info(con: &mut redis::Connection, resource: &str) -> Option<Vec<(String, String)>> {
    let value: redis::Value = redis::cmd("DLOCK.INFO").arg(resource).query(con).expect("INFO");
    let render = |v: &redis::Value| value_text(v).unwrap_or_else(|| format!("{v:?}"));
    match value {
        redis::Value::Nil => None,
        redis::Value::Array(items) => {
            Some(items.chunks(2).map(|pair| (render(&pair[0]), render(&pair[1]))).collect())
        }
        redis::Value::Map(pairs) => {
            Some(pairs.iter().map(|(k, v)| (render(k), render(v))).collect())
        }
        other => panic!("unexpected DLOCK.INFO reply {other:?}"),
    }
}

/// One field of DLOCK.INFO.
pub fn info_field(con: &mut redis::Connection, resource: &str, field: &str) -> Option<String> {
    info(con, resource)?.into_iter().find(|(name, _)| name == field).map(|(_, value)| value)
}

/// Whether `key` exists.
pub fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("EXISTS") == 1
}

/// The number of keys in the selected database.
pub fn dbsize(con: &mut redis::Connection) -> i64 {
    redis::cmd("DBSIZE").query(con).expect("DBSIZE")
}

/// `SELECT db`, then `DBSIZE` there (the connection stays in `db`).
pub fn dbsize_in(con: &mut redis::Connection, db: i64) -> i64 {
    let _: () = redis::cmd("SELECT").arg(db).query(con).expect("SELECT");
    dbsize(con)
}

/// `DEBUG DIGEST-VALUE` of one key.
pub fn digest(con: &mut redis::Connection, key: &str) -> String {
    let digests: Vec<String> =
        redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(con).expect("DIGEST-VALUE");
    digests.into_iter().next().expect("one digest")
}

/// Microseconds since the Unix epoch, as the module mints fences.
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_micros()
        as i64
}

/// Sends `DLOCK.ACQUIRE resource token ttl-ms WAIT 0 [extra …]` on a connection of its own and
/// returns the connection without reading the reply: read it later with `recv_response`, or
/// never, as a client that gave up on its own timeout but kept its connection open.
pub fn send_wait(
    server: &super::server::Server,
    resource: &str,
    token: &str,
    ttl_ms: u64,
    extra: &[&str],
) -> redis::Connection {
    send_wait_for(server, resource, token, ttl_ms, 0, extra)
}

/// [`send_wait`] with `WAIT wait_ms`.
pub fn send_wait_for(
    server: &super::server::Server,
    resource: &str,
    token: &str,
    ttl_ms: u64,
    wait_ms: u64,
    extra: &[&str],
) -> redis::Connection {
    let mut con = server.client();
    let request = redis::cmd("DLOCK.ACQUIRE")
        .arg(resource)
        .arg(token)
        .arg(ttl_ms)
        .arg("WAIT")
        .arg(wait_ms)
        .arg(extra)
        .get_packed_command();
    con.send_packed_command(&request).expect("send ACQUIRE WAIT");
    con
}

/// Encodes a command in RESP, as the AOF stores it.
pub fn resp_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}
