//! The explicit path for replicated effects: how a copy (a replica, or a primary loading its
//! AOF) applies a lease change its primary decided. No rule decides anything here; the copy
//! takes the primary's word, and [`plan_replicated`](super::effects::plan_replicated) says what
//! follows for its key and index.

use super::{Lease, Lock, Micros, Now};

/// A grant's history as `DLOCK.SETLEASE` carries it: when it was granted (Unix µs) and how many
/// times it was renewed. Older streams carry none.
pub type History = Option<(Micros, u32)>;

/// Applies a lease as the primary decided it (`DLOCK.SETLEASE`): an exclusive lease replaces
/// every lease of the lock, a shared one the exclusive lease and any shared lease of its token.
/// Its history travels with it, so hold time and `dlock.max-hold-ms` count from the grant on
/// every copy; from an older stream without it, a renewal of the grant this copy has keeps the
/// history it had.
pub fn set_lease(lock: &mut Lock, mut lease: Lease, history: History, now: Now) {
    let previous = lock.lease_with_fence(lease.fence).filter(|l| *l.token == *lease.token);
    match (history, previous) {
        (Some((granted_wall, renewals)), _) => {
            lease.granted_mono = now.mono_from_wall(granted_wall).min(now.mono);
            lease.renewals = renewals;
        }
        (None, Some(previous)) => {
            let renewed = previous.deadline_wall != lease.deadline_wall;
            lease.granted_mono = previous.granted_mono;
            lease.renewals = previous.renewals.saturating_add(u32::from(renewed));
        }
        (None, None) => {}
    }
    lock.put(lease);
}

/// Ends one shared lease as the primary decided (`DLOCK.ENDLEASE`); whether it was there.
pub fn end_lease(lock: &mut Lock, token: &[u8], fence: u64) -> bool {
    lock.drop_holder(token, fence).is_some()
}

/// Ends every lease of the lock as the primary decided (a `DLOCK.RELEASE` replayed from its
/// stream or the AOF: the primary propagates its RELEASE only when the key went with it).
pub fn end_all(lock: &mut Lock) {
    // A copy has no waiters; whatever the lock held goes.
    let _ = lock.displace();
}
