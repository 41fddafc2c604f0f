//! The bounds every input is checked against: the protocol crate's, which clients check too.

pub use dlock_proto::limits::{
    MAX_FENCE, MAX_LIMIT, MAX_LIST_COUNT, MAX_META_LEN, MAX_REASON_LEN, MAX_SET_SIZE,
    MAX_TOKEN_LEN, MAX_TOP_COUNT,
};
