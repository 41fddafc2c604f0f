//! Decimal digits of an integer written into a stack buffer: the grant path formats numbers
//! for its channel message and its replication without allocating.

/// Room for any `u64` (20 digits).
pub const MAX_DIGITS: usize = 20;

/// The two digits of every number below 100, in order: "00", "01", …, "99".
const PAIRS: [u8; 200] = {
    let mut pairs = [0; 200];
    let mut n = 0;
    while n < 100 {
        pairs[2 * n] = b'0' + (n / 10) as u8;
        pairs[2 * n + 1] = b'0' + (n % 10) as u8;
        n += 1;
    }
    pairs
};

/// `n` in decimal, written at the end of `buffer`; returns the digits. Two digits a step: a
/// fence or a deadline (16 digits) is 8 divisions, not 16 (every grant prints four of them).
pub fn decimal(n: u64, buffer: &mut [u8; MAX_DIGITS]) -> &[u8] {
    let mut at = MAX_DIGITS;
    let mut rest = n;
    while rest >= 100 {
        let pair = (rest % 100) as usize * 2;
        rest /= 100;
        at -= 2;
        buffer[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if rest >= 10 {
        let pair = rest as usize * 2;
        at -= 2;
        buffer[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        at -= 1;
        buffer[at] = b'0' + rest as u8;
    }
    &buffer[at..]
}

/// Writes `n` in decimal into `out` at `at`, after `separator` when one is given; returns where
/// the written bytes end. `out` must have room (at most `1 + MAX_DIGITS` bytes from `at`).
pub fn append(n: u64, separator: Option<u8>, out: &mut [u8], mut at: usize) -> usize {
    if let Some(separator) = separator {
        out[at] = separator;
        at += 1;
    }
    let mut digits = [0; MAX_DIGITS];
    let digits = decimal(n, &mut digits);
    out[at..at + digits.len()].copy_from_slice(digits);
    at + digits.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn numbers_are_appended_after_their_separator() {
        let mut out = [0; 64];
        let end = append(7, None, &mut out, 0);
        let end = append(u64::MAX, Some(b':'), &mut out, end);
        let end = append(0, Some(b' '), &mut out, end);
        assert_eq!(&out[..end], b"7:18446744073709551615 0");
    }

    #[test]
    fn the_edges_print_as_std_prints_them() {
        for n in [0, 9, 10, 99, 100, u64::from(u32::MAX), i64::MAX as u64, u64::MAX] {
            assert_eq!(decimal(n, &mut [0; MAX_DIGITS]), n.to_string().as_bytes());
        }
    }

    proptest! {
        #[test]
        fn any_number_prints_as_std_prints_it(n in any::<u64>()) {
            let mut buffer = [0; MAX_DIGITS];
            let expected = n.to_string();
            prop_assert_eq!(decimal(n, &mut buffer), expected.as_bytes());
        }
    }
}
