//! A lease: who owns a resource until when, with the fence minted for the grant; and the
//! server-wide rules every grant and renewal follows.

use super::super::limits::{MAX_FENCE, MAX_TOKEN_LEN};
use super::super::mode::Mode;
use super::super::token::Token;
use super::super::{DlockError, Micros, Now};

/// How far a deadline may lie past the longest ttl: a day, for clocks that differ between
/// servers.
const PLAUSIBLE_SLACK_US: u64 = 86_400_000_000;
/// How far a restored fence may run ahead of the wall clock: a year (a counter that ran ahead
/// of a wrong clock stays loadable; a forged one cannot exhaust 292,000 years of fences).
const FENCE_AHEAD_US: u64 = 365 * 86_400_000_000;
/// The longest ttl any configuration allows (`dlock.max-ttl-ms` is at most a year).
const MAX_TTL_US: u64 = 365 * 86_400_000_000;

/// "`token` owns the resource until `deadline`", with the fence minted for this grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The owner's identity, compared byte for byte (inline when short).
    pub token: Token,
    /// The fence minted when this lease was granted.
    pub fence: u64,
    /// When the lease ends, on the monotonic clock of this process. Decides expiry.
    pub deadline_mono: Micros,
    /// The same instant as Unix time, as decided when the deadline was set. Persistence and
    /// replication carry this value unchanged, so every copy of a lease is byte-identical.
    pub deadline_wall: Micros,
    /// When this grant was made (monotonic): hold time and `held-ms` count from here.
    pub granted_mono: Micros,
    /// How many times the holder renewed this grant.
    pub renewals: u32,
    /// Handed over with a claim window (`CLAIM`) that its holder has not yet claimed (by a
    /// RENEW or a repeated ACQUIRE): it runs only the window until then.
    pub unclaimed: bool,
    /// A shared lease (`SHARED`): it may live beside other shared leases, never beside an
    /// exclusive one.
    pub shared: bool,
}

impl Lease {
    /// A lease of `token` with `fence` that ends `ttl_ms` after `now`.
    pub fn new(token: &[u8], fence: u64, ttl_ms: u64, now: Now) -> Self {
        let mut lease = Self {
            token: token.into(),
            fence,
            deadline_mono: 0,
            deadline_wall: 0,
            granted_mono: now.mono,
            renewals: 0,
            unclaimed: false,
            shared: false,
        };
        lease.extend(ttl_ms, now);
        lease
    }

    /// A lease whose absolute wall-clock deadline came from persistence or replication, checked
    /// as strictly as client input: nothing invalid ever enters the keyspace this way.
    ///
    /// A fence more than a year past the wall clock (and past `last_fence`, the counter as this
    /// server knows it), or a deadline more than a year and a day away, is refused.
    pub fn restore(
        token: &[u8],
        fence: u64,
        deadline_wall: Micros,
        now: Now,
        last_fence: u64,
    ) -> Result<Self, DlockError> {
        if !(1..=MAX_TOKEN_LEN).contains(&token.len()) {
            return Err(DlockError::BadReplicatedLease("token length"));
        }
        if !(1..=MAX_FENCE).contains(&fence) {
            return Err(DlockError::BadReplicatedLease("fence"));
        }
        // Nothing a clock could not have minted or a ttl could not reach: a crafted payload must
        // not exhaust the fence counter or hold a resource for millennia.
        if fence > now.wall.saturating_add(FENCE_AHEAD_US) && fence > last_fence {
            return Err(DlockError::BadReplicatedLease("fence"));
        }
        // Deadlines travel as signed 64-bit integers (AOF, replication).
        if deadline_wall > i64::MAX as u64
            || deadline_wall > now.wall.saturating_add(MAX_TTL_US + PLAUSIBLE_SLACK_US)
        {
            return Err(DlockError::BadReplicatedLease("deadline"));
        }
        Ok(Self {
            token: token.into(),
            fence,
            deadline_mono: now.mono_from_wall(deadline_wall),
            deadline_wall,
            granted_mono: now.mono,
            renewals: 0,
            unclaimed: false,
            shared: false,
        })
    }

    /// The arguments after the resource of the `DLOCK.SETLEASE` that carries this lease (as
    /// replication and the AOF do): `token fence deadline GRANTED granted RENEWALS n`, then
    /// `SHARED` and `META value` when they apply. Everything is absolute: applying it twice or
    /// later gives the same lease.
    pub fn effect_args(&self, now: Now) -> Vec<Vec<u8>> {
        let number = |n: u64| n.min(i64::MAX as u64).to_string().into_bytes();
        let mut args = vec![
            self.token.to_vec(),
            number(self.fence),
            number(self.deadline_wall),
            b"GRANTED".to_vec(),
            number(self.granted_wall(now)),
            b"RENEWALS".to_vec(),
            number(u64::from(self.renewals)),
        ];
        if self.shared {
            args.push(b"SHARED".to_vec());
        }
        if let Some(meta) = self.token.meta() {
            args.extend([b"META".to_vec(), meta.to_vec()]);
        }
        args
    }

    /// Whether this lease's effect needs more than the version 1 fields and history (shared or
    /// described): [`Lease::effect_args`] then carries the rest.
    pub fn is_plain(&self) -> bool {
        !self.shared && self.token.meta().is_none()
    }

    /// The lease's mode, as a request would name it.
    pub fn mode(&self) -> Mode {
        if self.shared { Mode::Shared { limit: None } } else { Mode::Exclusive }
    }

    /// Whether the lease still holds at `now`.
    pub fn is_live(&self, now: Now) -> bool {
        self.deadline_mono > now.mono
    }

    /// When this grant was made, as Unix time in µs (what copies of the lease carry).
    pub fn granted_wall(&self, now: Now) -> Micros {
        now.wall.saturating_sub(now.mono.saturating_sub(self.granted_mono))
    }

    /// Milliseconds since the grant at `now`.
    pub fn held_ms(&self, now: Now) -> u64 {
        now.mono.saturating_sub(self.granted_mono) / 1_000
    }

    /// Milliseconds left at `now`, rounded up so that a live lease never reads as 0.
    pub fn remaining_ms(&self, now: Now) -> u64 {
        self.deadline_mono.saturating_sub(now.mono).div_ceil(1_000)
    }

    pub(super) fn extend(&mut self, ttl_ms: u64, now: Now) {
        let ttl = ttl_ms.saturating_mul(1_000);
        self.deadline_mono = now.mono.saturating_add(ttl);
        self.deadline_wall = now.wall.saturating_add(ttl);
    }
}

/// Server-wide rules every grant and renewal follows (from the module's configuration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// Just started or promoted: no new lease on a resource without a lease record.
    pub new_grants_held: bool,
    /// `dlock.max-hold-ms`: no lease lasts longer than this after its grant (0: no limit).
    pub max_hold_ms: u64,
}

impl Rules {
    /// A new grant's ttl: never longer than the hold limit.
    pub(super) fn grant_ttl_ms(&self, ttl_ms: u64) -> u64 {
        if self.max_hold_ms > 0 { ttl_ms.min(self.max_hold_ms) } else { ttl_ms }
    }

    /// The latest deadline a lease granted at `granted` may reach (`None`: no limit).
    pub(super) fn hold_limit(&self, granted: Micros) -> Option<Micros> {
        (self.max_hold_ms > 0)
            .then(|| granted.saturating_add(self.max_hold_ms.saturating_mul(1_000)))
    }
}
