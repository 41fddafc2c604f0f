//! Decimal digits of an integer written into a stack buffer: the grant path formats numbers
//! for its channel message and its replication without allocating. The protocol crate owns it
//! (its channel messages use it).

pub use dlock_proto::decimal::{MAX_DIGITS, append, decimal};
