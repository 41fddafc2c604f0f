//! The rules of dlock's wire protocol that both ends must agree on, written once: the module
//! (the server side) and the Rust client depend on this crate, other languages implement the
//! same rules and prove them with the shared vectors in `protocol/vectors/` (which this crate's
//! tests load too). `docs/protocol.md` is the contract in prose.
//!
//! Nothing here performs I/O, reads a clock or knows a Redis client library: every function
//! takes bytes or numbers and returns bytes, numbers or plain values.

pub mod channel;
pub mod command;
pub mod decimal;
pub mod error;
pub mod limits;
pub mod reply;
pub mod slot;
