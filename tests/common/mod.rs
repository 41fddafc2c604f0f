//! Only for `client/tests`, which still include this file by `#[path]`: it compiles the test
//! kit's own files (`testkit/src`), so nothing here is a copy. Tests under `tests/` use the
//! `dlock-testkit` crate. Delete `tests/common/` once `client/tests` depend on it too.

#![allow(dead_code, unused_imports)] // Each test binary uses a different part of the kit.

#[path = "../../testkit/src/cluster.rs"]
mod cluster;
#[path = "../../testkit/src/commands.rs"]
mod commands;
#[path = "../../testkit/src/info.rs"]
mod info;
#[path = "../../testkit/src/proxy.rs"]
mod proxy;
#[path = "../../testkit/src/rng.rs"]
mod rng;
#[path = "../../testkit/src/server.rs"]
mod server;

pub use cluster::*;
pub use commands::*;
pub use info::*;
pub use proxy::*;
pub use rng::*;
pub use server::*;
