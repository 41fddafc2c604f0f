//! A lease decoded from persisted or replicated fields: no panic, and only valid leases load; a
//! compact effect (`fence:deadline[:granted:renewals]`) reads back as written.
#![no_main]

use dlock::core::Lease;
use dlock::core::Now;
use dlock::core::error::MAX_FENCE;
use dlock::core::replica::{COMPACT_MAX, parse_compact, write_compact};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<u8>, u64, u64, u64, u64, u64)| {
    let (token, fence, deadline, mono, wall, last_fence) = input;
    if let Ok((fence, deadline, history)) = parse_compact(&token) {
        let mut out = [0; COMPACT_MAX];
        let written = write_compact(fence, deadline, history, &mut out);
        assert_eq!(written, &token[..], "a valid effect is written as it was read");
    }
    let now = Now { mono, wall };
    match Lease::restore(&token, fence, deadline, now, last_fence) {
        Ok(lease) => {
            assert!((1..=512).contains(&lease.token.len()));
            assert!((1..=MAX_FENCE).contains(&lease.fence));
            assert!(lease.deadline_wall() <= i64::MAX as u64);
            let _ = lease.remaining_ms(now);
        }
        Err(error) => assert!(error.to_string().starts_with("ERR ")),
    }
});
