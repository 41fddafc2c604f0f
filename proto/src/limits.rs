//! The bounds every input is checked against (by the server, and by clients before they send).

/// Longest accepted token, in bytes.
pub const MAX_TOKEN_LEN: usize = 512;

/// Longest accepted holder metadata (`META`), in bytes.
pub const MAX_META_LEN: usize = 1_024;

/// Longest accepted revocation reason (`DLOCK.REVOKE … REASON`), in bytes.
pub const MAX_REASON_LEN: usize = 256;

/// Largest `COUNT` of `DLOCK.LIST` (each call does about that much work).
pub const MAX_LIST_COUNT: usize = 10_000;

/// Largest `COUNT` of `DLOCK.TOP` (the watched locks shown by one call).
pub const MAX_TOP_COUNT: usize = 1_000;

/// Most resources in one set (`DLOCK.ACQUIREALL`, `RENEWALL`, `RELEASEALL`).
pub const MAX_SET_SIZE: usize = 64;

/// Largest `LIMIT` of a shared request.
pub const MAX_LIMIT: u32 = 1_000_000;

/// Largest fence any server will ever hand out: replies are signed 64-bit integers.
pub const MAX_FENCE: u64 = i64::MAX as u64;
