//! Active expiry: one timer drains the deadline index in bounded slices, answers waiters that
//! timed out, and takes gone waiters and lost grants out of their locks, each through the one
//! apply path. When an entry comes due the key's lock decides ([`Lock::on_due`]). While writes
//! are paused nothing is decided (see `expiry::writes_paused`). Also here: the keyspace handler
//! that meets lock values arriving under a new name.

use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis_module::{Context, ContextFlags, NotifyEvent, RedisString, raw};

use crate::core::expiry::DueBatch;
use crate::core::lock::Due;
use crate::core::{Lock, Micros, Now, Step};
use crate::datatype::LOCK_TYPE;
use crate::expiry::{PAUSED_POLL_MS, decides_expiry, writes_paused};
use crate::state;
use crate::{apply, clock, expiry};

/// Longest a slice of the sweep may run before yielding to clients.
const SLICE_BUDGET: Duration = Duration::from_millis(2);
/// Most entries looked at in one slice, whatever the clock says.
const SLICE_MAX_ENTRIES: usize = 10_000;
/// Entries taken from the index at a time; the clock is read after each batch.
const SWEEP_BATCH: usize = 64;
/// Longest timer period: a far deadline is approached in steps (Redis timers take i64 ms).
const MAX_TIMER_DELAY_MS: u64 = 3_600_000;

/// Keyspace events that put an existing lock value under a (new) key name.
const ARRIVAL_EVENTS: [&str; 5] = ["loaded", "restore", "rename_to", "move_to", "copy_to"];

/// Keyspace notification handler: a value renamed or moved to a new name, or restored outside
/// Cluster, loses its lease and its waiters (on every copy of the data set alike); then every arrival is indexed, so the timer
/// expires it or removes it once vacant.
pub fn on_keyspace_event(ctx: &Context, _class: NotifyEvent, event: &str, name: &[u8]) {
    if !ARRIVAL_EVENTS.contains(&event) {
        return;
    }
    let key_name = RedisString::create_from_slice(ctx.ctx, name);
    let key = ctx.open_key_writable(&key_name);
    let Ok(Some(lock)) = key.get_value::<Lock>(&LOCK_TYPE) else { return };
    let now = clock::now();
    // Outside Cluster a RESTORE is a copy too (an old DUMP replayed could bring an old fence
    // back); in Cluster it is how MIGRATE moves a slot's keys, and the lease moves with them.
    let restored = event == "restore" && !ctx.get_flags().contains(ContextFlags::CLUSTER);
    if matches!(event, "rename_to" | "move_to") || restored {
        let ((), changes) = apply::decide(now, |step| step.displace(lock));
        apply::announce_only(ctx, &key_name, lock, changes, now);
    }
    if !decides_expiry(ctx) {
        return;
    }
    let deadline = lock.index_deadline();
    lock.note_index_entry(deadline);
    expiry::insert(ctx, name, deadline);
}

/// Arms the timer for the earliest deadline in the index, unless it is armed early enough.
pub fn arm(ctx: &Context, now: Now) {
    let pending = state::with_expiry(|expiry| {
        if expiry.to_prune.is_empty() && expiry.to_release.is_empty() {
            expiry.index.next_deadline()
        } else {
            Some(now.mono)
        }
    });
    let next = match (pending, crate::waiters::next_timeout()) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => match a.or(b) {
            Some(next) => next,
            None => return,
        },
    };
    if state::with_expiry(|expiry| expiry.timer.is_some_and(|(_, due)| due <= next)) {
        return;
    }
    let delay_ms = next.saturating_sub(now.mono).div_ceil(1_000).min(MAX_TIMER_DELAY_MS);
    // Record what the timer is for: it fires at `next` or up to 1 ms after (whole
    // milliseconds), or earlier when the delay was capped. Recording the rounded-up firing
    // time instead made every later insert for the same `next` re-arm it.
    let due = now.mono.saturating_add(delay_ms * 1_000).min(next);
    rearm(ctx, delay_ms, due);
}

/// Stops the armed timer, if any, and arms one `delay_ms` from now, recorded as due at `due`.
/// Never from inside a timer callback (see [`before_sleep`]).
fn rearm(ctx: &Context, delay_ms: u64, due: Micros) {
    let armed = state::with_expiry(|expiry| expiry.timer.take());
    // SAFETY: ctx is live; the stopped id was returned by CreateTimer and carries no data; this
    // is not a timer callback, so the stopped timer is not the one running.
    unsafe {
        if let (Some((id, _)), Some(stop)) = (armed, raw::RedisModule_StopTimer) {
            stop(ctx.ctx, id, std::ptr::null_mut());
        }
        if let Some(create) = raw::RedisModule_CreateTimer {
            let id = create(ctx.ctx, delay_ms as i64, Some(on_timer), std::ptr::null_mut());
            state::with_expiry(|expiry| expiry.timer = Some((id, due)));
        }
    }
}

/// # Safety
/// Called by Redis on its main thread with a context valid for this call.
unsafe extern "C" fn on_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    let ctx = Context::new(ctx);
    state::with_expiry(|expiry| expiry.timer = None);
    if !decides_expiry(&ctx) {
        state::with_expiry(|expiry| expiry.index.clear());
        return;
    }
    let started = clock::now();
    // Answering a waiter nil changes no data, so time-outs are kept even during a pause.
    crate::waiters::time_out(started.mono);
    if writes_paused() {
        // Expired leases, gone waiters and lost grants stay as they are until writes resume.
        PAUSED_POLL.store(true, Ordering::Relaxed);
        return;
    }
    let (to_prune, to_release) = state::with_expiry(|expiry| {
        (std::mem::take(&mut expiry.to_prune), std::mem::take(&mut expiry.to_release))
    });
    // One visit per key, however many of its waiters left this turn.
    let mut to_prune = to_prune;
    to_prune.sort_unstable();
    for same_key in to_prune.chunk_by(|a, b| a.0 == b.0) {
        let key = &same_key[0].0;
        let ids: Vec<u64> = same_key.iter().map(|(_, id)| *id).collect();
        with_lock_at(&ctx, key.db, &key.name, started, |step, lock| step.leave(lock, &ids));
    }
    for grant in to_release {
        with_lock_at(&ctx, grant.key.db, &grant.key.name, started, |step, lock| {
            step.undo_grant(lock, &grant.token, grant.fence);
        });
    }
    let mut now = started;
    let mut backlog = false;
    let mut seen = 0;
    let mut due = DueBatch::default();
    loop {
        // A batch at a time: one lock of the index, and names copied out in one buffer.
        due.clear();
        if state::with_expiry(|expiry| expiry.index.pop_due(now.mono, SWEEP_BATCH, &mut due)) == 0 {
            break;
        }
        for (deadline, db, name) in due.iter() {
            sweep_one(&ctx, deadline, db, name, now);
        }
        seen += due.len();
        now = clock::now();
        if seen >= SLICE_MAX_ENTRIES
            || now.mono.saturating_sub(started.mono) >= SLICE_BUDGET.as_micros() as u64
        {
            backlog = true;
            break;
        }
    }
    if backlog {
        // Come back on the next turn of the event loop, after clients had theirs.
        BACKLOG.store(true, Ordering::Relaxed);
    } else {
        state::arm_soon();
    }
}

/// Set when a slice of the sweep yielded with due entries left.
static BACKLOG: AtomicBool = AtomicBool::new(false);
/// Set when the timer found writes paused: it looks again [`PAUSED_POLL_MS`] later.
static PAUSED_POLL: AtomicBool = AtomicBool::new(false);

/// Whether the armed timer should have fired by now (monotonic), with time to spare.
fn timer_late(now: Now) -> bool {
    state::with_expiry(|expiry| {
        expiry.timer.is_some_and(|(_, due)| now.mono > due.saturating_add(clock::TIMER_LATE_US))
    })
}

/// Called before the event loop sleeps: the only place the expiry timer is armed from, besides
/// server events. A timer callback never arms one itself: Redis fires module timers in a loop
/// against the wall clock read once as the loop starts, and fires at once any timer created
/// inside it that is due by then. After a step back of the wall clock in the middle of a
/// callback, every timer it armed was: the callback ran again and again, serving no client,
/// until the clock caught up (18 s in a chaos run). So the callback leaves what it needs (a
/// sweep with work left, a look after a write pause, the next deadline) and it is armed here.
///
/// A sweep that yielded with work left resumes right after the clients of this turn are served.
/// Slices stay bounded by the budget.
///
/// This is also the backstop for Redis's module timers, which run on the wall clock: a timer
/// armed before the clock stepped back fires that much later (a minute's step held every
/// hand-over and every waiter's time-out a minute). The event loop turns at least every cron
/// tick, on the monotonic clock, so a timer found [`clock::TIMER_LATE_US`] past its due is
/// replaced by one due at once.
pub fn before_sleep(ctx: &Context, now: Now) {
    let backlog = BACKLOG.swap(false, Ordering::Relaxed);
    let paused = PAUSED_POLL.swap(false, Ordering::Relaxed);
    // Inserts and waiters of this turn, and the last sweep, ask for the timer.
    let requested = state::take_arm_request();
    if backlog || timer_late(now) {
        rearm(ctx, 0, now.mono);
        return;
    }
    if paused {
        rearm(ctx, PAUSED_POLL_MS, now.mono.saturating_add(PAUSED_POLL_MS * 1_000));
    }
    if requested {
        arm(ctx, now);
    }
}

/// Looks at one due entry: settles an expired lease (hand-over or deletion), reschedules a
/// renewed one.
fn sweep_one(ctx: &Context, entry_deadline: Micros, db: i32, key: &[u8], now: Now) {
    with_lock_at(ctx, db, key, now, |step, lock| match lock.on_due(entry_deadline, now) {
        Due::Stale => {}
        Due::Reschedule(deadline) => {
            state::with_expiry(|expiry| expiry.index.insert(deadline, db, key));
        }
        Due::Expired | Due::Vacant => step.settle_after(lock),
    });
}

/// Opens the lock at key `key` of database `db`, decides `op` on it at `now` and applies what
/// changed; nothing when the key is gone.
fn with_lock_at(
    ctx: &Context,
    db: i32,
    key: &[u8],
    now: Now,
    op: impl FnOnce(&mut Step<'_, apply::Server>, &mut Lock),
) {
    // SAFETY: ctx is live; SelectDb only changes which database this context addresses.
    if unsafe { raw::RedisModule_SelectDb.map_or(1, |f| f(ctx.ctx, db)) } != 0 {
        return;
    }
    let name = RedisString::create_from_slice(ctx.ctx, key);
    let handle = ctx.open_key_writable(&name);
    let Ok(Some(lock)) = handle.get_value::<Lock>(&LOCK_TYPE) else { return };
    let ((), changes) = apply::decide(now, |step| op(step, lock));
    apply::apply(ctx, &apply::Site { key: &handle, name: &name }, lock, true, changes, now);
}
