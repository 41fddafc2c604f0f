//! Every operation on a lock as the server runs it, returning what changed as values.
//!
//! A [`Step`] is one decision on one lock at one instant. Its operations bring the lock up to
//! date first (gone waiters leave, an expired lease ends, the head of the queue takes a free
//! lease), then do what was asked, and record each change as a [`Transition`]. The glue applies
//! the transitions in one place (replication and AOF, events, log lines, metrics, answers to
//! blocked clients, timers, key deletion); nothing else writes those. The property tests in
//! `model_tests.rs` run these same operations against a reference model.

use super::fence::FenceCounter;
use super::lock::{Acquired, Admission, Lease, Lock, Renewal, Rules, Waiter};
use super::mode::Mode;
use super::token::Token;
use super::{DlockError, Micros, Now};

/// What the lock logic needs to ask of the server it runs in.
pub trait Host {
    /// Whether waiter `id` still waits for its answer (connected, not timed out, not unblocked).
    fn waiter_alive(&self, id: u64) -> bool;
}

/// One change of a lock, or one refused request, in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// ACQUIRE granted a new lease (one of the lock's leases now) with a fresh fence.
    Granted {
        /// The new fence.
        fence: u64,
    },
    /// The holder's ACQUIRE kept its grant (same fence) and moved the deadline.
    Reacquired {
        /// The grant's fence.
        fence: u64,
    },
    /// The holder's RENEW set the deadline of its lease anew (and counted a renewal).
    Renewed {
        /// The renewed grant's fence.
        fence: u64,
        /// The deadline changed (a RENEW landing on the very microsecond of the old deadline
        /// leaves it where it was): what lets a copy count the renewal from the deadline alone.
        moved: bool,
    },
    /// The holder of a lease handed over with a claim window claimed it (its first RENEW or
    /// repeated ACQUIRE); the `Renewed` or `Reacquired` that did it follows.
    Claimed {
        /// The claimed grant's fence.
        fence: u64,
    },
    /// The holder released this lease.
    Released(Lease),
    /// This lease reached its deadline.
    Expired(Lease),
    /// `DLOCK.REVOKE` ended this lease, for `reason` (empty when none was given).
    Revoked {
        /// The lease, ended.
        lease: Lease,
        /// The operator's reason.
        reason: Box<[u8]>,
    },
    /// A new lease (one of the lock's leases now) was handed to the head of the queue.
    HandedOver {
        /// The waiter that now holds it.
        waiter: u64,
        /// The fence minted for it.
        fence: u64,
        /// How long it waited, in µs.
        waited: Micros,
        /// It was a ticket: nobody is blocked to answer; its next ACQUIRE learns the fence.
        ticket: bool,
        /// The ticket's `NOTIFY request`: its own channel hears of the grant.
        notify: Option<u64>,
    },
    /// A lease handed to a waiter whose reply never arrived was taken back.
    GrantUndone(Lease),
    /// A client joined the queue.
    Queued {
        /// The blocked client.
        waiter: u64,
    },
    /// A token took a place in the queue with a ticket (`QUEUE`), or refreshed its ticket.
    Ticketed {
        /// Whether it was already in line (a refresh).
        refreshed: bool,
    },
    /// A ticket was not refreshed in time and left the queue.
    TicketLapsed {
        /// The token whose ticket lapsed.
        token: Box<[u8]>,
    },
    /// A RELEASE without `FENCE` by a token that held no lease but a ticket: the ticket left
    /// the queue (its holder gave up waiting).
    TicketWithdrawn {
        /// The token whose ticket left.
        token: Box<[u8]>,
    },
    /// A set's ticket heading the line left it: its `DLOCK.ACQUIREALL` is granted the lock (the
    /// grant follows as its own transition).
    SetTicketUsed {
        /// How long the ticket stood in line.
        waited: Micros,
    },
    /// A blocked client's place was taken by a newer wait or a ticket of the same token: it is
    /// answered nil. Only a client still waiting is reported (one whose wait already ended,
    /// counted where it ended, simply leaves the line).
    Superseded {
        /// The blocked client to answer.
        waiter: u64,
    },
    /// A ticket left the line with no turn: a blocked wait of its token took its place, or its
    /// key moved away (RENAME, MOVE).
    TicketDismissed {
        /// The token whose ticket left.
        token: Box<[u8]>,
    },
    /// The lock's value moved to another key name (RENAME, MOVE): this lease ended there.
    Displaced(Lease),
    /// A blocked client whose key moved away (RENAME, MOVE) left the line: it is answered nil.
    /// Only a client still waiting is reported.
    Dismissed {
        /// The blocked client to answer.
        waiter: u64,
    },
    /// A request was refused; nothing changed.
    Refused(Refusal),
    /// The lock was free for the head of its queue, but no fence could be minted.
    HandOverFailed(DlockError),
    /// A settle made [`SETTLE_GRANTS_MAX`] hand-overs and the head of the line may still pass,
    /// or ended [`SETTLE_EXPIRE_MAX`] leases and more have expired: the rest follow on the timer's
    /// next turns (no one command or timer turn does a crowd's work at once). Nothing changed
    /// by itself.
    MoreToSettle,
}

/// Most hand-overs one settle makes (a release before a crowd of shared requests, the end of a
/// write pause): about a millisecond of grants, replication and messages.
pub const SETTLE_GRANTS_MAX: usize = 256;
/// Most leases one settle ends (a crowd of shared leases with one deadline, the end of a write
/// pause over them): each is replicated and announced on its own.
pub const SETTLE_EXPIRE_MAX: usize = 512;

impl Transition {
    /// Whether the lock's lease changed (what replicas and the AOF must learn).
    pub fn changes_lease(&self) -> bool {
        !matches!(
            self,
            Self::Queued { .. }
                | Self::Ticketed { .. }
                | Self::TicketLapsed { .. }
                | Self::TicketWithdrawn { .. }
                | Self::TicketDismissed { .. }
                | Self::SetTicketUsed { .. }
                | Self::Claimed { .. }
                | Self::Superseded { .. }
                | Self::Dismissed { .. }
                | Self::Refused(_)
                | Self::HandOverFailed(_)
                | Self::MoreToSettle
        )
    }
}

/// Why a request changed nothing, with who held the lease at that moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// ACQUIRE found the lock held or queued for, and did not wait.
    Contended,
    /// RENEW by a token that holds no live lease here (or none with the `FENCE` it gave).
    RenewNotHeld {
        /// The token that asked.
        token: Token,
        /// The live lease's holder, if any.
        holder: Option<Token>,
        /// The `FENCE` given and the fence of the live lease the token does hold, when it holds
        /// one under another fence (a late request for an earlier grant).
        wrong_fence: Option<(u64, u64)>,
    },
    /// RENEW that would carry the lease past `dlock.max-hold-ms`.
    RenewPastMaxHold {
        /// The holder that asked.
        token: Token,
        /// How long it has held the lease, in ms.
        held_ms: u64,
    },
    /// RELEASE by a token that holds no live lease here (or none with the `FENCE` it gave).
    ReleaseNotOwner {
        /// The token that asked.
        token: Token,
        /// The live lease's holder, if any.
        holder: Option<Token>,
        /// The `FENCE` given and the fence of the live lease the token does hold, when it holds
        /// one under another fence (a late request for an earlier grant).
        wrong_fence: Option<(u64, u64)>,
    },
}

/// What one step changed, in order: kept in place for the one or two transitions almost every
/// command makes (a grant, a release, a renewal), so a command allocates nothing for them.
pub type Changes = smallvec::SmallVec<[Transition; 2]>;

/// One decision on one lock at one instant.
pub struct Step<'a, H: Host + ?Sized> {
    now: Now,
    rules: Rules,
    fences: &'a mut FenceCounter,
    host: &'a H,
    changes: Changes,
}

impl<'a, H: Host + ?Sized> Step<'a, H> {
    /// A step at `now` under `rules`, minting from `fences`, asking `host` about waiters.
    pub fn new(now: Now, rules: Rules, fences: &'a mut FenceCounter, host: &'a H) -> Self {
        Self { now, rules, fences, host, changes: Changes::new() }
    }

    /// The instant this step decides at.
    pub fn now(&self) -> Now {
        self.now
    }

    /// What changed, in order. Apply them even when an operation returned an error: the
    /// changes made before the error stand.
    pub fn into_changes(self) -> Changes {
        self.changes
    }

    /// Brings `lock` up to date: an expired lease ends, and a free lock passes to the first
    /// waiter that still waits (waiters ahead of it that are gone leave the queue).
    pub fn settle(&mut self, lock: &mut Lock) -> Result<(), DlockError> {
        // Without a line there is nobody to hand over to: at most an ended lease to take out
        // (no vectors built, no line walked; most settles, an expiry's too).
        if lock.has_no_line() {
            self.changes.extend(lock.take_ended(self.now).map(Transition::Expired));
            return Ok(());
        }
        let lapsed = lock.drop_lapsed_tickets(self.now);
        self.changes.extend(
            lapsed.into_iter().map(|waiter| Transition::TicketLapsed { token: waiter.token }),
        );
        let expired = lock.expire(self.now, SETTLE_EXPIRE_MAX);
        self.changes.extend(expired.into_iter().map(Transition::Expired));
        if lock.has_expired(self.now) {
            // The rest end on the timer's next turns; nothing is handed over before they have.
            self.changes.push(Transition::MoreToSettle);
            return Ok(());
        }
        let host = self.host;
        // Every compatible request at the head is granted: readers together, one writer alone;
        // a crowd of them over several turns, none passing the line meanwhile.
        for _ in 0..SETTLE_GRANTS_MAX {
            let Some(handed) =
                lock.hand_over(self.now, self.fences, self.rules, |w| host.waiter_alive(w.id))?
            else {
                return Ok(());
            };
            self.changes.push(Transition::HandedOver {
                waiter: handed.waiter,
                fence: handed.fence,
                waited: handed.waited,
                ticket: handed.ticket,
                notify: handed.notify,
            });
        }
        if lock.head_may_pass(self.now) {
            self.changes.push(Transition::MoreToSettle);
        }
        Ok(())
    }

    /// [`Step::settle`] after the request was done: a failed hand-over is reported as a
    /// transition, not as the request's error.
    pub fn settle_after(&mut self, lock: &mut Lock) {
        if let Err(error) = self.settle(lock) {
            self.changes.push(Transition::HandOverFailed(error));
        }
    }

    /// Waiters `ids` left (timed out, disconnected, unblocked): they leave the line, each in
    /// O(log n), and the lock settles.
    pub fn leave(&mut self, lock: &mut Lock, ids: &[u64]) {
        for &id in ids {
            lock.remove_waiter(id);
        }
        self.settle_after(lock);
    }

    /// ACQUIRE of an exclusive lease without metadata: see [`Step::acquire_as`].
    pub fn acquire(
        &mut self,
        lock: &mut Lock,
        token: &[u8],
        ttl_ms: u64,
    ) -> Result<Acquired, DlockError> {
        self.acquire_as(lock, token, ttl_ms, Mode::Exclusive, None)
    }

    /// ACQUIRE: settles, then grants in `mode`, re-acquires for the holder, or refuses (nothing
    /// changes; the caller then either queues with [`Step::enqueue`] or reports
    /// [`Step::contended`]).
    pub fn acquire_as(
        &mut self,
        lock: &mut Lock,
        token: &[u8],
        ttl_ms: u64,
        mode: Mode,
        meta: Option<&[u8]>,
    ) -> Result<Acquired, DlockError> {
        let admission = self.admission(lock, token, mode)?;
        self.take(lock, admission, token, ttl_ms, mode, meta)
    }

    /// Carries out an `admission` of `token` just decided on this lock, and records the
    /// outcome's transitions.
    #[inline]
    fn take(
        &mut self,
        lock: &mut Lock,
        admission: Admission,
        token: &[u8],
        ttl_ms: u64,
        mode: Mode,
        meta: Option<&[u8]>,
    ) -> Result<Acquired, DlockError> {
        // A holder's repeated ACQUIRE claims a hand-over made with a claim window (only a
        // holder re-acquires: a grant or a refusal has nothing to claim).
        let unclaimed = admission == Admission::Reacquire && self.unclaimed_by(lock, token, None);
        let (now, rules) = (self.now, self.rules);
        let outcome =
            lock.take_admitted(admission, token, ttl_ms, mode, meta, now, self.fences, rules)?;
        if let (true, Acquired::Reacquired { fence }) = (unclaimed, &outcome) {
            self.changes.push(Transition::Claimed { fence: *fence });
        }
        match outcome {
            Acquired::Granted { fence, .. } => self.changes.push(Transition::Granted { fence }),
            Acquired::Reacquired { fence } => {
                self.changes.push(Transition::Reacquired { fence });
            }
            Acquired::Busy | Acquired::GrantsHeld => {}
        }
        Ok(outcome)
    }

    /// What an ACQUIRE would answer after the lock settles, granting nothing: the rule
    /// [`Step::acquire_as`] follows. `DLOCK.ACQUIREALL` asks [`Step::set_admission`] of every
    /// member first, then grants every member (each then answers what it said) or none.
    #[inline]
    pub fn admission(
        &mut self,
        lock: &mut Lock,
        token: &[u8],
        mode: Mode,
    ) -> Result<Admission, DlockError> {
        self.admit(lock, token, |lock, now, rules| lock.admission(token, mode, now, rules))
    }

    /// What `DLOCK.ACQUIREALL` may have of one member after the lock settles, granting nothing:
    /// [`Step::admission`], except that the token's own set ticket heading the line does not
    /// stand in its way.
    pub fn set_admission(
        &mut self,
        lock: &mut Lock,
        token: &[u8],
        mode: Mode,
    ) -> Result<Admission, DlockError> {
        self.admit(lock, token, |lock, now, rules| lock.set_admission(token, mode, now, rules))
    }

    /// Settles the lock, then asks `decide` unless expired leases are still ending.
    #[inline]
    fn admit(
        &mut self,
        lock: &mut Lock,
        token: &[u8],
        decide: impl FnOnce(&Lock, Now, Rules) -> Result<Admission, DlockError>,
    ) -> Result<Admission, DlockError> {
        self.settle(lock)?;
        if lock.has_expired(self.now) && lock.holder(token, self.now).is_none() {
            // Expired leases are still ending, a slice a turn: no new grant before they have
            // (it would end them unannounced). The request waits or is refused as if held.
            return Ok(Admission::Busy);
        }
        decide(lock, self.now, self.rules)
    }

    /// `DLOCK.ACQUIREALL`'s grant of one member, once every member admitted the set
    /// ([`Step::set_admission`]): the token's set ticket heading the line leaves it, then the
    /// member is granted (or re-acquired) as ACQUIRE grants.
    pub fn acquire_member(
        &mut self,
        lock: &mut Lock,
        token: &[u8],
        ttl_ms: u64,
        mode: Mode,
        meta: Option<&[u8]>,
    ) -> Result<Acquired, DlockError> {
        let admission = self.set_admission(lock, token, mode)?;
        if admission.grants()
            && let Some(ticket) = lock.take_set_ticket(token)
        {
            let waited = self.now.mono.saturating_sub(ticket.queued_at);
            self.changes.push(Transition::SetTicketUsed { waited });
        }
        self.take(lock, admission, token, ttl_ms, mode, meta)
    }

    /// What a RENEW would answer after the lock settles, renewing nothing: the same rule as
    /// [`Step::renew_grant`], asked of every member by `DLOCK.RENEWALL` first.
    pub fn renewal(
        &mut self,
        lock: &mut Lock,
        token: &[u8],
        fence: Option<u64>,
        ttl_ms: u64,
    ) -> Result<Renewal, DlockError> {
        self.settle(lock)?;
        Ok(lock.renewal(token, fence, ttl_ms, self.now, self.rules))
    }

    /// Whether `token` (with `fence`, when given) holds the live lease, handed over unclaimed.
    fn unclaimed_by(&self, lock: &Lock, token: &[u8], fence: Option<u64>) -> bool {
        lock.holder(token, self.now).is_some_and(|lease| unclaimed_grant(lease, fence))
    }

    /// An ACQUIRE that was refused and does not wait.
    pub fn contended(&mut self) {
        self.changes.push(Transition::Refused(Refusal::Contended));
    }

    /// ACQUIRE … WAIT: puts `waiter` in line; a blocked wait or a ticket of the same token gives
    /// up its place to it.
    pub fn enqueue(&mut self, lock: &mut Lock, waiter: Waiter) {
        let id = waiter.id;
        if let Some(replaced) = lock.enqueue(waiter) {
            self.left_the_line(replaced, |waiter| Transition::Superseded { waiter });
        }
        self.changes.push(Transition::Queued { waiter: id });
    }

    /// ACQUIRE … QUEUE: `waiter` (a ticket) takes `token`'s place in line, or the back of it;
    /// a token already in line with a ticket keeps its place and its ticket is refreshed, and a
    /// blocked wait of the token gives its place to a new ticket.
    pub fn enqueue_ticket(&mut self, lock: &mut Lock, waiter: Waiter) {
        let replaced = lock.enqueue(waiter);
        let refreshed = replaced.as_ref().is_some_and(|old| old.ticket_until.is_some());
        if let Some(blocked) = replaced.filter(|old| old.ticket_until.is_none()) {
            self.left_the_line(blocked, |waiter| Transition::Superseded { waiter });
        }
        self.changes.push(Transition::Ticketed { refreshed });
    }

    /// `token`'s ticket leaves the line (a set rejoining every line at the back).
    pub fn withdraw_ticket(&mut self, lock: &mut Lock, token: &[u8]) {
        if let Some(ticket) = lock.withdraw_ticket(token) {
            self.changes.push(Transition::TicketWithdrawn { token: ticket.token });
        }
    }

    /// `waiter` left the line with no turn: a ticket is dismissed; a blocked client still
    /// waiting is reported by `ended` (to be answered nil), and one whose wait already ended
    /// (time-out, disconnection, `CLIENT UNBLOCK`: counted where it ended, its prune still to
    /// come) is not reported again.
    fn left_the_line(&mut self, waiter: Waiter, ended: impl FnOnce(u64) -> Transition) {
        if waiter.ticket_until.is_some() {
            self.changes.push(Transition::TicketDismissed { token: waiter.token });
        } else if self.host.waiter_alive(waiter.id) {
            self.changes.push(ended(waiter.id));
        }
    }

    /// RENEW: settles (an expired lease passes on first: its old owner renews nothing), then
    /// moves the holder's deadline.
    pub fn renew(
        &mut self,
        lock: &mut Lock,
        token: &[u8],
        ttl_ms: u64,
    ) -> Result<Renewal, DlockError> {
        self.renew_grant(lock, token, None, ttl_ms)
    }

    /// RENEW with an optional `FENCE`: only the grant with that fence is renewed.
    pub fn renew_grant(
        &mut self,
        lock: &mut Lock,
        token: &[u8],
        fence: Option<u64>,
        ttl_ms: u64,
    ) -> Result<Renewal, DlockError> {
        self.settle(lock)?;
        // One look at the holder's lease before: whether it was handed over unclaimed, and
        // where its deadline stood.
        let (unclaimed, before) = lock.holder(token, self.now).map_or((false, None), |lease| {
            (unclaimed_grant(lease, fence), Some(lease.deadline_wall()))
        });
        let renewal = lock.renew_grant(token, fence, ttl_ms, self.now, self.rules);
        let mine = lock.holder(token, self.now);
        if unclaimed && renewal == Renewal::Renewed {
            self.changes.push(Transition::Claimed { fence: mine.map_or(0, |lease| lease.fence) });
        }
        self.changes.push(match renewal {
            Renewal::Renewed => Transition::Renewed {
                fence: mine.map_or(0, |lease| lease.fence),
                moved: mine.map(|lease| lease.deadline_wall()) != before,
            },
            Renewal::NotHeld => Transition::Refused(Refusal::RenewNotHeld {
                token: token.into(),
                holder: lock.live_lease(self.now).map(|lease| lease.token.clone()),
                wrong_fence: fence.zip(mine.map(|lease| lease.fence)),
            }),
            Renewal::PastMaxHold => Transition::Refused(Refusal::RenewPastMaxHold {
                token: token.into(),
                held_ms: mine.map_or(0, |lease| lease.held_ms(self.now)),
            }),
        });
        Ok(renewal)
    }

    /// RELEASE: settles (a lease handed on at its predecessor's deadline is its new holder's to
    /// release), the holder gives its live lease up, and the lock settles again (the head of the
    /// queue takes it). Returns whether `token` held it.
    pub fn release(&mut self, lock: &mut Lock, token: &[u8]) -> bool {
        self.release_grant(lock, token, None)
    }

    /// RELEASE with an optional `FENCE`: only the grant with that fence is released.
    pub fn release_grant(&mut self, lock: &mut Lock, token: &[u8], fence: Option<u64>) -> bool {
        self.settle_after(lock);
        let released = lock.release_grant(token, fence, self.now);
        let done = released.is_some();
        // Without FENCE, a token that only stands in line gives up its ticket; with FENCE the
        // call names a grant, and a late duplicate must not touch a later ticket of the token.
        let withdrawn = if done || fence.is_some() { None } else { lock.withdraw_ticket(token) };
        self.changes.push(match (released, withdrawn) {
            (Some(lease), _) => Transition::Released(lease),
            (None, Some(ticket)) => Transition::TicketWithdrawn { token: ticket.token },
            // Nothing changed: the holder named in the refusal is the one the call found.
            (None, None) => Transition::Refused(Refusal::ReleaseNotOwner {
                token: token.into(),
                holder: lock.live_lease(self.now).map(|lease| lease.token.clone()),
                wrong_fence: fence.zip(lock.holder(token, self.now).map(|lease| lease.fence)),
            }),
        });
        self.settle_after(lock);
        done
    }

    /// REVOKE: ends the live lease with `fence`, or without it every live lease (the exclusive
    /// one, or the oldest [`SETTLE_EXPIRE_MAX`] shared ones: a call is bounded like a settle),
    /// whoever holds it; then the lock settles (the head of the line takes it). Returns how many
    /// leases ended. Expired leases are ended as expired first, never as revoked.
    pub fn revoke(&mut self, lock: &mut Lock, fence: Option<u64>, reason: &[u8]) -> usize {
        self.settle_after(lock);
        let revoked = lock.revoke(fence, self.now, SETTLE_EXPIRE_MAX);
        let count = revoked.len();
        self.changes.extend(
            revoked.into_iter().map(|lease| Transition::Revoked { lease, reason: reason.into() }),
        );
        self.settle_after(lock);
        count
    }

    /// The lock's value arrived under another key name (RENAME, MOVE): its leases end, its
    /// blocked clients are dismissed and its tickets too. Nothing settles: the key is removed
    /// later, as a vacant one.
    pub fn displace(&mut self, lock: &mut Lock) {
        let (leases, waiters) = lock.displace();
        self.changes.extend(leases.into_iter().map(Transition::Displaced));
        for waiter in waiters {
            self.left_the_line(waiter, |waiter| Transition::Dismissed { waiter });
        }
    }

    /// Takes back the lease handed to a waiter whose reply never arrived, if it is still the
    /// live lease (`token` with `fence`); then settles.
    pub fn undo_grant(&mut self, lock: &mut Lock, token: &[u8], fence: u64) {
        if let Some(lease) = lock.release_grant(token, Some(fence), self.now) {
            self.changes.push(Transition::GrantUndone(lease));
        }
        self.settle_after(lock);
    }
}

/// Whether `lease` is the grant `fence` names (any, when none is given), handed over unclaimed.
fn unclaimed_grant(lease: &Lease, fence: Option<u64>) -> bool {
    lease.unclaimed() && fence.is_none_or(|f| f == lease.fence)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000;

    fn at(seconds: u64) -> Now {
        Now { mono: seconds * SEC, wall: 1_700_000_000 * SEC + seconds * SEC }
    }

    /// Every waiter is alive except those listed.
    struct Gone(&'static [u64]);

    impl Host for Gone {
        fn waiter_alive(&self, id: u64) -> bool {
            !self.0.contains(&id)
        }
    }

    fn waiter(id: u64, token: &[u8]) -> Waiter {
        Waiter {
            id,
            token: token.into(),
            ttl_ms: 10_000,
            gives_up_at: None,
            queued_at: 0,
            claim_ms: None,
            ticket_until: None,
            set: false,
            notify: None,
            mode: Mode::Exclusive,
            meta: None,
        }
    }

    fn step_at<'a>(now: Now, fences: &'a mut FenceCounter, host: &'a Gone) -> Step<'a, Gone> {
        Step::new(now, Rules::default(), fences, host)
    }

    #[test]
    fn a_release_with_a_waiter_reports_the_release_then_the_hand_over() {
        let (mut lock, mut fences, host) = (Lock::default(), FenceCounter::default(), Gone(&[]));
        let mut step = step_at(at(0), &mut fences, &host);
        assert_eq!(
            step.acquire(&mut lock, b"A", 10_000),
            Ok(Acquired::Granted { fence: at(0).wall, replaced_expired: false })
        );
        assert_eq!(*step.into_changes(), [Transition::Granted { fence: at(0).wall }]);
        let mut step = step_at(at(1), &mut fences, &host);
        assert_eq!(step.acquire(&mut lock, b"B", 10_000), Ok(Acquired::Busy));
        step.enqueue(&mut lock, waiter(7, b"B"));
        assert_eq!(*step.into_changes(), [Transition::Queued { waiter: 7 }]);
        let mut step = step_at(at(2), &mut fences, &host);
        assert!(step.release(&mut lock, b"A"));
        let changes = step.into_changes();
        assert!(matches!(&changes[0], Transition::Released(lease) if &*lease.token == b"A"));
        assert_eq!(
            changes[1],
            Transition::HandedOver {
                waiter: 7,
                fence: at(2).wall,
                waited: 2 * SEC,
                ticket: false,
                notify: None
            }
        );
        assert_eq!(changes.len(), 2);
        assert_eq!(lock.live_lease(at(2)).map(|l| &*l.token), Some(&b"B"[..]));
    }

    #[test]
    fn an_expired_lease_is_reported_before_the_renewal_it_refuses() {
        let (mut lock, mut fences, host) = (Lock::default(), FenceCounter::default(), Gone(&[]));
        step_at(at(0), &mut fences, &host).acquire(&mut lock, b"A", 1_000).expect("grant");
        let mut step = step_at(at(2), &mut fences, &host);
        assert_eq!(step.renew(&mut lock, b"A", 1_000), Ok(Renewal::NotHeld));
        let changes = step.into_changes();
        assert!(matches!(&changes[0], Transition::Expired(lease) if &*lease.token == b"A"));
        assert_eq!(
            changes[1],
            Transition::Refused(Refusal::RenewNotHeld {
                token: b"A"[..].into(),
                holder: None,
                wrong_fence: None
            })
        );
        assert!(changes[0].changes_lease() && !changes[1].changes_lease());
    }

    #[test]
    fn waiters_that_left_leave_the_line_and_a_superseded_wait_is_answered() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let alive = Gone(&[]);
        step_at(at(0), &mut fences, &alive).acquire(&mut lock, b"A", 10_000).expect("grant");
        let mut step = step_at(at(0), &mut fences, &alive);
        step.enqueue(&mut lock, waiter(1, b"B"));
        step.enqueue(&mut lock, waiter(2, b"C"));
        step.enqueue(&mut lock, waiter(3, b"B"));
        assert_eq!(step.into_changes()[2], Transition::Superseded { waiter: 1 });
        let gone = Gone(&[2]);
        let mut step = step_at(at(1), &mut fences, &gone);
        step.leave(&mut lock, &[2]);
        assert_eq!(*step.into_changes(), []);
        assert_eq!(lock.waiters().map(|w| w.id).collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn a_wait_dismisses_its_tokens_ticket_and_a_ticket_supersedes_its_tokens_wait() {
        let (mut lock, mut fences, host) = (Lock::default(), FenceCounter::default(), Gone(&[]));
        let ticket =
            |id, token: &[u8]| Waiter { ticket_until: Some(at(60).mono), ..waiter(id, token) };
        let mut step = step_at(at(0), &mut fences, &host);
        step.acquire(&mut lock, b"A", 10_000).expect("grant");
        step.enqueue_ticket(&mut lock, ticket(1, b"T"));
        step.enqueue(&mut lock, waiter(2, b"T"));
        step.enqueue_ticket(&mut lock, ticket(3, b"T"));
        step.enqueue_ticket(&mut lock, ticket(3, b"T"));
        assert_eq!(
            step.into_changes()[1..],
            [
                Transition::Ticketed { refreshed: false },
                Transition::TicketDismissed { token: b"T"[..].into() },
                Transition::Queued { waiter: 2 },
                Transition::Superseded { waiter: 2 },
                Transition::Ticketed { refreshed: false },
                Transition::Ticketed { refreshed: true },
            ]
        );
        assert_eq!(lock.tickets(), 1);
    }

    #[test]
    fn a_waiter_whose_wait_already_ended_is_neither_superseded_nor_dismissed_again() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let alive = Gone(&[]);
        let mut step = step_at(at(0), &mut fences, &alive);
        step.acquire(&mut lock, b"A", 10_000).expect("grant");
        step.enqueue(&mut lock, waiter(1, b"B"));
        step.enqueue(&mut lock, waiter(2, b"C"));
        step.enqueue_ticket(
            &mut lock,
            Waiter { ticket_until: Some(at(60).mono), ..waiter(3, b"D") },
        );
        let _ = step.into_changes();
        // 1 and 2 left (disconnected, timed out): counted where they ended, not yet pruned.
        let gone = Gone(&[1, 2]);
        let mut step = step_at(at(1), &mut fences, &gone);
        step.enqueue(&mut lock, waiter(4, b"B"));
        assert_eq!(*step.into_changes(), [Transition::Queued { waiter: 4 }]);
        let mut step = step_at(at(1), &mut fences, &gone);
        step.displace(&mut lock);
        let changes = step.into_changes();
        assert!(matches!(changes[0], Transition::Displaced(_)), "{changes:?}");
        assert_eq!(
            changes[1..],
            [
                Transition::Dismissed { waiter: 4 },
                Transition::TicketDismissed { token: b"D"[..].into() },
            ],
            "in line order, without 2, whose wait had ended"
        );
        assert!(lock.is_vacant(at(1)));
    }

    #[test]
    fn a_claim_is_reported_once_when_the_holder_first_renews() {
        let (mut lock, mut fences, host) = (Lock::default(), FenceCounter::default(), Gone(&[]));
        step_at(at(0), &mut fences, &host).acquire(&mut lock, b"A", 1_000).expect("grant");
        let mut step = step_at(at(0), &mut fences, &host);
        step.enqueue(&mut lock, Waiter { claim_ms: Some(500), ..waiter(7, b"B") });
        let mut step = step_at(at(1), &mut fences, &host);
        step.settle(&mut lock).expect("hand over");
        let mut step = step_at(at(1), &mut fences, &host);
        assert_eq!(step.renew(&mut lock, b"B", 10_000), Ok(Renewal::Renewed));
        let fence = at(1).wall;
        assert_eq!(
            *step.into_changes(),
            [Transition::Claimed { fence }, Transition::Renewed { fence, moved: true }]
        );
        let mut step = step_at(at(2), &mut fences, &host);
        assert_eq!(step.renew(&mut lock, b"B", 10_000), Ok(Renewal::Renewed));
        assert_eq!(
            *step.into_changes(),
            [Transition::Renewed { fence, moved: true }],
            "claimed once"
        );
    }

    #[test]
    fn a_ticket_keeps_its_place_while_refreshed_is_granted_with_a_claim_window_and_lapses() {
        let (mut lock, mut fences, host) = (Lock::default(), FenceCounter::default(), Gone(&[]));
        step_at(at(0), &mut fences, &host).acquire(&mut lock, b"A", 5_000).expect("grant");
        let ticket = |id, token: &[u8], until| Waiter {
            ticket_until: Some(until),
            set: false,
            notify: None,
            claim_ms: Some(2_000),
            ..waiter(id, token)
        };
        let mut step = step_at(at(0), &mut fences, &host);
        step.enqueue_ticket(&mut lock, ticket(1, b"B", at(3).mono));
        step.enqueue_ticket(&mut lock, ticket(2, b"C", at(3).mono));
        step.enqueue_ticket(&mut lock, ticket(3, b"B", at(6).mono));
        assert_eq!(
            *step.into_changes(),
            [
                Transition::Ticketed { refreshed: false },
                Transition::Ticketed { refreshed: false },
                Transition::Ticketed { refreshed: true },
            ]
        );
        assert_eq!(lock.tickets(), 2);
        assert_eq!(lock.next_wake(), Some(at(3).mono), "C's ticket lapses first");
        // C stops refreshing: at 3 s it leaves; B, refreshed, is still first in line.
        let mut step = step_at(at(3), &mut fences, &host);
        step.settle(&mut lock).expect("settle");
        assert_eq!(*step.into_changes(), [Transition::TicketLapsed { token: b"C"[..].into() }]);
        assert_eq!(lock.waiters().map(|w| &*w.token).collect::<Vec<_>>(), [&b"B"[..]]);
        // A's lease ends at 5 s: B's ticket is granted with its claim window.
        let mut step = step_at(at(5), &mut fences, &host);
        step.settle(&mut lock).expect("settle");
        let changes = step.into_changes();
        assert!(matches!(changes[1], Transition::HandedOver { ticket: true, .. }), "{changes:?}");
        let lease = lock.live_lease(at(5)).expect("B holds");
        assert_eq!(
            (&*lease.token, lease.deadline_mono(), lease.unclaimed()),
            (&b"B"[..], 7 * SEC, true)
        );
    }

    #[test]
    fn a_lost_grant_is_undone_only_while_it_is_the_live_lease() {
        let (mut lock, mut fences, host) = (Lock::default(), FenceCounter::default(), Gone(&[]));
        let mut step = step_at(at(0), &mut fences, &host);
        step.acquire(&mut lock, b"A", 10_000).expect("grant");
        let fence = at(0).wall;
        let mut step = step_at(at(1), &mut fences, &host);
        step.undo_grant(&mut lock, b"A", fence + 1);
        assert_eq!(*step.into_changes(), [], "another grant's lease stays");
        let mut step = step_at(at(1), &mut fences, &host);
        step.undo_grant(&mut lock, b"A", fence);
        assert!(matches!(&step.into_changes()[..], [Transition::GrantUndone(_)]));
        assert!(lock.is_vacant(at(1)));
    }

    #[test]
    fn a_release_without_fence_withdraws_a_ticket_and_with_a_fence_does_not() {
        let (mut lock, mut fences, host) = (Lock::default(), FenceCounter::default(), Gone(&[]));
        let mut step = step_at(at(0), &mut fences, &host);
        step.acquire(&mut lock, b"A", 10_000).expect("granted");
        let ticket = Waiter { ticket_until: Some(at(60).mono), ..waiter(1, b"B") };
        step.enqueue_ticket(&mut lock, ticket);
        let _ = step.into_changes();
        let mut step = step_at(at(1), &mut fences, &host);
        assert!(!step.release_grant(&mut lock, b"B", Some(1)));
        assert_eq!(lock.tickets(), 1, "a fenced release names a grant, never a ticket");
        assert!(!step.release(&mut lock, b"B"));
        assert_eq!(lock.tickets(), 0);
        let changes = step.into_changes();
        assert!(
            matches!(changes.last(), Some(Transition::TicketWithdrawn { token }) if &**token == b"B")
        );
    }

    #[test]
    fn a_set_ticket_heading_the_line_is_never_handed_the_lease_and_holds_the_line_for_its_set() {
        let (mut lock, mut fences, host) = (Lock::default(), FenceCounter::default(), Gone(&[]));
        let mut step = step_at(at(0), &mut fences, &host);
        step.acquire(&mut lock, b"A", 10_000).expect("granted");
        let set = Waiter { ticket_until: Some(at(60).mono), set: true, ..waiter(1, b"S") };
        step.enqueue_ticket(&mut lock, set);
        step.enqueue(&mut lock, waiter(2, b"B"));
        let _ = step.into_changes();
        let mut step = step_at(at(1), &mut fences, &host);
        assert!(step.release(&mut lock, b"A"));
        let changes = step.into_changes();
        assert!(
            !changes.iter().any(|c| matches!(c, Transition::HandedOver { .. })),
            "neither the set's ticket nor the waiter behind it is handed the lease: {changes:?}"
        );
        assert!(!lock.head_may_pass(at(1)), "and the timer has nothing to do for it");
        let mut step = step_at(at(1), &mut fences, &host);
        assert_eq!(step.admission(&mut lock, b"B", Mode::Exclusive), Ok(Admission::Busy));
        assert_eq!(step.set_admission(&mut lock, b"S", Mode::Exclusive), Ok(Admission::Grant));
        let granted = step.acquire_member(&mut lock, b"S", 10_000, Mode::Exclusive, None);
        assert!(matches!(granted, Ok(Acquired::Granted { .. })));
        let changes = step.into_changes();
        assert!(matches!(changes[0], Transition::SetTicketUsed { waited } if waited == SEC));
        assert_eq!(lock.waiters().map(|w| w.id).collect::<Vec<_>>(), [2], "B is next in line");
    }
}
