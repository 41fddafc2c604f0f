//! The one path from a decision to its effects.
//!
//! Commands and the expiry timer decide through [`decide`], which runs the core's
//! [`Step`](crate::core::Step) against this server and returns the transitions it made. [`apply`]
//! turns them into everything the outside world sees, in one order for every caller: metrics,
//! keyspace events and log lines, answers to blocked clients, then what replicas and the AOF must
//! learn (the lock's lease as it now is, or its removal), key deletion and the expiry timer.
//! Nothing else writes any of these for a decision of a lock. A wait that ends with no decision
//! behind it (its timeout, its client gone or unblocked, a `SWAPDB`) is answered and counted by
//! `waiters.rs`, which then leaves the lock to the timer and this path (docs/architecture.md).

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, RedisString, raw};

use crate::core::args::printable;
use crate::core::decimal::{MAX_DIGITS, decimal};
use crate::core::{Host, Lease, Lock, Now, Refusal, Step, Transition};
use crate::notify::{self, Event};
use crate::state::{self, Grant};
use crate::waiters::{self, Outcome};
use crate::{config, expiry, metrics};

/// The internal command a lease travels as (registered by `commands/setlease.rs`).
pub const SETLEASE: &std::ffi::CStr = c"dlock.setlease";
/// The same name, for the crate's calls.
const SETLEASE_NAME: &str = "dlock.setlease";
/// The internal command the end of one shared lease travels as (`commands/endlease.rs`).
pub const ENDLEASE: &str = "dlock.endlease";
/// The internal command the fence counter travels as (registered by `commands/setfence.rs`).
pub const SETFENCE: &str = "dlock.setfence";

/// The server as the lock logic sees it: waiters are alive while the registry says so.
pub struct Server;

impl Host for Server {
    fn waiter_alive(&self, id: u64) -> bool {
        waiters::is_alive(id)
    }
}

/// Runs one decision at `now` under the current rules and fence counter; returns what `op`
/// returned and the transitions to [`apply`]. `op` may call into Redis (block a client).
pub fn decide<T>(now: Now, op: impl FnOnce(&mut Step<'_, Server>) -> T) -> (T, Vec<Transition>) {
    let mut fences = state::fence_counter();
    let mut step = Step::new(now, config::rules(now.mono), &mut fences, &Server);
    let result = op(&mut step);
    let changes = step.into_changes();
    state::keep_fences(&fences);
    (result, changes)
}

/// Where a lock lives: its open key and its name in the selected database.
pub struct Site<'a> {
    /// The key, open for writing.
    pub key: &'a RedisKeyWritable,
    /// The key's name.
    pub name: &'a RedisString,
}

/// Makes `changes` (of `lock`, stored at `site` unless `stored` is false) visible and durable.
pub fn apply(
    ctx: &Context,
    site: &Site<'_>,
    lock: &Lock,
    stored: bool,
    changes: Vec<Transition>,
    now: Now,
) {
    let mut lease_changed = false;
    let more_to_settle = changes.iter().any(|change| matches!(change, Transition::MoreToSettle));
    for change in &changes {
        metrics::count(|stats| stats.record(change, now.mono));
        lease_changed |= change.changes_lease();
        announce(ctx, site.name, lock, change, now);
    }
    let vacant = lock.is_vacant(now);
    if stored && vacant {
        expiry::forget(ctx, site.name, lock, now);
        delete(ctx, site);
    } else if lease_changed {
        replicate_leases(ctx, site.name, lock, &changes, now);
    }
    if stored && !vacant {
        expiry::schedule(ctx, site.name, lock, now);
        if !lock.has_record() {
            // A queue without a lease (grants held after start-up): look again when they resume.
            expiry::wake_at(ctx, site.name, config::grants_held_until());
        }
        if more_to_settle {
            // The rest of a crowd at the head: granted on the timer's next turn.
            expiry::wake_at(ctx, site.name, now.mono);
        }
    }
}

/// For a decision made inside a keyspace notification (a value arrived under a new name),
/// where the server takes no write: counters, events, log lines and answers only. The timer
/// removes the vacant key afterwards, with its `DEL`, like any other.
pub fn announce_only(
    ctx: &Context,
    name: &RedisString,
    lock: &Lock,
    changes: Vec<Transition>,
    now: Now,
) {
    for change in &changes {
        metrics::count(|stats| stats.record(change, now.mono));
        announce(ctx, name, lock, change, now);
    }
}

/// Redis freed a lock's value (DEL, FLUSHALL, an overwrite, a reload): its waiters wait for
/// nothing now and are answered nil, and its tickets leave with it. Nothing else changes: the
/// key is already gone.
pub fn value_freed(lock: &Lock) {
    let mut answered = 0;
    for waiter in lock.waiters().filter(|waiter| waiter.ticket_until.is_none()) {
        answered += u64::from(waiters::answer(waiter.id, Outcome::Nil, None));
    }
    // Every wait and every ticket ends in exactly one counter: the waits answered here count
    // with the time-outs (a waiter whose wait had already ended was counted then), the
    // tickets as dismissed.
    let tickets = lock.tickets() as u64;
    metrics::count(|stats| stats.record_freed(answered, tickets));
}

/// Propagates the fence counter as `DLOCK.SETFENCE last` (after a fork, so the AOF file opened
/// for it carries the counter); called from a timer, never inside a command.
pub fn propagate_fence_counter(ctx: &Context) {
    let last = state::last_fence();
    if last > 0 {
        ctx.replicate(SETFENCE, &[last.to_string().as_str()]);
    }
}

/// Events, log lines and answers to blocked clients for one transition.
fn announce(ctx: &Context, name: &RedisString, lock: &Lock, change: &Transition, now: Now) {
    let current = |fence: u64| lock.lease_with_fence(fence);
    match change {
        Transition::Granted { fence } => event(ctx, Event::Acquired, name, current(*fence), now),
        // A ticket's holder learns of its end from its next ACQUIRE; the counters have it.
        Transition::Ticketed { .. } | Transition::TicketDismissed { .. } => {}
        Transition::Claimed { fence } => {
            if let Some(lease) = current(*fence) {
                notify::verbose(ctx, || {
                    format!(
                        "lease claimed resource={} owner={} fence={}",
                        printable(name.as_slice()),
                        printable(&lease.token),
                        lease.fence
                    )
                });
            }
        }
        Transition::TicketWithdrawn { token } => notify::verbose(ctx, || {
            format!(
                "ticket withdrawn resource={} token={}",
                printable(name.as_slice()),
                printable(token)
            )
        }),
        Transition::TicketLapsed { token } => notify::anomaly(ctx, now, || {
            format!(
                "ticket lapsed (not refreshed in time) resource={} token={}",
                printable(name.as_slice()),
                printable(token)
            )
        }),
        Transition::Reacquired { fence } | Transition::Renewed { fence } => {
            // The holder was answered about this grant: a clean-up of a hand-over whose reply
            // was lost must not take it back any more.
            waiters::confirm_grant(*fence);
            state::confirm_grant(*fence);
            event(ctx, Event::Renewed, name, current(*fence), now);
        }
        Transition::Released(lease) => event(ctx, Event::Released, name, Some(lease), now),
        Transition::Expired(lease) if lease.unclaimed => {
            event(ctx, Event::Expired, name, Some(lease), now);
            notify::anomaly(ctx, now, || {
                format!(
                    "grant lapsed unclaimed (its claim window ended) resource={} owner={} fence={}",
                    printable(name.as_slice()),
                    printable(&lease.token),
                    lease.fence
                )
            });
        }
        Transition::Expired(lease) => {
            event(ctx, Event::Expired, name, Some(lease), now);
            notify::anomaly(ctx, now, || {
                format!(
                    "lease expired under its holder resource={} owner={} fence={} held-ms={} renewals={}",
                    printable(name.as_slice()),
                    printable(&lease.token),
                    lease.fence,
                    lease.deadline_mono.saturating_sub(lease.granted_mono) / 1_000,
                    lease.renewals
                )
            });
        }
        Transition::HandedOver { waiter, fence, ticket, .. } => {
            let lease = current(*fence);
            event(ctx, Event::Handoff, name, lease, now);
            if *ticket {
                return; // its holder learns the fence from its next ACQUIRE
            }
            let grant = lease.map(|lease| Grant {
                key: expiry::key_ref(ctx, name.as_slice()),
                token: (*lease.token).into(),
                fence: lease.fence,
            });
            waiters::answer(*waiter, Outcome::Granted(*fence), grant);
        }
        Transition::GrantUndone(lease) => {
            event(ctx, Event::Released, name, Some(lease), now);
            notify::anomaly(ctx, now, || {
                format!(
                    "lease released: its waiter left before the reply resource={} owner={} fence={}",
                    printable(name.as_slice()),
                    printable(&lease.token),
                    lease.fence
                )
            });
        }
        // The timer answers the wait when it times out.
        Transition::Queued { .. } => state::arm_soon(),
        Transition::Superseded { waiter } | Transition::Dismissed { waiter } => {
            waiters::answer(*waiter, Outcome::Nil, None);
        }
        Transition::Displaced(lease) => notify::anomaly(ctx, now, || {
            format!(
                "lease ended: its key was renamed or moved to resource={} owner={} fence={}",
                printable(name.as_slice()),
                printable(&lease.token),
                lease.fence
            )
        }),
        Transition::Refused(refusal) => refused(ctx, name, refusal, now),
        Transition::HandOverFailed(error) => {
            notify::log(ctx, notify::Level::Warning, &format!("dlock: hand-over failed: {error}"));
        }
        Transition::MoreToSettle => {}
    }
}

fn event(ctx: &Context, what: Event, name: &RedisString, lease: Option<&Lease>, now: Now) {
    if let Some(lease) = lease {
        notify::transition(ctx, what, name, lease, now);
        if what != Event::Renewed {
            notify::publish(ctx, what, name, lease);
        }
    }
}

/// Rate-limited notice lines for refusals that say something is wrong with a client.
fn refused(ctx: &Context, name: &RedisString, refusal: &Refusal, now: Now) {
    match refusal {
        Refusal::Contended | Refusal::RenewNotHeld { holder: None, .. } => {}
        Refusal::ReleaseNotOwner { holder: None, .. } => {}
        Refusal::RenewNotHeld { token, holder: Some(holder) } => notify::anomaly(ctx, now, || {
            format!(
                "renewal refused (not the owner) resource={} token={} holder={}",
                printable(name.as_slice()),
                printable(token),
                printable(holder)
            )
        }),
        Refusal::RenewPastMaxHold { token, held_ms } => notify::anomaly(ctx, now, || {
            format!(
                "renewal refused (past dlock.max-hold-ms) resource={} token={} held-ms={}",
                printable(name.as_slice()),
                printable(token),
                held_ms
            )
        }),
        Refusal::ReleaseNotOwner { token, holder: Some(holder) } => {
            notify::anomaly(ctx, now, || {
                format!(
                    "release by a non-owner refused resource={} token={} holder={}",
                    printable(name.as_slice()),
                    printable(token),
                    printable(holder)
                )
            });
        }
    }
}

/// Tells replicas and the AOF what `changes` did to the lock's leases. With no live lease left,
/// copies drop the key (the primary may keep it for its waiters). A live exclusive lease
/// replaces whatever a copy holds in one `DLOCK.SETLEASE`; shared leases travel one by one:
/// each one touched as it now is, or its end (`DLOCK.ENDLEASE`).
fn replicate_leases(
    ctx: &Context,
    resource: &RedisString,
    lock: &Lock,
    changes: &[Transition],
    now: Now,
) {
    if let Some(lease) = lock.live_exclusive(now) {
        return replicate_lease(ctx, resource, lease, now);
    }
    if !lock.has_live(now) {
        return replicate_del(ctx, resource);
    }
    for change in changes {
        match change {
            Transition::Granted { fence }
            | Transition::Reacquired { fence }
            | Transition::Renewed { fence }
            | Transition::HandedOver { fence, .. } => {
                if let Some(lease) = lock.lease_with_fence(*fence).filter(|l| l.is_live(now)) {
                    replicate_lease(ctx, resource, lease, now);
                }
            }
            Transition::Released(lease)
            | Transition::Expired(lease)
            | Transition::GrantUndone(lease)
            | Transition::Displaced(lease) => {
                let fence = lease.fence.to_string();
                ctx.replicate(ENDLEASE, &[resource.as_slice(), &lease.token, fence.as_bytes()]);
            }
            _ => {}
        }
    }
}

/// Propagates a lease as its effect, history included:
/// `DLOCK.SETLEASE resource token fence deadline-unix-us GRANTED granted-unix-us RENEWALS n`,
/// then `SHARED` and `META value` when they apply.
fn replicate_lease(ctx: &Context, resource: &RedisString, lease: &Lease, now: Now) {
    if !lease.is_plain() {
        let args = lease.effect_args(now);
        let mut all: Vec<&[u8]> = vec![resource.as_slice()];
        all.extend(args.iter().map(Vec::as_slice));
        return ctx.replicate(SETLEASE_NAME, all.as_slice());
    }
    // Fences are minted and restored at most i64::MAX and deadlines are wall-clock microseconds
    // (restored ones at most a year and a day away); the clamps only keep a copy's parser happy.
    let (mut fence, mut deadline, mut granted, mut renewals) =
        ([0; MAX_DIGITS], [0; MAX_DIGITS], [0; MAX_DIGITS], [0; MAX_DIGITS]);
    let fence = decimal(lease.fence.min(i64::MAX as u64), &mut fence);
    let deadline = decimal(lease.deadline_wall.min(i64::MAX as u64), &mut deadline);
    let granted = decimal(lease.granted_wall(now), &mut granted);
    let renewals = decimal(u64::from(lease.renewals), &mut renewals);
    // The raw call: the crate's `replicate` would copy every argument into a new string, and
    // ACQUIRE makes this call on every grant. Numbers go as digits we print (format `b`, one
    // allocation each in Redis) rather than as `l` (Redis prints them into a string of its own
    // and wraps it: two).
    // SAFETY: ctx is live; the command name, the format and the keywords are NUL-terminated;
    // "sbbbcbcb" takes a RedisModuleString, then (pointer, length) buffers that Redis copies and
    // C strings, each as the format says; every buffer outlives the call.
    unsafe {
        if let Some(replicate) = raw::RedisModule_Replicate {
            replicate(
                ctx.ctx,
                SETLEASE.as_ptr(),
                c"sbbbcbcb".as_ptr(),
                resource.inner,
                lease.token.as_ptr().cast::<std::os::raw::c_char>(),
                lease.token.len(),
                fence.as_ptr().cast::<std::os::raw::c_char>(),
                fence.len(),
                deadline.as_ptr().cast::<std::os::raw::c_char>(),
                deadline.len(),
                c"GRANTED".as_ptr(),
                granted.as_ptr().cast::<std::os::raw::c_char>(),
                granted.len(),
                c"RENEWALS".as_ptr(),
                renewals.as_ptr().cast::<std::os::raw::c_char>(),
                renewals.len(),
            );
        }
    }
}

/// Deletes a lock key that holds nothing live any more and propagates the `DEL`.
fn delete(ctx: &Context, site: &Site<'_>) {
    if site.key.delete().is_ok() {
        replicate_del(ctx, site.name);
    }
}

/// Propagates `DEL resource`.
fn replicate_del(ctx: &Context, resource: &RedisString) {
    // The raw call with static strings: the crate's `replicate` allocates a C string and an
    // argument vector per call, and the expiry sweep makes this call once per expired key.
    // SAFETY: ctx is live; the command name and the format are NUL-terminated; format "s"
    // takes exactly one RedisModuleString, which Redis retains for as long as it needs it.
    unsafe {
        if let Some(replicate) = raw::RedisModule_Replicate {
            replicate(ctx.ctx, c"DEL".as_ptr(), c"s".as_ptr(), resource.inner);
        }
    }
}
