//! A lease: who owns a resource until when, with the fence minted for the grant; and the
//! server-wide rules every grant and renewal follows.

use std::cell::Cell;

#[cfg(test)]
use super::super::expiry::comes_due;
use super::super::expiry::due_ms;
use super::super::limits::{MAX_FENCE, MAX_TOKEN_LEN};
use super::super::mode::Mode;
use super::super::token::{ExactTimes, Token};
use super::super::{DlockError, Micros, Now};

/// How far a deadline may lie past the longest ttl: a day, for clocks that differ between
/// servers.
const PLAUSIBLE_SLACK_US: u64 = 86_400_000_000;
/// How far a restored fence may run ahead of the wall clock: a year (a counter that ran ahead
/// of a wrong clock stays loadable; a forged one cannot exhaust 292,000 years of fences).
const FENCE_AHEAD_US: u64 = 365 * 86_400_000_000;
/// The longest ttl any configuration allows (`dlock.max-ttl-ms` is at most a year).
const MAX_TTL_US: u64 = 365 * 86_400_000_000;

/// [`Lease::wall_offset`] when the lease's exact times are kept beside its token.
const WIDE: i32 = i32::MIN;
/// [`Lease::scheduled`] when no pending index entry is known.
const NO_ENTRY: u32 = u32::MAX;
/// [`Lease::counts`]: handed over with a claim window, not yet claimed.
const UNCLAIMED: u32 = 1 << 31;
/// [`Lease::counts`]: a shared lease.
const SHARED: u32 = 1 << 30;
/// The most renewals a lease counts (about a billion); more read as this many.
pub const MAX_RENEWALS: u32 = SHARED - 1;

/// "`token` owns the resource until `deadline`", with the fence minted for this grant.
///
/// 72 bytes, so that a lock is one 80-byte allocation: the token inline (when short), the fence
/// and the monotonic deadline whole, and the rest narrowed. The wall-clock deadline is kept as
/// its µs offset from the monotonic one (the module's monotonic clock reads as Unix time when it
/// loads, so the offset is how far the wall clock has moved since: within ±35 minutes it fits);
/// the grant time as whole milliseconds before the deadline's (the grant is kept to the
/// millisecond, up to 49 days before the deadline). Times that do not fit (a wall clock stepped
/// by more than 35 minutes, a lease held for more than 49 days) are kept exactly beside the
/// token on the heap instead ([`Token::times`]): nothing saturates, and the lease reads the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The owner's identity, compared byte for byte (inline when short). Replace it only with
    /// [`Token::with_meta`], which keeps the exact times it may carry.
    pub token: Token,
    /// The fence minted when this lease was granted.
    pub fence: u64,
    /// When the lease ends, on the monotonic clock of this process. Decides expiry.
    deadline_mono: Micros,
    /// The wall-clock deadline minus the monotonic one, µs ([`WIDE`]: both exact times are
    /// beside the token).
    wall_offset: i32,
    /// The deadline's millisecond minus the grant's (monotonic).
    held: u32,
    /// How many times the holder renewed this grant (up to [`MAX_RENEWALS`]), and the
    /// [`UNCLAIMED`] and [`SHARED`] flags.
    counts: u32,
    /// How many milliseconds before the end of `deadline_mono`'s millisecond the lock's pending
    /// expiry index entry comes due ([`NO_ENTRY`]: none known). Bookkeeping of the lock's
    /// ([`super::Lock`]), kept here for room; a `Cell` because it changes where Redis hands out
    /// the value read-only.
    scheduled: Cell<u32>,
}

impl Lease {
    /// A lease of `token` with `fence` that ends `ttl_ms` after `now`.
    pub fn new(token: &[u8], fence: u64, ttl_ms: u64, now: Now) -> Self {
        let ttl = ttl_ms.saturating_mul(1_000);
        Self::with_times(
            token,
            fence,
            now.mono.saturating_add(ttl),
            now.wall.saturating_add(ttl),
            now.mono,
        )
    }

    fn with_times(
        token: &[u8],
        fence: u64,
        deadline_mono: Micros,
        deadline_wall: Micros,
        granted_mono: Micros,
    ) -> Self {
        let mut lease = Self {
            token: token.into(),
            fence,
            deadline_mono,
            wall_offset: WIDE,
            held: 0,
            counts: 0,
            scheduled: Cell::new(NO_ENTRY),
        };
        match narrow(deadline_mono, deadline_wall, granted_mono) {
            Some((offset, held)) => (lease.wall_offset, lease.held) = (offset, held),
            None => {
                let granted_mono = granted_mono.min(deadline_mono);
                let times = ExactTimes { deadline_wall, granted_mono };
                lease.token = lease.token.with_times(Some(times));
            }
        }
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
        Ok(Self::with_times(
            token,
            fence,
            now.mono_from_wall(deadline_wall),
            deadline_wall,
            now.mono,
        ))
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
            number(self.deadline_wall()),
            b"GRANTED".to_vec(),
            number(self.granted_wall(now)),
            b"RENEWALS".to_vec(),
            number(u64::from(self.renewals())),
        ];
        if self.shared() {
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
        !self.shared() && self.token.meta().is_none()
    }

    /// The lease's mode, as a request would name it.
    pub fn mode(&self) -> Mode {
        if self.shared() { Mode::Shared { limit: None } } else { Mode::Exclusive }
    }

    /// Whether the lease still holds at `now`.
    pub fn is_live(&self, now: Now) -> bool {
        self.deadline_mono > now.mono
    }

    /// When the lease ends, on the monotonic clock of this process.
    pub fn deadline_mono(&self) -> Micros {
        self.deadline_mono
    }

    /// The same instant as Unix time, as decided when the deadline was set. Persistence and
    /// replication carry this value unchanged, so every copy of a lease is byte-identical.
    pub fn deadline_wall(&self) -> Micros {
        match self.exact_times() {
            Some(times) => times.deadline_wall,
            None => self.deadline_mono.wrapping_add_signed(i64::from(self.wall_offset)),
        }
    }

    /// When this grant was made (monotonic, to the millisecond): hold time and `held-ms`
    /// count from here.
    pub fn granted_mono(&self) -> Micros {
        match self.exact_times() {
            Some(times) => times.granted_mono,
            None => (self.deadline_mono / 1_000 - u64::from(self.held)) * 1_000,
        }
    }

    /// How many times the holder renewed this grant (at most [`MAX_RENEWALS`]).
    pub fn renewals(&self) -> u32 {
        self.counts & MAX_RENEWALS
    }

    /// Handed over with a claim window (`CLAIM`) that its holder has not yet claimed (by a
    /// RENEW or a repeated ACQUIRE): it runs only the window until then.
    pub fn unclaimed(&self) -> bool {
        self.counts & UNCLAIMED != 0
    }

    /// A shared lease (`SHARED`): it may live beside other shared leases, never beside an
    /// exclusive one.
    pub fn shared(&self) -> bool {
        self.counts & SHARED != 0
    }

    /// Sets the renewal count (past [`MAX_RENEWALS`], that many).
    pub fn set_renewals(&mut self, renewals: u32) {
        self.counts = (self.counts & !MAX_RENEWALS) | renewals.min(MAX_RENEWALS);
    }

    /// Counts one more renewal.
    pub fn add_renewal(&mut self) {
        self.set_renewals(self.renewals().saturating_add(1));
    }

    /// Marks the lease unclaimed (handed over with a claim window) or claimed.
    pub fn set_unclaimed(&mut self, unclaimed: bool) {
        self.counts = if unclaimed { self.counts | UNCLAIMED } else { self.counts & !UNCLAIMED };
    }

    /// Marks the lease shared or exclusive.
    pub fn set_shared(&mut self, shared: bool) {
        self.counts = if shared { self.counts | SHARED } else { self.counts & !SHARED };
    }

    /// Sets when this grant was made (monotonic; never after the deadline).
    pub fn set_granted_mono(&mut self, granted_mono: Micros) {
        self.set_times(self.deadline_mono, self.deadline_wall(), granted_mono);
    }

    /// When this grant was made, as Unix time in µs (what copies of the lease carry).
    pub fn granted_wall(&self, now: Now) -> Micros {
        now.wall.saturating_sub(now.mono.saturating_sub(self.granted_mono()))
    }

    /// Milliseconds since the grant at `now`.
    pub fn held_ms(&self, now: Now) -> u64 {
        now.mono.saturating_sub(self.granted_mono()) / 1_000
    }

    /// Milliseconds left at `now`, rounded up so that a live lease never reads as 0.
    pub fn remaining_ms(&self, now: Now) -> u64 {
        self.deadline_mono.saturating_sub(now.mono).div_ceil(1_000)
    }

    pub(super) fn extend(&mut self, ttl_ms: u64, now: Now) {
        let ttl = ttl_ms.saturating_mul(1_000);
        let granted = self.granted_mono();
        self.set_times(now.mono.saturating_add(ttl), now.wall.saturating_add(ttl), granted);
    }

    /// The exact times, when they are kept beside the token.
    fn exact_times(&self) -> Option<ExactTimes> {
        if self.wall_offset == WIDE { self.token.times() } else { None }
    }

    /// Sets the deadline on both clocks and the grant time (clamped to the deadline), narrowed
    /// when they fit and beside the token when they do not; the pending index entry stays
    /// where it is.
    fn set_times(&mut self, deadline_mono: Micros, deadline_wall: Micros, granted_mono: Micros) {
        let pending = self.scheduled_at();
        self.deadline_mono = deadline_mono;
        match narrow(deadline_mono, deadline_wall, granted_mono) {
            Some((offset, held)) => {
                (self.wall_offset, self.held) = (offset, held);
                if self.token.times().is_some() {
                    self.token = self.token.with_times(None);
                }
            }
            None => {
                (self.wall_offset, self.held) = (WIDE, 0);
                let granted_mono = granted_mono.min(deadline_mono);
                let times = ExactTimes { deadline_wall, granted_mono };
                self.token = self.token.with_times(Some(times));
            }
        }
        if pending.is_some() {
            self.note_scheduled(pending);
        }
    }

    /// When the lock's pending index entry recorded here comes due, if there is one.
    pub(super) fn scheduled_at(&self) -> Option<Micros> {
        let before = self.scheduled.get();
        (before != NO_ENTRY)
            .then(|| due_ms(self.deadline_mono).saturating_sub(u64::from(before)) * 1_000)
    }

    /// Records that the lock's pending index entry comes due at `at` (the end of a millisecond;
    /// `None`: none known). One due after the end of the deadline's millisecond, or more than 49
    /// days before it, is not recorded: the lock then inserts an entry it may not have needed,
    /// never skips one it needs.
    pub(super) fn note_scheduled(&self, at: Option<Micros>) {
        let before = at
            .and_then(|at| due_ms(self.deadline_mono).checked_sub(due_ms(at)))
            .and_then(|before| u32::try_from(before).ok())
            .filter(|&before| before != NO_ENTRY)
            .unwrap_or(NO_ENTRY);
        self.scheduled.set(before);
    }
}

/// A lease's narrow wall offset and held milliseconds for these times, if they fit (the grant
/// time clamped to the deadline).
#[inline]
fn narrow(
    deadline_mono: Micros,
    deadline_wall: Micros,
    granted_mono: Micros,
) -> Option<(i32, u32)> {
    if (deadline_mono | deadline_wall) >> 63 != 0 {
        return None;
    }
    let offset = i32::try_from(deadline_wall as i64 - deadline_mono as i64).ok()?;
    let held =
        u32::try_from(deadline_mono / 1_000 - granted_mono.min(deadline_mono) / 1_000).ok()?;
    (offset != WIDE).then_some((offset, held))
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;
    /// The module's clocks as they read soon after it loaded: the monotonic one shifted to
    /// Unix time.
    const LOADED: Now = Now { mono: 1_700_000_000_000_000, wall: 1_700_000_000_000_000 };

    fn moved(now: Now, by: Micros) -> Now {
        Now { mono: now.mono + by, wall: now.wall + by }
    }

    #[test]
    fn a_lease_is_72_bytes_and_keeps_its_times_beside_it_only_when_they_do_not_fit() {
        assert_eq!(std::mem::size_of::<Lease>(), 72);
        let lease = Lease::new(&[b'u'; 36], 1, 30_000, moved(LOADED, 500));
        assert_eq!(lease.token.heap_bytes(), 0, "narrow: nothing beside the token");
        assert_eq!(lease.deadline_mono(), LOADED.mono + 500 + 30_000 * MS);
        assert_eq!(lease.deadline_wall(), LOADED.wall + 500 + 30_000 * MS);
        assert_eq!(lease.granted_mono(), LOADED.mono, "the grant is kept to the millisecond");
        // The wall clock runs ahead of or behind the monotonic one by up to 35 minutes: narrow,
        // exact; one µs further (or the offset reserved to mean "beside the token"): exact too.
        for offset in [0, 1, -1, i64::from(i32::MAX), -i64::from(i32::MAX), 1 << 31, -(1 << 31)] {
            let now = Now { mono: LOADED.mono, wall: LOADED.wall.wrapping_add_signed(offset) };
            let lease = Lease::new(b"A", 1, 1_000, now);
            let narrow = offset.abs() <= i64::from(i32::MAX);
            assert_eq!(lease.token.heap_bytes() == 0, narrow, "offset {offset}");
            assert_eq!(lease.deadline_wall(), now.wall + 1_000 * MS, "offset {offset}");
            assert_eq!(lease.deadline_mono(), now.mono + 1_000 * MS, "offset {offset}");
            assert_eq!(lease.granted_mono(), now.mono, "offset {offset}");
        }
    }

    #[test]
    fn a_lease_held_past_49_days_keeps_its_grant_time_exactly_and_narrows_again_with_a_later_one() {
        let mut lease = Lease::new(b"A", 1, 1_000, LOADED);
        // Renewed until its deadline lies u32::MAX ms after the grant: still narrow.
        let ttl_ms = 1_000;
        let last_narrow = moved(LOADED, (u64::from(u32::MAX) - ttl_ms) * MS);
        lease.extend(ttl_ms, last_narrow);
        assert_eq!(lease.token.heap_bytes(), 0);
        assert_eq!(lease.granted_mono(), LOADED.mono);
        assert_eq!(lease.held_ms(last_narrow), u64::from(u32::MAX) - ttl_ms);
        // One millisecond more: the grant time goes beside the token, exact.
        let lease_meta = lease.token.with_meta(Some(b"host=a"));
        lease.token = lease_meta;
        lease.extend(ttl_ms, moved(last_narrow, MS));
        assert!(lease.token.times().is_some());
        assert_eq!(lease.granted_mono(), LOADED.mono);
        assert_eq!(lease.deadline_wall(), last_narrow.wall + MS + ttl_ms * MS);
        assert_eq!(lease.token.meta(), Some(&b"host=a"[..]), "the metadata stays");
        assert_eq!(lease.held_ms(moved(last_narrow, MS)), u64::from(u32::MAX) - ttl_ms + 1);
        // A newer grant time (a replica's copy of a fresh grant) fits again.
        lease.set_granted_mono(last_narrow.mono);
        assert_eq!((lease.token.times(), lease.token.meta()), (None, Some(&b"host=a"[..])));
        assert_eq!(lease.granted_mono(), last_narrow.mono);
    }

    #[test]
    fn a_grant_time_after_the_deadline_reads_as_the_deadline() {
        let mut lease = Lease::new(b"A", 1, 1_000, LOADED);
        lease.set_granted_mono(LOADED.mono + 5_000 * MS);
        assert_eq!(lease.granted_mono(), lease.deadline_mono());
    }

    #[test]
    fn renewals_count_to_about_a_billion_beside_the_flags() {
        let mut lease = Lease::new(b"A", 1, 1_000, LOADED);
        lease.set_shared(true);
        lease.set_unclaimed(true);
        lease.set_renewals(MAX_RENEWALS - 1);
        lease.add_renewal();
        lease.add_renewal();
        assert_eq!(lease.renewals(), MAX_RENEWALS, "saturates");
        assert!(lease.shared() && lease.unclaimed());
        lease.set_renewals(u32::MAX);
        assert_eq!(lease.renewals(), MAX_RENEWALS);
        lease.set_unclaimed(false);
        assert!(lease.shared() && !lease.unclaimed());
        lease.set_shared(false);
        lease.set_renewals(7);
        assert!(!lease.shared() && !lease.unclaimed() && lease.renewals() == 7);
    }

    #[test]
    fn the_pending_index_entry_is_recorded_up_to_49_days_before_the_deadline_never_after_it() {
        let mut lease = Lease::new(b"A", 1, 10_000, moved(LOADED, 300));
        let deadline = lease.deadline_mono();
        let due = comes_due(deadline);
        assert_eq!(due, deadline + 700, "the end of the deadline's millisecond");
        lease.note_scheduled(Some(due));
        assert_eq!(lease.scheduled_at(), Some(due));
        lease.note_scheduled(Some(deadline - 400));
        assert_eq!(lease.scheduled_at(), Some(due - MS), "kept as when it comes due");
        let oldest = due - u64::from(NO_ENTRY - 1) * MS;
        lease.note_scheduled(Some(oldest));
        assert_eq!(lease.scheduled_at(), Some(oldest));
        // Beyond: not recorded, so the lock inserts another entry rather than skip a needed one.
        lease.note_scheduled(Some(oldest - MS));
        assert_eq!(lease.scheduled_at(), None);
        lease.note_scheduled(Some(due + 1));
        assert_eq!(lease.scheduled_at(), None, "an entry due later does not cover the deadline");
        // A renewal keeps the entry where it was, while it is within reach of the new deadline.
        lease.note_scheduled(Some(due));
        lease.extend(20_000, LOADED);
        assert_eq!(lease.scheduled_at(), Some(due));
        lease.extend(50 * 86_400_000, LOADED);
        assert_eq!(lease.scheduled_at(), None, "more than 49 days before the new deadline");
    }
}
