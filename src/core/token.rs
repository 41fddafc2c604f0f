//! A lease's token, kept inside the lease when it is short, as almost every token is (a UUID is
//! 36 bytes): one allocation per lock instead of two. It reads as `[u8]` wherever it is used.
//!
//! The holder's metadata (`META`), which few leases carry, travels with the token on the heap, so
//! a lease without it costs nothing more; so do a lease's exact times in the rare case that they
//! do not fit the lease's narrow fields (a clock stepped by more than 35 minutes, a hold of more
//! than 49 days).

use std::fmt;
use std::ops::Deref;

use super::Micros;

/// Longest token stored inline: what fits beside a length byte and the variant tag in 40 bytes,
/// the size of the heap variant rounded up to the lease's alignment.
pub const INLINE_CAPACITY: usize = 38;

/// The owner's identity: opaque bytes, compared byte for byte.
#[derive(Clone)]
pub enum Token {
    /// A short token, in place: `bytes[..len]`.
    Inline {
        /// How many bytes of `bytes` are the token.
        len: u8,
        /// The token, then zeros.
        bytes: [u8; INLINE_CAPACITY],
    },
    /// A longer token, on the heap.
    Heap(Box<[u8]>),
    /// A token with the holder's metadata beside it.
    Described(Box<Described>),
    /// A token with its lease's exact times beside it (and the metadata, if any): the times
    /// did not fit the lease's narrow fields (see [`super::lock::Lease`]).
    Timed(Box<Timed>),
}

/// A lease's exact times, kept on the heap beside its token only when they do not fit the
/// lease itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactTimes {
    /// The deadline as Unix time, µs.
    pub deadline_wall: Micros,
    /// When the grant was made (monotonic), µs.
    pub granted_mono: Micros,
}

/// A token, its metadata if any, and its lease's exact times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timed {
    token: Box<[u8]>,
    meta: Option<Box<[u8]>>,
    times: ExactTimes,
}

/// A token and the metadata its holder gave (`META`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    token: Box<[u8]>,
    meta: Box<[u8]>,
}

impl Token {
    /// Bytes this token keeps on the heap (0 when inline).
    pub fn heap_bytes(&self) -> usize {
        match self {
            Self::Inline { .. } => 0,
            Self::Heap(bytes) => bytes.len(),
            Self::Described(described) => {
                std::mem::size_of::<Described>() + described.token.len() + described.meta.len()
            }
            Self::Timed(timed) => {
                std::mem::size_of::<Timed>()
                    + timed.token.len()
                    + timed.meta.as_ref().map_or(0, |meta| meta.len())
            }
        }
    }

    /// The holder's metadata, if it gave any.
    pub fn meta(&self) -> Option<&[u8]> {
        match self {
            Self::Described(described) => Some(&described.meta),
            Self::Timed(timed) => timed.meta.as_deref(),
            _ => None,
        }
    }

    /// The lease's exact times kept beside the token, if they are.
    pub fn times(&self) -> Option<ExactTimes> {
        match self {
            Self::Timed(timed) => Some(timed.times),
            _ => None,
        }
    }

    /// The same token described by `meta` (`None`: without metadata), its times kept.
    pub fn with_meta(&self, meta: Option<&[u8]>) -> Self {
        Self::build(self, meta, self.times())
    }

    /// The same token and metadata with `times` beside them (`None`: without).
    pub fn with_times(&self, times: Option<ExactTimes>) -> Self {
        Self::build(self, self.meta(), times)
    }

    fn build(token: &[u8], meta: Option<&[u8]>, times: Option<ExactTimes>) -> Self {
        match (meta, times) {
            (None, None) => Self::from(token),
            (Some(meta), None) => {
                Self::Described(Box::new(Described { token: token.into(), meta: meta.into() }))
            }
            (meta, Some(times)) => Self::Timed(Box::new(Timed {
                token: token.into(),
                meta: meta.map(Box::from),
                times,
            })),
        }
    }
}

impl From<&[u8]> for Token {
    fn from(token: &[u8]) -> Self {
        match u8::try_from(token.len()) {
            Ok(len) if token.len() <= INLINE_CAPACITY => {
                let mut bytes = [0; INLINE_CAPACITY];
                bytes[..token.len()].copy_from_slice(token);
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(token.into()),
        }
    }
}

impl Deref for Token {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or(bytes),
            Self::Heap(bytes) => bytes,
            Self::Described(described) => &described.token,
            Self::Timed(timed) => &timed.token,
        }
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Token {}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_tokens_live_inline_long_ones_on_the_heap_and_both_read_back_exactly() {
        assert_eq!(std::mem::size_of::<Token>(), 40);
        for len in [1, 16, 36, INLINE_CAPACITY, INLINE_CAPACITY + 1, 512] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let token = Token::from(&bytes[..]);
            assert_eq!(&*token, &bytes[..]);
            assert_eq!(token.heap_bytes(), if len <= INLINE_CAPACITY { 0 } else { len });
            assert_eq!(token.clone(), token);
        }
        assert_ne!(Token::from(&b"A\0"[..]), Token::from(&b"A"[..]), "lengths count, not padding");
        let long = [9u8; 40];
        assert_ne!(Token::from(&long[..]), Token::from(&long[..39]));
    }

    #[test]
    fn metadata_rides_with_the_token_and_leaves_its_identity_alone() {
        let plain = Token::from(&b"worker-a"[..]);
        let described = plain.with_meta(Some(b"host=a pid=7"));
        assert_eq!(std::mem::size_of::<Token>(), 40, "no larger for the metadata");
        assert_eq!((&*described, described.meta()), (&b"worker-a"[..], Some(&b"host=a pid=7"[..])));
        assert_eq!(described, plain, "the token alone names the holder");
        assert_eq!(plain.meta(), None);
        let cleared = described.with_meta(None);
        assert_eq!((&*cleared, cleared.meta(), cleared.heap_bytes()), (&b"worker-a"[..], None, 0));
    }

    #[test]
    fn exact_times_ride_with_the_token_through_metadata_changes_and_leave_its_identity_alone() {
        let times = ExactTimes { deadline_wall: 7, granted_mono: 3 };
        let plain = Token::from(&b"worker-a"[..]);
        let timed = plain.with_times(Some(times));
        assert_eq!((&*timed, timed.times(), timed.meta()), (&b"worker-a"[..], Some(times), None));
        assert_eq!(timed, plain);
        let described = timed.with_meta(Some(b"host=a"));
        assert_eq!((described.times(), described.meta()), (Some(times), Some(&b"host=a"[..])));
        let untimed = described.with_times(None);
        assert_eq!((untimed.times(), untimed.meta()), (None, Some(&b"host=a"[..])));
        assert_eq!(described.with_meta(None).times(), Some(times), "times stay without metadata");
        let bare = described.with_meta(None).with_times(None);
        assert_eq!((&*bare, bare.heap_bytes()), (&b"worker-a"[..], 0));
        assert!(timed.heap_bytes() > 0);
    }
}
