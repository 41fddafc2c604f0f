//! The watched locks behind `DLOCK.TOP` and the per-resource percentiles of `DLOCK.INFO`.
//!
//! A lock is watched from the first time a request waits for it (a blocked waiter or a ticket
//! joins its line): the locks that hurt are the ones others wait for. An uncontended lock is not
//! noted at all, so its ACQUIRE, RENEW and RELEASE pay nothing for this (noting a lock costs
//! about 5,000 instructions, a third of a RENEW: renewals, even first ones, are not noted).
//!
//! For each watched lock the server counts hand-overs and records, in small histograms, how long
//! the requests it granted waited and how long the leases others waited for were held (a lease
//! that ended with a line behind it). The record outlives the key (a lock whose key is deleted
//! between bursts of contention keeps its history) and is dropped when [`CAPACITY`] locks are
//! watched and another one starts to be: the one least recently noted goes.

use std::collections::BTreeMap;

use super::Micros;

/// How many locks are watched at most, per server.
pub const CAPACITY: usize = 4_096;

/// What a decision tells the watch about one lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    /// A blocked waiter or a new ticket joined the lock's line.
    Joined,
    /// A waiting request was granted the lock after this long (µs): a hand-over, or a set whose
    /// ticket headed the line.
    Waited(Micros),
    /// A lease others waited for ended after being held this long (µs).
    Held(Micros),
}

/// Durations in µs in buckets of 8 per power of two (each percentile within 12.5 % of the true
/// value), stored only up to the largest bucket used: a few hundred bytes for waits and holds of
/// up to an hour.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmallHistogram {
    buckets: Vec<u32>,
    count: u64,
    max: Micros,
}

impl SmallHistogram {
    /// Records one duration.
    pub fn record(&mut self, micros: Micros) {
        let bucket = super::stats::Histogram::bucket_of(micros);
        if self.buckets.len() <= bucket {
            self.buckets.resize(bucket + 1, 0);
        }
        self.buckets[bucket] = self.buckets[bucket].saturating_add(1);
        self.count += 1;
        self.max = self.max.max(micros);
    }

    /// How many durations were recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The `p`-th percentile (0 < p ≤ 100): the upper bound of the bucket that holds it, never
    /// above the maximum; 0 when nothing was recorded.
    pub fn percentile(&self, p: f64) -> Micros {
        if self.count == 0 {
            return 0;
        }
        let total: u64 = self.buckets.iter().map(|&n| u64::from(n)).sum();
        let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, &n) in self.buckets.iter().enumerate() {
            seen += u64::from(n);
            if seen >= rank {
                return super::stats::Histogram::upper_bound(bucket).min(self.max);
            }
        }
        self.max
    }

    /// The largest duration recorded (0 when none).
    pub fn max(&self) -> Micros {
        self.max
    }
}

/// What the server remembers of one watched lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Leases handed to a waiting request (hand-overs and sets granted from the head of line).
    pub handovers: u64,
    /// How long the granted requests waited.
    pub waits: SmallHistogram,
    /// How long the leases others waited for were held.
    pub holds: SmallHistogram,
    /// When it was last noted ([`Watched::note`]'s order), for eviction.
    noted: u64,
}

/// The watched locks of every database, at most [`CAPACITY`] of them.
#[derive(Clone, Debug, Default)]
pub struct Watched {
    by_db: BTreeMap<i32, BTreeMap<Box<[u8]>, Record>>,
    /// Every watched lock by when it was last noted, oldest first.
    by_age: BTreeMap<u64, (i32, Box<[u8]>)>,
    next: u64,
    capacity: usize,
}

impl Watched {
    /// No lock watched yet, at most `capacity` at once.
    pub fn with_capacity(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), ..Self::default() }
    }

    /// Notes `watch` of lock `name` in database `db`. A [`Watch::Held`] of a lock not watched
    /// is ignored (it was not watched when its lease began, or has been dropped since).
    pub fn note(&mut self, db: i32, name: &[u8], watch: Watch) {
        let capacity = self.capacity.max(1);
        let noted = self.next;
        self.next += 1;
        let known = self.by_db.get_mut(&db).and_then(|names| names.get_mut(name));
        let record = match known {
            Some(record) => {
                self.by_age.remove(&record.noted);
                record
            }
            None if matches!(watch, Watch::Held(_)) => return,
            None => {
                while self.by_age.len() >= capacity {
                    let Some((_, (old_db, old_name))) = self.by_age.pop_first() else { break };
                    if let Some(names) = self.by_db.get_mut(&old_db) {
                        names.remove(&old_name);
                        if names.is_empty() {
                            self.by_db.remove(&old_db);
                        }
                    }
                }
                self.by_db.entry(db).or_default().entry(name.into()).or_default()
            }
        };
        record.noted = noted;
        self.by_age.insert(noted, (db, name.into()));
        match watch {
            Watch::Joined => {}
            Watch::Waited(waited) => {
                record.handovers += 1;
                record.waits.record(waited);
            }
            Watch::Held(held) => record.holds.record(held),
        }
    }

    /// The record of lock `name` in database `db`, if it is watched.
    pub fn get(&self, db: i32, name: &[u8]) -> Option<&Record> {
        self.by_db.get(&db)?.get(name)
    }

    /// Every watched lock of database `db`, by name.
    pub fn of_db(&self, db: i32) -> impl Iterator<Item = (&[u8], &Record)> + '_ {
        self.by_db.get(&db).into_iter().flatten().map(|(name, record)| (&**name, record))
    }

    /// How many locks are watched.
    pub fn len(&self) -> usize {
        self.by_age.len()
    }

    /// Whether no lock is watched.
    pub fn is_empty(&self) -> bool {
        self.by_age.is_empty()
    }

    /// Forgets every lock (`CONFIG RESETSTAT`).
    pub fn clear(&mut self) {
        *self = Self::with_capacity(self.capacity);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_lock_is_watched_from_its_first_wait_and_a_hold_alone_does_not_start_it() {
        let mut watched = Watched::with_capacity(8);
        watched.note(0, b"a", Watch::Held(5_000));
        assert!(watched.get(0, b"a").is_none(), "a hold of an unwatched lock is not noted");
        watched.note(0, b"a", Watch::Joined);
        watched.note(0, b"a", Watch::Held(7_000));
        watched.note(0, b"a", Watch::Waited(2_000));
        watched.note(1, b"a", Watch::Joined);
        let record = watched.get(0, b"a").expect("watched");
        assert_eq!((record.handovers, record.waits.count(), record.holds.count()), (1, 1, 1));
        assert_eq!((record.waits.max(), record.holds.max()), (2_000, 7_000));
        assert_eq!(watched.get(1, b"a").map(|r| r.handovers), Some(0), "databases apart");
        assert_eq!(watched.len(), 2);
        let names: Vec<&[u8]> = watched.of_db(0).map(|(name, _)| name).collect();
        assert_eq!(names, [&b"a"[..]]);
    }

    #[test]
    fn past_capacity_the_lock_least_recently_noted_is_dropped() {
        let mut watched = Watched::with_capacity(3);
        for name in [b"a", b"b", b"c"] {
            watched.note(0, name, Watch::Joined);
        }
        watched.note(0, b"a", Watch::Waited(1)); // a is now the most recent
        watched.note(0, b"d", Watch::Joined); // b goes
        assert!(watched.get(0, b"b").is_none());
        for name in [b"a", b"c", b"d"] {
            assert!(watched.get(0, name).is_some(), "{:?} kept", name);
        }
        assert_eq!(watched.len(), 3);
        watched.clear();
        assert!(watched.is_empty() && watched.get(0, b"a").is_none());
    }

    #[test]
    fn small_histograms_answer_as_the_server_wide_ones_do() {
        let mut small = SmallHistogram::default();
        let mut wide = super::super::stats::Histogram::default();
        for ms in 1..=100u64 {
            small.record(ms * 1_000);
            wide.record(ms * 1_000);
        }
        for p in [50.0, 90.0, 99.0, 100.0] {
            assert_eq!(small.percentile(p), wide.percentile(p), "p{p}");
        }
        assert_eq!(SmallHistogram::default().percentile(99.0), 0);
    }

    proptest! {
        #[test]
        fn the_watch_never_exceeds_its_capacity_and_indexes_agree(
            notes in prop::collection::vec((0i32..3, 0u8..12, 0u8..4, 0u64..1_000_000), 0..300),
            capacity in 1usize..10,
        ) {
            let mut watched = Watched::with_capacity(capacity);
            let mut last_started = None;
            for (db, name, kind, micros) in notes {
                let watch = match kind {
                    0 | 1 => Watch::Joined,
                    2 => Watch::Waited(micros),
                    _ => Watch::Held(micros),
                };
                watched.note(db, &[name], watch);
                if kind != 3 {
                    last_started = Some((db, name));
                }
                prop_assert!(watched.len() <= capacity);
                let by_db: usize = watched.by_db.values().map(BTreeMap::len).sum();
                prop_assert_eq!(by_db, watched.len());
                if let Some((db, name)) = last_started {
                    prop_assert!(watched.get(db, &[name]).is_some(), "the latest noted stays");
                }
            }
        }

        #[test]
        fn a_percentile_of_a_small_histogram_bounds_its_rank_within_a_bucket(
            values in prop::collection::vec(0u64..10_000_000_000, 1..200),
            p in 1u32..=100,
        ) {
            let mut small = SmallHistogram::default();
            for &value in &values {
                small.record(value);
            }
            let mut sorted = values.clone();
            sorted.sort_unstable();
            let rank = ((f64::from(p) / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
            let truth = sorted[rank - 1];
            let got = small.percentile(f64::from(p));
            prop_assert!(got >= truth, "p{} {} below {}", p, got, truth);
            prop_assert!(got <= truth + truth / 8 + 1, "p{} {} too far above {}", p, got, truth);
        }
    }
}
