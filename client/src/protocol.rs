//! The protocol crate's rules (`dlock_proto`) in the `redis` crate's terms: its argument vectors
//! as commands, replies as [`Reply`] values, and the class of a server's error reply. No rule
//! is written here; only the translation.

use dlock_proto::command::Args;
use dlock_proto::error::{self, ErrorClass};
use dlock_proto::reply::Reply;
use redis::{RedisError, Value};

use crate::Mode;

/// The command of an argument vector (its first element is the command's name).
pub(crate) fn cmd(args: Args) -> redis::Cmd {
    let mut args = args.into_iter();
    let mut cmd = redis::cmd(&String::from_utf8_lossy(&args.next().unwrap_or_default()));
    for arg in args {
        cmd.arg(arg);
    }
    cmd
}

/// The mode as the protocol crate builds its options.
pub(crate) fn mode(mode: Mode) -> dlock_proto::command::Mode {
    match mode {
        Mode::Exclusive => dlock_proto::command::Mode::Exclusive,
        Mode::Shared => dlock_proto::command::Mode::Shared,
        Mode::Permit(n) => dlock_proto::command::Mode::Permits(n),
    }
}

/// A reply of the `redis` crate as the protocol crate reads it (kinds dlock never answers with
/// read as nil).
pub(crate) fn reply_of(value: &Value) -> Reply {
    match value {
        Value::Int(n) => Reply::Int(*n),
        Value::BulkString(bytes) => Reply::Bulk(bytes.clone()),
        Value::SimpleString(text) => Reply::Simple(text.clone()),
        Value::Okay => Reply::Simple("OK".into()),
        Value::Array(items) | Value::Set(items) => {
            Reply::Array(items.iter().map(reply_of).collect())
        }
        Value::Map(pairs) => Reply::Map(
            pairs.iter().map(|(name, value)| (reply_of(name), reply_of(value))).collect(),
        ),
        Value::ServerError(error) => {
            Reply::Error(format!("{} {}", error.code(), error.details().unwrap_or_default()))
        }
        _ => Reply::Nil,
    }
}

/// The server's error reply `error` carries, code first; `None` for an error of this side (I/O,
/// a timeout, a reply of the wrong type).
pub(crate) fn error_reply(error: &RedisError) -> Option<String> {
    let code = error.code()?;
    Some(match error.detail() {
        Some(detail) => format!("{code} {detail}"),
        None => code.to_owned(),
    })
}

/// The class of the server's error reply `error` carries (`None`: not a server's reply).
pub(crate) fn class_of(error: &RedisError) -> Option<ErrorClass> {
    error_reply(error).map(|reply| error::classify(&reply))
}

/// The option an older server refused as an unknown argument, if that is what `error` says.
pub(crate) fn unsupported_option(error: &RedisError) -> Option<&'static str> {
    error::unsupported_option(&error_reply(error)?)
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
