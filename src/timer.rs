//! Active expiry: one timer drains the deadline index in bounded slices, answers waiters that
//! timed out, and takes gone waiters and lost grants out of their locks, each through the one
//! apply path. When an entry comes due the key's lock decides ([`Lock::on_due`]). While writes
//! are paused nothing is decided (see `expiry::writes_paused`). Also here: the keyspace handler
//! that meets lock values arriving under a new name.

use std::cell::RefCell;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use redis_module::{Context, ContextFlags, NotifyEvent, RedisString, Status, raw};

use crate::core::expiry::DueBatch;
use crate::core::lock::Due;
use crate::core::schedule::{Plan, SweepWork};
use crate::core::{Lock, Micros, Now, Step};
use crate::datatype::LOCK_TYPE;
use crate::expiry::{decides_expiry, writes_paused};
use crate::state::{self, Expiry};
use crate::{apply, clock, expiry};

/// Longest a slice of the sweep may run before yielding to clients.
const SLICE_BUDGET: Duration = Duration::from_millis(2);
/// Most entries looked at in one slice, whatever the clock says.
const SLICE_MAX_ENTRIES: usize = 10_000;
/// Entries taken from the index at a time (one lock of the index, one buffer of names).
const SWEEP_BATCH: usize = 64;

/// Keyspace events that put an existing lock value under a (new) key name.
const ARRIVAL_EVENTS: [&[u8]; 5] = [b"loaded", b"restore", b"rename_to", b"move_to", b"copy_to"];

/// Subscribes to the generic and loading keyspace events ([`on_keyspace_notification`]).
pub fn subscribe_keyspace(ctx: &Context) -> Status {
    let classes = NotifyEvent::GENERIC | NotifyEvent::LOADED;
    // SAFETY: ctx is the load context; the callback is a plain function that lives forever.
    let subscribed = unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents
            .map(|subscribe| subscribe(ctx.ctx, classes.bits(), Some(on_keyspace_notification)))
    };
    if subscribed == Some(raw::REDISMODULE_OK as c_int) { Status::Ok } else { Status::Err }
}

/// Called by Redis for every generic keyspace event of every key of the server (each `DEL`,
/// `EXPIRE`, `SET … PX`, whatever the key holds): the event's name is checked on its bytes before
/// anything is built, and only an arrival goes on to [`on_keyspace_event`], guarded like a
/// command (a panic must never unwind into Redis).
///
/// # Safety
/// Redis calls it on its main thread with a live context, a NUL-terminated event name and the
/// key's name.
unsafe extern "C" fn on_keyspace_notification(
    ctx: *mut raw::RedisModuleCtx,
    _class: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if event.is_null() || key.is_null() {
        return raw::REDISMODULE_OK as c_int;
    }
    // SAFETY: Redis passes a NUL-terminated event name that lives for this call.
    let event = unsafe { CStr::from_ptr(event) }.to_bytes();
    if ARRIVAL_EVENTS.contains(&event) {
        let name = RedisString::string_as_slice(key);
        let _ =
            catch_unwind(AssertUnwindSafe(|| on_keyspace_event(&Context::new(ctx), event, name)));
    }
    raw::REDISMODULE_OK as c_int
}

/// A lock value arrived under a key name: renamed or moved to it, or restored outside Cluster,
/// it loses its lease and its waiters (on every copy of the data set alike); then every arrival
/// is indexed, so the timer expires it or removes it once vacant.
fn on_keyspace_event(ctx: &Context, event: &[u8], name: &[u8]) {
    let key_name = RedisString::create_from_slice(ctx.ctx, name);
    let key = ctx.open_key_writable(&key_name);
    let Ok(Some(lock)) = key.get_value::<Lock>(&LOCK_TYPE) else { return };
    let now = clock::now();
    // Outside Cluster a RESTORE is a copy too (an old DUMP replayed could bring an old fence
    // back); in Cluster it is how MIGRATE moves a slot's keys, and the lease moves with them.
    let restored = event == b"restore" && !ctx.get_flags().contains(ContextFlags::CLUSTER);
    if matches!(event, b"rename_to" | b"move_to") || restored {
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

/// Before the event loop sleeps (and after a server event that changed what is due): asks the
/// schedule whether to (re)arm the one module timer, and does it. The only place a module timer
/// is created or stopped.
///
/// Never from inside a timer callback: Redis fires module timers in a loop against the wall
/// clock read once as the loop starts, and fires at once any timer created inside it that is due
/// by then. After a step back of the wall clock in the middle of a callback, every timer it armed
/// was: the callback ran again and again, serving no client, until the clock caught up (18 s in
/// a chaos run). So the callback tells the schedule what it left, and it is armed here.
///
/// The schedule also replaces a timer held up by a step back of the wall clock (Redis runs module
/// timers on it; a minute's step held every hand-over a minute): the event loop turns at least
/// every cron tick, on the monotonic clock, and a timer found late is replaced by one due at once.
pub fn before_sleep(ctx: &Context, now: Now) {
    let requested = state::take_arm_request();
    let plan = state::with_expiry(|expiry| {
        if requested {
            expiry.schedule.request();
        }
        let Expiry { schedule, index, to_prune, to_release } = expiry;
        schedule.plan(now.mono, || SweepWork {
            index: index.next_deadline(),
            time_out: crate::waiters::next_timeout(),
            clean_up: !to_prune.is_empty() || !to_release.is_empty(),
        })
    });
    perform(ctx, plan);
}

/// Stops and creates the module timer as the plan says.
fn perform(ctx: &Context, plan: Plan) {
    let Plan::Arm { stop, delay_ms, due } = plan else { return };
    // SAFETY: ctx is live; the stopped id was returned by CreateTimer and carries no data; this
    // is not a timer callback, so the stopped timer is not the one running.
    unsafe {
        if let (Some(id), Some(stop_timer)) = (stop, raw::RedisModule_StopTimer) {
            stop_timer(ctx.ctx, id, std::ptr::null_mut());
        }
        if let Some(create) = raw::RedisModule_CreateTimer {
            let id = create(ctx.ctx, delay_ms as i64, Some(on_timer), std::ptr::null_mut());
            state::with_expiry(|expiry| expiry.schedule.armed(id, due));
        }
    }
    wake_event_loop(delay_ms);
}

/// Makes the event loop turn once more before it sleeps, so it sees the timer just created.
/// Redis 7.0 computes how long to sleep before it calls the before-sleep hook, so a timer armed
/// there waited for the next cron tick (up to a second at `hz 1`); Redis 7.4 and Valkey ask the
/// hook first, and the extra turn costs them a pipe write. A timer a second or more away needs
/// no wake: the cron tick comes first.
fn wake_event_loop(delay_ms: u64) {
    if delay_ms >= 1_000 {
        return;
    }
    // SAFETY: AddOneShot takes a plain function and no data; the callback does nothing.
    unsafe {
        if let Some(add) = raw::RedisModule_EventLoopAddOneShot {
            add(Some(on_wake), std::ptr::null_mut());
        }
    }
}

/// # Safety
/// Called by Redis on its main thread; does nothing (the wake was the point).
unsafe extern "C" fn on_wake(_data: *mut c_void) {}

/// # Safety
/// Called by Redis on its main thread with a context valid for this call.
unsafe extern "C" fn on_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    let ctx = Context::new(ctx);
    let outer = crate::call::enter_turn();
    turn(&ctx);
    crate::call::leave(outer);
}

/// One turn of the timer: time-outs, waiters gone, grants undone, then due index entries until
/// the slice's budget is spent.
fn turn(ctx: &Context) {
    let started = clock::now();
    let fired = state::with_expiry(|expiry| expiry.schedule.fired(started.mono));
    if !decides_expiry(ctx) {
        state::with_expiry(|expiry| expiry.index.clear());
        return;
    }
    // Answering a waiter nil changes no data, so time-outs are kept even during a pause.
    crate::waiters::time_out(started.mono);
    if writes_paused() {
        // Expired leases, gone waiters, lost grants and the counter's propagation stay as they
        // are until writes resume: a propagated write would abort the server.
        state::with_expiry(|expiry| expiry.schedule.writes_paused(started.mono, fired.propagate));
        return;
    }
    if fired.propagate {
        apply::propagate_fence_counter(ctx);
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
        with_lock_at(ctx, key.db, &key.name, started, None, |step, lock| step.leave(lock, &ids));
    }
    for grant in to_release {
        with_lock_at(ctx, grant.key.db, &grant.key.name, started, None, |step, lock| {
            step.undo_grant(lock, &grant.token, grant.fence);
        });
    }
    let mut now = started;
    let mut seen = 0;
    let mut due = DueBatch::default();
    // Expired keys' deletions go out together, whichever way the turn ends.
    let deletions = RefCell::new(apply::Deletions::default());
    'turn: loop {
        // A batch at a time: one lock of the index, and names copied out in one buffer.
        due.clear();
        if state::with_expiry(|expiry| expiry.index.pop_due(now.mono, SWEEP_BATCH, &mut due)) == 0 {
            break;
        }
        // The clock is read after every entry: one entry may be a slice of a crowd's settle.
        for (done, (deadline, db, name)) in due.iter().enumerate() {
            sweep_one(ctx, deadline, db, name, now, &deletions);
            seen += 1;
            now = clock::now();
            if seen >= SLICE_MAX_ENTRIES
                || now.mono.saturating_sub(started.mono) >= SLICE_BUDGET.as_micros() as u64
            {
                // Come back on the next turn of the event loop, after clients had theirs; the
                // entries of this batch not looked at yet go back to the index.
                state::with_expiry(|expiry| {
                    for (deadline, db, name) in due.iter().skip(done + 1) {
                        expiry.index.insert(deadline, db, name);
                    }
                    expiry.schedule.yielded();
                });
                break 'turn;
            }
        }
    }
    deletions.borrow_mut().flush(ctx);
}

/// Looks at one due entry: settles an expired lease (hand-over or deletion), reschedules a
/// renewed one.
fn sweep_one(
    ctx: &Context,
    entry_deadline: Micros,
    db: i32,
    key: &[u8],
    now: Now,
    deletions: &RefCell<apply::Deletions>,
) {
    let site = Some(deletions);
    with_lock_at(ctx, db, key, now, site, |step, lock| match lock.on_due(entry_deadline, now) {
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
    deletions: Option<&RefCell<apply::Deletions>>,
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
    let site = apply::Site { deletions, ..apply::Site::new(&handle, &name, None) };
    apply::apply(ctx, &site, lock, true, changes, now);
}
