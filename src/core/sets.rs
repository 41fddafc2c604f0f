//! The rules of `DLOCK.ACQUIREALL` over a set's locks, however they are reached: the module
//! reaches each member through its Redis key (decided and applied one at a time, all within one
//! command), the tests through plain values.
//!
//! Every member is first asked what an ACQUIRE would answer ([`Step::set_admission`]); when all
//! would grant, each is granted ([`Step::acquire_member`]), else none is: the set is refused
//! (counted once), or with `QUEUE` its ticket takes or keeps a place in every member's line.

use super::lock::Waiter;
use super::mode::Mode;
use super::{Acquired, DlockError, Host, Lock, Micros, Step};

/// A set's locks, one decision at a time.
pub trait Members {
    /// Who answers whether a waiter still waits.
    type Host: Host;
    /// What reaching a member can fail with besides a [`DlockError`].
    type Error: From<DlockError>;

    /// How many members the set has.
    fn count(&self) -> usize;

    /// Decides `op` on member `index`'s lock (an empty lock when it has none) and makes the
    /// changes visible and durable.
    fn decide<T>(
        &mut self,
        index: usize,
        op: impl FnOnce(&mut Step<'_, Self::Host>, &mut Lock) -> T,
    ) -> Result<T, Self::Error>;

    /// A new ticket's id.
    fn new_ticket_id(&mut self) -> u64;
}

/// What `DLOCK.ACQUIREALL` asks for, once its arguments are read.
#[derive(Clone, Copy, Debug)]
pub struct SetRequest<'a> {
    /// The token every member is granted to.
    pub token: &'a [u8],
    /// Each member's lease length.
    pub ttl_ms: u64,
    /// Exclusive or shared, for every member.
    pub mode: Mode,
    /// `META`, stored with every member's lease.
    pub meta: Option<&'a [u8]>,
    /// `QUEUE ticket-ms`: the set waits in every member's line.
    pub queue_ms: Option<u64>,
}

/// How an `ACQUIREALL` ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetOutcome {
    /// Every member, with its fence, in the members' order.
    Granted(Vec<u64>),
    /// Not granted; nothing changed (counted as one refusal).
    Refused,
    /// Not granted; the set's ticket stands in every member's line.
    Queued,
    /// A member admitted the set, then refused it: a broken rule, reported rather than hidden
    /// (the members before it were granted).
    Inconsistent,
}

/// `DLOCK.ACQUIREALL` over `members`.
pub fn acquire_all<M: Members>(
    members: &mut M,
    request: &SetRequest<'_>,
) -> Result<SetOutcome, M::Error> {
    let (token, mode) = (request.token, request.mode);
    // Nothing runs between these decisions and the grants below (one command), so each grant
    // answers what its member said here.
    let mut refused = None;
    for index in 0..members.count() {
        let admission =
            members.decide(index, |step, lock| step.set_admission(lock, token, mode))??;
        if !admission.grants() && refused.is_none() {
            refused = Some(index);
        }
    }
    if let Some(index) = refused {
        return match request.queue_ms {
            Some(ticket_ms) => {
                queue(members, request, ticket_ms)?;
                Ok(SetOutcome::Queued)
            }
            None => {
                members.decide(index, |step, _| step.contended())?;
                Ok(SetOutcome::Refused)
            }
        };
    }
    let mut fences = Vec::with_capacity(members.count());
    for index in 0..members.count() {
        let outcome = members.decide(index, |step, lock| {
            step.acquire_member(lock, token, request.ttl_ms, mode, request.meta)
        })??;
        match outcome {
            Acquired::Granted { fence, .. } | Acquired::Reacquired { fence } => fences.push(fence),
            Acquired::Busy | Acquired::GrantsHeld => return Ok(SetOutcome::Inconsistent),
        }
    }
    Ok(SetOutcome::Granted(fences))
}

/// The set's ticket takes or keeps its place in every member's line. A set whose ticket is
/// missing from some line (it lapsed there, or the key was deleted) first leaves every line and
/// joins them all at the back: every two sets then stand in the same order in every line they
/// share, so the oldest set is never behind a younger one, and no two sets wait for each other.
fn queue<M: Members>(
    members: &mut M,
    request: &SetRequest<'_>,
    ticket_ms: u64,
) -> Result<(), M::Error> {
    let token = request.token;
    let mut in_line = 0;
    for index in 0..members.count() {
        let queued =
            members.decide(index, |_, lock| lock.queued(token).is_some_and(|waiter| waiter.set))?;
        in_line += usize::from(queued);
    }
    let rejoin = in_line != 0 && in_line != members.count();
    for index in 0..members.count() {
        let id = members.new_ticket_id();
        members.decide(index, |step, lock| {
            if rejoin {
                step.withdraw_ticket(lock, token);
            }
            let now = step.now();
            let ticket = ticket(
                lock,
                token,
                request.ttl_ms,
                request.mode,
                request.meta,
                None,
                ticket_ms,
                true,
                now.mono,
                id,
            );
            step.enqueue_ticket(lock, ticket);
        })?;
    }
    Ok(())
}

/// A ticket (`QUEUE ticket-ms`) of `token` for `lock`: a token already in line with a ticket
/// keeps its id and its place (`new_id` otherwise). `claim_ms` is the claim window of its turn;
/// a set's ticket (`set`) has no turn of its own.
#[allow(clippy::too_many_arguments)]
pub fn ticket(
    lock: &Lock,
    token: &[u8],
    ttl_ms: u64,
    mode: Mode,
    meta: Option<&[u8]>,
    claim_ms: Option<u64>,
    ticket_ms: u64,
    set: bool,
    now_mono: Micros,
    new_id: u64,
) -> Waiter {
    let (id, queued_at) = match lock.queued(token) {
        Some(waiter) if waiter.ticket_until.is_some() => (waiter.id, waiter.queued_at),
        _ => (new_id, now_mono),
    };
    Waiter {
        id,
        token: token.into(),
        ttl_ms,
        gives_up_at: None,
        queued_at,
        claim_ms,
        ticket_until: Some(now_mono.saturating_add(ticket_ms.saturating_mul(1_000))),
        set,
        mode,
        meta: meta.map(Into::into),
        notify: None,
    }
}
