//! The cluster profile's checkers, over the workers' histories, the faults, the registers read
//! from each slot's owner at the end and PostgreSQL's log of accepted writes. `fence-order` and
//! `store-order` are the single-server harness's own ([`crate::check`]); the others are the
//! cluster's:
//!
//! - `unique-fences`: on each resource, a fence belongs to one grant (nodes mint fences apart,
//!   so the same number on two resources is no finding);
//! - `store-fence`: a fenced SQL write refused because the row kept a larger fence is a
//!   violation when no grant gave that fence, or when its grant was acknowledged before the
//!   refused lease was asked for (the store refused the real holder);
//! - `double-holders`: a worker invoking a write or a release under a lease (each such invoke
//!   follows a check of the lease's conservative local expiry) after a grant of a larger fence
//!   on its resource was acknowledged to another;
//! - `lost-writes`: every acknowledged `DLOCK.FENCED RPUSH` is in the final list on its slot's
//!   owner; one acknowledged around an unplanned failover (a primary killed, stopped or cut off,
//!   whose replica may not have received it: the client does not `WAIT` after a fenced write) is
//!   excused and counted, never one around a manual failover, a reshard, a rebalance, a node
//!   added or removed, or a clock skew;
//! - `client-errors`: every error the client API returned that is neither NotAcquired (held,
//!   not replicated and released, an unknown grant found and released) nor LeaseLost (a renewal
//!   refused, the local expiry passed, a stale fenced write, a release of a lease no longer
//!   held), nor an unknown outcome (a request that timed out or whose connection dropped after
//!   it left), is printed and counted as a violation.

use std::collections::{BTreeMap, HashMap};

use crate::check::{self, Fault, Finding, Operation, Report, State};
use crate::history::{Event, Kind, Op};

/// How long before an unplanned failover a write may still be lost with it: replication lags
/// by milliseconds, a second is generous.
const REPLICATION_LAG_NS: u64 = 1_000_000_000;

/// What the cluster checkers counted besides the violations.
#[derive(Debug, Default)]
pub struct Counts {
    pub appends_acknowledged: usize,
    pub appends_kept: usize,
    pub sql_accepted: usize,
    pub sql_refused: usize,
    pub leases_lost: usize,
    pub not_acquired: usize,
    pub unknown_outcomes: usize,
    pub escaped: usize,
    /// Appends acknowledged to a worker on the minority side of a partition, while cut off.
    pub minority_acknowledged: usize,
    /// Of those, the ones lost (the minority's primary rejoined as a replica).
    pub minority_lost: usize,
    /// Errors the client returned to a worker on the minority side while it was cut off.
    pub minority_errors: usize,
}

/// A worker on the minority side of a partition: its id, and when its node was cut off and
/// joined again.
#[derive(Clone, Copy, Debug)]
pub struct Minority {
    pub worker: u32,
    pub from: u64,
    pub to: u64,
}

fn on_minority_side(minority: &[Minority], o: &Operation) -> bool {
    minority.iter().any(|m| m.worker == o.worker && o.invoked <= m.to && o.completed >= m.from)
}

/// Runs every cluster checker.
pub fn check(
    events: &[Event],
    faults: &[Fault],
    state: &State,
    minority: &[Minority],
) -> (Report, Counts) {
    let operations = check::operations(events);
    let all_grants = check::grants(&operations);
    let grants: Vec<&Operation> = all_grants.iter().collect();
    let mut report =
        Report { operations: operations.len(), grants: grants.len(), ..Report::default() };
    let mut counts = Counts::default();
    unique_fences(&grants, &mut report);
    check::fence_order(&grants, &mut report);
    check::state_order(state, &mut report);
    store_fence(&operations, &grants, &mut report, &mut counts);
    double_holders(&operations, &grants, &mut report);
    lost_writes(&operations, state, faults, minority, &mut report, &mut counts);
    client_errors(&operations, minority, &mut report, &mut counts);
    (report, counts)
}

fn by_fence<'a>(grants: &[&'a Operation]) -> HashMap<(&'a str, u64), &'a Operation> {
    grants.iter().map(|g| ((g.resource.as_str(), g.fence), *g)).collect()
}

fn unique_fences(grants: &[&Operation], report: &mut Report) {
    let mut owners: HashMap<(&str, u64), &Operation> = HashMap::new();
    for grant in grants {
        if let Some(first) = owners.insert((&grant.resource, grant.fence), grant)
            && first.detail != grant.detail
        {
            report.violations.push(Finding {
                checker: "unique-fences",
                message: format!(
                    "fence {} granted to token {} (worker {}) and to token {} (worker {})",
                    grant.fence, first.detail, first.worker, grant.detail, grant.worker
                ),
                resource: grant.resource.clone(),
                from: first.invoked,
                to: grant.completed,
            });
        }
    }
}

fn store_fence(
    operations: &[Operation],
    grants: &[&Operation],
    report: &mut Report,
    counts: &mut Counts,
) {
    let granted = by_fence(grants);
    for write in operations.iter().filter(|o| o.op == Op::SqlWrite) {
        match write.outcome {
            Kind::Ok => counts.sql_accepted += 1,
            Kind::Fail => counts.sql_refused += 1,
            _ => {}
        }
        if write.outcome != Kind::Fail {
            continue;
        }
        let Some(kept) = check::field(&write.detail, "kept").and_then(|k| k.parse::<u64>().ok())
        else {
            continue;
        };
        let own = granted.get(&(write.resource.as_str(), write.fence));
        let message = match (granted.get(&(write.resource.as_str(), kept)), own) {
            (None, _) => format!(
                "fence {} (worker {}) refused: the store kept fence {kept}, which no grant gave",
                write.fence, write.worker
            ),
            (Some(larger), Some(own)) if larger.completed < own.requested => format!(
                "fence {} (worker {}) refused: the store kept fence {kept} (worker {}), granted before it",
                write.fence, write.worker, larger.worker
            ),
            _ => continue,
        };
        report.violations.push(Finding {
            checker: "store-fence",
            message,
            resource: write.resource.clone(),
            from: own.map_or(write.invoked, |g| g.invoked),
            to: write.completed,
        });
    }
}

fn double_holders(operations: &[Operation], grants: &[&Operation], report: &mut Report) {
    let mut by_resource: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for grant in grants {
        by_resource.entry(&grant.resource).or_default().push(grant);
    }
    for list in by_resource.values_mut() {
        list.sort_by_key(|g| g.fence);
    }
    // Per resource and fence, the first acknowledgement of any larger fence.
    let mut first_larger: HashMap<(&str, u64), &Operation> = HashMap::new();
    for (resource, list) in &by_resource {
        let mut best: Option<&Operation> = None;
        for grant in list.iter().rev() {
            if let Some(best) = best {
                first_larger.insert((resource, grant.fence), best);
            }
            if best.is_none_or(|b| grant.completed < b.completed) {
                best = Some(grant);
            }
        }
    }
    let granted = by_fence(grants);
    let beliefs = operations
        .iter()
        .filter(|o| matches!(o.op, Op::RedisWrite | Op::SqlWrite | Op::Release) && o.fence > 0);
    let mut reported: HashMap<(&str, u64), ()> = HashMap::new();
    for belief in beliefs {
        let key = (belief.resource.as_str(), belief.fence);
        let (Some(later), Some(own)) = (first_larger.get(&key), granted.get(&key)) else {
            continue;
        };
        if own.worker != belief.worker || later.completed >= belief.invoked {
            continue;
        }
        if reported.insert(key, ()).is_some() {
            continue;
        }
        report.violations.push(Finding {
            checker: "double-holders",
            message: format!(
                "worker {} still believed it held fence {} ({:?} invoked) {} ms after fence {} was acknowledged to worker {}",
                belief.worker,
                belief.fence,
                belief.op,
                (belief.invoked - later.completed) / 1_000_000,
                later.fence,
                later.worker
            ),
            resource: belief.resource.clone(),
            from: own.invoked,
            to: belief.invoked,
        });
    }
}

fn lost_writes(
    operations: &[Operation],
    state: &State,
    faults: &[Fault],
    minority: &[Minority],
    report: &mut Report,
    counts: &mut Counts,
) {
    for write in operations.iter().filter(|o| o.op == Op::RedisWrite && o.outcome == Kind::Ok) {
        counts.appends_acknowledged += 1;
        let cut_off = on_minority_side(minority, write);
        counts.minority_acknowledged += usize::from(cut_off);
        let kept = state
            .redis
            .get(&write.resource)
            .is_some_and(|entries| entries.iter().any(|e| e.entry() == write.detail));
        if kept {
            counts.appends_kept += 1;
            continue;
        }
        if cut_off {
            // The one loss the docs admit: a primary cut off from the majority acknowledges
            // writes until its node timeout, and drops them when it rejoins as a replica.
            counts.minority_lost += 1;
            let finding = Finding {
                checker: "lost-writes",
                message: format!(
                    "acknowledged fenced append {} on the minority side of a partition is lost",
                    write.detail
                ),
                resource: write.resource.clone(),
                from: write.invoked,
                to: write.completed,
            };
            report.file(finding, true);
            continue;
        }
        let unplanned = faults.iter().find(|f| {
            f.may_lose_leases
                && f.start <= write.completed.saturating_add(REPLICATION_LAG_NS)
                && f.end >= write.completed
        });
        let finding = Finding {
            checker: "lost-writes",
            message: format!(
                "acknowledged fenced append {} is not in the list on the slot's owner{}",
                write.detail,
                unplanned.map_or(String::new(), |f| format!(" (around {})", f.kind))
            ),
            resource: write.resource.clone(),
            from: write.invoked,
            to: write.completed,
        };
        report.file(finding, unplanned.is_some());
    }
}

fn client_errors(
    operations: &[Operation],
    minority: &[Minority],
    report: &mut Report,
    counts: &mut Counts,
) {
    for o in operations.iter().filter(|o| o.outcome != Kind::Ok || o.op == Op::Lost) {
        if matches!(o.op, Op::SqlWrite) {
            continue; // PostgreSQL's, not the client's
        }
        let class = o.detail.split(' ').next().unwrap_or_default();
        match class {
            "lost" => counts.leases_lost += 1,
            "not-acquired" => counts.not_acquired += 1,
            "unknown" => counts.unknown_outcomes += 1,
            // Cut off with its node, the worker cannot reach most primaries: that is the truth.
            "escaped" if on_minority_side(minority, o) => counts.minority_errors += 1,
            "escaped" => {
                counts.escaped += 1;
                report.violations.push(Finding {
                    checker: "client-errors",
                    message: format!(
                        "{:?} by worker {} returned {}",
                        o.op,
                        o.worker,
                        o.detail.trim_start_matches("escaped ")
                    ),
                    resource: o.resource.clone(),
                    from: o.invoked,
                    to: o.completed,
                });
            }
            // An invoke whose worker was killed before it completed: no error came back.
            _ if o.completed == u64::MAX => {}
            _ => {
                counts.escaped += 1;
                report.violations.push(Finding {
                    checker: "client-errors",
                    message: format!(
                        "{:?} by worker {} ended unclassified: {}",
                        o.op, o.worker, o.detail
                    ),
                    resource: o.resource.clone(),
                    from: o.invoked,
                    to: o.completed,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Accepted;

    const MS: u64 = 1_000_000;

    fn event(at: u64, worker: u32, op: Op, kind: Kind, fence: u64, detail: &str) -> Event {
        Event { at: at * MS, worker, op, kind, resource: "r".into(), fence, detail: detail.into() }
    }

    /// Worker `worker` is granted `fence` at `at`, appends, writes SQL and releases.
    fn lease(history: &mut Vec<Event>, at: u64, worker: u32, fence: u64) -> String {
        let entry = Accepted { fence, worker, seq: fence, value: fence as i64 }.entry();
        history.push(event(at, worker, Op::Acquire, Kind::Invoke, 0, ""));
        history.push(event(
            at + 1,
            worker,
            Op::Acquire,
            Kind::Ok,
            fence,
            &format!("t{worker}-{fence}"),
        ));
        history.push(event(at + 2, worker, Op::RedisWrite, Kind::Invoke, fence, &entry));
        history.push(event(at + 3, worker, Op::RedisWrite, Kind::Ok, fence, &entry));
        history.push(event(at + 4, worker, Op::Release, Kind::Invoke, fence, ""));
        history.push(event(at + 5, worker, Op::Release, Kind::Ok, fence, ""));
        entry
    }

    fn state(entries: &[&str]) -> State {
        let mut state = State::default();
        state.redis.insert("r".into(), entries.iter().filter_map(|e| Accepted::parse(e)).collect());
        state
    }

    fn checkers(history: &[Event], faults: &[Fault], state: &State) -> Vec<&'static str> {
        check(history, faults, state, &[]).0.violations.iter().map(|v| v.checker).collect()
    }

    #[test]
    fn leases_one_after_another_with_every_append_kept_pass() {
        let mut history = Vec::new();
        let a = lease(&mut history, 0, 1, 10);
        let b = lease(&mut history, 10, 2, 11);
        assert_eq!(checkers(&history, &[], &state(&[&a, &b])), Vec::<&str>::new());
    }

    #[test]
    fn a_write_invoked_after_a_larger_fence_was_acknowledged_is_a_double_holder() {
        let mut history = Vec::new();
        let a = lease(&mut history, 0, 1, 10);
        let b = lease(&mut history, 10, 2, 11);
        // Worker 1 still writes under fence 10 once fence 11 was acknowledged to worker 2.
        history.push(event(20, 1, Op::SqlWrite, Kind::Invoke, 10, ""));
        history.push(event(21, 1, Op::SqlWrite, Kind::Fail, 10, "kept=11"));
        assert_eq!(checkers(&history, &[], &state(&[&a, &b])), vec!["double-holders"]);
    }

    #[test]
    fn a_missing_append_is_lost_unless_an_unplanned_failover_came_right_after_it() {
        let mut history = Vec::new();
        let a = lease(&mut history, 0, 1, 10);
        let _b = lease(&mut history, 10, 2, 11);
        assert_eq!(checkers(&history, &[], &state(&[&a])), vec!["lost-writes"]);
        let kill =
            Fault { kind: "kill-primary", start: 14 * MS, end: 900 * MS, may_lose_leases: true };
        let (report, _) = check(&history, &[kill], &state(&[&a]), &[]);
        assert!(report.violations.is_empty());
        assert_eq!(report.excused.len(), 1);
        let reshard =
            Fault { kind: "reshard", start: 14 * MS, end: 900 * MS, may_lose_leases: false };
        assert_eq!(checkers(&history, &[reshard], &state(&[&a])), vec!["lost-writes"]);
    }

    #[test]
    fn one_fence_for_two_tokens_on_a_resource_is_a_violation_on_two_resources_none() {
        let mut history = Vec::new();
        let a = lease(&mut history, 0, 1, 10);
        let b = lease(&mut history, 10, 2, 10);
        let found = checkers(&history, &[], &state(&[&a, &b]));
        assert!(found.contains(&"unique-fences"), "{found:?}");
        let mut history = Vec::new();
        let a = lease(&mut history, 0, 1, 10);
        history.extend(lease_on("s", 10, 2, 10));
        let found = checkers(&history, &[], &state(&[&a]));
        assert!(!found.contains(&"unique-fences"), "{found:?}");
    }

    /// [`lease`] on resource `resource`.
    fn lease_on(resource: &str, at: u64, worker: u32, fence: u64) -> Vec<Event> {
        let mut history = Vec::new();
        lease(&mut history, at, worker, fence);
        history.iter_mut().for_each(|e| e.resource = resource.into());
        history
    }

    #[test]
    fn a_lost_append_and_an_error_of_a_worker_cut_off_with_its_node_are_counted_apart() {
        let mut history = Vec::new();
        let a = lease(&mut history, 0, 1, 10);
        let _b = lease(&mut history, 10, 2, 11);
        history.push(event(20, 2, Op::Acquire, Kind::Invoke, 0, ""));
        history.push(event(30, 2, Op::Acquire, Kind::Fail, 0, "escaped unreachable: refused"));
        let cut_off = [Minority { worker: 2, from: 9 * MS, to: 25 * MS }];
        let (report, counts) = check(&history, &[], &state(&[&a]), &cut_off);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!((counts.minority_acknowledged, counts.minority_lost), (1, 1));
        assert_eq!(counts.minority_errors, 1);
        // The same history with nobody cut off: a lost write and an escaped error.
        let found = checkers(&history, &[], &state(&[&a]));
        assert_eq!(found, vec!["lost-writes", "client-errors"]);
    }

    #[test]
    fn a_refusal_by_a_fence_granted_earlier_or_never_is_a_store_fence_violation() {
        let mut history = Vec::new();
        let a = lease(&mut history, 0, 1, 12);
        let b = lease(&mut history, 10, 2, 11);
        history.push(event(13, 2, Op::SqlWrite, Kind::Invoke, 11, ""));
        history.push(event(14, 2, Op::SqlWrite, Kind::Fail, 11, "kept=12"));
        history.push(event(15, 2, Op::SqlWrite, Kind::Invoke, 11, ""));
        history.push(event(16, 2, Op::SqlWrite, Kind::Fail, 11, "kept=99"));
        let found = checkers(&history, &[], &state(&[&a, &b]));
        assert_eq!(found.iter().filter(|c| **c == "store-fence").count(), 2, "{found:?}");
        assert!(found.contains(&"fence-order"), "{found:?}");
    }

    #[test]
    fn only_not_acquired_lease_lost_and_unknown_outcomes_stay_in_the_client() {
        let mut history = vec![
            event(0, 1, Op::Acquire, Kind::Invoke, 0, ""),
            event(1, 1, Op::Acquire, Kind::Fail, 0, "not-acquired held: held"),
            event(2, 1, Op::Lost, Kind::Ok, 10, "lost refused"),
            event(3, 1, Op::Release, Kind::Invoke, 10, ""),
            event(4, 1, Op::Release, Kind::Unknown, 10, "unknown timed out"),
        ];
        let (report, counts) = check(&history, &[], &State::default(), &[]);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!((counts.not_acquired, counts.leases_lost, counts.unknown_outcomes), (1, 1, 1));
        history.push(event(5, 1, Op::Release, Kind::Invoke, 10, ""));
        history.push(event(6, 1, Op::Release, Kind::Unknown, 10, "escaped Connection refused"));
        assert_eq!(checkers(&history, &[], &State::default()), vec!["client-errors"]);
    }
}
