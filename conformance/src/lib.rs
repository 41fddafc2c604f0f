//! The conformance harness: every client's driver (a small program speaking JSON lines, see
//! `docs/protocol.md`, section 14) through the same scenarios (`protocol/conformance/*.json`),
//! against real servers started by `dlock-testkit`, doing what a client cannot do to itself
//! (an operator's `DEL`, a paused server or driver, a silent link, a failover, a restart) and
//! checking each outcome against the driver's answers and the server's own state.

pub mod driver;
pub mod pattern;
pub mod report;
pub mod scenario;

use serde_json::{Value, json};

/// A reply of the server as JSON: bulk and simple strings as strings, integers, arrays, nil as
/// null (a RESP3 map as a flat array of names and values, as in RESP2).
pub fn json_of(value: &redis::Value) -> Value {
    match value {
        redis::Value::Nil => Value::Null,
        redis::Value::Int(n) => json!(n),
        redis::Value::BulkString(bytes) => json!(String::from_utf8_lossy(bytes)),
        redis::Value::SimpleString(text) => json!(text),
        redis::Value::Okay => json!("OK"),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            Value::Array(items.iter().map(json_of).collect())
        }
        redis::Value::Map(pairs) => Value::Array(
            pairs.iter().flat_map(|(name, value)| [json_of(name), json_of(value)]).collect(),
        ),
        redis::Value::Double(x) => json!(x),
        redis::Value::Boolean(b) => json!(b),
        other => json!(format!("{other:?}")),
    }
}
