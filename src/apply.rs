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

use std::cell::RefCell;

use dlock_proto::slot::key_slot;
use redis_module::key::RedisKeyWritable;
use redis_module::{Context, RedisString, raw};

use crate::core::decimal::{MAX_DIGITS, decimal};
use crate::core::effects::{self, Effect, LogLevel, Place};
use crate::core::replica::{self, COMPACT_MAX, History};
use crate::core::{Changes, Host, Lease, Lock, Micros, Now, Step};
use crate::notify;
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
pub fn decide<T>(now: Now, op: impl FnOnce(&mut Step<'_, Server>) -> T) -> (T, Changes) {
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
    /// The request's token as the client sent it (ACQUIRE, RENEW): the lease's effect passes
    /// this string on rather than a copy of its bytes.
    pub token: Option<&'a RedisString>,
    /// The client's command, replayed by a replica or the AOF, deletes the key (RELEASE): a
    /// deletion is propagated as that command, which the server passes on as it received it,
    /// instead of as a `DEL`, which it would look up by name first.
    pub replays_as_delete: bool,
    /// Where the expiry sweep gathers its deletions, to propagate them as one `DEL` of many keys.
    pub deletions: Option<&'a RefCell<Deletions>>,
}

/// Deletions the expiry sweep propagates together, as `DEL key…` for keys of one database (and,
/// in Cluster, one slot): the server looks `DEL` up by name once for them all rather than once a
/// key. Before anything else is propagated the gathered deletions go first ([`Deletions::flush`]),
/// so the stream differs from one `DEL` a key only in the order of deletions among themselves,
/// which commute.
#[derive(Default)]
pub struct Deletions {
    /// The database and slot of the names gathered (the slot is 0 outside Cluster).
    place: (i32, u16),
    /// Key names, each retained until the flush.
    names: Vec<*mut raw::RedisModuleString>,
}

/// Most keys in one propagated `DEL`.
const DELETIONS_MAX: usize = 1_024;

impl Deletions {
    /// Gathers the deletion of `name` in the selected database `db`.
    fn push(&mut self, ctx: &Context, db: i32, name: &RedisString) {
        let place = (db, if notify::in_cluster(ctx) { key_slot(name.as_slice()) } else { 0 });
        if place != self.place || self.names.len() >= DELETIONS_MAX {
            self.flush(ctx);
            self.place = place;
        }
        // SAFETY: the API table is written once, when the module loads.
        let Some(retain) = (unsafe { raw::RedisModule_RetainString }) else {
            return replicate_del(ctx, name);
        };
        // SAFETY: `name` is a live string; retained with no context, it lives until the one
        // free of it in `flush`.
        unsafe { retain(std::ptr::null_mut(), name.inner) };
        self.names.push(name.inner);
    }

    /// Propagates the gathered deletions as one `DEL`, in their database, and lets go of the
    /// names. Leaves the context's selected database as it found it.
    pub fn flush(&mut self, ctx: &Context) {
        if self.names.is_empty() {
            return;
        }
        // SAFETY: ctx is live; SelectDb/GetSelectedDb only change or read which database it
        // addresses; format "v" takes an array of RedisModuleStrings and its length, each
        // retained by Redis for as long as it needs it; every name was retained in `push` and
        // is freed once, here.
        unsafe {
            let current = raw::RedisModule_GetSelectedDb.map_or(self.place.0, |f| f(ctx.ctx));
            if current != self.place.0
                && let Some(select) = raw::RedisModule_SelectDb
            {
                select(ctx.ctx, self.place.0);
            }
            if let Some(replicate) = raw::RedisModule_Replicate {
                replicate(
                    ctx.ctx,
                    c"DEL".as_ptr(),
                    c"v".as_ptr(),
                    self.names.as_mut_ptr(),
                    self.names.len(),
                );
            }
            if current != self.place.0
                && let Some(select) = raw::RedisModule_SelectDb
            {
                select(ctx.ctx, current);
            }
            if let Some(free) = raw::RedisModule_FreeString {
                for name in self.names.drain(..) {
                    free(std::ptr::null_mut(), name);
                }
            }
        }
        self.names.clear();
    }
}

impl<'a> Site<'a> {
    /// The lock at `key`, named `name`; `token`: [`Site::token`].
    pub fn new(
        key: &'a RedisKeyWritable,
        name: &'a RedisString,
        token: Option<&'a RedisString>,
    ) -> Self {
        Self { key, name, token, replays_as_delete: false, deletions: None }
    }
}

/// Makes `changes` (of `lock`, stored at `site` unless `stored` is false) visible and durable:
/// performs the effects [`effects::plan`] gives, in its order.
pub fn apply(
    ctx: &Context,
    site: &Site<'_>,
    lock: &Lock,
    stored: bool,
    changes: Changes,
    now: Now,
) {
    let place = if stored {
        Place::Stored {
            indexes: expiry::decides_expiry(ctx),
            grants_held_until: config::grants_held_until(),
        }
    } else {
        Place::NotStored
    };
    let mut executor = Executor::at(ctx, site, now);
    effects::plan(lock, place, &changes, now, |effect| executor.perform(effect));
    executor.finish(site);
}

/// For a decision made inside a keyspace notification (a value arrived under a new name),
/// where the server takes no write: counters, events, log lines and answers only. The timer
/// removes the vacant key afterwards, with its `DEL`, like any other.
pub fn announce_only(ctx: &Context, name: &RedisString, lock: &Lock, changes: Changes, now: Now) {
    let mut executor = Executor { ctx, name, token: None, now, delete: None, deletions: None };
    effects::plan(lock, Place::Notified, &changes, now, |effect| executor.perform(effect));
}

/// Performs the effects of a replicated lease change (`DLOCK.SETLEASE`, `DLOCK.ENDLEASE`)
/// already made to `lock` at `site` ([`effects::plan_replicated`]).
pub fn apply_replicated(ctx: &Context, site: &Site<'_>, lock: &Lock, now: Now) {
    let indexes = expiry::decides_expiry(ctx);
    let mut executor = Executor::at(ctx, site, now);
    effects::plan_replicated(lock, indexes, now, |effect| executor.perform(effect));
    executor.finish(site);
}

/// Performs effects one by one, each with one call into the server; the key's deletion waits for
/// [`Executor::finish`], once nothing refers to the lock any more.
struct Executor<'c> {
    ctx: &'c Context,
    name: &'c RedisString,
    token: Option<&'c RedisString>,
    now: Now,
    /// A planned deletion: the pending index entry to forget, and whether to propagate it.
    delete: Option<(Option<Micros>, bool)>,
    /// The sweep's gathered deletions, flushed before anything else is propagated.
    deletions: Option<&'c RefCell<Deletions>>,
}

impl<'c> Executor<'c> {
    /// An executor for the lock at `site`.
    fn at(ctx: &'c Context, site: &Site<'c>, now: Now) -> Self {
        Self {
            ctx,
            name: site.name,
            token: site.token,
            now,
            delete: None,
            deletions: site.deletions,
        }
    }

    fn perform(&mut self, effect: Effect<'_>) {
        if effect.is_replication()
            && let Some(deletions) = self.deletions
        {
            deletions.borrow_mut().flush(self.ctx);
        }
        match effect {
            Effect::DeleteKey { forget, propagate } => self.delete = Some((forget, propagate)),
            Effect::ReplicateLease(lease) => {
                // The client's own string, when it is this lease's token.
                let token = self.token.filter(|token| token.as_slice() == &*lease.token);
                let history = Some((lease.granted_wall(self.now), lease.renewals()));
                if !(lease.is_plain() && self.in_place(token, lease, history)) {
                    replicate_lease(self.ctx, self.name, lease, token, self.now);
                }
            }
            Effect::ReplicateRenewal(lease) => {
                let token = self.token.filter(|token| token.as_slice() == &*lease.token);
                if !self.in_place(token, lease, None) {
                    replicate_renewal(self.ctx, self.name, lease, token);
                }
            }
            effect => perform(self.ctx, self.name, effect, self.now),
        }
    }

    /// Propagates a plain exclusive `lease` of the client's `token` as the client's own command
    /// rewritten into `DLOCK.SETLEASE resource token effect` ([`replicate_in_place`]); whether
    /// it could.
    fn in_place(&self, token: Option<&RedisString>, lease: &Lease, history: History) -> bool {
        token.is_some_and(|token| replicate_in_place(self.ctx, self.name, token, lease, history))
    }

    /// Deletes the key if that was planned (the lock must not be used after this).
    fn finish(self, site: &Site<'_>) {
        let Some((forget, propagate)) = self.delete else { return };
        if let Some(deadline) = forget {
            expiry::forget(self.ctx, site.name, deadline);
        }
        if site.key.delete().is_ok() && propagate {
            if site.replays_as_delete {
                self.ctx.replicate_verbatim();
            } else if let Some(deletions) = site.deletions {
                deletions.borrow_mut().push(self.ctx, expiry::selected_db(self.ctx), site.name);
            } else {
                replicate_del(self.ctx, site.name);
            }
        }
    }
}

/// Performs one effect (a key deletion is [`Executor::finish`]'s).
fn perform(ctx: &Context, name: &RedisString, effect: Effect<'_>, now: Now) {
    match effect {
        Effect::Count(change) => metrics::count(|stats| stats.record(change, now.mono)),
        Effect::Watch(watch) => {
            let db = expiry::selected_db(ctx);
            state::with_watched(|watched| watched.note(db, name.as_slice(), watch));
        }
        Effect::Block { waiter } => {
            // Its time-out (and, if the block fails, its leaving the line) is the timer's.
            waiters::block(ctx, waiter);
            state::arm_soon();
        }
        Effect::Event { what, lease, publish, detail } => {
            notify::transition(ctx, what, name, lease, now);
            if publish {
                notify::publish(ctx, what, name, lease, detail, now.mono);
            }
        }
        Effect::Granted { lease, request } => {
            notify::publish_granted(ctx, name, lease, request, now.mono);
        }
        Effect::Log(line) => match line.level() {
            LogLevel::Verbose => notify::verbose(ctx, || line.text(name.as_slice())),
            LogLevel::Anomaly => notify::anomaly(ctx, now, || line.text(name.as_slice())),
            LogLevel::Warning => {
                notify::log(ctx, notify::Level::Warning, &line.text(name.as_slice()));
            }
        },
        Effect::Answer { waiter, grant: Some(lease) } => {
            let grant = Grant {
                key: expiry::key_ref(ctx, name.as_slice()),
                token: (*lease.token).into(),
                fence: lease.fence,
            };
            waiters::answer(waiter, Outcome::Granted(lease.fence), Some(grant));
        }
        Effect::Answer { waiter, grant: None } => {
            waiters::answer(waiter, Outcome::Nil, None);
        }
        Effect::Confirm { fence } => {
            waiters::confirm_grant(fence);
            state::confirm_grant(fence);
        }
        Effect::ReplicateLease(lease) => replicate_lease(ctx, name, lease, None, now),
        Effect::ReplicateRenewal(lease) => replicate_renewal(ctx, name, lease, None),
        Effect::ReplicateEnd(lease) => {
            let fence = lease.fence.to_string();
            ctx.replicate(ENDLEASE, &[name.as_slice(), &lease.token, fence.as_bytes()]);
        }
        Effect::ReplicateDel => replicate_del(ctx, name),
        Effect::Index(at) => expiry::insert(ctx, name.as_slice(), at),
        Effect::PassOn => ctx.replicate_verbatim(),
        // Never reached: `Executor::perform` keeps a deletion for `Executor::finish`, after every
        // other effect (no panic may reach the server, so nothing happens here).
        Effect::DeleteKey { .. } => {}
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

/// Propagates a lease as its effect, history included:
/// `DLOCK.SETLEASE resource token fence deadline-unix-us GRANTED granted-unix-us RENEWALS n`,
/// then `SHARED` and `META value` when they apply.
/// Propagates `DLOCK.SETLEASE` with `lease` as it now is; `token`, when given, is a string
/// holding the lease's token (the client's), passed on instead of a copy.
fn replicate_lease(
    ctx: &Context,
    resource: &RedisString,
    lease: &Lease,
    token: Option<&RedisString>,
    now: Now,
) {
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
    let deadline = decimal(lease.deadline_wall().min(i64::MAX as u64), &mut deadline);
    let granted = decimal(lease.granted_wall(now), &mut granted);
    let renewals = decimal(u64::from(lease.renewals()), &mut renewals);
    // The raw call: the crate's `replicate` would copy every argument into a new string, and
    // ACQUIRE makes this call on every grant. Numbers go as digits we print (format `b`, one
    // allocation each in Redis) rather than as `l` (Redis prints them into a string of its own
    // and wraps it: two); the keywords and a fresh grant's `0` renewals go as strings made once
    // and kept (format `s`: Redis takes a reference, no allocation and no free).
    let Some(kept) = Kept::get() else {
        // Never made (no string API): every argument as a copied buffer.
        let args = lease.effect_args(now);
        let mut all: Vec<&[u8]> = vec![resource.as_slice()];
        all.extend(args.iter().map(Vec::as_slice));
        return ctx.replicate(SETLEASE_NAME, all.as_slice());
    };
    // SAFETY: the API table is written once, when the module loads.
    let Some(replicate) = (unsafe { raw::RedisModule_Replicate }) else { return };
    let buffer = |bytes: &[u8]| (bytes.as_ptr().cast::<std::os::raw::c_char>(), bytes.len());
    let ((fence_ptr, fence_len), (deadline_ptr, deadline_len), (granted_ptr, granted_len)) =
        (buffer(fence), buffer(deadline), buffer(granted));
    let (token_ptr, token_len) = buffer(&lease.token);
    let (renewals_ptr, renewals_len) = buffer(renewals);
    let (ctx, command, key) = (ctx.ctx, SETLEASE.as_ptr(), resource.inner);
    let (kw_granted, kw_renewals, zero) = (kept.granted, kept.renewals, kept.zero);
    // The token as the client's string or a copy; the renewals as the kept `0` or digits.
    macro_rules! setlease {
        ($format:literal, [$($token:expr),+], [$($renewals:expr),+]) => {
            replicate(
                ctx, command, $format.as_ptr(), key, $($token,)+ fence_ptr, fence_len,
                deadline_ptr, deadline_len, kw_granted, granted_ptr, granted_len, kw_renewals,
                $($renewals),+
            )
        };
    }
    // SAFETY: ctx is live; the command name and the formats are NUL-terminated; each format
    // takes RedisModuleStrings (`s`: the key's name and the client's token, live for this call,
    // and the kept strings, never freed) and (pointer, length) buffers that Redis copies (`b`),
    // each as it says; every buffer outlives the call.
    unsafe {
        match (token, lease.renewals() == 0) {
            (Some(token), true) => setlease!(c"ssbbsbss", [token.inner], [zero]),
            (Some(token), false) => {
                setlease!(c"ssbbsbsb", [token.inner], [renewals_ptr, renewals_len])
            }
            (None, true) => setlease!(c"sbbbsbss", [token_ptr, token_len], [zero]),
            (None, false) => {
                setlease!(c"sbbbsbsb", [token_ptr, token_len], [renewals_ptr, renewals_len])
            }
        };
    }
}

/// Propagates a renewal of a plain exclusive lease the copies hold as
/// `DLOCK.SETLEASE resource token fence deadline-unix-us`: without the history, which each copy
/// keeps from the grant, counting the renewal because the deadline moved
/// ([`replica::set_lease`](crate::core::replica::set_lease)). `token`: as for
/// [`replicate_lease`].
fn replicate_renewal(
    ctx: &Context,
    resource: &RedisString,
    lease: &Lease,
    token: Option<&RedisString>,
) {
    let (mut fence, mut deadline) = ([0; MAX_DIGITS], [0; MAX_DIGITS]);
    let fence = decimal(lease.fence.min(i64::MAX as u64), &mut fence);
    let deadline = decimal(lease.deadline_wall().min(i64::MAX as u64), &mut deadline);
    // SAFETY: the API table is written once, when the module loads.
    let Some(replicate) = (unsafe { raw::RedisModule_Replicate }) else { return };
    let buffer = |bytes: &[u8]| (bytes.as_ptr().cast::<std::os::raw::c_char>(), bytes.len());
    let ((fence_ptr, fence_len), (deadline_ptr, deadline_len)) = (buffer(fence), buffer(deadline));
    let (ctx, command, key) = (ctx.ctx, SETLEASE.as_ptr(), resource.inner);
    // SAFETY: as in `replicate_lease`: the key's name and the client's token are strings live
    // for this call (`s`), the other arguments buffers Redis copies (`b`), each as the format
    // says; every buffer outlives the call.
    unsafe {
        match token {
            Some(token) => replicate(
                ctx,
                command,
                c"ssbb".as_ptr(),
                key,
                token.inner,
                fence_ptr,
                fence_len,
                deadline_ptr,
                deadline_len,
            ),
            None => {
                let (token_ptr, token_len) = buffer(&lease.token);
                replicate(
                    ctx,
                    command,
                    c"sbbb".as_ptr(),
                    key,
                    token_ptr,
                    token_len,
                    fence_ptr,
                    fence_len,
                    deadline_ptr,
                    deadline_len,
                )
            }
        };
    }
}

/// The strings every lease's effect carries, made once (with no context: never freed) and kept
/// for the process's life. Only the main thread uses them.
struct Kept {
    setlease: *mut raw::RedisModuleString,
    granted: *mut raw::RedisModuleString,
    renewals: *mut raw::RedisModuleString,
    zero: *mut raw::RedisModuleString,
}

// SAFETY: the pointers are immutable strings Redis never frees (created without a context) and
// only the main thread passes them to Redis.
unsafe impl Send for Kept {}
// SAFETY: as above.
unsafe impl Sync for Kept {}

impl Kept {
    /// The kept strings; `None` if they could not be made.
    fn get() -> Option<&'static Self> {
        static KEPT: std::sync::OnceLock<Kept> = std::sync::OnceLock::new();
        let kept = KEPT.get_or_init(|| {
            let make = |text: &[u8]| {
                // SAFETY: a null context makes a string that is not freed automatically; the
                // bytes are copied.
                unsafe {
                    raw::RedisModule_CreateString.map_or(std::ptr::null_mut(), |create| {
                        create(std::ptr::null_mut(), text.as_ptr().cast(), text.len())
                    })
                }
            };
            Self {
                setlease: make(SETLEASE.to_bytes()),
                granted: make(b"GRANTED"),
                renewals: make(b"RENEWALS"),
                zero: make(b"0"),
            }
        });
        let made =
            [kept.setlease, kept.granted, kept.renewals, kept.zero].iter().all(|p| !p.is_null());
        made.then_some(kept)
    }
}

/// Propagates `DLOCK.SETLEASE resource token effect` without the server's lookup of a command by
/// name and the argument vector `RedisModule_Replicate` builds: when the command running now
/// was called as `name resource token arg` with these very strings, its argument vector is
/// rewritten to `DLOCK.SETLEASE resource token effect` for the moment of
/// `RedisModule_ReplicateVerbatim` and put back at once. Returns false (nothing propagated)
/// when the call does not have that shape.
///
/// This relies on the server passing the command its client's own argument vector and copying
/// the strings' references when replicating verbatim (Redis 7.0, 7.4, 8.0 and Valkey 9 do;
/// `tests/persistence.rs` and `tests/replication.rs` fail the day a server does not: its AOF or
/// its replica would receive the client's ACQUIRE).
fn replicate_in_place(
    ctx: &Context,
    resource: &RedisString,
    token: &RedisString,
    lease: &Lease,
    history: History,
) -> bool {
    let Some((argv, 4)) = crate::call::current() else { return false };
    let Some(kept) = Kept::get() else { return false };
    // SAFETY: the API table is written once, when the module loads.
    let (Some(create), Some(free)) =
        (unsafe { (raw::RedisModule_CreateString, raw::RedisModule_FreeString) })
    else {
        return false;
    };
    // SAFETY: `argv` holds the 4 strings Redis passed to the command running now, live until it
    // returns.
    let args = unsafe { std::slice::from_raw_parts_mut(argv, 4) };
    if args[1] != resource.inner || args[2] != token.inner {
        return false;
    }
    let mut effect = [0; COMPACT_MAX];
    let effect = replica::write_compact(lease.fence, lease.deadline_wall(), history, &mut effect);
    // SAFETY: a null context makes a string only the explicit free below lets go of; the bytes
    // are copied.
    let effect = unsafe { create(std::ptr::null_mut(), effect.as_ptr().cast(), effect.len()) };
    if effect.is_null() {
        return false;
    }
    let (name, last) = (args[0], args[3]);
    args[0] = kept.setlease;
    args[3] = effect;
    ctx.replicate_verbatim();
    args[0] = name;
    args[3] = last;
    // SAFETY: made above; the server holds its own reference for as long as it propagates it.
    unsafe { free(std::ptr::null_mut(), effect) };
    true
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
