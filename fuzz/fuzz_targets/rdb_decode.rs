//! A lock decoded from the fields of an RDB file or a DUMP payload, in any encoding version: no
//! panic; what loads is a valid lock that saves and reloads unchanged and whose fence no later
//! grant repeats.
//!
//! Input: one byte choosing the encoding version (0 to 4; 1 to 3 exist), the monotonic and
//! wall clocks of the load (8 bytes little-endian each), then the fields as `ByteFields` lays them.
#![no_main]

use dlock::core::encoding::{
    ByteFields, ENCODING_V2, ENCODING_VERSION, FieldSource, decode_lock, encode_lock,
    is_known_version,
};
use dlock::core::error::MAX_FENCE;
use dlock::core::fence::FenceCounter;
use dlock::core::{Acquired, DlockError, Host, Lease, Now, Rules, Step};
use libfuzzer_sys::fuzz_target;

/// A loaded lock has nobody waiting.
struct NoWaiters;

impl Host for NoWaiters {
    fn waiter_alive(&self, _id: u64) -> bool {
        false
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&version, rest)) = data.split_first() else { return };
    let encver = i32::from(version % 5);
    let mut fields = ByteFields::new(rest);
    let (Some(mono), Some(wall)) = (fields.unsigned(), fields.unsigned()) else { return };
    // A monotonic clock counts from boot or start-up: it never nears u64::MAX, where a grant's
    // deadline would saturate onto `now` and read as expired at once (2^62 µs is 146,000 years).
    let now = Now { mono: mono & ((1 << 62) - 1), wall };
    let Some(mut lock) = decode_lock(&mut fields, encver, now, 0) else { return };
    assert!(is_known_version(encver));
    assert_eq!(lock.waiters().len(), 0, "waiters are never persisted");

    let loaded: Vec<Lease> = lock.holders().cloned().collect();
    for lease in &loaded {
        assert!((1..=512).contains(&lease.token.len()));
        assert!((1..=MAX_FENCE).contains(&lease.fence));
        assert!(lease.deadline_wall() <= i64::MAX as u64);
        assert_eq!(lease.deadline_mono(), now.mono_from_wall(lease.deadline_wall()));
        assert!(lease.granted_mono() <= lease.deadline_mono().max(now.mono));
        assert!(lease.token.meta().is_none_or(|meta| (1..=1024).contains(&meta.len())));
        let _ = (lease.remaining_ms(now), lease.held_ms(now));
        assert_eq!(lock.fence_check(lease.fence, now), lease.is_live(now));
    }
    // One exclusive lease, or shared ones only, each token once.
    assert!(loaded.len() <= 1 || loaded.iter().all(|lease| lease.shared()));
    let live_before: Vec<&Lease> = loaded.iter().filter(|lease| lease.is_live(now)).collect();
    assert_eq!(lock.live_lease(now).is_some(), !live_before.is_empty());

    // Saved again and reloaded at the same instant, the lock is the same. A version 1 lease
    // counts its hold from the load, which the saved hold time keeps only while it is live.
    let mut saved = Vec::new();
    encode_lock(&mut saved, &lock);
    let mut saved_fields = ByteFields::new(&saved);
    let reloaded = decode_lock(&mut saved_fields, ENCODING_VERSION, now, 0).expect("reloads");
    assert!(saved_fields.rest().is_empty(), "the decoder reads every saved field");
    let after: Vec<&Lease> = reloaded.holders().collect();
    assert_eq!(after.len(), loaded.len());
    for (before, after) in loaded.iter().zip(after) {
        let keeps_hold = encver >= ENCODING_V2 || before.deadline_mono() >= now.mono;
        if keeps_hold {
            assert_eq!(before, after);
            assert_eq!(before.token.meta(), after.token.meta());
        } else {
            assert_eq!(
                (&before.token, before.fence, before.deadline_wall(), before.renewals()),
                (&after.token, after.fence, after.deadline_wall(), after.renewals())
            );
        }
    }

    // The counter observes the loaded fences, as rdb_load does: a later grant mints a larger one.
    let mut fences = FenceCounter::default();
    for lease in &loaded {
        fences.observe(lease.fence);
    }
    let rules = Rules { new_grants_held: false, max_hold_ms: 0 };
    let mine = live_before.iter().find(|lease| &*lease.token == b"fuzz");
    // As a server would: the step first ends expired leases (a slice at a time), then decides.
    let mut step = Step::new(now, rules, &mut fences, &NoWaiters);
    let acquired = step.acquire(&mut lock, b"fuzz", 1_000);
    drop(step);
    match acquired {
        Ok(Acquired::Granted { fence, .. }) => {
            assert!(live_before.is_empty());
            assert!(loaded.iter().all(|lease| lease.fence < fence));
            assert_eq!(lock.live_lease(now).map(|lease| lease.fence), Some(fence));
        }
        Ok(Acquired::Reacquired { fence }) => {
            let holder = mine.expect("a re-acquire needs a live lease");
            assert_eq!((holder.fence, holder.shared()), (fence, false));
        }
        Ok(Acquired::Busy) => {
            assert!(mine.is_none() && (!live_before.is_empty() || lock.has_expired(now)));
            let now_live: Vec<&Lease> = lock.live_holders(now).collect();
            assert_eq!(now_live, live_before, "a busy lock's live leases are left alone");
        }
        Ok(Acquired::GrantsHeld) => panic!("grants are not held back here"),
        Err(DlockError::ModeConflict { .. }) => {
            assert!(mine.is_some_and(|lease| lease.shared()), "only a shared holder conflicts");
        }
        Err(_) => {
            assert!(live_before.is_empty() && (fences.last() == MAX_FENCE || wall > MAX_FENCE))
        }
    }
});
