//! Server events that move, drop or orphan lock keys behind the module's back (SWAPDB, FLUSHDB /
//! FLUSHALL, role changes), start the grant delay and the fence lead (end of loading, promotion),
//! or need the fence counter written down (a fork for an AOF rewrite); and the event loop's
//! turns, where a sweep with work left resumes.

use std::cell::RefCell;
use std::os::raw::c_void;

use redis_module::{Context, KeysCursor, Status, raw};

use crate::core::Lock;
use crate::datatype::LOCK_TYPE;
use crate::state::{self, KeyRef};
use crate::{config, expiry};

/// Subscribes to the server events the module follows.
pub fn subscribe(ctx: &Context) -> Status {
    let events = [
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_FORK_CHILD,
        raw::REDISMODULE_EVENT_CONFIG,
    ];
    // SAFETY: ctx is the load context; the callback is a plain function that lives forever.
    let Some(subscribe) = (unsafe { raw::RedisModule_SubscribeToServerEvent }) else {
        return Status::Err;
    };
    for id in events {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: as above.
        if unsafe { subscribe(ctx.ctx, event, Some(on_server_event)) } != raw::REDISMODULE_OK as i32
        {
            crate::notify::log(
                ctx,
                crate::notify::Level::Warning,
                &format!("dlock: cannot subscribe to server event {id}"),
            );
            return Status::Err;
        }
    }
    // Valkey's atomic slot migration (the event does not exist on Redis: refused there).
    let migration =
        raw::RedisModuleEvent { id: crate::cluster::ATOMIC_SLOT_MIGRATION_EVENT, dataver: 1 };
    // SAFETY: as above.
    let _ = unsafe { subscribe(ctx.ctx, migration, Some(on_server_event)) };
    // Before the event loop sleeps the expiry timer is armed for what this turn inserted, and a
    // sweep with work left resumes (Redis 7.0+, Valkey).
    let event_loop = raw::RedisModuleEvent { id: raw::REDISMODULE_EVENT_EVENTLOOP, dataver: 1 };
    // SAFETY: as above.
    if unsafe { subscribe(ctx.ctx, event_loop, Some(on_server_event)) }
        != raw::REDISMODULE_OK as i32
    {
        crate::notify::log(
            ctx,
            crate::notify::Level::Warning,
            "dlock: cannot subscribe to the event loop's turns (Redis 7.0 or later is needed)",
        );
        return Status::Err;
    }
    Status::Ok
}

/// # Safety
/// Called by Redis on its main thread; `data` points to the event's info struct for `eid.id`.
unsafe extern "C" fn on_server_event(
    ctx: *mut raw::RedisModuleCtx,
    eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    let ctx = Context::new(ctx);
    match eid.id {
        raw::REDISMODULE_EVENT_SWAPDB if !data.is_null() => {
            // SAFETY: for SWAPDB, data is a RedisModuleSwapDbInfo.
            let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
            let (first, second) = (info.dbnum_first, info.dbnum_second);
            if first == second {
                return; // SWAPDB of a database with itself changes nothing for Redis either
            }
            state::with_expiry(|expiry| {
                expiry.index.rewrite(|_, _| true, |db| swapped(db, first, second))
            });
            if crate::waiters::dismiss_swapped(first, second) > 0 {
                state::arm_soon();
            }
        }
        raw::REDISMODULE_EVENT_FLUSHDB
            if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END && !data.is_null() =>
        {
            // SAFETY: for FLUSHDB, data is a RedisModuleFlushInfo; dbnum -1 means every database.
            let flushed = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() }.dbnum;
            state::with_expiry(|expiry| {
                expiry.index.rewrite(|db, _| flushed != -1 && db != flushed, |db| db)
            });
        }
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED => {
            if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
                let now = crate::clock::now();
                config::hold_new_grants(now.mono);
                // Above whatever the deposed primary may still mint (docs/guarantees.md).
                config::lead_fences(now.wall);
                index_every_lock(&ctx);
            } else {
                // The server answers blocked clients itself when it turns into a replica.
                state::with_expiry(|expiry| expiry.index.clear());
            }
        }
        raw::REDISMODULE_EVENT_LOADING
            if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED
                && expiry::decides_expiry(&ctx) =>
        {
            // The grant delay counts from when the data set is back, not from module load, and
            // the fence lead from the clock then.
            let now = crate::clock::now();
            config::hold_new_grants(now.mono);
            config::lead_fences(now.wall);
            state::arm_soon(); // for the leases just loaded
        }
        raw::REDISMODULE_EVENT_FORK_CHILD
            if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN
                && expiry::decides_expiry(&ctx) =>
        {
            // An AOF rewrite opens a new increment file before it forks: record the counter
            // there, next to a base that may hold no lock key (and, without a preamble, no aux).
            crate::commands::setfence::propagate_counter_soon(crate::clock::now());
        }
        raw::REDISMODULE_EVENT_CONFIG => crate::notify::refresh_log_level(&ctx),
        crate::cluster::ATOMIC_SLOT_MIGRATION_EVENT => {
            // SAFETY: for this event, data is null or Valkey's migration info, valid now.
            unsafe { crate::cluster::slot_migration(&ctx, subevent, data) }
        }
        raw::REDISMODULE_EVENT_EVENTLOOP
            if subevent == raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP =>
        {
            let now = crate::clock::now();
            crate::cluster::before_sleep(&ctx, now);
            crate::timer::before_sleep(&ctx, now)
        }
        _ => {}
    }
}

/// The database a key of `db` lives in after `first` and `second` swapped.
fn swapped(db: i32, first: i32, second: i32) -> i32 {
    if db == first {
        second
    } else if db == second {
        first
    } else {
        db
    }
}

/// A promoted replica starts deciding expiry: index every lock key it holds.
fn index_every_lock(ctx: &Context) {
    let found = RefCell::new(Vec::new());
    for db in 0.. {
        // SAFETY: ctx is live; SelectDb fails once db is past the configured databases.
        if unsafe { raw::RedisModule_SelectDb.map_or(1, |f| f(ctx.ctx, db)) } != 0 {
            break;
        }
        let cursor = KeysCursor::new();
        while cursor.scan(
            ctx,
            &|_ctx: &Context,
              name: &redis_module::RedisString,
              key: Option<&redis_module::key::RedisKey>| {
                let lock = key.and_then(|key| key.get_value::<Lock>(&LOCK_TYPE).ok().flatten());
                if let Some(lock) = lock {
                    // What the lock remembers of an earlier term as primary (or nothing) is
                    // replaced by the entry inserted now: a renewal trusts it to skip the index.
                    let deadline = lock.index_deadline();
                    lock.note_index_entry(deadline);
                    found
                        .borrow_mut()
                        .push((deadline, KeyRef { db, name: name.as_slice().into() }));
                }
            },
        ) {}
    }
    let found = found.into_inner();
    let count = found.len();
    state::with_expiry(|expiry| {
        for (deadline, key) in found {
            expiry.index.insert(deadline, key.db, &key.name);
        }
    });
    state::arm_soon();
    crate::notify::log(
        ctx,
        crate::notify::Level::Notice,
        &format!("dlock: now primary; {count} lock keys indexed for expiry"),
    );
}

#[cfg(test)]
mod tests {
    use super::swapped;

    #[test]
    fn swapdb_exchanges_exactly_the_two_databases() {
        assert_eq!(swapped(0, 0, 3), 3);
        assert_eq!(swapped(3, 0, 3), 0);
        assert_eq!(swapped(5, 0, 3), 5);
    }
}
