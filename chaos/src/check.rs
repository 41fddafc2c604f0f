//! Checkers over a finished run: the history of every worker, the faults the nemesis injected,
//! and the final protected state (the Redis registers and the PostgreSQL write log).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::check_clock;
use crate::check_lines::{self, LineReport};
use crate::check_modes::{self, ModeReport};
use crate::history::{Event, Kind, Op};
use crate::observer::OBSERVER;

/// A fault as the nemesis logged it.
#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: &'static str,
    pub start: u64,
    pub end: u64,
    /// By docs/guarantees.md this fault may lose a lease (a crash without `appendfsync always`, a
    /// promotion): an overlap right after it is counted apart, not as a violation.
    pub may_lose_leases: bool,
}

/// One write the protected state accepted, in the order it accepted them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub fence: u64,
    pub worker: u32,
    pub seq: u64,
    pub value: i64,
}

impl Accepted {
    /// The Redis register's entry form: `fence:worker:seq:value`.
    pub fn entry(&self) -> String {
        format!("{}:{}:{}:{}", self.fence, self.worker, self.seq, self.value)
    }

    pub fn parse(entry: &str) -> Option<Self> {
        let mut parts = entry.split(':');
        let accepted = Self {
            fence: parts.next()?.parse().ok()?,
            worker: parts.next()?.parse().ok()?,
            seq: parts.next()?.parse().ok()?,
            value: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(accepted)
    }
}

/// What the checkers are told besides the history.
#[derive(Clone, Debug)]
pub struct Settings {
    pub ttl_ns: u64,
    pub grant_delay_ns: u64,
    pub slack_ns: u64,
    /// `appendfsync always` and no promotion: no acknowledged grant or fenced write may be lost.
    pub durable: bool,
    pub run_end: u64,
    /// The mixed workers' resources: `Some(n)` for a semaphore of `n` permits, `None` for a
    /// read-write lock. The exclusive-lease checkers skip them.
    pub mixed: BTreeMap<String, Option<u32>>,
}

impl Settings {
    /// How long after `kind` of fault heals some worker must be granted a lease: a ttl (a lease
    /// held by a stopped or cut-off worker runs out) plus slack, and after a restart or a
    /// promotion also the grant delay.
    pub fn liveness_window(&self, kind: &str) -> u64 {
        let delay = if RESTARTS.contains(&kind) { self.grant_delay_ns } else { 0 };
        self.ttl_ns + delay + self.slack_ns
    }
}

/// The final protected state, per resource.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub redis: BTreeMap<String, Vec<Accepted>>,
    pub sql: BTreeMap<String, Vec<Accepted>>,
}

/// A violation, with the part of the history that shows it.
#[derive(Clone, Debug)]
pub struct Finding {
    pub checker: &'static str,
    pub message: String,
    pub resource: String,
    pub from: u64,
    pub to: u64,
}

/// What the checkers found.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<Finding>,
    /// Overlaps and losses after faults that may lose leases: reported, not hidden, not violations.
    pub excused: Vec<Finding>,
    pub operations: usize,
    pub grants: usize,
    pub lost_updates: usize,
    pub liveness_checked: usize,
    /// The mixed workers' leases: what the checkers of modes saw.
    pub modes: ModeReport,
    /// Tickets, claim windows and the observer's readings.
    pub lines: LineReport,
}

impl Report {
    /// Files a finding as a violation, or apart when a fault excuses it.
    pub(crate) fn file(&mut self, finding: Finding, excused: bool) {
        if excused { self.excused.push(finding) } else { self.violations.push(finding) }
    }
}

/// An operation: an invoke and how it ended.
#[derive(Clone, Debug)]
pub struct Operation {
    pub worker: u32,
    pub op: Op,
    pub resource: String,
    pub fence: u64,
    /// The completion's detail (the invoke's while none came).
    pub detail: String,
    /// The invoke's detail: what was asked (a mixed worker's token first).
    pub request: String,
    pub invoked: u64,
    /// When the request that this grant answers was first sent: a ticket's first send (its turn
    /// may come before the re-send that learns of it), else `invoked`.
    pub requested: u64,
    /// When it completed; a killed worker's last operation never did (`u64::MAX`).
    pub completed: u64,
    pub outcome: Kind,
}

impl Operation {
    /// An operation invoked by `event`.
    fn from_event(event: &Event, completed: u64, outcome: Kind) -> Self {
        Self {
            worker: event.worker,
            op: event.op,
            resource: event.resource.clone(),
            fence: event.fence,
            detail: event.detail.clone(),
            request: event.detail.clone(),
            invoked: event.at,
            requested: event.at,
            completed,
            outcome,
        }
    }
}

/// Pairs each worker's invokes with their completions, resource by resource (a set's request
/// is one invoke per member, then one completion per member). An invoke followed by another
/// invoke of the same worker on the same resource (it was killed and restarted) ended
/// `Unknown`.
pub fn operations(events: &[Event]) -> Vec<Operation> {
    let mut sorted: Vec<&Event> = events.iter().collect();
    sorted.sort_by_key(|event| event.at);
    let mut open: HashMap<(u32, &str), Operation> = HashMap::new();
    let mut done = Vec::new();
    for event in sorted {
        match event.kind {
            Kind::Invoke => {
                let key = (event.worker, event.resource.as_str());
                if let Some(killed) = open.remove(&key) {
                    done.push(killed);
                }
                open.insert(key, Operation::from_event(event, u64::MAX, Kind::Unknown));
            }
            outcome => match open.remove(&(event.worker, event.resource.as_str())) {
                Some(mut operation) if operation.op == event.op => {
                    operation.completed = event.at;
                    operation.outcome = outcome;
                    operation.fence = event.fence.max(operation.fence);
                    operation.detail = event.detail.clone();
                    done.push(operation);
                }
                other => {
                    if let Some(operation) = other {
                        done.push(operation);
                    }
                    // A completion without invoke (`lost`): an instant.
                    done.push(Operation::from_event(event, event.at, outcome));
                }
            },
        }
    }
    done.extend(open.into_values());
    done.sort_by_key(|operation| operation.invoked);
    done
}

/// The first word of an invoke's detail: a mixed worker's token.
pub fn token_of(request: &str) -> &str {
    request.split(' ').next().unwrap_or_default()
}

/// The value of `name=value` among the words of a detail.
pub fn field<'a>(detail: &'a str, name: &str) -> Option<&'a str> {
    detail.split(' ').find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
}

/// Every grant, once: the first acknowledgement of each fence to each token on its resource (a
/// claim that answers the same fence again is no new grant). A grant to a token named in its
/// requests (the mixed workers') counts as requested at the token's first request: a ticket's
/// turn may come before the re-send that learns of it, and a retry after an unknown outcome may
/// only learn of the grant an earlier attempt made.
pub fn grants(operations: &[Operation]) -> Vec<Operation> {
    let asks = |o: &&Operation| matches!(o.op, Op::Acquire | Op::Queue);
    let mut first_request: HashMap<(u32, &str, &str), u64> = HashMap::new();
    for o in operations.iter().filter(asks).filter(|o| !token_of(&o.request).is_empty()) {
        let key = (o.worker, o.resource.as_str(), token_of(&o.request));
        let at = first_request.entry(key).or_insert(o.invoked);
        *at = (*at).min(o.invoked);
    }
    let mut seen: HashSet<(&str, u64, &str)> = HashSet::new();
    let mut grants = Vec::new();
    for o in operations.iter().filter(asks) {
        if o.outcome != Kind::Ok || o.fence == 0 || !seen.insert((&o.resource, o.fence, &o.detail))
        {
            continue;
        }
        let mut grant = o.clone();
        let key = (o.worker, o.resource.as_str(), token_of(&o.request));
        grant.requested = first_request.get(&key).copied().unwrap_or(o.invoked).min(o.invoked);
        grants.push(grant);
    }
    grants
}

/// The faults that restart the primary or put another in its place: leases not yet durable may be
/// lost there, lines (tickets, blocked waiters) always are, and a grant delay follows.
pub(crate) const RESTARTS: [&str; 6] = [
    "kill-primary",
    "clock-step-restart",
    "promote",
    "failover",
    "failover-and-back",
    "failover-in-delay",
];

pub(crate) fn excusing_fault(faults: &[Fault], from: u64, to: u64) -> Option<&Fault> {
    faults.iter().find(|fault| fault.may_lose_leases && fault.start <= to && fault.end >= from)
}

/// Runs every checker.
pub fn check(events: &[Event], faults: &[Fault], state: &State, settings: &Settings) -> Report {
    let (samples, events): (Vec<Event>, Vec<Event>) =
        events.iter().cloned().partition(|event| event.worker == OBSERVER);
    let samples = operations(&samples);
    let operations = operations(&events);
    let acknowledged: Vec<&Operation> = operations
        .iter()
        .filter(|o| matches!(o.op, Op::Acquire | Op::Queue) && o.outcome == Kind::Ok && o.fence > 0)
        .collect();
    let all_grants = grants(&operations);
    let grants: Vec<&Operation> = all_grants.iter().collect();
    // The exclusive-lease checkers, on the resources where every lease is exclusive.
    let exclusive: Vec<&Operation> =
        grants.iter().copied().filter(|g| !settings.mixed.contains_key(&g.resource)).collect();
    let mut report =
        Report { operations: operations.len(), grants: grants.len(), ..Report::default() };
    unique_fences(&acknowledged, &mut report);
    fence_order(&grants, &mut report);
    no_overlap(&operations, &exclusive, faults, &mut report);
    grants_kept(&operations, &exclusive, faults, settings, &mut report);
    state_order(state, &mut report);
    durability(&operations, state, faults, settings, &mut report);
    liveness(&grants, faults, settings, &mut report);
    check_modes::check(&operations, &grants, faults, settings, &mut report);
    check_lines::check(&operations, &grants, &samples, faults, settings, &mut report);
    check_clock::check(&operations, faults, settings, &mut report);
    report
}

/// Every fence belongs to one grant (one token).
fn unique_fences(grants: &[&Operation], report: &mut Report) {
    let mut owners: HashMap<u64, &Operation> = HashMap::new();
    for grant in grants {
        if let Some(first) = owners.insert(grant.fence, grant)
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

fn by_resource<'a>(grants: &[&'a Operation]) -> BTreeMap<&'a str, Vec<&'a Operation>> {
    let mut map: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for grant in grants {
        map.entry(grant.resource.as_str()).or_default().push(grant);
    }
    map
}

/// Per resource, a grant invoked after another grant completed has a larger fence.
pub(crate) fn fence_order(grants: &[&Operation], report: &mut Report) {
    for (resource, mut list) in by_resource(grants) {
        let mut by_completion = list.clone();
        by_completion.sort_by_key(|g| g.completed);
        list.sort_by_key(|g| g.requested);
        let mut before: Option<&Operation> = None; // the largest fence completed so far
        let mut next = 0;
        for grant in list {
            while next < by_completion.len() && by_completion[next].completed < grant.requested {
                let candidate = by_completion[next];
                if before.is_none_or(|b| candidate.fence > b.fence) {
                    before = Some(candidate);
                }
                next += 1;
            }
            if let Some(earlier) = before
                && grant.fence <= earlier.fence
            {
                report.violations.push(Finding {
                    checker: "fence-order",
                    message: format!(
                        "fence {} (worker {}) granted after fence {} (worker {}) was granted",
                        grant.fence, grant.worker, earlier.fence, earlier.worker
                    ),
                    resource: resource.to_owned(),
                    from: earlier.requested,
                    to: grant.completed,
                });
            }
        }
    }
}

/// No lease is used (a fenced write or release the server accepted) after another grant on its
/// resource completed, if that other grant was invoked after this one completed.
fn no_overlap(
    operations: &[Operation],
    grants: &[&Operation],
    faults: &[Fault],
    report: &mut Report,
) {
    for (resource, mut list) in by_resource(grants) {
        // A grant with a larger fence is a later grant (fence-order checks that against real
        // time), also when its acquire was queued before this one completed.
        list.sort_by_key(|g| g.fence);
        // first_after[i]: the grant completing first among list[i..] (larger fences).
        let mut first_after: Vec<Option<&Operation>> = vec![None; list.len() + 1];
        for i in (0..list.len()).rev() {
            first_after[i] = match first_after[i + 1] {
                Some(best) if best.completed <= list[i].completed => Some(best),
                _ => Some(list[i]),
            };
        }
        let grant_of: HashMap<u64, &Operation> = list.iter().map(|g| (g.fence, *g)).collect();
        let uses = operations.iter().filter(|o| {
            o.resource == resource
                && o.outcome == Kind::Ok
                && matches!(o.op, Op::RedisWrite | Op::Release)
        });
        for used in uses {
            let Some(own) = grant_of.get(&used.fence) else { continue };
            let larger = list.partition_point(|g| g.fence <= own.fence);
            let Some(other) = first_after[larger] else { continue };
            if other.completed >= used.invoked {
                continue;
            }
            let finding = Finding {
                checker: "no-overlap",
                message: format!(
                    "fence {} (worker {}) was still live for a {:?} after fence {} (worker {}) was granted",
                    own.fence, own.worker, used.op, other.fence, other.worker
                ),
                resource: resource.to_owned(),
                from: own.invoked,
                to: used.completed,
            };
            report.file(finding, excusing_fault(faults, own.completed, used.invoked).is_some());
        }
    }
}

/// No grant is forgotten: a later grant on the same resource completing before the earlier one's
/// lease could have ended (its invoke + ttl: the server's deadline is later still) means the
/// server lost the earlier grant, unless its holder released it or gave it up first.
fn grants_kept(
    operations: &[Operation],
    grants: &[&Operation],
    faults: &[Fault],
    settings: &Settings,
    report: &mut Report,
) {
    let mut given_up: HashMap<(&str, u64), u64> = HashMap::new();
    for o in operations.iter().filter(|o| matches!(o.op, Op::Release | Op::Lost)) {
        let at = given_up.entry((o.resource.as_str(), o.fence)).or_insert(u64::MAX);
        *at = (*at).min(o.invoked);
    }
    for (resource, mut list) in by_resource(grants) {
        list.sort_by_key(|g| g.invoked);
        for earlier in &list {
            let lease_end = earlier.invoked.saturating_add(settings.ttl_ns);
            // Later grants: larger fences (also those queued before this one completed).
            let later_grants = list.iter().filter(|g| {
                g.fence > earlier.fence && g.invoked < lease_end && g.completed > earlier.invoked
            });
            for later in later_grants {
                let released =
                    given_up.get(&(resource, earlier.fence)).copied().unwrap_or(u64::MAX);
                if later.completed >= lease_end || released < later.completed {
                    continue;
                }
                let finding = Finding {
                    checker: "grants-kept",
                    message: format!(
                        "fence {} (worker {}) granted while fence {} (worker {}) was live and not released",
                        later.fence, later.worker, earlier.fence, earlier.worker
                    ),
                    resource: resource.to_owned(),
                    from: earlier.invoked,
                    to: later.completed,
                };
                let excused = excusing_fault(faults, earlier.invoked, later.completed).is_some();
                report.file(finding, excused);
            }
        }
    }
}

/// The protected state accepted writes in non-decreasing fence order (so never one whose fence
/// was already superseded there). Counts lost updates (a value that is not the previous plus
/// one), which fencing alone does not prevent after a lost lease.
pub(crate) fn state_order(state: &State, report: &mut Report) {
    for (store, registers) in [("redis", &state.redis), ("sql", &state.sql)] {
        for (resource, accepted) in registers {
            for pair in accepted.windows(2) {
                if pair[1].fence < pair[0].fence {
                    report.violations.push(Finding {
                        checker: "state-order",
                        message: format!(
                            "{store} accepted fence {} (worker {}) after fence {} (worker {})",
                            pair[1].fence, pair[1].worker, pair[0].fence, pair[0].worker
                        ),
                        resource: resource.clone(),
                        from: 0,
                        to: u64::MAX,
                    });
                }
                if pair[1].value != pair[0].value + 1 {
                    report.lost_updates += 1;
                }
            }
        }
    }
}

/// With `durable`, every acknowledged fenced Redis write is in the final register.
fn durability(
    operations: &[Operation],
    state: &State,
    faults: &[Fault],
    settings: &Settings,
    report: &mut Report,
) {
    for write in operations.iter().filter(|o| o.op == Op::RedisWrite && o.outcome == Kind::Ok) {
        let kept = state
            .redis
            .get(&write.resource)
            .is_some_and(|entries| entries.iter().any(|e| e.entry() == write.detail));
        if kept {
            continue;
        }
        let finding = Finding {
            checker: "durability",
            message: format!("acknowledged fenced write {} is not in the register", write.detail),
            resource: write.resource.clone(),
            from: write.invoked,
            to: write.completed,
        };
        let excused =
            !settings.durable && excusing_fault(faults, write.completed, u64::MAX).is_some();
        report.file(finding, excused);
    }
}

/// After every fault heals, some worker is granted a lease within ttl + grant delay + slack,
/// unless the run ends or another fault starts first.
fn liveness(grants: &[&Operation], faults: &[Fault], settings: &Settings, report: &mut Report) {
    for fault in faults {
        let window = settings.liveness_window(fault.kind);
        let until = fault.end.saturating_add(window);
        let interrupted = faults.iter().any(|f| f.start > fault.start && f.start < until);
        if until > settings.run_end || interrupted {
            continue;
        }
        report.liveness_checked += 1;
        let progressed = grants.iter().any(|g| g.completed >= fault.end && g.completed <= until);
        if !progressed {
            report.violations.push(Finding {
                checker: "liveness",
                message: format!(
                    "no grant within {} ms after {} healed",
                    window / 1_000_000,
                    fault.kind
                ),
                resource: String::new(),
                from: fault.start,
                to: until,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn event(at: u64, worker: u32, op: Op, kind: Kind, fence: u64, detail: &str) -> Event {
        Event { at: at * MS, worker, op, kind, resource: "r".into(), fence, detail: detail.into() }
    }

    fn grant(history: &mut Vec<Event>, at: u64, worker: u32, fence: u64, token: &str) {
        history.push(event(at, worker, Op::Acquire, Kind::Invoke, 0, ""));
        history.push(event(at + 1, worker, Op::Acquire, Kind::Ok, fence, token));
    }

    fn settings() -> Settings {
        Settings {
            ttl_ns: 100 * MS,
            grant_delay_ns: 0,
            slack_ns: 100 * MS,
            durable: true,
            run_end: 10_000 * MS,
            mixed: BTreeMap::new(),
        }
    }

    fn checkers(history: &[Event], faults: &[Fault], state: &State) -> Vec<&'static str> {
        check(history, faults, state, &settings()).violations.iter().map(|v| v.checker).collect()
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "a");
        history.push(event(5, 1, Op::RedisWrite, Kind::Invoke, 10, ""));
        history.push(event(6, 1, Op::RedisWrite, Kind::Ok, 10, "10:1:1:1"));
        history.push(event(7, 1, Op::Release, Kind::Invoke, 10, ""));
        history.push(event(8, 1, Op::Release, Kind::Ok, 10, ""));
        grant(&mut history, 9, 2, 11, "b");
        let mut state = State::default();
        state.redis.insert("r".into(), vec![Accepted { fence: 10, worker: 1, seq: 1, value: 1 }]);
        let report = check(&history, &[], &state, &settings());
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.grants, 2);
    }

    #[test]
    fn a_fence_granted_twice_or_out_of_order_is_a_violation() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "a");
        grant(&mut history, 150, 2, 10, "b");
        assert_eq!(checkers(&history, &[], &State::default()), ["unique-fences", "fence-order"]);
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "a");
        grant(&mut history, 150, 2, 9, "b");
        assert_eq!(checkers(&history, &[], &State::default()), ["fence-order"]);
    }

    #[test]
    fn grants_that_ran_concurrently_may_come_in_any_fence_order() {
        let history = vec![
            event(0, 1, Op::Acquire, Kind::Invoke, 0, ""),
            event(1, 2, Op::Acquire, Kind::Invoke, 0, ""),
            event(2, 2, Op::Acquire, Kind::Ok, 20, "b"),
            event(3, 1, Op::Acquire, Kind::Ok, 19, "a"),
        ];
        // (Both live at once would be an overlap; here only the fence order is in question.)
        assert!(!checkers(&history, &[], &State::default()).contains(&"fence-order"));
    }

    #[test]
    fn a_lease_used_after_a_later_grant_is_an_overlap_unless_a_fault_may_have_lost_it() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "a");
        grant(&mut history, 5, 2, 11, "b");
        history.push(event(8, 1, Op::Release, Kind::Invoke, 10, ""));
        history.push(event(9, 1, Op::Release, Kind::Ok, 10, ""));
        // Granted within a's lease, before a released: also a forgotten grant.
        assert_eq!(checkers(&history, &[], &State::default()), ["no-overlap", "grants-kept"]);
        let crash =
            Fault { kind: "kill-primary", start: 2 * MS, end: 3 * MS, may_lose_leases: true };
        let report = check(&history, &[crash], &State::default(), &settings());
        assert!(report.violations.is_empty());
        assert_eq!(report.excused.len(), 2);
    }

    #[test]
    fn an_overlap_with_a_waiter_queued_before_the_grant_completed_is_caught() {
        let history = vec![
            event(0, 1, Op::Acquire, Kind::Invoke, 0, ""),
            event(1, 2, Op::Acquire, Kind::Invoke, 0, ""),
            event(2, 1, Op::Acquire, Kind::Ok, 10, "a"),
            event(20, 2, Op::Acquire, Kind::Ok, 11, "b"),
            event(30, 1, Op::RedisWrite, Kind::Invoke, 10, ""),
            event(31, 1, Op::RedisWrite, Kind::Ok, 10, "10:1:1:1"),
        ];
        let mut state = State::default();
        state.redis.insert("r".into(), vec![Accepted { fence: 10, worker: 1, seq: 1, value: 1 }]);
        assert_eq!(checkers(&history, &[], &state), ["no-overlap", "grants-kept"]);
    }

    #[test]
    fn a_grant_forgotten_by_the_server_is_a_violation_but_a_released_one_is_not() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "a");
        grant(&mut history, 20, 2, 11, "b"); // within a's 100 ms lease, a never released
        assert_eq!(checkers(&history, &[], &State::default()), ["grants-kept"]);
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "a");
        history.push(event(10, 1, Op::Release, Kind::Invoke, 10, ""));
        grant(&mut history, 20, 2, 11, "b");
        assert!(checkers(&history, &[], &State::default()).is_empty());
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "a");
        grant(&mut history, 150, 2, 11, "b"); // after a's lease ran out
        assert!(checkers(&history, &[], &State::default()).is_empty());
    }

    #[test]
    fn a_write_accepted_with_a_superseded_fence_is_a_violation_and_lost_updates_are_counted() {
        let mut state = State::default();
        state.sql.insert(
            "r".into(),
            vec![
                Accepted { fence: 10, worker: 1, seq: 1, value: 1 },
                Accepted { fence: 12, worker: 2, seq: 1, value: 2 },
                Accepted { fence: 11, worker: 1, seq: 2, value: 2 },
            ],
        );
        let report = check(&[], &[], &state, &settings());
        assert_eq!(report.violations.len(), 1);
        assert_eq!(report.violations[0].checker, "state-order");
        assert_eq!(report.lost_updates, 1);
    }

    #[test]
    fn an_acknowledged_fenced_write_missing_from_a_durable_register_is_a_violation() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "a");
        history.push(event(5, 1, Op::RedisWrite, Kind::Invoke, 10, ""));
        history.push(event(6, 1, Op::RedisWrite, Kind::Ok, 10, "10:1:1:1"));
        assert_eq!(checkers(&history, &[], &State::default()), ["durability"]);
    }

    #[test]
    fn no_grant_after_a_healed_fault_is_a_liveness_violation() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "a");
        let fault =
            Fault { kind: "partition", start: 10 * MS, end: 20 * MS, may_lose_leases: false };
        assert_eq!(
            checkers(&history, std::slice::from_ref(&fault), &State::default()),
            ["liveness"]
        );
        grant(&mut history, 150, 2, 11, "b");
        assert!(checkers(&history, &[fault], &State::default()).is_empty());
    }

    #[test]
    fn a_killed_workers_open_invoke_ends_unknown() {
        let history = vec![
            event(0, 1, Op::Acquire, Kind::Invoke, 0, ""),
            event(5, 1, Op::Acquire, Kind::Invoke, 0, ""),
            event(6, 1, Op::Acquire, Kind::Ok, 3, "t"),
        ];
        let ops = operations(&history);
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0].outcome, Kind::Unknown);
        assert_eq!(ops[1].outcome, Kind::Ok);
    }
}
