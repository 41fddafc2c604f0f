//! What dlock's integration tests, benchmarks and chaos harness share, in one place: real
//! `redis-server` processes with the module loaded (each on its own port and directory, with a
//! start-up deadline, killed on drop), a primary with a replica, a Redis Cluster, a TCP proxy
//! for link faults, a wall clock that steps, a seeded random source, INFO parsing, one-line command helpers, a
//! throwaway PostgreSQL and the shared protocol vectors.
//!
//! Modules name their siblings through `super::`, never `crate::`: `tests/common/mod.rs` compiles
//! these same files for test crates that do not depend on the kit yet.

mod clock;
mod cluster;
mod commands;
mod info;
mod postgres;
mod proxy;
mod rng;
mod server;
pub mod vectors;

pub use clock::{Clock, clock_shim};
pub use cluster::{Cluster, migrate};
pub use commands::{
    acquire, dbsize, dbsize_in, digest, error_text, eventually, exists, fencecheck, field_map,
    info, info_field, now_us, release, renew, resp_command, send_wait, send_wait_for, value_number,
    value_text,
};
pub use info::{
    cluster_info, command_calls, counters_add_up, dlock_counters, info_fields, info_line,
    info_value, wait_for_background_persistence,
};
pub use postgres::{PG_USER, Postgres};
pub use proxy::LinkProxy;
pub use rng::{Rng, seed_from_env};
pub use server::{
    AOF_ALWAYS, Launch, PRIMARY_NO_PERSISTENCE, Server, free_port, module_path,
    primary_and_replica_with, server_binary, wait_until_replica_streams,
};
