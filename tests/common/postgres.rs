//! Only for `client/tests`, which still include this file by `#[path]` next to `common`: the test
//! kit's own `testkit/src/postgres.rs`. Delete it once `client/tests` depend on `dlock-testkit`.

#![allow(dead_code)] // Each test binary uses a different part of the kit.

#[path = "../../testkit/src/postgres.rs"]
mod kit;

pub use kit::*;
// The kit's file finds its sibling helpers through `super::`.
use super::common::free_port;
