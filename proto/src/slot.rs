//! The Redis Cluster slot of a key, as the server computes it: a client routes every dlock
//! command to the primary of its resource's slot, and the module checks that a fenced command's
//! keys share the resource's slot.

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// The part of `key` Redis Cluster hashes: its hash tag (the bytes between the first `{` and
/// the next `}`, when not empty), else the whole key.
pub fn hashed_part(key: &[u8]) -> &[u8] {
    match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    }
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its [`hashed_part`], modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hashed_part(key)) % SLOTS
}

/// CRC16/XMODEM (polynomial `0x1021`, initial value 0, no reflection), as Redis Cluster uses it.
pub fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |mut crc, &byte| {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
        crc
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // Values from CLUSTER KEYSLOT on a real server (protocol/vectors/slots.json has more).
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"{user1000}.followers"));
        assert_eq!(key_slot(b"{invoice:123}"), key_slot(b"{invoice:123}:data"));
        assert_eq!(key_slot(b"foo{}{bar}"), 8363, "an empty tag hashes the whole key");
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }
}
