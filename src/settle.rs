//! Bringing a lock up to date before and after every decision: gone waiters leave the queue, an
//! expired lease ends, the head of the queue gets the lease, and a lock with nothing left in it
//! loses its key. Commands, the expiry timer and waiter clean-up all go through here, so a
//! hand-over happens the same way (one propagated grant, one answered waiter) wherever it starts.

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, RedisString};

use crate::commands::{delete_lock_key, replicate_lease};
use crate::core::args::printable;
use crate::core::{DlockError, Lock, Now};
use crate::notify::{self, Transition};
use crate::state::Grant;
use crate::waiters::{self, Outcome};
use crate::{config, expiry, metrics, state};

/// Prunes gone waiters, ends an expired lease and hands a free lock to the head of its queue
/// (propagating the grant and answering the waiter). Never deletes the key.
pub fn pass_on(
    ctx: &Context,
    name: &RedisString,
    lock: &mut Lock,
    now: Now,
) -> Result<(), DlockError> {
    if let Some(expired) = lock.expire(now) {
        metrics::count(|stats| {
            stats.leases_expired += 1;
            stats.hold_time.record(expired.deadline_mono.saturating_sub(expired.granted_mono));
        });
        notify::transition(ctx, Transition::Expired, name, &expired, now);
        notify::anomaly(ctx, now, || {
            format!(
                "lease expired under its holder resource={} owner={} fence={} held-ms={} renewals={}",
                printable(name.as_slice()),
                printable(&expired.token),
                expired.fence,
                expired.deadline_mono.saturating_sub(expired.granted_mono) / 1_000,
                expired.renewals
            )
        });
    }
    let rules = config::rules(now.mono);
    let handed = state::with_fences(|fences| {
        lock.hand_over(now, fences, rules, |waiter| waiters::is_alive(waiter.id))
    })?;
    if let Some(handed) = handed {
        let mut grant = None;
        if let Some(lease) = lock.lease() {
            replicate_lease(ctx, name, lease);
            notify::transition(ctx, Transition::Handoff, name, lease, now);
            let key = expiry::key_ref(ctx, name.as_slice());
            grant = Some(Grant { key, token: (*lease.token).into(), fence: lease.fence });
        }
        waiters::answer(handed.waiter, Outcome::Granted(handed.fence), grant);
        metrics::count(|stats| {
            stats.waits_granted += 1;
            stats.wait_time.record(handed.waited);
        });
    }
    Ok(())
}

/// After a decision: deletes the key of a vacant lock, or makes sure the timer will come back
/// for it (its lease's deadline, or the end of the grant delay for a queue without a lease).
pub fn tidy(ctx: &Context, key: &RedisKeyWritable, name: &RedisString, lock: &Lock, now: Now) {
    if lock.is_vacant(now) {
        delete_lock_key(ctx, key, name);
        return;
    }
    expiry::schedule(ctx, name, lock, now);
    if lock.lease().is_none() {
        expiry::wake_at(ctx, name, config::grants_held_until(), now);
    }
}

/// Releases a lease handed to a waiter whose reply never arrived (it left in between), if that
/// lease is still the live one, and passes the lock on.
pub fn release_lost_grant(
    ctx: &Context,
    key: &RedisKeyWritable,
    name: &RedisString,
    lock: &mut Lock,
    grant: &Grant,
    now: Now,
) {
    let current = lock.live_lease(now).is_some_and(|l| l.fence == grant.fence);
    if let Some(lease) = lock.release(&grant.token, now).filter(|_| current) {
        notify::transition(ctx, Transition::Released, name, &lease, now);
        notify::anomaly(ctx, now, || {
            format!(
                "lease released: its waiter left before the reply resource={} owner={} fence={}",
                printable(name.as_slice()),
                printable(&lease.token),
                lease.fence
            )
        });
    }
    settle(ctx, key, name, lock, now);
}

/// [`pass_on`] then [`tidy`].
pub fn settle(
    ctx: &Context,
    key: &RedisKeyWritable,
    name: &RedisString,
    lock: &mut Lock,
    now: Now,
) {
    if let Err(error) = pass_on(ctx, name, lock, now) {
        notify::log(ctx, notify::Level::Warning, &format!("dlock: hand-over failed: {error}"));
    }
    tidy(ctx, key, name, lock, now);
}
