//! Every command's argument parsing, and every error reply built from what a client sent: no
//! panic, and an error reply is always one printable ASCII line.
#![no_main]

use dlock::core::args::{self, DEFAULT_MAX_TTL_MS};
use dlock::core::fenced::{key_slot, refusal};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let argv: Vec<&[u8]> = rest.split(|&b| b == 0xff).take(12).collect();
    let max = if selector & 0x80 != 0 { DEFAULT_MAX_TTL_MS } else { u64::from(selector) + 1 };
    let error = match selector % 5 {
        0 => args::acquire(&argv, max).err(),
        1 => args::renew(&argv, max).err(),
        2 => args::release(&argv).err(),
        3 => args::fencecheck(&argv).err(),
        _ => {
            if let Some((name, inner)) = argv.split_first() {
                let _ = refusal(name, inner);
                let _ = key_slot(name);
            }
            None
        }
    };
    if let Some(error) = error {
        let text = error.to_string();
        assert!(text.bytes().all(|b| (0x20..0x7f).contains(&b)), "{text:?}");
    }
});
