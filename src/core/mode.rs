//! Exclusive or shared: what one request asks for.

/// What a request asks for: the lease to itself, or a share of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The only lease on the resource (version 1's lock, a writer of a read-write lock).
    #[default]
    Exclusive,
    /// `SHARED [LIMIT n]`: beside other shared leases (a reader), and, with a limit, only while
    /// fewer than `n` of them live (a semaphore permit).
    Shared {
        /// `LIMIT n`, checked against the live shared leases when this request is granted.
        limit: Option<u32>,
    },
}

impl Mode {
    /// Whether the request is for a shared lease.
    pub fn is_shared(self) -> bool {
        matches!(self, Self::Shared { .. })
    }

    /// The mode's name in replies and errors.
    pub fn name(self) -> &'static str {
        if self.is_shared() { "shared" } else { "exclusive" }
    }
}
