//! The channel where a resource's ownership changes are published, so that a client holding a
//! ticket (or watching a lock) learns of its turn without polling.
//!
//! The name hashes to the resource's own Cluster slot: a resource with a hash tag keeps it
//! (`dlock:invoice:{123}`), any other is wrapped in one (`dlock:{invoice:123}`). A name with
//! braces but no usable tag cannot be wrapped without changing its slot; its channel is the
//! plain prefixed name (on a single server, or with `SUBSCRIBE`, that makes no difference).

/// What every channel name starts with.
pub const PREFIX: &[u8] = b"dlock:";

/// The channel of `resource`.
pub fn name(resource: &[u8]) -> Vec<u8> {
    let mut channel = Vec::with_capacity(PREFIX.len() + resource.len() + 2);
    channel.extend_from_slice(PREFIX);
    if has_hash_tag(resource) || resource.contains(&b'}') || resource.contains(&b'{') {
        channel.extend_from_slice(resource);
    } else {
        channel.push(b'{');
        channel.extend_from_slice(resource);
        channel.push(b'}');
    }
    channel
}

/// Whether Redis Cluster would hash `key` by a tag: a `{` followed later by a `}` with at least
/// one byte between them.
fn has_hash_tag(key: &[u8]) -> bool {
    key.iter().position(|&b| b == b'{').is_some_and(|open| {
        key[open + 1..].iter().position(|&b| b == b'}').is_some_and(|len| len > 0)
    })
}

/// The message for one ownership change: the event's name and the fence of the lease it
/// concerns, e.g. `released 1796207757444058`.
pub fn message(event: &str, fence: u64) -> Vec<u8> {
    format!("{event} {fence}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fenced::key_slot;

    #[test]
    fn a_channel_hashes_to_its_resources_slot() {
        for resource in [&b"invoice:123"[..], b"invoice:{123}", b"{a}b{c}", b"x", b"a{b}c"] {
            let channel = name(resource);
            assert_eq!(
                key_slot(&channel),
                key_slot(resource),
                "{:?}",
                String::from_utf8_lossy(&channel)
            );
        }
        assert_eq!(name(b"invoice:123"), b"dlock:{invoice:123}");
        assert_eq!(name(b"invoice:{123}"), b"dlock:invoice:{123}");
        assert_eq!(name(b"odd}name"), b"dlock:odd}name", "no tag possible: plain name");
        assert_eq!(message("handoff", 42), b"handoff 42");
    }
}
