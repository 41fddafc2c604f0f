//! One resource's lock: one exclusive lease or any number of shared ones, the FIFO line of
//! requests for it, the operations on them, and their exact owner checks. By concept: the lease
//! and the rules (`lease.rs`), the line of waiters (`line.rs`), the shared holders
//! (`shared.rs`), and the lock that holds them (here).

mod lease;
mod line;
mod shared;
mod slot;

use super::expiry::comes_due;
use super::fence::FenceCounter;
use super::mode::Mode;
use super::{DlockError, Micros, Now};

pub use lease::{Lease, Rules};
use line::Queue;
pub use line::Waiter;
use shared::SharedLeases;
use slot::Slot;

/// The outcome of a RENEW.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease now ends `ttl-ms` from now.
    Renewed,
    /// The token does not hold a live lease; nothing changed.
    NotHeld,
    /// The renewal would carry the lease past `dlock.max-hold-ms`; nothing changed.
    PastMaxHold,
}

/// The outcome of an ACQUIRE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// A new lease with a freshly minted fence.
    Granted {
        /// The new fence.
        fence: u64,
        /// An expired lease of another grant was replaced (it had not been removed yet).
        replaced_expired: bool,
    },
    /// The token already held the live lease: same fence, deadline reset (idempotent retry).
    Reacquired {
        /// The fence of the existing grant.
        fence: u64,
    },
    /// Another token holds a live lease, or others wait first; nothing changed.
    Busy,
    /// The resource has no lease record and new grants are held back (restart grant delay).
    GrantsHeld,
}

/// What an ACQUIRE would be answered, decided without changing anything: what
/// `DLOCK.ACQUIREALL` asks of every member before it grants any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The token holds the live lease: the same fence again, its deadline reset.
    Reacquire,
    /// A new lease would be granted.
    Grant,
    /// Another token holds a live lease, or others wait first.
    Busy,
    /// The resource has no lease record and new grants are held back (restart grant delay).
    GrantsHeld,
}

impl Admission {
    /// Whether the request would hold the lease afterwards.
    pub fn grants(self) -> bool {
        matches!(self, Self::Reacquire | Self::Grant)
    }
}

/// A lease passed to the head of the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandOver {
    /// The waiter that now holds the lease.
    pub waiter: u64,
    /// The fence minted for it.
    pub fence: u64,
    /// How long it waited, in µs.
    pub waited: Micros,
    /// It was a ticket (`QUEUE`): nobody is blocked to answer.
    pub ticket: bool,
    /// The ticket's `NOTIFY request`: its own channel hears of the grant.
    pub notify: Option<u64>,
}

/// What the active expiry cycle should do with a key whose index entry came due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// The lease has expired: remove it.
    Expired,
    /// The lease is live and already has an earlier index entry that has not fired: drop this one.
    Stale,
    /// The lease is live (renewed since): index it again at this deadline.
    Reschedule(Micros),
    /// There is no lease: hand it to a waiter, or delete the key if nobody waits.
    Vacant,
}

/// The state stored in one lock key: one exclusive lease or any number of shared ones, and the
/// FIFO line of requests for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lock {
    /// The exclusive lease, live or not (expired leases stay until the key is next touched).
    lease: Slot,
    /// The line of waiters, and the shared leases.
    waiters: Queue,
}

impl Lock {
    /// A lock holding `lease` (exclusive or shared, as the lease says).
    pub fn with_lease(lease: Lease) -> Self {
        let mut lock = Self::default();
        lock.put(lease);
        lock
    }

    /// Every lease, live or not: the exclusive one, then the shared ones in grant order.
    pub fn holders(&self) -> impl Iterator<Item = &Lease> + use<'_> {
        self.lease.iter().chain(self.waiters.shared_leases())
    }

    /// Every lease live at `now`.
    pub fn live_holders(&self, now: Now) -> impl Iterator<Item = &Lease> + use<'_> {
        self.holders().filter(move |lease| lease.is_live(now))
    }

    /// The lease `token` holds at `now`, if any.
    pub fn holder(&self, token: &[u8], now: Now) -> Option<&Lease> {
        self.lease_of(token).filter(|lease| lease.is_live(now))
    }

    /// The lease of `token`, live or not.
    #[inline]
    fn lease_of(&self, token: &[u8]) -> Option<&Lease> {
        match self.lease.as_ref() {
            Some(lease) if *lease.token == *token => Some(lease),
            _ => self.waiters.shared()?.of_token(token),
        }
    }

    /// The lease with `fence`, live or not.
    pub fn lease_with_fence(&self, fence: u64) -> Option<&Lease> {
        match self.lease.as_ref() {
            Some(lease) if lease.fence == fence => Some(lease),
            _ => self.waiters.shared()?.get(fence),
        }
    }

    /// The live exclusive lease, if there is one.
    pub fn live_exclusive(&self, now: Now) -> Option<&Lease> {
        self.lease.as_ref().filter(|lease| lease.is_live(now))
    }

    /// Whether any lease lives at `now`.
    pub fn has_live(&self, now: Now) -> bool {
        self.live_exclusive(now).is_some()
            || self.waiters.shared().is_some_and(|shared| shared.any_live(now))
    }

    /// How many shared leases live at `now`.
    fn live_shared(&self, now: Now) -> usize {
        self.waiters.shared().map_or(0, |shared| shared.live(now))
    }

    /// The lease a version 1 view shows: the live exclusive lease, or else the newest live
    /// shared one.
    pub fn live_lease(&self, now: Now) -> Option<&Lease> {
        self.live_exclusive(now).or_else(|| self.waiters.shared()?.newest_live(now))
    }

    /// How many leases live at `now`, and whether they are shared.
    pub fn live_mode(&self, now: Now) -> Option<(Mode, usize)> {
        if let Some(lease) = self.live_exclusive(now) {
            return Some((lease.mode(), 1 + self.live_shared(now)));
        }
        let live = self.live_shared(now);
        (live > 0).then_some((Mode::Shared { limit: None }, live))
    }

    /// Puts `lease` in place as replication, persistence or a grant decided it: an exclusive
    /// lease replaces every lease; a shared one replaces the exclusive lease and any shared
    /// lease of the same token. Returns whether it replaced something.
    pub(in crate::core) fn put(&mut self, lease: Lease) -> bool {
        if !lease.shared() {
            let shared = self.waiters.take_shared();
            let replaced = self.lease.replace(lease).is_some() || !shared.is_empty();
            return replaced;
        }
        let replaced = self.lease.take().is_some();
        self.waiters.add_shared(lease) || replaced
    }

    /// Whether `lease` could not stand beside this lock's leases: there is an exclusive lease,
    /// or one of the same token or fence (a restored lock is checked lease by lease).
    pub fn clashes_with(&self, lease: &Lease) -> bool {
        self.lease.is_some()
            || self.waiters.shared().is_some_and(|shared| {
                shared.get(lease.fence).is_some() || shared.of_token(&lease.token).is_some()
            })
    }

    /// Takes out the lease of `token` with `fence` (replication of a shared lease's end).
    pub(in crate::core) fn drop_holder(&mut self, token: &[u8], fence: u64) -> Option<Lease> {
        let lease = self.lease_with_fence(fence).filter(|lease| *lease.token == *token)?;
        if lease.shared() { self.waiters.remove_shared(fence) } else { self.lease.take() }
    }

    /// Changes the lease of `token` (live or not) with `change`, which keeps its token and
    /// fence; `None` if it holds none.
    fn update_lease<R>(&mut self, token: &[u8], change: impl FnOnce(&mut Lease) -> R) -> Option<R> {
        match self.lease.as_mut() {
            Some(lease) if *lease.token == *token => Some(change(lease)),
            _ => self.waiters.update_shared(token, change),
        }
    }

    /// Whether the key holding this lock should be deleted: no lease, live or expired, and
    /// nobody waiting. Expired leases a settle has not ended yet (a crowd ends a slice a turn)
    /// keep the key: each end is announced, counted and replicated on its own.
    pub fn is_vacant(&self, now: Now) -> bool {
        !self.has_live(now) && !self.has_expired(now) && self.waiters.is_empty()
    }

    /// Whether the lock holds any lease record at all, live or not (a restarted server's grant
    /// delay spares resources it has a record of).
    pub fn has_record(&self) -> bool {
        self.lease.is_some() || self.waiters.shared().is_some()
    }

    /// The queue, head first.
    pub fn waiters(&self) -> impl ExactSizeIterator<Item = &Waiter> + use<'_> {
        self.waiters.iter()
    }

    /// Puts a waiter in line. A waiter with the same token takes over the earlier one's place
    /// (a client retrying its wait, a blocked wait or a ticket of the same token); the earlier
    /// one is returned, so a blocked client can be answered nil and a ticket counted.
    pub(in crate::core) fn enqueue(&mut self, waiter: Waiter) -> Option<Waiter> {
        self.waiters.join(waiter)
    }

    #[cfg(test)]
    /// Keeps only the waiters for which `alive` holds (the others timed out or disconnected).
    pub(in crate::core) fn retain_waiters(&mut self, mut alive: impl FnMut(&Waiter) -> bool) {
        self.waiters.retain(|waiter| alive(waiter));
    }

    /// The waiter of `token`, if it stands in line.
    pub fn queued(&self, token: &[u8]) -> Option<&Waiter> {
        self.waiters.of_token(token)
    }

    /// How many tickets (`QUEUE`) stand in line.
    pub fn tickets(&self) -> usize {
        self.waiters.tickets()
    }

    /// Takes `token`'s ticket (`QUEUE`) out of line: its holder gave up waiting.
    pub(in crate::core) fn withdraw_ticket(&mut self, token: &[u8]) -> Option<Waiter> {
        self.waiters.withdraw_ticket(token)
    }

    /// Takes the tickets that lapsed by `now` out of line.
    pub(in crate::core) fn drop_lapsed_tickets(&mut self, now: Now) -> Vec<Waiter> {
        self.waiters.lapsed_tickets(now.mono)
    }

    /// When this lock next needs the timer: the first lease deadline or ticket lapse.
    pub fn next_wake(&self) -> Option<Micros> {
        let exclusive = self.lease.as_ref().map(|lease| lease.deadline_mono());
        let shared = self.waiters.shared().and_then(SharedLeases::first_deadline);
        let lease = match (exclusive, shared) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let ticket = self.waiters.first_ticket_lapse();
        match (lease, ticket) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes a waiter out of line (timed out, disconnected, unblocked).
    pub(in crate::core) fn remove_waiter(&mut self, id: u64) -> bool {
        self.waiters.remove(id)
    }

    /// Bytes held on the heap beyond the value itself: a long token, the line of waiters, the
    /// shared leases.
    pub fn heap_bytes(&self) -> usize {
        self.lease.as_ref().map_or(0, |lease| lease.token.heap_bytes()) + self.waiters.heap_bytes()
    }

    /// Whether a request in `mode` may be granted now, the line aside: an exclusive one when no
    /// lease lives, a shared one when no exclusive lease lives and fewer than its limit of
    /// shared ones do.
    fn admits(&self, mode: Mode, now: Now) -> bool {
        match mode {
            Mode::Exclusive => !self.has_live(now),
            Mode::Shared { limit } => {
                self.live_exclusive(now).is_none()
                    && limit.is_none_or(|n| self.live_shared(now) < n as usize)
            }
        }
    }

    /// Installs a new grant: an exclusive one replaces every (expired) lease; a shared one
    /// replaces an expired exclusive lease and an expired shared one of its token (other expired
    /// shared leases stay until a settle ends them, each with its `Expired`). Returns whether it
    /// replaced an expired lease.
    fn install(&mut self, lease: Lease) -> bool {
        if !lease.shared() {
            return self.put(lease);
        }
        let replaced = self.lease.take().is_some();
        self.waiters.add_shared(lease) || replaced
    }

    /// With the head of the line admitted, passes it a new lease; waiters ahead of it that are
    /// no longer `alive` or about to time out are dropped from the line. The fence is minted and
    /// the waiter's ttl starts at `now`. Call again until `None`: every compatible shared
    /// request at the head is granted together.
    pub(in crate::core) fn hand_over(
        &mut self,
        now: Now,
        fences: &mut FenceCounter,
        rules: Rules,
        mut alive: impl FnMut(&Waiter) -> bool,
    ) -> Result<Option<HandOver>, DlockError> {
        if rules.new_grants_held && !self.has_record() {
            return Ok(None);
        }
        while let Some(waiter) = self.waiters.front() {
            let timing_out = waiter.gives_up_at.is_some_and(|at| at <= now.mono);
            let waiting = match waiter.ticket_until {
                Some(until) => until > now.mono,
                None => alive(waiter),
            };
            if timing_out || !waiting {
                self.waiters.pop_front();
                continue;
            }
            if waiter.set || !self.admits(waiter.mode, now) {
                // Strict FIFO: nobody passes the head, nor a set's ticket heading the line
                // (its set takes the lock when it heads every member's line).
                return Ok(None);
            }
            // Minted before the waiter leaves the line: a refused mint leaves it in place.
            let fence = fences.mint(now.wall)?;
            let Some(waiter) = self.waiters.pop_front() else { break };
            // With a claim window the lease first runs only the window: its holder may be gone.
            let ttl_ms = waiter.claim_ms.map_or(waiter.ttl_ms, |claim| claim.min(waiter.ttl_ms));
            let mut lease = Lease::new(&waiter.token, fence, rules.grant_ttl_ms(ttl_ms), now);
            lease.set_unclaimed(waiter.claim_ms.is_some());
            lease.set_shared(waiter.mode.is_shared());
            if let Some(meta) = &waiter.meta {
                lease.token = lease.token.with_meta(Some(meta));
            }
            self.install(lease);
            let waited = now.mono.saturating_sub(waiter.queued_at);
            let ticket = waiter.ticket_until.is_some();
            let notify = waiter.notify;
            return Ok(Some(HandOver { waiter: waiter.id, fence, waited, ticket, notify }));
        }
        Ok(None)
    }

    #[cfg(test)]
    /// ACQUIRE of an exclusive lease without metadata: see [`Lock::acquire_as`].
    pub(in crate::core) fn acquire(
        &mut self,
        token: &[u8],
        ttl_ms: u64,
        now: Now,
        fences: &mut FenceCounter,
        rules: Rules,
    ) -> Result<Acquired, DlockError> {
        self.acquire_as(token, ttl_ms, Mode::Exclusive, None, now, fences, rules)
    }

    /// ACQUIRE: grants a lease in `mode` when the lock admits it, re-acquires for a holder, or
    /// refuses. Waiters come first: a lock with a queue is never granted past it. With
    /// `new_grants_held`, a lock without any lease record is not granted either. A re-acquire
    /// never carries the lease past `max_hold_ms` (its deadline is capped there), and never
    /// changes its mode (an error). `meta` replaces the holder's metadata when given.
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    pub(in crate::core) fn acquire_as(
        &mut self,
        token: &[u8],
        ttl_ms: u64,
        mode: Mode,
        meta: Option<&[u8]>,
        now: Now,
        fences: &mut FenceCounter,
        rules: Rules,
    ) -> Result<Acquired, DlockError> {
        let admission = self.admission(token, mode, now, rules)?;
        self.take_admitted(admission, token, ttl_ms, mode, meta, now, fences, rules)
    }

    /// Carries out an `admission` decided for `token` at `now` (by [`Lock::admission`] or, for a
    /// set, [`Lock::set_admission`]): grants, re-acquires, or refuses.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(in crate::core) fn take_admitted(
        &mut self,
        admission: Admission,
        token: &[u8],
        ttl_ms: u64,
        mode: Mode,
        meta: Option<&[u8]>,
        now: Now,
        fences: &mut FenceCounter,
        rules: Rules,
    ) -> Result<Acquired, DlockError> {
        match admission {
            Admission::Reacquire => Ok(self
                .update_lease(token, |lease| {
                    let cap = rules.hold_limit(lease.granted_mono());
                    let capped_ms =
                        cap.map_or(ttl_ms, |cap| ttl_ms.min(cap.saturating_sub(now.mono) / 1_000));
                    lease.extend(capped_ms.max(1), now);
                    lease.set_unclaimed(false);
                    if meta.is_some() {
                        lease.token = lease.token.with_meta(meta);
                    }
                    Acquired::Reacquired { fence: lease.fence }
                })
                .unwrap_or(Acquired::Busy)),
            Admission::Busy => Ok(Acquired::Busy),
            Admission::GrantsHeld => Ok(Acquired::GrantsHeld),
            Admission::Grant => {
                let fence = fences.mint(now.wall)?;
                let mut lease = Lease::new(token, fence, rules.grant_ttl_ms(ttl_ms), now);
                lease.set_shared(mode.is_shared());
                if meta.is_some() {
                    lease.token = lease.token.with_meta(meta);
                }
                let replaced_expired = self.install(lease);
                Ok(Acquired::Granted { fence, replaced_expired })
            }
        }
    }

    /// What an ACQUIRE of `token` in `mode` would be answered now, changing nothing: the rule
    /// [`Lock::acquire_as`] follows. A token holding a live lease of the other mode is a
    /// [`DlockError::ModeConflict`].
    #[inline]
    pub fn admission(
        &self,
        token: &[u8],
        mode: Mode,
        now: Now,
        rules: Rules,
    ) -> Result<Admission, DlockError> {
        if let Some(lease) = self.holder(token, now) {
            if lease.shared() != mode.is_shared() {
                return Err(DlockError::ModeConflict {
                    held: lease.mode().name(),
                    asked: mode.name(),
                });
            }
            return Ok(Admission::Reacquire);
        }
        if !self.waiters.is_empty() {
            return Ok(Admission::Busy);
        }
        self.admission_when_first(mode, now, rules)
    }

    /// What `DLOCK.ACQUIREALL` of `token` may have of this member: as [`Lock::admission`],
    /// except that the token's own set ticket heading the line does not stand in its way.
    pub fn set_admission(
        &self,
        token: &[u8],
        mode: Mode,
        now: Now,
        rules: Rules,
    ) -> Result<Admission, DlockError> {
        if self.set_ticket_heads(token) && self.holder(token, now).is_none() {
            return self.admission_when_first(mode, now, rules);
        }
        self.admission(token, mode, now, rules)
    }

    /// The rest of the admission once nobody stands in line before the request.
    #[inline]
    fn admission_when_first(
        &self,
        mode: Mode,
        now: Now,
        rules: Rules,
    ) -> Result<Admission, DlockError> {
        if rules.new_grants_held && !self.has_record() {
            return Ok(Admission::GrantsHeld);
        }
        if !self.admits(mode, now) {
            return Ok(Admission::Busy);
        }
        Ok(Admission::Grant)
    }

    #[cfg(test)]
    /// RENEW: the owner of the live lease moves its deadline to `now + ttl_ms`. An expired lease
    /// is never renewed back to life.
    pub(in crate::core) fn renew(
        &mut self,
        token: &[u8],
        ttl_ms: u64,
        now: Now,
        rules: Rules,
    ) -> Renewal {
        self.renew_grant(token, None, ttl_ms, now, rules)
    }

    /// RENEW with `FENCE`: as [`Lock::renew`], and only if the live lease is the grant with
    /// `fence` (when given), so a late RENEW of an earlier grant of the same token changes nothing.
    pub(in crate::core) fn renew_grant(
        &mut self,
        token: &[u8],
        fence: Option<u64>,
        ttl_ms: u64,
        now: Now,
        rules: Rules,
    ) -> Renewal {
        let renewal = self.renewal(token, fence, ttl_ms, now, rules);
        if renewal == Renewal::Renewed {
            self.update_lease(token, |lease| {
                lease.extend(ttl_ms, now);
                lease.add_renewal();
                lease.set_unclaimed(false);
            });
        }
        renewal
    }

    /// What a RENEW of `token` (the grant with `fence`, when given) would be answered now,
    /// changing nothing: the rule [`Lock::renew_grant`] follows.
    pub fn renewal(
        &self,
        token: &[u8],
        fence: Option<u64>,
        ttl_ms: u64,
        now: Now,
        rules: Rules,
    ) -> Renewal {
        let Some(lease) = self.lease_of(token) else {
            return Renewal::NotHeld;
        };
        if !(lease.is_live(now) && fence.is_none_or(|f| f == lease.fence)) {
            return Renewal::NotHeld;
        }
        let deadline = now.mono.saturating_add(ttl_ms.saturating_mul(1_000));
        if rules.hold_limit(lease.granted_mono()).is_some_and(|limit| deadline > limit) {
            return Renewal::PastMaxHold;
        }
        Renewal::Renewed
    }

    #[cfg(test)]
    /// RELEASE: the owner of the live lease gives it up; returns the released lease.
    pub(in crate::core) fn release(&mut self, token: &[u8], now: Now) -> Option<Lease> {
        self.release_grant(token, None, now)
    }

    /// RELEASE with `FENCE`: as [`Lock::release`], and only if the live lease is the grant with
    /// `fence` (when given): a retried or duplicated RELEASE never frees a later grant.
    pub(in crate::core) fn release_grant(
        &mut self,
        token: &[u8],
        fence: Option<u64>,
        now: Now,
    ) -> Option<Lease> {
        let fence = self.owned(token, fence, now)?.fence;
        self.drop_holder(token, fence)
    }

    /// Takes out the live lease with `fence`, or without it the live exclusive lease or else the
    /// oldest `max` live shared leases (in grant order), whoever holds them.
    pub(in crate::core) fn revoke(
        &mut self,
        fence: Option<u64>,
        now: Now,
        max: usize,
    ) -> Vec<Lease> {
        let fences: Vec<u64> = match fence {
            Some(fence) => self
                .lease_with_fence(fence)
                .filter(|lease| lease.is_live(now))
                .map(|_| fence)
                .into_iter()
                .collect(),
            None => match self.live_exclusive(now) {
                Some(lease) => vec![lease.fence],
                None => self
                    .waiters
                    .shared_leases()
                    .filter(|lease| lease.is_live(now))
                    .take(max)
                    .map(|lease| lease.fence)
                    .collect(),
            },
        };
        fences
            .into_iter()
            .filter_map(|fence| {
                let token = self.lease_with_fence(fence)?.token.clone();
                self.drop_holder(&token, fence)
            })
            .collect()
    }

    /// FENCECHECK: whether `fence` is the fence of a live lease.
    pub fn fence_check(&self, fence: u64, now: Now) -> bool {
        self.lease_with_fence(fence).is_some_and(|lease| lease.is_live(now))
    }

    /// Removes at most `max` of the leases that have expired at `now` (the exclusive one first,
    /// then the shared ones with the earliest deadlines); returns them in grant order.
    pub(in crate::core) fn expire(&mut self, now: Now, max: usize) -> Vec<Lease> {
        let mut expired = Vec::new();
        if max > 0 {
            expired.extend(self.take_ended(now));
        }
        let left = max - expired.len();
        expired.extend(self.waiters.expire_shared(now, left));
        expired
    }

    /// Whether the lock has no line: no waiter, ticket or shared lease. Most locks, most of the
    /// time; a settle then has at most an ended exclusive lease to take ([`Lock::take_ended`]).
    pub(in crate::core) fn has_no_line(&self) -> bool {
        self.waiters.0.is_none()
    }

    /// Takes the exclusive lease out if it has ended at `now`.
    pub(in crate::core) fn take_ended(&mut self, now: Now) -> Option<Lease> {
        self.lease.take_if(|lease| !lease.is_live(now))
    }

    /// Whether a lease that has expired at `now` is still in the lock (a settle ended only some).
    pub fn has_expired(&self, now: Now) -> bool {
        self.lease.as_ref().is_some_and(|lease| !lease.is_live(now))
            || self
                .waiters
                .shared()
                .and_then(SharedLeases::first_deadline)
                .is_some_and(|deadline| deadline <= now.mono)
    }

    /// The deadline at which the caller must insert an expiry index entry for this key (and
    /// records it as pending), or `None`: no lease, or an entry at or before it is still pending.
    pub fn needs_index_entry(&self, now: Now) -> Option<Micros> {
        let deadline = self.next_wake()?;
        let (pending, due) = (self.scheduled(), comes_due(deadline));
        if pending > now.mono && pending <= due {
            None
        } else {
            self.lease.set_scheduled(due);
            Some(deadline)
        }
    }

    /// The deadline of this value's pending index entry at `now`, if it has one.
    pub fn pending_index_entry(&self, now: Now) -> Option<Micros> {
        Some(self.scheduled()).filter(|&pending| pending > now.mono)
    }

    /// Records that an index entry at `deadline` now exists for this value under its current
    /// key name (after a rename, move, restore, load or promotion inserted one).
    pub fn note_index_entry(&self, deadline: Micros) {
        self.set_scheduled(deadline);
    }

    /// When this key's earliest entry in the expiry index comes due (the end of its
    /// millisecond), 0 if none is known. Lets a renewal skip the index when an entry due by the
    /// end of the new deadline's millisecond is already there. An entry at 0 would be no
    /// different from none: a pending entry comes due after `now`.
    fn scheduled(&self) -> Micros {
        self.lease.scheduled()
    }

    /// Records the key's pending index entry, inserted with `deadline`. Updated also where
    /// Redis hands out the value read-only (keyspace notifications, scans): it is bookkeeping.
    fn set_scheduled(&self, deadline: Micros) {
        self.lease.set_scheduled(comes_due(deadline));
    }

    /// Where the expiry index should look at this key next: its first deadline, or at once
    /// when it holds no lease (to hand over to waiters, or to delete the key).
    pub fn index_deadline(&self) -> Micros {
        self.next_wake().unwrap_or(0)
    }

    /// A copy for another key name (COPY): empty. A lease belongs to the name it was granted
    /// under, so a copy of it must never become current somewhere else (or later, copied back,
    /// here again); waiters wait on the original key. The empty copy goes like any vacant key.
    pub fn copied(&self) -> Self {
        Self::default()
    }

    /// The value now lives under another name (RENAME, MOVE): its leases end and its waiters
    /// (blocked clients and tickets) leave the line, all returned. A lease belongs to the name
    /// it was granted under, and a waiter is only ever granted the name it asked for.
    pub(in crate::core) fn displace(&mut self) -> (Vec<Lease>, Vec<Waiter>) {
        let mut gone = Vec::with_capacity(self.waiters.len());
        while let Some(waiter) = self.waiters.pop_front() {
            gone.push(waiter);
        }
        let mut leases: Vec<Lease> = self.lease.take().into_iter().collect();
        leases.extend(self.waiters.take_shared());
        (leases, gone)
    }

    /// Whether the first in line would be admitted now (its liveness and the rules aside).
    pub fn head_may_pass(&self, now: Now) -> bool {
        self.waiters.front().is_some_and(|waiter| !waiter.set && self.admits(waiter.mode, now))
    }

    /// Whether `token`'s set ticket heads the line.
    pub fn set_ticket_heads(&self, token: &[u8]) -> bool {
        self.waiters.front().is_some_and(|waiter| waiter.set && *waiter.token == *token)
    }

    /// Takes `token`'s set ticket out of line when it heads it: its set is being granted.
    pub(in crate::core) fn take_set_ticket(&mut self, token: &[u8]) -> Option<Waiter> {
        if self.set_ticket_heads(token) { self.waiters.pop_front() } else { None }
    }

    /// Decides what to do when an expiry index entry at `entry_deadline` for this key comes due.
    pub fn on_due(&self, entry_deadline: Micros, now: Now) -> Due {
        let Some(deadline) = self.next_wake() else {
            return Due::Vacant;
        };
        if deadline <= now.mono {
            return Due::Expired; // a lease ended, or a ticket lapsed
        }
        if self.head_may_pass(now) {
            // The head of the line may be granted: a settle left the rest of a crowd for this
            // turn, or new grants were held (this entry is the end of the hold, or comes before
            // it and the settle changes nothing).
            return Due::Expired;
        }
        let pending = self.scheduled();
        if pending != entry_deadline && pending > now.mono && pending <= comes_due(deadline) {
            Due::Stale
        } else {
            self.set_scheduled(deadline);
            Due::Reschedule(deadline)
        }
    }

    fn owned(&self, token: &[u8], fence: Option<u64>, now: Now) -> Option<&Lease> {
        self.holder(token, now).filter(|lease| fence.is_none_or(|f| f == lease.fence))
    }

    /// Whether the shared leases' indexes agree with the leases (for tests).
    #[cfg(test)]
    pub(crate) fn indexes_agree(&self) -> bool {
        self.waiters.0.as_ref().is_none_or(|line| line.shared.is_consistent())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limits::MAX_FENCE;

    const SEC: u64 = 1_000_000;

    fn at(seconds: u64) -> Now {
        Now { mono: seconds * SEC, wall: 1_700_000_000 * SEC + seconds * SEC }
    }

    fn granted(
        lock: &mut Lock,
        token: &[u8],
        ttl_ms: u64,
        now: Now,
        fences: &mut FenceCounter,
    ) -> u64 {
        match lock.acquire(token, ttl_ms, now, fences, Rules::default()) {
            Ok(Acquired::Granted { fence, .. }) => fence,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn a_free_lock_is_granted_with_a_fence_from_the_wall_clock() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let fence = granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        assert_eq!(fence, at(0).wall);
        let lease = lock.live_lease(at(9)).expect("live");
        assert_eq!((&*lease.token, lease.fence), (&b"A"[..], fence));
        assert_eq!(lease.remaining_ms(at(9)), 1_000);
        assert!(lock.live_lease(at(10)).is_none(), "a lease ends exactly at its deadline");
    }

    #[test]
    fn the_holder_reacquiring_gets_the_same_fence_and_a_new_deadline() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let fence = granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        assert_eq!(
            lock.acquire(b"A", 10_000, at(5), &mut fences, Rules::default()),
            Ok(Acquired::Reacquired { fence })
        );
        assert!(lock.live_lease(at(14)).is_some(), "deadline reset to 5 s + 10 s");
        assert_eq!(fences.last(), fence, "no second fence minted for one grant");
    }

    #[test]
    fn another_token_is_refused_while_the_lease_lives_and_granted_after() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let first = granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        assert_eq!(
            lock.acquire(b"B", 10_000, at(9), &mut fences, Rules::default()),
            Ok(Acquired::Busy)
        );
        assert_eq!(
            lock.acquire(b"B", 10_000, at(10), &mut fences, Rules::default()),
            Ok(Acquired::Granted { fence: at(10).wall, replaced_expired: true })
        );
        assert!(at(10).wall > first);
    }

    #[test]
    fn a_lease_expires_while_its_holder_still_works_and_its_late_calls_change_nothing() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let stale = granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        let fresh = granted(&mut lock, b"B", 10_000, at(11), &mut fences);
        assert_ne!(
            lock.renew(b"A", 10_000, at(12), Rules::default()),
            Renewal::Renewed,
            "late RENEW"
        );
        assert!(lock.release(b"A", at(12)).is_none(), "late RELEASE");
        assert!(!lock.fence_check(stale, at(12)));
        assert!(lock.fence_check(fresh, at(12)));
        assert_eq!(&*lock.live_lease(at(12)).expect("B holds").token, b"B");
    }

    #[test]
    fn an_expired_lease_is_never_renewed_back_to_life() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        granted(&mut lock, b"A", 1_000, at(0), &mut fences);
        assert_ne!(lock.renew(b"A", 10_000, at(1), Rules::default()), Renewal::Renewed);
        assert!(!lock.has_live(at(1)));
        assert!(!lock.is_vacant(at(1)), "the expired lease is kept until a settle ends it");
        assert_eq!(lock.expire(at(1), 1).len(), 1);
        assert!(lock.is_vacant(at(1)));
    }

    #[test]
    fn release_frees_the_lock_and_the_next_grant_has_a_larger_fence() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let first = granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        assert!(lock.release(b"B", at(1)).is_none(), "owner checks are exact");
        assert_eq!(lock.release(b"A", at(1)).map(|lease| lease.held_ms(at(1))), Some(1_000));
        assert!(lock.is_vacant(at(1)));
        assert!(lock.release(b"A", at(1)).is_none(), "a second release finds nothing");
        let second = granted(&mut lock, b"B", 10_000, at(1), &mut fences);
        assert!(second > first);
    }

    #[test]
    fn with_a_fence_a_late_renew_or_release_of_an_earlier_grant_changes_nothing() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let first = granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        assert!(lock.release_grant(b"A", Some(first), at(1)).is_some());
        let second = granted(&mut lock, b"A", 10_000, at(2), &mut fences);
        let rules = Rules::default();
        assert_eq!(lock.renew_grant(b"A", Some(first), 10_000, at(3), rules), Renewal::NotHeld);
        assert!(lock.release_grant(b"A", Some(first), at(3)).is_none(), "the retried release");
        assert_eq!(lock.live_lease(at(3)).map(|l| l.fence), Some(second), "the new grant stands");
        assert_eq!(lock.renew_grant(b"A", Some(second), 10_000, at(3), rules), Renewal::Renewed);
        assert!(lock.release_grant(b"A", Some(second), at(4)).is_some());
    }

    #[test]
    fn tokens_compare_byte_for_byte() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        granted(&mut lock, b"worker\0a", 10_000, at(0), &mut fences);
        assert_ne!(lock.renew(b"worker\0b", 10_000, at(1), Rules::default()), Renewal::Renewed);
        assert_ne!(lock.renew(b"worker", 10_000, at(1), Rules::default()), Renewal::Renewed);
        assert_eq!(lock.renew(b"worker\0a", 10_000, at(1), Rules::default()), Renewal::Renewed);
    }

    #[test]
    fn a_refused_mint_leaves_the_lock_unchanged() {
        let mut lock = Lock::default();
        let mut fences = FenceCounter::new(crate::core::error::MAX_FENCE);
        assert_eq!(
            lock.acquire(b"A", 1_000, at(0), &mut fences, Rules::default()),
            Err(DlockError::FencesExhausted)
        );
        assert_eq!(lock, Lock::default());
    }

    #[test]
    fn restored_leases_map_their_wall_deadline_onto_this_process_clock() {
        let now = at(100);
        let lease = Lease::restore(b"A", 7, now.wall + 2 * SEC, now, 0).expect("valid");
        assert_eq!(lease.deadline_mono(), now.mono + 2 * SEC);
        assert_eq!(lease.deadline_wall(), now.wall + 2 * SEC);
        let past = Lease::restore(b"A", 7, now.wall - SEC, now, 0).expect("valid");
        assert!(!past.is_live(now));
        for (token, fence, what) in [
            (&b""[..], 7, "token length"),
            (&[1u8; 513][..], 7, "token length"),
            (b"A", 0, "fence"),
            (b"A", MAX_FENCE + 1, "fence"),
        ] {
            assert_eq!(
                Lease::restore(token, fence, now.wall, now, 0),
                Err(DlockError::BadReplicatedLease(what))
            );
        }
    }

    #[test]
    fn a_restored_lease_a_clock_could_not_have_minted_is_refused() {
        let now = at(100);
        let day = 86_400 * SEC;
        let year = 365 * day;
        let refused = |fence, deadline, last| Lease::restore(b"A", fence, deadline, now, last);
        assert_eq!(refused(MAX_FENCE, now.wall, 0), Err(DlockError::BadReplicatedLease("fence")));
        assert_eq!(
            refused(now.wall + 2 * year, now.wall, 0),
            Err(DlockError::BadReplicatedLease("fence"))
        );
        assert!(refused(now.wall + 2 * year, now.wall, now.wall + 2 * year).is_ok(), "known");
        assert!(refused(now.wall + 30 * day, now.wall, 0).is_ok(), "clocks may be wrong");
        assert_eq!(
            refused(7, now.wall + 2 * year, 0),
            Err(DlockError::BadReplicatedLease("deadline"))
        );
        assert!(refused(7, now.wall + year, 0).is_ok(), "the longest ttl a config allows");
    }

    const HELD: Rules = Rules { new_grants_held: true, max_hold_ms: 0 };

    #[test]
    fn max_hold_refuses_the_renewal_that_would_outlast_it_and_caps_reacquires() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let rules = Rules { new_grants_held: false, max_hold_ms: 30_000 };
        let fence = granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        assert_eq!(lock.renew(b"A", 10_000, at(5), rules), Renewal::Renewed);
        assert_eq!(lock.renew(b"A", 10_000, at(14), rules), Renewal::Renewed);
        assert_eq!(lock.renew(b"A", 10_000, at(19), rules), Renewal::Renewed, "ends at 29 s");
        assert_eq!(lock.renew(b"A", 10_000, at(25), rules), Renewal::PastMaxHold);
        assert_eq!(lock.live_lease(at(25)).map(|l| l.deadline_mono()), Some(29 * SEC), "unchanged");
        assert_eq!(
            lock.acquire(b"A", 60_000, at(25), &mut fences, rules),
            Ok(Acquired::Reacquired { fence })
        );
        assert_eq!(lock.live_lease(at(25)).map(|l| l.deadline_mono()), Some(30 * SEC), "capped");
        assert!(lock.live_lease(at(30)).is_none());
        assert_eq!(lock.renew(b"B", 1_000, at(1), rules), Renewal::NotHeld);
        let mut fresh = Lock::default();
        fresh.acquire(b"C", 60_000, at(100), &mut fences, rules).expect("mint");
        assert_eq!(
            fresh.live_lease(at(100)).map(|l| l.deadline_mono()),
            Some(130 * SEC),
            "a grant is capped too"
        );
    }

    fn waiter(id: u64, token: &[u8], gives_up_at: Option<Micros>) -> Waiter {
        Waiter {
            id,
            token: token.into(),
            ttl_ms: 10_000,
            gives_up_at,
            queued_at: 0,
            claim_ms: None,
            ticket_until: None,
            set: false,
            notify: None,
            mode: Mode::Exclusive,
            meta: None,
        }
    }

    #[test]
    fn the_queue_gets_the_lease_in_order_with_fences_increasing_along_it() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let first = granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        assert_eq!(lock.enqueue(waiter(1, b"B", None)), None);
        assert_eq!(lock.enqueue(waiter(2, b"C", None)), None);
        assert_eq!(
            lock.acquire(b"D", 1_000, at(1), &mut fences, Rules::default()),
            Ok(Acquired::Busy)
        );
        assert_eq!(
            lock.hand_over(at(1), &mut fences, Rules::default(), |_| true),
            Ok(None),
            "A still holds"
        );
        assert!(lock.release(b"A", at(1)).is_some());
        let to_b = lock
            .hand_over(at(1), &mut fences, Rules::default(), |_| true)
            .expect("mint")
            .expect("B");
        assert_eq!(to_b.waiter, 1);
        assert!(to_b.fence > first);
        assert_eq!(
            &*lock.live_lease(at(10)).expect("B holds").token,
            b"B",
            "ttl counts from hand-over"
        );
        // B's lease expires: C is next, even against a newcomer.
        assert_eq!(
            lock.acquire(b"D", 1_000, at(12), &mut fences, Rules::default()),
            Ok(Acquired::Busy)
        );
        let to_c = lock
            .hand_over(at(12), &mut fences, Rules::default(), |_| true)
            .expect("mint")
            .expect("C");
        assert_eq!((to_c.waiter, to_c.fence > to_b.fence), (2, true));
        assert_eq!(lock.waiters().len(), 0);
    }

    #[test]
    fn a_lease_handed_over_with_a_claim_window_runs_the_window_until_its_holder_claims_it() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        granted(&mut lock, b"A", 1_000, at(0), &mut fences);
        lock.enqueue(Waiter { claim_ms: Some(2_000), ..waiter(1, b"B", None) });
        lock.enqueue(Waiter { claim_ms: Some(2_000), ..waiter(2, b"C", None) });
        let rules = Rules::default();
        lock.hand_over(at(1), &mut fences, rules, |_| true).expect("mint").expect("B");
        let lease = lock.live_lease(at(1)).expect("B holds");
        assert!(lease.unclaimed());
        assert_eq!(lease.deadline_mono(), 3 * SEC, "the window, not B's 10 s ttl");
        // B never comes back: its grant lapses at the window and C is next.
        assert!(lock.live_lease(at(3)).is_none());
        assert!(matches!(&lock.expire(at(3), usize::MAX)[..], [lease] if lease.unclaimed()));
        lock.hand_over(at(3), &mut fences, rules, |_| true).expect("mint").expect("C");
        // C claims with a RENEW: from then on its ttl is its own.
        assert_eq!(lock.renew(b"C", 10_000, at(4), rules), Renewal::Renewed);
        let lease = lock.live_lease(at(4)).expect("C holds");
        assert!(!lease.unclaimed());
        assert_eq!(lease.deadline_mono(), 14 * SEC);
    }

    #[test]
    fn gone_and_timing_out_waiters_are_skipped_never_made_owners() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        lock.enqueue(waiter(1, b"gone", None));
        lock.enqueue(waiter(2, b"late", Some(at(5).mono)));
        lock.enqueue(waiter(3, b"ready", Some(at(9).mono)));
        let handed =
            lock.hand_over(at(5), &mut fences, Rules::default(), |w| w.id != 1).expect("mint");
        assert_eq!(handed.map(|h| h.waiter), Some(3));
        assert_eq!(lock.waiters().len(), 0, "skipped waiters left the queue");
    }

    #[test]
    fn the_same_token_waiting_again_takes_over_its_place_in_line() {
        let mut lock = Lock::default();
        lock.enqueue(waiter(1, b"A", None));
        lock.enqueue(waiter(2, b"B", None));
        assert_eq!(lock.enqueue(waiter(3, b"A", None)).map(|w| w.id), Some(1));
        let order: Vec<u64> = lock.waiters().map(|w| w.id).collect();
        assert_eq!(order, [3, 2]);
        assert!(lock.remove_waiter(2));
        assert!(!lock.remove_waiter(2));
        assert!(!lock.is_vacant(at(0)), "a waiter keeps the key alive");
        lock.retain_waiters(|w| w.id != 3);
        assert!(lock.is_vacant(at(0)));
    }

    #[test]
    fn held_grants_wait_for_the_delay_but_known_leases_follow_the_usual_rules() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        assert_eq!(lock.acquire(b"A", 1_000, at(0), &mut fences, HELD), Ok(Acquired::GrantsHeld));
        lock.enqueue(waiter(1, b"A", None));
        assert_eq!(lock.hand_over(at(0), &mut fences, HELD, |_| true), Ok(None));
        assert!(
            lock.hand_over(at(0), &mut fences, Rules::default(), |_| true).expect("mint").is_some()
        );
        // An expired lease is a record: the resource can be granted during the delay.
        assert_eq!(
            lock.acquire(b"B", 1_000, at(11), &mut fences, HELD)
                .map(|a| matches!(a, Acquired::Granted { .. })),
            Ok(true)
        );
    }

    #[test]
    fn the_index_is_touched_once_per_pending_deadline_and_rescheduled_when_due() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        assert_eq!(lock.needs_index_entry(at(0)), Some(10 * SEC));
        assert_eq!(lock.renew(b"A", 10_000, at(5), Rules::default()), Renewal::Renewed);
        assert_eq!(lock.needs_index_entry(at(5)), None, "the 10 s entry fires first");
        assert_eq!(lock.on_due(10 * SEC, at(10)), Due::Reschedule(15 * SEC));
        assert_eq!(lock.on_due(10 * SEC, at(10)), Due::Stale, "a duplicate entry is dropped");
        assert_eq!(lock.on_due(15 * SEC, at(15)), Due::Expired);
        assert_eq!(lock.expire(at(15), usize::MAX).len(), 1);
        assert_eq!(lock.on_due(15 * SEC, at(15)), Due::Vacant);
    }

    #[test]
    fn a_value_that_arrived_under_a_new_name_trusts_only_the_entry_made_for_that_name() {
        // ACQUIRE 1 s, RENEW 60 s, RENAME, RENEW 2 s: the 2 s deadline needs its own entry.
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        granted(&mut lock, b"A", 1_000, at(0), &mut fences);
        assert_eq!(lock.needs_index_entry(at(0)), Some(SEC));
        assert_eq!(lock.renew(b"A", 60_000, at(0), Rules::default()), Renewal::Renewed);
        assert_eq!(lock.needs_index_entry(at(0)), None);
        // The rename handler inserts an entry for the new name and records it.
        lock.note_index_entry(lock.index_deadline());
        assert_eq!(lock.renew(b"A", 2_000, at(0), Rules::default()), Renewal::Renewed);
        assert_eq!(lock.needs_index_entry(at(0)), Some(2 * SEC), "a shorter deadline is indexed");
    }

    #[test]
    fn the_pending_index_entry_outlives_the_lease_that_recorded_it() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        assert_eq!(lock.needs_index_entry(at(0)), Some(10 * SEC));
        assert!(lock.release(b"A", at(1)).is_some());
        assert_eq!(lock.pending_index_entry(at(1)), Some(10 * SEC), "for the release to forget");
        granted(&mut lock, b"B", 20_000, at(2), &mut fences);
        assert_eq!(lock.needs_index_entry(at(2)), None, "the entry at 10 s comes first");
        // A lease that comes with a record of its own (restored, replicated) takes the lock's.
        let lease = Lease::new(b"C", 9, 30_000, at(3));
        lease.note_scheduled(Some(31 * SEC));
        lock.put(lease);
        assert_eq!(lock.pending_index_entry(at(3)), Some(10 * SEC));
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_lock_with_a_uuid_token_is_one_80_byte_allocation() {
        assert_eq!(std::mem::size_of::<Lock>(), 80, "a jemalloc size class; 96 is the next");
        // As the module's clock reads: its monotonic clock is shifted to Unix time at load.
        let now = Now { mono: at(0).wall, wall: at(0).wall };
        let lease = Lease::new(&[b'u'; 36], 1, 1_000, now);
        assert_eq!(lease.token.heap_bytes(), 0);
    }

    #[test]
    fn a_copied_or_moved_value_indexes_itself_again() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        granted(&mut lock, b"A", 10_000, at(0), &mut fences);
        assert_eq!(lock.needs_index_entry(at(0)), Some(10 * SEC));
        let copy = lock.copied();
        assert_eq!(copy.holders().next(), None, "a lease never travels to another name");
        assert!(copy.is_vacant(at(0)));
        assert_eq!(copy.index_deadline(), 0, "the empty copy is due at once");
        assert_eq!(lock.needs_index_entry(at(0)), None);
        lock.enqueue(waiter(1, b"B", None));
        let (leases, waiters) = lock.displace();
        assert_eq!(leases.iter().map(|l| l.fence).collect::<Vec<_>>(), [at(0).wall]);
        assert_eq!(waiters.iter().map(|w| w.id).collect::<Vec<_>>(), [1]);
        assert!(lock.is_vacant(at(0)));
        assert_eq!(Lock::default().index_deadline(), 0, "an empty lock is due at once");
    }

    #[test]
    fn a_line_that_a_crowd_left_gives_its_memory_back() {
        let mut lock = Lock::default();
        let tokens: Vec<Vec<u8>> = (0..2_000u64).map(|i| format!("w{i}").into_bytes()).collect();
        for (id, token) in (1..).zip(&tokens) {
            assert_eq!(lock.enqueue(waiter(id, token, None)), None);
        }
        // Its indexes are B-trees: each removal frees what it emptied, with no rehash.
        let crowd = lock.heap_bytes();
        for id in 1..=1_990 {
            assert!(lock.remove_waiter(id));
        }
        assert!(lock.heap_bytes() * 100 < crowd, "{} of {crowd} bytes kept", lock.heap_bytes());
        assert!(lock.indexes_agree());
        let order: Vec<u64> = lock.waiters().map(|w| w.id).collect();
        assert_eq!(order, (1_991..=2_000).collect::<Vec<_>>(), "the rest keep their order");
        assert_eq!(lock.queued(b"w1995").map(|w| w.id), Some(1_996), "and are found by token");
    }
}
