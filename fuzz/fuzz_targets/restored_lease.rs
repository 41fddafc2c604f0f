//! A lease decoded from persisted or replicated fields: no panic, and only valid leases load.
#![no_main]

use dlock::core::Lease;
use dlock::core::Now;
use dlock::core::error::MAX_FENCE;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<u8>, u64, u64, u64, u64, u64)| {
    let (token, fence, deadline, mono, wall, last_fence) = input;
    let now = Now { mono, wall };
    match Lease::restore(&token, fence, deadline, now, last_fence) {
        Ok(lease) => {
            assert!((1..=512).contains(&lease.token.len()));
            assert!((1..=MAX_FENCE).contains(&lease.fence));
            assert!(lease.deadline_wall <= i64::MAX as u64);
            let _ = lease.remaining_ms(now);
        }
        Err(error) => assert!(error.to_string().starts_with("ERR ")),
    }
});
