//! `clock-lease`: a lease keeps its length whatever the servers' wall clocks do. The mixed
//! workers renew with `RENEW … FENCE` and use their leases (readers and permits) or write
//! (writers) under `DLOCK.FENCED`, so each of their leases shows, on the worker's monotonic clock, when the server must still have held it: a
//! refused renewal (`0`) or fenced use (`STALE`) that completed sooner than `ttl` (less a
//! tolerance) after a renewal the server granted was sent is a **shortened** lease. It is excused
//! across a restart or a promotion (a lease may be lost there, and a clock stepped forward while a
//! server was down shortens what it restores, as Redis TTLs are), never across a clock step on a
//! running server.
//!
//! The same holds after the answer to a retry after a dropped hand-over (`retry-handover`,
//! `mixed.rs`): once a client was answered a grant, nothing but the lease's own end may end it,
//! so a refusal sooner than `ttl` after that retry was sent is a shortened lease too.
//!
//! A **lengthened** lease, the other way a clock could move one, is what `stale-fence`
//! (`check_modes`) already finds: a renewal or fenced use accepted after the deadline.

use std::collections::BTreeMap;

use crate::check::{Fault, Finding, Operation, RESTARTS, Report, Settings};
use crate::history::{Kind, Op};

/// How far from the ttl a lease's end may be seen: timer slices and the workers' scheduling.
const TOLERANCE_NS: u64 = 100_000_000;

pub fn check(operations: &[Operation], faults: &[Fault], settings: &Settings, report: &mut Report) {
    let mut leases: BTreeMap<(u32, &str, u64), Vec<&Operation>> = BTreeMap::new();
    for o in operations.iter().filter(|o| o.fence > 0 && settings.mixed.contains_key(&o.resource)) {
        if matches!(o.op, Op::Renew | Op::Use | Op::RedisWrite) || is_confirmed_retry(o) {
            leases.entry((o.worker, o.resource.as_str(), o.fence)).or_default().push(o);
        }
    }
    for ops in leases.values_mut() {
        ops.sort_by_key(|o| o.invoked);
        one_lease(ops, faults, settings.ttl_ns, report);
    }
}

/// A retry after a dropped hand-over that was answered the lease's fence.
fn is_confirmed_retry(o: &Operation) -> bool {
    o.op == Op::Acquire && o.outcome == Kind::Ok && o.detail.contains("retry after a dropped")
}

fn one_lease(ops: &[&Operation], faults: &[Fault], ttl: u64, report: &mut Report) {
    // The last renewal granted: the deadline is at least its send plus the ttl.
    let mut renewed_at: Option<u64> = None;
    for o in ops {
        let refused = o.outcome == Kind::Fail
            && ((o.op == Op::Renew && o.detail == "not held")
                || (matches!(o.op, Op::Use | Op::RedisWrite) && o.detail.contains("STALE")));
        if let (true, Some(sent)) = (refused, renewed_at)
            && o.completed + TOLERANCE_NS < sent + ttl
        {
            let excused = faults
                .iter()
                .any(|f| RESTARTS.contains(&f.kind) && f.start <= o.completed && f.end >= sent);
            let finding = Finding {
                checker: "clock-lease",
                message: format!(
                    "shortened: {} of fence {} refused {} ms after a renewal was sent (ttl {} ms)",
                    if o.op == Op::Renew { "a renewal" } else { "a fenced use" },
                    o.fence,
                    (o.completed - sent) / 1_000_000,
                    ttl / 1_000_000
                ),
                resource: o.resource.clone(),
                from: sent,
                to: o.completed,
            };
            report.file(finding, excused);
        }
        if (o.op == Op::Renew && o.outcome == Kind::Ok) || is_confirmed_retry(o) {
            renewed_at = Some(o.invoked);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn op(op: Op, outcome: Kind, invoked: u64, completed: u64, detail: &str) -> Operation {
        Operation {
            worker: 1,
            op,
            resource: "rw:0".into(),
            fence: 7,
            detail: detail.into(),
            request: String::new(),
            invoked,
            requested: invoked,
            completed,
            outcome,
        }
    }

    fn findings(ops: &[Operation], faults: &[Fault]) -> (Vec<String>, Vec<String>) {
        let mut report = Report::default();
        let refs: Vec<&Operation> = ops.iter().collect();
        one_lease(&refs, faults, 1_000 * MS, &mut report);
        let messages = |found: &[Finding]| found.iter().map(|f| f.message.clone()).collect();
        (messages(&report.violations), messages(&report.excused))
    }

    #[test]
    fn a_lease_renewed_on_time_and_refused_after_its_ttl_is_clean() {
        let ops = [
            op(Op::Acquire, Kind::Ok, 0, 2 * MS, "t"),
            op(Op::Renew, Kind::Ok, 300 * MS, 302 * MS, ""),
            op(Op::Use, Kind::Ok, 900 * MS, 901 * MS, ""),
            op(Op::Renew, Kind::Fail, 1_400 * MS, 1_401 * MS, "not held"),
        ];
        assert_eq!(findings(&ops, &[]), (vec![], vec![]));
    }

    #[test]
    fn a_refusal_within_the_ttl_of_a_renewal_is_a_shortened_lease_unless_a_restart_came_between() {
        let ops = [
            op(Op::Acquire, Kind::Ok, 0, 2 * MS, "t"),
            op(Op::Renew, Kind::Ok, 300 * MS, 302 * MS, ""),
            op(Op::Use, Kind::Fail, 500 * MS, 501 * MS, "STALE fence"),
        ];
        let (violations, excused) = findings(&ops, &[]);
        assert_eq!((violations.len(), excused.len()), (1, 0), "{violations:?}");
        assert!(violations[0].starts_with("shortened"));
        let restart =
            Fault { kind: "kill-primary", start: 400 * MS, end: 450 * MS, may_lose_leases: false };
        let step = Fault { kind: "clock-step", start: 400 * MS, end: 450 * MS, ..restart.clone() };
        assert_eq!(findings(&ops, &[restart]).1.len(), 1, "a restart excuses it");
        assert_eq!(findings(&ops, &[step]).0.len(), 1, "a step on a running server does not");
    }
}
