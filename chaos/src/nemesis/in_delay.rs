//! Promotions while a grant delay runs (`failover-in-delay`, profile `failover`), and what stood
//! in line on the mixed resources at each promotion.
//!
//! `failover-in-delay` is one of two, at random: the primary is killed and restarted from its AOF
//! (its grant delay starts once it has loaded), and within that delay it is killed again and the
//! replica promoted; or the replica is promoted, and within the new primary's delay it is killed
//! and the old primary (restarted as its replica meanwhile, synchronised or not) promoted in
//! turn. Either way the workers follow the last promotion, as after `promote`.
//!
//! Before every promotion (`promote`, `failover`, `failover-in-delay`) the nemesis waits a
//! little for a moment when the primary shows waiters or tickets on a mixed resource, and counts
//! the promotions that found some: a promotion drops them (they are client state; a re-sent
//! ACQUIRE takes a new place, docs/guarantees.md).

use std::thread::sleep;
use std::time::{Duration, Instant};

use dlock_testkit::{Rng, Server};

use super::{Cluster, swap_roles};

/// `failover-in-delay` is drawn from a stream of its own (seed ^ this), so that the schedule of
/// the other kinds stays what a seed gave before it existed.
pub const IN_DELAY_STREAM: u64 = 0xde1a_7ed0_fa11_0ae5;

/// How long the nemesis waits for waiters or tickets before a promotion (it promotes anyway).
const LINE_WAIT: Duration = Duration::from_millis(1_000);

/// What the promotions found, for the summary.
#[derive(Clone, Debug, Default)]
pub struct Promotions {
    /// Promotions of the replica (`REPLICAOF NO ONE`, or a `FAILOVER` that completed).
    pub total: usize,
    /// Of those, the ones made while the primary showed waiters or tickets on a mixed resource,
    /// and how many of each it showed then (summed).
    pub with_line: usize,
    pub waiters: u64,
    pub tickets: u64,
    /// `failover-in-delay` by variant, and the second steps that came after the delay had
    /// already ended (a slow restart): not a promotion during a delay.
    pub restart_then_promote: usize,
    pub promote_twice: usize,
    pub late: usize,
}

/// Waiters and tickets standing on `resources` on `server`, summed; `None` if unreadable.
fn standing(server: &Server, resources: &[String]) -> Option<(u64, u64)> {
    let mut con = server.try_client().ok()?;
    con.set_read_timeout(Some(Duration::from_millis(300))).ok()?;
    let (mut waiters, mut tickets) = (0, 0);
    for resource in resources {
        let reply: redis::Value = redis::cmd("DLOCK.INFO").arg(resource).query(&mut con).ok()?;
        let redis::Value::Array(items) = reply else { continue };
        for pair in items.chunks(2) {
            let (redis::Value::BulkString(name), Some(redis::Value::Int(n))) =
                (&pair[0], pair.get(1))
            else {
                continue;
            };
            match name.as_slice() {
                b"waiters" => waiters += *n as u64,
                b"tickets" => tickets += *n as u64,
                _ => {}
            }
        }
    }
    Some((waiters, tickets))
}

impl Promotions {
    /// Waits (up to `within`) until the primary shows waiters or tickets on a mixed resource;
    /// what it showed last.
    pub(super) fn await_line(
        &self,
        cluster: &Cluster,
        resources: &[String],
        within: Duration,
    ) -> (u64, u64) {
        let deadline = Instant::now() + within;
        loop {
            let seen = standing(&cluster.primary.server, resources).unwrap_or_default();
            if seen.0 + seen.1 > 0 || Instant::now() >= deadline {
                return seen;
            }
            sleep(Duration::from_millis(10));
        }
    }

    /// Counts a promotion made right after the primary showed `seen`.
    pub(super) fn record(&mut self, seen: (u64, u64)) {
        self.total += 1;
        if seen.0 + seen.1 > 0 {
            self.with_line += 1;
            self.waiters += seen.0;
            self.tickets += seen.1;
        }
    }

    /// `promote` once a line stands (or [`LINE_WAIT`] passed); when the replica was promoted
    /// (its grant delay began).
    pub(super) fn promote(&mut self, cluster: &mut Cluster, resources: &[String]) -> Instant {
        let seen = self.await_line(cluster, resources, LINE_WAIT);
        let promoted = promote(cluster);
        self.record(seen);
        promoted
    }

    /// `failover-in-delay`: a promotion within the grant delay of a restart or of another
    /// promotion.
    pub(super) fn in_delay(
        &mut self,
        cluster: &mut Cluster,
        resources: &[String],
        rng: &mut Rng,
        delay: Duration,
    ) {
        let delay_started = if rng.below(2) == 0 {
            self.restart_then_promote += 1;
            // As a primary: after a promotion this node was started as a replica.
            let args: Vec<&str> = cluster.args.iter().map(String::as_str).collect();
            cluster.primary.server.crash_and_restart_with(&args);
            Instant::now()
        } else {
            self.promote_twice += 1;
            // Its delay began at REPLICAOF NO ONE, before the old primary restarted as its
            // replica.
            self.promote(cluster, resources)
        };
        // Somewhere in the first half of the delay, then as soon as a line stands.
        sleep(delay.mul_f64(rng.below(50) as f64 / 100.0));
        let left = (delay_started + delay.mul_f64(0.8)).saturating_duration_since(Instant::now());
        let seen = self.await_line(cluster, resources, left);
        if delay_started.elapsed() >= delay {
            self.late += 1;
        }
        promote(cluster);
        self.record(seen);
    }
}

/// Kills the primary, promotes the replica (retried while it is still loading a resync), moves
/// both links to it, and restarts the old primary as its replica. Returns when the replica
/// became the primary.
fn promote(cluster: &mut Cluster) -> Instant {
    cluster.primary.server.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    let promoted_at = loop {
        let promoted: redis::RedisResult<()> = cluster
            .replica
            .server
            .try_client()
            .and_then(|mut con| redis::cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut con));
        match promoted {
            Ok(()) => break Instant::now(),
            Err(error) if Instant::now() < deadline => {
                eprintln!("dlock-chaos: REPLICAOF NO ONE refused ({error}); retrying");
                sleep(Duration::from_millis(20));
            }
            Err(error) => panic!("REPLICAOF NO ONE: {error}"),
        }
    };
    swap_roles(cluster);
    promoted_at
}
