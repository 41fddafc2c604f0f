//! What a decision means to the world outside the lock, as values.
//!
//! A [`Step`](super::Step) changes a lock and records [`Transition`]s; [`plan`] turns the lock
//! and those transitions into [`Effect`]s in the one order every caller performs them: counters,
//! then per transition its keyspace event, channel message, log line or answer to a blocked
//! client, then what replicas and the AOF must learn, key deletion and the expiry index. The glue
//! (`apply.rs`) performs each effect with one call into the server and decides nothing; the
//! replica-side commands plan through [`plan_replicated`] and are performed by the same executor.
//! So the rules of replication, deletion and scheduling are tested here, without a server, and
//! the model test (`model_tests.rs`) follows the effects instead of copying the rules.

use super::args::printable;
use super::step::{Refusal, Transition};
use super::watch::Watch;
use super::{DlockError, Lease, Lock, Micros, Now};

/// An ownership change, as its keyspace event and channel message name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A new lease was granted.
    Acquired,
    /// The holder moved its deadline (RENEW, or ACQUIRE by the holder).
    Renewed,
    /// The holder released the lease.
    Released,
    /// The lease ended at its deadline, nobody having released it.
    Expired,
    /// The lease was handed to the head of the queue.
    Handoff,
    /// `DLOCK.REVOKE` ended the lease.
    Revoked,
}

impl Event {
    /// The keyspace event (module class).
    pub fn event(self) -> &'static std::ffi::CStr {
        match self {
            Self::Acquired => c"dlock.acquired",
            Self::Renewed => c"dlock.renewed",
            Self::Released => c"dlock.released",
            Self::Expired => c"dlock.expired",
            Self::Handoff => c"dlock.handoff",
            Self::Revoked => c"dlock.revoked",
        }
    }

    /// The word its channel message starts with.
    pub fn word(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Renewed => "renewed",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::Handoff => "handoff",
            Self::Revoked => "revoked",
        }
    }

    /// The verb of its log line.
    pub fn verb(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Renewed => "renewed",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::Handoff => "handed over",
            Self::Revoked => "revoked",
        }
    }
}

/// How a log line is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// At `verbose`, formatted only when the server logs verbose lines.
    Verbose,
    /// At `notice`, rate-limited: something is wrong with a client or a clock.
    Anomaly,
    /// At `warning`.
    Warning,
}

/// A log line about a lock, as data: formatted only when the server writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLine<'a> {
    /// A lease handed over with a claim window was claimed by its holder.
    Claimed(&'a Lease),
    /// A RELEASE took a ticket out of the line.
    TicketWithdrawn(&'a [u8]),
    /// A ticket was not refreshed in time.
    TicketLapsed(&'a [u8]),
    /// A lease handed over with a claim window lapsed unclaimed.
    LapsedUnclaimed(&'a Lease),
    /// A lease reached its deadline while its holder may still work.
    ExpiredUnderHolder(&'a Lease),
    /// A hand-over whose reply was lost was taken back.
    GrantUndone(&'a Lease),
    /// The lock's value moved to another name: this lease ended.
    Displaced(&'a Lease),
    /// `DLOCK.REVOKE` ended this lease.
    Revoked {
        /// The lease it ended.
        lease: &'a Lease,
        /// The reason given (may be empty).
        reason: &'a [u8],
    },
    /// A RENEW by a token other than the holder.
    RenewNotHeld {
        /// The token that asked.
        token: &'a [u8],
        /// The lease's holder.
        holder: &'a [u8],
    },
    /// A RENEW past `dlock.max-hold-ms`.
    RenewPastMaxHold {
        /// The holder that asked.
        token: &'a [u8],
        /// How long it has held the lease.
        held_ms: u64,
    },
    /// A RELEASE by a token other than the holder.
    ReleaseNotOwner {
        /// The token that asked.
        token: &'a [u8],
        /// The lease's holder.
        holder: &'a [u8],
    },
    /// A RENEW or RELEASE by a holder whose `FENCE` names another (an earlier) grant.
    WrongFence {
        /// `"renewal"` or `"release"`.
        request: &'static str,
        /// The token that asked.
        token: &'a [u8],
        /// The fence it gave.
        asked: u64,
        /// The fence of the lease it holds.
        holds: u64,
    },
    /// The head of the line could not be handed the free lock.
    HandOverFailed(&'a DlockError),
}

impl LogLine<'_> {
    /// How the line is written.
    pub fn level(&self) -> LogLevel {
        match self {
            Self::Claimed(_) | Self::TicketWithdrawn(_) => LogLevel::Verbose,
            Self::HandOverFailed(_) => LogLevel::Warning,
            _ => LogLevel::Anomaly,
        }
    }

    /// The line about the lock at key `resource`, `key=value` fields greppable.
    pub fn text(&self, resource: &[u8]) -> String {
        let resource = printable(resource);
        match self {
            Self::Claimed(lease) => format!(
                "lease claimed resource={resource} owner={} fence={}",
                printable(&lease.token),
                lease.fence
            ),
            Self::TicketWithdrawn(token) => {
                format!("ticket withdrawn resource={resource} token={}", printable(token))
            }
            Self::TicketLapsed(token) => format!(
                "ticket lapsed (not refreshed in time) resource={resource} token={}",
                printable(token)
            ),
            Self::LapsedUnclaimed(lease) => format!(
                "grant lapsed unclaimed (its claim window ended) resource={resource} owner={} fence={}",
                printable(&lease.token),
                lease.fence
            ),
            Self::ExpiredUnderHolder(lease) => format!(
                "lease expired under its holder resource={resource} owner={} fence={} held-ms={} renewals={}",
                printable(&lease.token),
                lease.fence,
                lease.deadline_mono().saturating_sub(lease.granted_mono()) / 1_000,
                lease.renewals()
            ),
            Self::GrantUndone(lease) => format!(
                "lease released: its waiter left before the reply resource={resource} owner={} fence={}",
                printable(&lease.token),
                lease.fence
            ),
            Self::Revoked { lease, reason } => format!(
                "lease revoked resource={resource} owner={} fence={} reason={}",
                printable(&lease.token),
                lease.fence,
                printable(reason)
            ),
            Self::Displaced(lease) => format!(
                "lease ended: its key was renamed or moved to resource={resource} owner={} fence={}",
                printable(&lease.token),
                lease.fence
            ),
            Self::RenewNotHeld { token, holder } => format!(
                "renewal refused (not the owner) resource={resource} token={} holder={}",
                printable(token),
                printable(holder)
            ),
            Self::RenewPastMaxHold { token, held_ms } => format!(
                "renewal refused (past dlock.max-hold-ms) resource={resource} token={} held-ms={held_ms}",
                printable(token)
            ),
            Self::ReleaseNotOwner { token, holder } => format!(
                "release by a non-owner refused resource={resource} token={} holder={}",
                printable(token),
                printable(holder)
            ),
            Self::WrongFence { request, token, asked, holds } => format!(
                "{request} refused (FENCE names another grant of this token) resource={resource} token={} fence={asked} holds={holds}",
                printable(token)
            ),
            Self::HandOverFailed(error) => format!("dlock: hand-over failed: {error}"),
        }
    }
}

/// One thing the outside world must see of a decision on one lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect<'a> {
    /// Count the transition in the module's counters.
    Count(&'a Transition),
    /// Note this about the lock in the watched locks (`DLOCK.TOP`, `DLOCK.INFO`'s percentiles).
    Watch(Watch),
    /// Block the client of this command: it joined the line as waiter `waiter` (its answer
    /// comes from a hand-over or its time-out, which the timer must now look for).
    Block {
        /// The waiter id the client was registered under.
        waiter: u64,
    },
    /// The keyspace event and verbose log line of `lease`'s change; also its channel message
    /// when `publish` (every change but a renewal, which subscribers need not wake for).
    Event {
        /// The change.
        what: Event,
        /// The lease as it is now (or as it ended).
        lease: &'a Lease,
        /// Whether the resource's channel hears of it.
        publish: bool,
        /// What the channel message adds after the fence (a revocation's reason), if anything.
        detail: &'a [u8],
    },
    /// The ticket that asked with `NOTIFY request` was handed `lease`: its own channel hears
    /// of it (`granted <fence> <request> <window-ms>`).
    Granted {
        /// The lease it now holds, unclaimed.
        lease: &'a Lease,
        /// The number of the ticket's last refresh before the hand-over.
        request: u64,
    },
    /// A log line.
    Log(LogLine<'a>),
    /// Answer blocked client `waiter`: the lease it was handed (which the answer names, so the
    /// grant can be taken back if the reply is lost), or nil.
    Answer {
        /// The waiter to answer.
        waiter: u64,
        /// The lease handed to it; `None`: nil.
        grant: Option<&'a Lease>,
    },
    /// The grant with this fence was answered to its holder by a later command: a lost
    /// hand-over reply must not take it back any more.
    Confirm {
        /// The grant's fence.
        fence: u64,
    },
    /// Tell replicas and the AOF this lease as it now is (`DLOCK.SETLEASE`).
    ReplicateLease(&'a Lease),
    /// Tell replicas and the AOF this plain exclusive lease was renewed: its new deadline alone
    /// (`DLOCK.SETLEASE` without the history); each copy keeps the grant's history it holds and
    /// counts one renewal ([`replica::set_lease`](super::replica::set_lease)).
    ReplicateRenewal(&'a Lease),
    /// Tell replicas and the AOF this shared lease ended (`DLOCK.ENDLEASE`).
    ReplicateEnd(&'a Lease),
    /// Tell replicas and the AOF the key holds nothing (`DEL`).
    ReplicateDel,
    /// Delete the lock's key (and propagate the `DEL` when `propagate`); its index entry
    /// pending at `forget` may be dropped.
    DeleteKey {
        /// The deadline of the key's pending index entry.
        forget: Option<Micros>,
        /// Whether the deletion is propagated (a primary's decision), or the command that led
        /// to it travels as it is (a replicated effect).
        propagate: bool,
    },
    /// Index the key at this monotonic instant: the timer looks at it then.
    Index(Micros),
    /// Pass the command on to replicas and the AOF unchanged (a replicated effect's command,
    /// whose arguments are absolute).
    PassOn,
}

/// Where the decided lock is, which decides what may be done with its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Stored at its key. `indexes`: this server keeps the expiry index (a primary; replicas
    /// never expire on their own). `grants_held_until`: grants are held until this monotonic
    /// instant after a start (a queue without a lease looks again then).
    Stored {
        /// This server keeps the expiry index.
        indexes: bool,
        /// When held grants resume.
        grants_held_until: Micros,
    },
    /// A fresh lock that stayed vacant: it was never stored, so nothing is deleted or indexed.
    NotStored,
    /// Inside a keyspace notification (a value arrived under a new name): the server takes no
    /// write there, and the command that moved the value travels on its own, so the decision
    /// is counted, announced and answered, and the timer removes or indexes the key later.
    Notified,
}

/// The effects of `changes` on `lock` at `place`, in the order they are performed, each given
/// to `effect`.
pub fn plan<'a>(
    lock: &'a Lock,
    place: Place,
    changes: &'a [Transition],
    now: Now,
    mut effect: impl FnMut(Effect<'a>),
) {
    for change in changes {
        effect(Effect::Count(change));
        if let Some(watch) = watch(lock, change, changes, now) {
            effect(Effect::Watch(watch));
        }
        announce(lock, change, &mut effect);
    }
    let Place::Stored { indexes, grants_held_until } = place else {
        if place == Place::NotStored && changes.iter().any(Transition::changes_lease) {
            replicate(lock, changes, now, &mut effect);
        }
        return;
    };
    if lock.is_vacant(now) {
        let forget = lock.pending_index_entry(now);
        return effect(Effect::DeleteKey { forget, propagate: true });
    }
    if changes.iter().any(Transition::changes_lease) {
        replicate(lock, changes, now, &mut effect);
    }
    if !indexes {
        return;
    }
    if changes.iter().any(|change| matches!(change, Transition::MoreToSettle)) {
        // The rest of a crowd, decided by this one entry (another for the earliest, passed,
        // deadline as well would double the key's entries on every slice). Leases still to end
        // go on at once, after what came due before them, while the sweep's turn lasts; requests
        // at the head still to pass wait for the next millisecond: each grant answers a client,
        // and the server writes those answers after the turn, so a turn of several slices of
        // grants would hold every other client up for all their writes.
        let next =
            if lock.has_expired(now) { crate::core::expiry::due_now(now.mono) } else { now.mono };
        lock.note_index_entry(next);
        return effect(Effect::Index(next));
    }
    if let Some(deadline) = lock.needs_index_entry(now) {
        effect(Effect::Index(deadline));
    }
    if !lock.has_record() && lock.head_may_pass(now) {
        // A queue without a lease (grants held after start-up): look again when they resume.
        // (A set's ticket heading the line waits for its set's ACQUIREALL, not for the timer.)
        effect(Effect::Index(grants_held_until));
    }
}

/// The effects of a replicated lease change (`DLOCK.SETLEASE`, `DLOCK.ENDLEASE`) already made to
/// `lock`: it is indexed where this server keeps the index (a primary loading its AOF), its key
/// goes when nothing is left in it, and the command travels on unchanged.
pub fn plan_replicated<'a>(
    lock: &'a Lock,
    indexes: bool,
    now: Now,
    mut effect: impl FnMut(Effect<'a>),
) {
    if !lock.has_record() && lock.waiters().len() == 0 {
        let forget = lock.pending_index_entry(now);
        effect(Effect::DeleteKey { forget, propagate: false });
    } else if indexes && let Some(deadline) = lock.needs_index_entry(now) {
        effect(Effect::Index(deadline));
    }
    effect(Effect::PassOn);
}

/// What the watched locks learn of one transition: a wait begun or granted, the end of a lease
/// that others waited for. Nothing for an uncontended lock.
fn watch(lock: &Lock, change: &Transition, changes: &[Transition], now: Now) -> Option<Watch> {
    let waited_for = || {
        lock.waiters().len() > 0
            || changes.iter().any(|change| {
                matches!(change, Transition::HandedOver { .. } | Transition::SetTicketUsed { .. })
            })
    };
    match change {
        Transition::Queued { .. } | Transition::Ticketed { refreshed: false } => {
            Some(Watch::Joined)
        }
        Transition::HandedOver { waited, .. } | Transition::SetTicketUsed { waited } => {
            Some(Watch::Waited(*waited))
        }
        Transition::Released(lease) | Transition::Revoked { lease, .. } if waited_for() => {
            Some(Watch::Held(now.mono.saturating_sub(lease.granted_mono())))
        }
        Transition::Expired(lease) if waited_for() => {
            Some(Watch::Held(lease.deadline_mono().saturating_sub(lease.granted_mono())))
        }
        _ => None,
    }
}

/// Events, log lines and answers for one transition.
fn announce<'a>(lock: &'a Lock, change: &'a Transition, effect: &mut impl FnMut(Effect<'a>)) {
    let current = |fence: u64| lock.lease_with_fence(fence);
    let event = |what: Event, lease: Option<&'a Lease>, effect: &mut dyn FnMut(Effect<'a>)| {
        if let Some(lease) = lease {
            effect(Effect::Event { what, lease, publish: what != Event::Renewed, detail: &[] });
        }
    };
    match change {
        Transition::Granted { fence } => event(Event::Acquired, current(*fence), effect),
        // A ticket's holder learns of its end from its next ACQUIRE; the counters have it.
        Transition::Ticketed { .. }
        | Transition::TicketDismissed { .. }
        | Transition::SetTicketUsed { .. } => {}
        Transition::Claimed { fence } => {
            if let Some(lease) = current(*fence) {
                effect(Effect::Log(LogLine::Claimed(lease)));
            }
        }
        Transition::TicketWithdrawn { token } => {
            effect(Effect::Log(LogLine::TicketWithdrawn(token)))
        }
        Transition::TicketLapsed { token } => effect(Effect::Log(LogLine::TicketLapsed(token))),
        Transition::Reacquired { fence } | Transition::Renewed { fence, .. } => {
            effect(Effect::Confirm { fence: *fence });
            event(Event::Renewed, current(*fence), effect);
        }
        Transition::Released(lease) => event(Event::Released, Some(lease), effect),
        Transition::Revoked { lease, reason } => {
            effect(Effect::Event { what: Event::Revoked, lease, publish: true, detail: reason });
            effect(Effect::Log(LogLine::Revoked { lease, reason }));
        }
        Transition::Expired(lease) => {
            event(Event::Expired, Some(lease), effect);
            let line = if lease.unclaimed() {
                LogLine::LapsedUnclaimed(lease)
            } else {
                LogLine::ExpiredUnderHolder(lease)
            };
            effect(Effect::Log(line));
        }
        Transition::HandedOver { waiter, fence, ticket, notify, .. } => {
            let lease = current(*fence);
            // The grantee first: it may start on this message alone.
            if let (Some(request), Some(lease)) = (notify, lease) {
                effect(Effect::Granted { lease, request: *request });
            }
            event(Event::Handoff, lease, effect);
            if !*ticket {
                // A ticket's holder learns the fence from its next ACQUIRE.
                effect(Effect::Answer { waiter: *waiter, grant: lease });
            }
        }
        Transition::GrantUndone(lease) => {
            event(Event::Released, Some(lease), effect);
            effect(Effect::Log(LogLine::GrantUndone(lease)));
        }
        Transition::Queued { waiter } => effect(Effect::Block { waiter: *waiter }),
        Transition::Superseded { waiter } | Transition::Dismissed { waiter } => {
            effect(Effect::Answer { waiter: *waiter, grant: None });
        }
        Transition::Displaced(lease) => effect(Effect::Log(LogLine::Displaced(lease))),
        Transition::Refused(refusal) => {
            if let Some(line) = refused(refusal) {
                effect(Effect::Log(line));
            }
        }
        Transition::HandOverFailed(error) => effect(Effect::Log(LogLine::HandOverFailed(error))),
        Transition::MoreToSettle => {}
    }
}

/// The line for a refusal that says something is wrong with a client (not mere contention).
fn refused(refusal: &Refusal) -> Option<LogLine<'_>> {
    match refusal {
        Refusal::Contended
        | Refusal::RenewNotHeld { holder: None, wrong_fence: None, .. }
        | Refusal::ReleaseNotOwner { holder: None, wrong_fence: None, .. } => None,
        Refusal::RenewNotHeld { token, wrong_fence: Some((asked, holds)), .. } => {
            Some(LogLine::WrongFence { request: "renewal", token, asked: *asked, holds: *holds })
        }
        Refusal::ReleaseNotOwner { token, wrong_fence: Some((asked, holds)), .. } => {
            Some(LogLine::WrongFence { request: "release", token, asked: *asked, holds: *holds })
        }
        Refusal::RenewNotHeld { token, holder: Some(holder), .. } => {
            Some(LogLine::RenewNotHeld { token, holder })
        }
        Refusal::RenewPastMaxHold { token, held_ms } => {
            Some(LogLine::RenewPastMaxHold { token, held_ms: *held_ms })
        }
        Refusal::ReleaseNotOwner { token, holder: Some(holder), .. } => {
            Some(LogLine::ReleaseNotOwner { token, holder })
        }
    }
}

/// What replicas and the AOF must learn of `changes` to the lock's leases. With no live lease
/// left, copies drop the key (the primary may keep it for its waiters). A live exclusive lease
/// replaces whatever a copy holds in one `DLOCK.SETLEASE`; shared leases travel one by one: each
/// one touched as it now is, or its end (`DLOCK.ENDLEASE`).
fn replicate<'a>(
    lock: &'a Lock,
    changes: &'a [Transition],
    now: Now,
    effect: &mut impl FnMut(Effect<'a>),
) {
    if let Some(lease) = lock.live_exclusive(now) {
        if lease.is_plain() && only_renewed(changes, lease.fence) {
            return effect(Effect::ReplicateRenewal(lease));
        }
        return effect(Effect::ReplicateLease(lease));
    }
    if !lock.has_live(now) {
        return effect(Effect::ReplicateDel);
    }
    for change in changes {
        match change {
            Transition::Granted { fence }
            | Transition::Reacquired { fence }
            | Transition::Renewed { fence, .. }
            | Transition::HandedOver { fence, .. } => {
                if let Some(lease) = lock.lease_with_fence(*fence).filter(|l| l.is_live(now)) {
                    effect(Effect::ReplicateLease(lease));
                }
            }
            Transition::Released(lease)
            | Transition::Revoked { lease, .. }
            | Transition::Expired(lease)
            | Transition::GrantUndone(lease)
            | Transition::Displaced(lease) => effect(Effect::ReplicateEnd(lease)),
            _ => {}
        }
    }
}

/// Whether the only change of a lease in `changes` is a renewal of the grant with `fence` that
/// moved its deadline: a copy holding that grant then learns everything from the new deadline.
fn only_renewed(changes: &[Transition], fence: u64) -> bool {
    let mut lease_changes = changes.iter().filter(|change| change.changes_lease());
    matches!(
        (lease_changes.next(), lease_changes.next()),
        (Some(Transition::Renewed { fence: renewed, moved: true }), None) if *renewed == fence
    )
}

impl Effect<'_> {
    /// Whether it tells replicas and the AOF something.
    pub fn is_replication(&self) -> bool {
        matches!(
            self,
            Self::ReplicateLease(_)
                | Self::ReplicateRenewal(_)
                | Self::ReplicateEnd(_)
                | Self::ReplicateDel
                | Self::PassOn
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fence::FenceCounter;
    use crate::core::lock::Rules;
    use crate::core::{Host, Mode, Step, Waiter};

    const SEC: Micros = 1_000_000;
    /// The wall clock at `at(0)`: fences print as microseconds since.
    const BASE: Micros = 1_700_000_000 * SEC;
    const PRIMARY: Place = Place::Stored { indexes: true, grants_held_until: 0 };
    const REPLICA: Place = Place::Stored { indexes: false, grants_held_until: 0 };

    struct AllAlive;

    impl Host for AllAlive {
        fn waiter_alive(&self, _id: u64) -> bool {
            true
        }
    }

    fn at(seconds: u64) -> Now {
        Now { mono: seconds * SEC, wall: BASE + seconds * SEC }
    }

    /// Runs `op` on `lock` at `now` and returns the planned effects in a printable form: the
    /// effect's name and the fence (or waiter) it concerns.
    fn planned(
        lock: &mut Lock,
        fences: &mut FenceCounter,
        place: Place,
        now: Now,
        op: impl FnOnce(&mut Step<'_, AllAlive>, &mut Lock),
    ) -> Vec<String> {
        let mut step = Step::new(now, Rules::default(), fences, &AllAlive);
        op(&mut step, lock);
        let changes = step.into_changes();
        let mut out = Vec::new();
        plan(lock, place, &changes, now, |effect| out.push(name(&effect)));
        out
    }

    fn name(effect: &Effect<'_>) -> String {
        match effect {
            Effect::Count(_) => "count".into(),
            Effect::Watch(watch) => format!("watch {watch:?}"),
            Effect::Block { waiter } => format!("block {waiter}"),
            Effect::Event { what, lease, publish, .. } => {
                format!(
                    "{} {}{}",
                    what.word(),
                    lease.fence - BASE,
                    if *publish { " published" } else { "" }
                )
            }
            Effect::Granted { lease, request } => {
                format!("granted {} after {request}", lease.fence - BASE)
            }
            Effect::Log(line) => format!("log {:?}", line.level()),
            Effect::Answer { waiter, grant } => {
                format!(
                    "answer {waiter} {}",
                    grant.map_or("nil".into(), |l| (l.fence - BASE).to_string())
                )
            }
            Effect::Confirm { fence } => format!("confirm {}", fence - BASE),
            Effect::ReplicateLease(lease) => format!("setlease {}", lease.fence - BASE),
            Effect::ReplicateRenewal(lease) => format!("renewal {}", lease.fence - BASE),
            Effect::ReplicateEnd(lease) => format!("endlease {}", lease.fence - BASE),
            Effect::ReplicateDel => "del".into(),
            Effect::DeleteKey { propagate, .. } => format!("delete key (propagated: {propagate})"),
            Effect::Index(at) => format!("index at {}", at / SEC),
            Effect::PassOn => "pass on".into(),
        }
    }

    fn waiter(id: u64, token: &[u8], now: Now) -> Waiter {
        Waiter {
            id,
            token: token.into(),
            ttl_ms: 10_000,
            gives_up_at: None,
            queued_at: now.mono,
            claim_ms: None,
            ticket_until: None,
            set: false,
            notify: None,
            mode: Mode::Exclusive,
            meta: None,
        }
    }

    #[test]
    fn a_grant_is_counted_announced_replicated_and_indexed_on_a_primary_only() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let grant = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| {
            step.acquire(lock, b"A", 10_000).expect("mint");
        };
        assert_eq!(
            planned(&mut lock, &mut fences, PRIMARY, at(0), grant),
            ["count", "acquired 0 published", "setlease 0", "index at 10"]
        );
        let (mut copy, mut fences) = (Lock::default(), FenceCounter::default());
        assert_eq!(
            planned(&mut copy, &mut fences, REPLICA, at(0), grant),
            ["count", "acquired 0 published", "setlease 0"],
            "a server that keeps no index indexes nothing"
        );
    }

    #[test]
    fn a_renewal_confirms_the_grant_and_is_replicated_but_not_published() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        planned(&mut lock, &mut fences, PRIMARY, at(0), |step, lock| {
            step.acquire(lock, b"A", 10_000).expect("mint");
        });
        let renew = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| {
            step.renew(lock, b"A", 20_000).expect("renew");
        };
        assert_eq!(
            planned(&mut lock, &mut fences, PRIMARY, at(1), renew),
            ["count", "confirm 0", "renewed 0", "renewal 0"],
            "the 10 s entry comes first and reschedules; an uncontended renewal notes nothing"
        );
    }

    #[test]
    fn only_a_renewal_that_moved_a_plain_leases_deadline_travels_without_its_history() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        planned(&mut lock, &mut fences, PRIMARY, at(0), |step, lock| {
            step.acquire(lock, b"A", 10_000).expect("mint");
        });
        // The same deadline again (renewed at 1 s for 9 s): a copy could not tell it was a
        // renewal, so the lease travels whole, history and all.
        let same = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| {
            step.renew(lock, b"A", 9_000).expect("renew");
        };
        let effects = planned(&mut lock, &mut fences, PRIMARY, at(1), same);
        assert!(effects.contains(&"setlease 0".to_owned()), "{effects:?}");
        // A lease with metadata travels whole, as does a shared one.
        planned(&mut lock, &mut fences, PRIMARY, at(2), |step, lock| {
            assert!(step.release(lock, b"A"));
            step.acquire_as(lock, b"B", 10_000, Mode::Exclusive, Some(b"host-1")).expect("mint");
        });
        let renew_b = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| {
            step.renew(lock, b"B", 20_000).expect("renew");
        };
        let effects = planned(&mut lock, &mut fences, PRIMARY, at(3), renew_b);
        assert!(effects.iter().any(|e| e.starts_with("setlease ")), "{effects:?}");
        let (mut shared, mut fences) = (Lock::default(), FenceCounter::default());
        planned(&mut shared, &mut fences, PRIMARY, at(0), |step, lock| {
            step.acquire_as(lock, b"S", 10_000, Mode::Shared { limit: None }, None).expect("mint");
        });
        let renew_s = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| {
            step.renew(lock, b"S", 20_000).expect("renew");
        };
        let effects = planned(&mut shared, &mut fences, PRIMARY, at(1), renew_s);
        assert!(effects.contains(&"setlease 0".to_owned()), "{effects:?}");
    }

    #[test]
    fn a_holder_acquiring_again_after_a_lost_hand_over_reply_confirms_that_grant() {
        // The waiter was handed the lease; its reply was lost; it retries with its token. The
        // retry's answer names the grant, so the clean-up of the lost reply must leave it be.
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        planned(&mut lock, &mut fences, PRIMARY, at(0), |step, lock| {
            step.acquire(lock, b"A", 1_000).expect("mint");
            step.enqueue(lock, waiter(7, b"W", at(0)));
        });
        let handed = planned(&mut lock, &mut fences, PRIMARY, at(2), |step, lock| {
            step.settle_after(lock);
        });
        assert!(handed.contains(&"answer 7 2000000".to_owned()), "{handed:?}");
        let retry = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| {
            step.acquire(lock, b"W", 10_000).expect("reacquire");
        };
        assert_eq!(
            planned(&mut lock, &mut fences, PRIMARY, at(2), retry),
            ["count", "confirm 2000000", "renewed 2000000", "setlease 2000000"]
        );
    }

    #[test]
    fn a_release_that_empties_the_lock_deletes_the_key_and_propagates_the_delete() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        planned(&mut lock, &mut fences, PRIMARY, at(0), |step, lock| {
            step.acquire(lock, b"A", 10_000).expect("mint");
        });
        let release = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| {
            assert!(step.release(lock, b"A"));
        };
        assert_eq!(
            planned(&mut lock, &mut fences, PRIMARY, at(1), release),
            ["count", "released 0 published", "delete key (propagated: true)"]
        );
    }

    #[test]
    fn a_release_before_a_waiter_hands_over_answers_it_and_replicates_the_new_lease() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let queued = planned(&mut lock, &mut fences, PRIMARY, at(0), |step, lock| {
            step.acquire(lock, b"A", 10_000).expect("mint");
            step.enqueue(lock, waiter(7, b"B", at(0)));
        });
        assert_eq!(
            queued,
            [
                "count",
                "acquired 0 published",
                "count",
                "watch Joined",
                "block 7",
                "setlease 0",
                "index at 10"
            ]
        );
        let release = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| {
            assert!(step.release(lock, b"A"));
        };
        assert_eq!(
            planned(&mut lock, &mut fences, PRIMARY, at(2), release),
            [
                "count",
                "watch Held(2000000)",
                "released 0 published",
                "count",
                "watch Waited(2000000)",
                "handoff 2000000 published",
                "answer 7 2000000",
                "setlease 2000000",
            ],
            "the new lease's deadline is after the pending 10 s entry, which reschedules"
        );
    }

    #[test]
    fn a_notified_tickets_own_channel_hears_of_its_grant_before_the_resources() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        planned(&mut lock, &mut fences, PRIMARY, at(0), |step, lock| {
            step.acquire(lock, b"A", 10_000).expect("mint");
            let ticket = Waiter {
                ticket_until: Some(at(60).mono),
                claim_ms: Some(4_000),
                notify: Some(3),
                ..waiter(7, b"B", at(0))
            };
            step.enqueue_ticket(lock, ticket);
        });
        let release = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| {
            assert!(step.release(lock, b"A"));
        };
        let effects = planned(&mut lock, &mut fences, PRIMARY, at(2), release);
        let granted = effects.iter().position(|e| e == "granted 2000000 after 3");
        let handoff = effects.iter().position(|e| e == "handoff 2000000 published");
        assert!(granted.is_some() && granted < handoff, "{effects:?}");
        assert!(!effects.iter().any(|e| e.starts_with("answer")), "a ticket has nobody to answer");
    }

    #[test]
    fn the_end_of_one_shared_lease_of_several_travels_alone() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        planned(&mut lock, &mut fences, PRIMARY, at(0), |step, lock| {
            step.acquire_as(lock, b"A", 10_000, Mode::Shared { limit: None }, None).expect("mint");
            step.acquire_as(lock, b"B", 10_000, Mode::Shared { limit: None }, None).expect("mint");
        });
        let fence_a = lock.holder(b"A", at(0)).expect("held").fence - BASE;
        let release = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| {
            assert!(step.release(lock, b"A"));
        };
        assert_eq!(
            planned(&mut lock, &mut fences, PRIMARY, at(1), release),
            [
                "count".to_owned(),
                format!("released {fence_a} published"),
                format!("endlease {fence_a}")
            ]
        );
    }

    #[test]
    fn a_crowd_of_expired_shared_leases_keeps_its_key_until_the_last_slice_has_ended() {
        use crate::core::step::SETTLE_EXPIRE_MAX;
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        let crowd = SETTLE_EXPIRE_MAX + 3;
        planned(&mut lock, &mut fences, PRIMARY, at(0), |step, lock| {
            for i in 0..crowd {
                let token = format!("reader-{i}");
                let shared = Mode::Shared { limit: None };
                step.acquire_as(lock, token.as_bytes(), 1_000, shared, None).expect("mint");
            }
        });
        let settle = |step: &mut Step<'_, AllAlive>, lock: &mut Lock| step.settle_after(lock);
        let first = planned(&mut lock, &mut fences, PRIMARY, at(5), settle);
        let ended = first.iter().filter(|effect| effect.starts_with("expired ")).count();
        assert_eq!(ended, SETTLE_EXPIRE_MAX, "one slice ends at most SETTLE_EXPIRE_MAX");
        assert!(
            !first.iter().any(|effect| effect.starts_with("delete key")),
            "the key keeps the leases still to end (deleting it would end them unannounced)"
        );
        let entries: Vec<&String> = first.iter().filter(|e| e.starts_with("index")).collect();
        assert_eq!(entries, ["index at 5"], "one entry for the next slice, at once");
        let rest = planned(&mut lock, &mut fences, PRIMARY, at(5), settle);
        let ended = rest.iter().filter(|effect| effect.starts_with("expired ")).count();
        assert_eq!(ended, 3);
        assert_eq!(rest.last().map(String::as_str), Some("delete key (propagated: true)"));
    }

    #[test]
    fn a_holder_naming_another_grants_fence_is_told_apart_from_a_non_owner() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        planned(&mut lock, &mut fences, PRIMARY, at(0), |step, lock| {
            step.acquire(lock, b"A", 10_000).expect("mint");
        });
        let holds = lock.holder(b"A", at(0)).expect("held").fence;
        let lines = |lock: &mut Lock,
                     fences: &mut FenceCounter,
                     op: &dyn Fn(&mut Step<'_, AllAlive>, &mut Lock)| {
            let mut step = Step::new(at(1), Rules::default(), fences, &AllAlive);
            op(&mut step, lock);
            let changes = step.into_changes();
            let mut out = Vec::new();
            plan(lock, PRIMARY, &changes, at(1), |effect| {
                if let Effect::Log(line) = effect {
                    out.push(line.text(b"job"));
                }
            });
            out
        };
        let asked = holds - 1;
        assert_eq!(
            lines(&mut lock, &mut fences, &|step, lock| {
                assert!(!step.release_grant(lock, b"A", Some(asked)));
            }),
            [format!(
                "release refused (FENCE names another grant of this token) resource=job token=A fence={asked} holds={holds}"
            )]
        );
        assert_eq!(
            lines(&mut lock, &mut fences, &|step, lock| {
                step.renew_grant(lock, b"A", Some(asked), 5_000).expect("renew");
            }),
            [format!(
                "renewal refused (FENCE names another grant of this token) resource=job token=A fence={asked} holds={holds}"
            )]
        );
        assert_eq!(
            lines(&mut lock, &mut fences, &|step, lock| {
                assert!(!step.release_grant(lock, b"B", Some(holds)));
            }),
            ["release by a non-owner refused resource=job token=B holder=A"]
        );
    }

    #[test]
    fn in_a_keyspace_notification_nothing_is_written() {
        let (mut lock, mut fences) = (Lock::default(), FenceCounter::default());
        planned(&mut lock, &mut fences, PRIMARY, at(0), |step, lock| {
            step.acquire(lock, b"A", 10_000).expect("mint");
        });
        assert_eq!(
            planned(&mut lock, &mut fences, Place::Notified, at(1), |step, lock| step
                .displace(lock)),
            ["count", "log Anomaly"],
            "no replication, deletion or index entry: the move itself travels"
        );
    }

    #[test]
    fn a_replicated_end_that_empties_the_key_deletes_it_without_a_delete_of_its_own() {
        let mut lock = Lock::default();
        let lease = Lease::new(b"A", 5, 10_000, at(0));
        crate::core::replica::set_lease(&mut lock, lease, None, at(0));
        let mut out = Vec::new();
        plan_replicated(&lock, true, at(0), |effect| out.push(name(&effect)));
        assert_eq!(out, ["index at 10", "pass on"]);
        assert!(crate::core::replica::end_lease(&mut lock, b"A", 5));
        out.clear();
        plan_replicated(&lock, true, at(1), |effect| out.push(name(&effect)));
        assert_eq!(out, ["delete key (propagated: false)", "pass on"]);
    }
}
