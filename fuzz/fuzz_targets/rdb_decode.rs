//! A lock decoded from the fields of an RDB file or a DUMP payload, in any encoding version: no
//! panic; what loads is a valid lock that saves and reloads unchanged and whose fence no later
//! grant repeats.
//!
//! Input: one byte choosing the encoding version (0 to 3; only 1 and 2 exist), the monotonic and
//! wall clocks of the load (8 bytes little-endian each), then the fields as `ByteFields` lays them.
#![no_main]

use dlock::core::encoding::{
    ByteFields, ENCODING_VERSION, FieldSource, decode_lock, encode_lock, is_known_version,
};
use dlock::core::error::MAX_FENCE;
use dlock::core::fence::FenceCounter;
use dlock::core::{Acquired, Now, Rules};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&version, rest)) = data.split_first() else { return };
    let encver = i32::from(version % 4);
    let mut fields = ByteFields::new(rest);
    let (Some(mono), Some(wall)) = (fields.unsigned(), fields.unsigned()) else { return };
    // A monotonic clock counts from boot or start-up: it never nears u64::MAX, where a grant's
    // deadline would saturate onto `now` and read as expired at once (2^62 µs is 146,000 years).
    let now = Now { mono: mono & ((1 << 62) - 1), wall };
    let Some(mut lock) = decode_lock(&mut fields, encver, now, 0) else { return };
    assert!(is_known_version(encver));
    assert_eq!(lock.waiters().len(), 0, "waiters are never persisted");

    let loaded = lock.lease().cloned();
    if let Some(lease) = &loaded {
        assert!((1..=512).contains(&lease.token.len()));
        assert!((1..=MAX_FENCE).contains(&lease.fence));
        assert!(lease.deadline_wall <= i64::MAX as u64);
        assert_eq!(lease.deadline_mono, now.mono_from_wall(lease.deadline_wall));
        assert!(lease.granted_mono <= lease.deadline_mono.max(now.mono));
        let _ = (lease.remaining_ms(now), lease.held_ms(now));
        assert_eq!(lock.fence_check(lease.fence, now), lease.is_live(now));
        assert_eq!(lock.live_lease(now).is_some(), lease.is_live(now));
    }

    // Saved again and reloaded at the same instant, the lock is the same. A version 1 lease
    // counts its hold from the load, which the saved hold time keeps only while it is live.
    let mut saved = Vec::new();
    encode_lock(&mut saved, &lock);
    let mut saved_fields = ByteFields::new(&saved);
    let reloaded = decode_lock(&mut saved_fields, ENCODING_VERSION, now, 0);
    assert!(saved_fields.rest().is_empty(), "the decoder reads every saved field");
    match (&loaded, reloaded.as_ref().map(|lock| lock.lease())) {
        (None, Some(None)) => {}
        (Some(before), Some(Some(after))) => {
            let keeps_hold = encver == ENCODING_VERSION || before.deadline_mono >= now.mono;
            if keeps_hold {
                assert_eq!(before, after);
            } else {
                assert_eq!(
                    (&before.token, before.fence, before.deadline_wall, before.renewals),
                    (&after.token, after.fence, after.deadline_wall, after.renewals)
                );
            }
        }
        (before, after) => panic!("saved {before:?}, reloaded {after:?}"),
    }

    // The counter observes the loaded fence, as rdb_load does: a later grant mints a larger one,
    // and at most one lease is live.
    let mut fences = FenceCounter::default();
    if let Some(lease) = &loaded {
        fences.observe(lease.fence);
    }
    let rules = Rules { new_grants_held: false, max_hold_ms: 0 };
    let live_before = loaded.as_ref().filter(|lease| lease.is_live(now));
    match lock.acquire(b"fuzz", 1_000, now, &mut fences, rules) {
        Ok(Acquired::Granted { fence, .. }) => {
            assert!(live_before.is_none());
            assert!(loaded.as_ref().is_none_or(|lease| lease.fence < fence));
            assert_eq!(lock.live_lease(now).map(|lease| lease.fence), Some(fence));
        }
        Ok(Acquired::Reacquired { fence }) => {
            let holder = live_before.expect("a re-acquire needs a live lease");
            assert_eq!((&*holder.token, holder.fence), (&b"fuzz"[..], fence));
        }
        Ok(Acquired::Busy) => {
            assert!(live_before.is_some_and(|lease| &*lease.token != b"fuzz"));
            assert_eq!(lock.lease(), loaded.as_ref(), "a busy lock is left alone");
        }
        Ok(Acquired::GrantsHeld) => panic!("grants are not held back here"),
        Err(_) => {
            assert!(live_before.is_none() && (fences.last() == MAX_FENCE || wall > MAX_FENCE))
        }
    }
});
