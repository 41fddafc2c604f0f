//! Decimal digits of an integer written into a stack buffer: the grant path formats numbers
//! for its channel message and its replication without allocating.

/// Room for any `u64` (20 digits).
pub const MAX_DIGITS: usize = 20;

/// `n` in decimal, written at the end of `buffer`; returns the digits.
pub fn decimal(n: u64, buffer: &mut [u8; MAX_DIGITS]) -> &[u8] {
    let mut at = buffer.len();
    let mut rest = n;
    loop {
        at -= 1;
        buffer[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    &buffer[at..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
