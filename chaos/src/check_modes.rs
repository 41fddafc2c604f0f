//! Checkers of the mixed workers' leases: readers (`SHARED`), writers (exclusive) and permits
//! (`SHARED LIMIT n`). A writer is never granted while another lease lives, a reader never while
//! a writer lives, a permit never while `n` permits live; and no fence is accepted after its
//! lease must have ended.
//!
//! Whether an earlier lease was live when a later one was granted is decided conservatively,
//! from the history alone, as for exclusive leases: the later grant happened before its
//! acknowledgement completed, and the earlier lease (granted first: its fence is smaller) was
//! live then if the server accepted something under its fence invoked after that, or if its
//! deadline could not have passed yet (counted from the invokes of the requests that set it)
//! and its holder had not begun to give it up. A fault that may lose leases excuses a finding.

use std::collections::{BTreeMap, HashMap};

use crate::check::{Fault, Finding, Operation, Report, Settings, excusing_fault, field, token_of};
use crate::history::{Kind, Op};

/// How much later than its latest possible deadline an accepted request must be invoked to
/// count as a stale fence accepted (rounding of the deadlines the server carries).
const STALE_TOLERANCE_NS: u64 = 20_000_000;

/// What the checkers of modes saw.
#[derive(Debug, Default)]
pub struct ModeReport {
    /// Grants on the mixed resources, by role.
    pub readers: usize,
    pub writers: usize,
    pub permits: usize,
    /// Grants by how they were waited for: answered to a WAIT, a ticket's turn, a plain ACQUIRE.
    pub waits: usize,
    pub tickets: usize,
    /// Tickets' turns taken on their own channel's `granted` message (`NOTIFY`).
    pub told: usize,
    pub plain: usize,
    /// Hand-overs claimed (a RENEW or the same ACQUIRE again answered).
    pub claims: usize,
    /// Fenced uses and renewals the server refused (the lease was over).
    pub refused: usize,
    /// Per semaphore, the most permits the history shows live at one grant.
    pub most_permits: BTreeMap<String, usize>,
    /// The most readers the history shows live at one grant.
    pub most_readers: usize,
}

/// What a holder is, as the first letter of its token says (a set's member, `s-…`, is held as
/// a writer's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Reader,
    Writer,
    Permit,
}

pub fn role_of(token: &str) -> Option<Role> {
    match token.as_bytes().first() {
        Some(b'r') => Some(Role::Reader),
        Some(b'w' | b's') => Some(Role::Writer),
        Some(b'p') => Some(Role::Permit),
        _ => None,
    }
}

/// One grant on a mixed resource and what the history says of its lease.
struct Lease<'a> {
    grant: &'a Operation,
    role: Role,
    /// The request accepted under this fence, after the grant, invoked last: the lease was live
    /// when it ran.
    confirmed: Option<&'a Operation>,
    /// Without a fault that loses leases, the server's deadline is no earlier than this.
    lives_until: u64,
    /// When its holder may first have ended it: the first release or loss invoked.
    given_up: u64,
    /// Every operation under its fence after the grant, in invoke order.
    after: Vec<&'a Operation>,
}

impl Lease<'_> {
    /// Whether the lease was certainly live at server time `at`, when a grant with a larger
    /// fence was made.
    fn live_at(&self, at: u64) -> bool {
        self.confirmed.is_some_and(|c| c.invoked > at)
            || (self.lives_until > at && self.given_up >= at)
    }

    /// The fault that may have lost this lease before `at`, if any.
    fn excuse<'f>(&self, faults: &'f [Fault], at: u64) -> Option<&'f Fault> {
        let until = self.confirmed.map_or(at, |c| c.invoked.max(at));
        excusing_fault(faults, self.grant.requested, until)
    }
}

/// Whether the server accepted `o` under its fence: the lease was live when it ran.
fn accepted(o: &Operation) -> bool {
    o.outcome == Kind::Ok
        && matches!(
            o.op,
            Op::Use | Op::RedisWrite | Op::Renew | Op::Release | Op::Acquire | Op::Queue
        )
}

/// Whether `o` (whatever its outcome) asked the server to move the lease's deadline.
fn extends(o: &Operation) -> bool {
    matches!(o.op, Op::Renew | Op::Acquire | Op::Queue)
}

fn leases<'a>(
    operations: &'a [Operation],
    grants: &[&'a Operation],
    settings: &Settings,
) -> BTreeMap<&'a str, Vec<Lease<'a>>> {
    let mut by_fence: HashMap<(&str, u64), Vec<&Operation>> = HashMap::new();
    for o in operations.iter().filter(|o| o.fence > 0 && settings.mixed.contains_key(&o.resource)) {
        by_fence.entry((&o.resource, o.fence)).or_default().push(o);
    }
    let mut leases: BTreeMap<&str, Vec<Lease>> = BTreeMap::new();
    for &grant in grants.iter().filter(|g| settings.mixed.contains_key(&g.resource)) {
        let Some(role) = role_of(&grant.detail) else { continue };
        // A hand-over answered to a WAIT first runs only its claim window.
        let first = match field(&grant.request, "claim").and_then(|c| c.parse::<u64>().ok()) {
            Some(claim) if grant.op == Op::Acquire => settings.ttl_ns.min(claim * 1_000_000),
            _ => settings.ttl_ns,
        };
        let mut lease = Lease {
            grant,
            role,
            confirmed: None,
            lives_until: grant.invoked.saturating_add(first),
            given_up: u64::MAX,
            after: Vec::new(),
        };
        let same = |o: &Operation| o.worker == grant.worker && o.invoked == grant.invoked;
        for &o in by_fence.get(&(grant.resource.as_str(), grant.fence)).into_iter().flatten() {
            if same(o) || o.invoked < grant.invoked {
                continue;
            }
            lease.after.push(o);
            if matches!(o.op, Op::Release | Op::Lost) {
                lease.given_up = lease.given_up.min(o.invoked);
            }
            if accepted(o) {
                if lease.confirmed.is_none_or(|c| o.invoked > c.invoked) {
                    lease.confirmed = Some(o);
                }
                if extends(o) {
                    lease.lives_until =
                        lease.lives_until.max(o.invoked.saturating_add(settings.ttl_ns));
                }
            }
        }
        lease.after.sort_by_key(|o| o.invoked);
        leases.entry(&grant.resource).or_default().push(lease);
    }
    for list in leases.values_mut() {
        list.sort_by_key(|lease| lease.grant.fence);
    }
    leases
}

/// Runs the checkers of modes and counts what they saw.
pub fn check(
    operations: &[Operation],
    grants: &[&Operation],
    faults: &[Fault],
    settings: &Settings,
    report: &mut Report,
) {
    let leases = leases(operations, grants, settings);
    count(operations, &leases, report);
    exclusion(&leases, faults, settings, report);
    stale_fences(operations, &leases, settings, report);
}

fn count(operations: &[Operation], leases: &BTreeMap<&str, Vec<Lease>>, report: &mut Report) {
    let modes = &mut report.modes;
    for lease in leases.values().flatten() {
        match lease.role {
            Role::Reader => modes.readers += 1,
            Role::Writer => modes.writers += 1,
            Role::Permit => modes.permits += 1,
        }
        match lease.grant.op {
            Op::Queue => {
                modes.tickets += 1;
                modes.told += usize::from(field(&lease.grant.request, "told").is_some());
            }
            _ if field(&lease.grant.request, "wait").is_some() => modes.waits += 1,
            _ => modes.plain += 1,
        }
        let claimed = lease.after.iter().any(|o| {
            o.outcome == Kind::Ok
                && ((o.op == Op::Renew && o.detail == "claimed")
                    || (o.op == Op::Acquire && o.request.ends_with(" claim")))
        });
        modes.claims += usize::from(claimed);
    }
    modes.refused = operations
        .iter()
        .filter(|o| {
            o.outcome == Kind::Fail
                && ((matches!(o.op, Op::Use | Op::RedisWrite) && o.detail.contains("STALE"))
                    || (o.op == Op::Renew && o.detail == "not held"))
        })
        .count();
}

fn describe(lease: &Lease) -> String {
    let role = match lease.role {
        Role::Reader => "reader",
        Role::Writer => "writer",
        Role::Permit => "permit",
    };
    format!("{role} fence {} (worker {})", lease.grant.fence, lease.grant.worker)
}

/// At each grant, the earlier leases certainly live: a writer beside anyone, a reader beside a
/// writer, or a permit beside `n` permits is a violation.
fn exclusion(
    leases: &BTreeMap<&str, Vec<Lease>>,
    faults: &[Fault],
    settings: &Settings,
    report: &mut Report,
) {
    for (&resource, list) in leases {
        let limit = settings.mixed.get(resource).copied().flatten();
        for (j, later) in list.iter().enumerate() {
            let at = later.grant.completed;
            let live: Vec<&Lease> = list[..j].iter().filter(|e| e.live_at(at)).collect();
            let (checker, conflicting): (&'static str, Vec<&Lease>) = match later.role {
                Role::Writer => ("writer-overlap", live.clone()),
                Role::Reader => {
                    let readers = 1 + live.iter().filter(|e| e.role == Role::Reader).count();
                    report.modes.most_readers = report.modes.most_readers.max(readers);
                    (
                        "reader-overlap",
                        live.iter().copied().filter(|e| e.role == Role::Writer).collect(),
                    )
                }
                Role::Permit => {
                    let permits: Vec<&Lease> =
                        live.iter().copied().filter(|e| e.role == Role::Permit).collect();
                    let most = report.modes.most_permits.entry(resource.to_owned()).or_default();
                    *most = (*most).max(permits.len() + 1);
                    match limit {
                        Some(n) if permits.len() >= n as usize => ("permit-limit", permits),
                        _ => ("permit-limit", Vec::new()),
                    }
                }
            };
            let Some(first) = conflicting.first() else { continue };
            let others: Vec<String> = conflicting.iter().map(|e| describe(e)).collect();
            let message = match later.role {
                Role::Permit => format!(
                    "{} granted while {} permits (of {}) were live: {}",
                    describe(later),
                    conflicting.len(),
                    limit.unwrap_or_default(),
                    others.join(", ")
                ),
                _ => format!("{} granted while {} was live", describe(later), others.join(", ")),
            };
            let excused = conflicting.iter().any(|e| e.excuse(faults, at).is_some());
            let finding = Finding {
                checker,
                message,
                resource: resource.to_owned(),
                from: first.grant.requested,
                to: first.confirmed.map_or(at, |c| c.completed.max(at)),
            };
            report.file(finding, excused);
        }
    }
}

/// No request under a fence is accepted after the lease's latest possible deadline: the
/// completion of the last request that set it, plus what it asked for. An extension whose
/// outcome stayed unknown (by fence or by token) may have moved the deadline at any later time:
/// the lease is not checked past its invoke.
fn stale_fences(
    operations: &[Operation],
    leases: &BTreeMap<&str, Vec<Lease>>,
    settings: &Settings,
    report: &mut Report,
) {
    let mut unknown_by_token: HashMap<(&str, &str), u64> = HashMap::new();
    for o in operations.iter().filter(|o| extends(o) && o.outcome == Kind::Unknown) {
        let at = unknown_by_token.entry((&o.resource, token_of(&o.request))).or_insert(o.invoked);
        *at = (*at).min(o.invoked);
    }
    for (&resource, list) in leases {
        for lease in list {
            let grant = lease.grant;
            let mut unchecked_from = unknown_by_token
                .get(&(resource, grant.detail.as_str()))
                .copied()
                .unwrap_or(u64::MAX);
            if let Some(o) = lease.after.iter().find(|o| extends(o) && o.outcome == Kind::Unknown) {
                unchecked_from = unchecked_from.min(o.invoked);
            }
            let mut deadline = grant.completed.saturating_add(settings.ttl_ns);
            for &o in &lease.after {
                if o.invoked >= unchecked_from {
                    break;
                }
                if !accepted(o) {
                    continue;
                }
                if o.invoked > deadline.saturating_add(STALE_TOLERANCE_NS) {
                    report.violations.push(Finding {
                        checker: "stale-fence",
                        message: format!(
                            "{} accepted a {:?} {} ms after its lease must have ended",
                            describe(lease),
                            o.op,
                            (o.invoked - deadline) / 1_000_000
                        ),
                        resource: resource.to_owned(),
                        from: grant.requested,
                        to: o.completed,
                    });
                    break;
                }
                if extends(o) {
                    deadline = deadline.max(o.completed.saturating_add(settings.ttl_ns));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::check::{State, check};
    use crate::history::Event;

    const MS: u64 = 1_000_000;

    fn event(at: u64, worker: u32, op: Op, kind: Kind, fence: u64, detail: &str) -> Event {
        Event { at: at * MS, worker, op, kind, resource: "m".into(), fence, detail: detail.into() }
    }

    /// A plain grant of `token` at `at`, acknowledged 1 ms later.
    fn grant(history: &mut Vec<Event>, at: u64, worker: u32, fence: u64, token: &str) {
        history.push(event(at, worker, Op::Acquire, Kind::Invoke, 0, token));
        history.push(event(at + 1, worker, Op::Acquire, Kind::Ok, fence, token));
    }

    fn used(history: &mut Vec<Event>, at: u64, worker: u32, fence: u64) {
        history.push(event(at, worker, Op::Use, Kind::Invoke, fence, ""));
        history.push(event(at + 1, worker, Op::Use, Kind::Ok, fence, ""));
    }

    fn released(history: &mut Vec<Event>, at: u64, worker: u32, fence: u64) {
        history.push(event(at, worker, Op::Release, Kind::Invoke, fence, ""));
        history.push(event(at + 1, worker, Op::Release, Kind::Ok, fence, ""));
    }

    fn settings(limit: Option<u32>) -> Settings {
        Settings {
            ttl_ns: 100 * MS,
            grant_delay_ns: 0,
            slack_ns: 100 * MS,
            durable: false,
            run_end: 10_000 * MS,
            mixed: BTreeMap::from([("m".to_owned(), limit)]),
        }
    }

    fn checkers(history: &[Event], limit: Option<u32>) -> Vec<&'static str> {
        let report = check(history, &[], &State::default(), &settings(limit));
        report.violations.iter().map(|v| v.checker).collect()
    }

    #[test]
    fn readers_share_and_a_writer_after_them_is_clean() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "r-1");
        grant(&mut history, 2, 2, 11, "r-2");
        used(&mut history, 5, 1, 10);
        used(&mut history, 6, 2, 11);
        released(&mut history, 8, 1, 10);
        released(&mut history, 8, 2, 11);
        grant(&mut history, 12, 3, 12, "w-3");
        assert!(checkers(&history, None).is_empty());
    }

    #[test]
    fn a_reader_granted_beside_a_writer_that_still_writes_is_an_overlap() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "w-1");
        released(&mut history, 2, 1, 10); // given up: only the later use shows it lived on
        grant(&mut history, 5, 2, 11, "r-2");
        used(&mut history, 8, 1, 10);
        assert_eq!(checkers(&history, None), ["reader-overlap"]);
    }

    #[test]
    fn a_writer_granted_within_a_readers_unreleased_lease_is_an_overlap_unless_a_fault_lost_it() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "r-1");
        grant(&mut history, 20, 2, 11, "w-2"); // within r-1's 100 ms, never released
        assert_eq!(checkers(&history, None), ["writer-overlap"]);
        let crash =
            Fault { kind: "kill-primary", start: 10 * MS, end: 11 * MS, may_lose_leases: true };
        let report = check(&history, &[crash], &State::default(), &settings(None));
        assert!(report.violations.is_empty());
        assert_eq!(report.excused.len(), 1);
    }

    #[test]
    fn a_permit_beyond_the_limit_is_caught_and_n_permits_are_not() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "p-1");
        grant(&mut history, 2, 2, 11, "p-2");
        assert!(checkers(&history, Some(2)).is_empty());
        grant(&mut history, 4, 3, 12, "p-3");
        assert_eq!(checkers(&history, Some(2)), ["permit-limit"]);
        assert!(checkers(&history, Some(3)).is_empty());
    }

    #[test]
    fn a_wait_grant_lives_only_its_claim_window_until_claimed() {
        let mut history = Vec::new();
        history.push(event(0, 1, Op::Acquire, Kind::Invoke, 0, "w-1 wait=500 claim=30"));
        history.push(event(1, 1, Op::Acquire, Kind::Ok, 10, "w-1"));
        // Unclaimed, it may lapse after 30 ms: a writer at 40 ms is no overlap.
        grant(&mut history, 40, 2, 11, "w-2");
        assert!(checkers(&history, None).is_empty());
        // Claimed at 5 ms, it runs the full ttl: a writer at 40 ms overlaps it.
        history.push(event(5, 1, Op::Renew, Kind::Invoke, 10, "w-1"));
        history.push(event(6, 1, Op::Renew, Kind::Ok, 10, "claimed"));
        assert_eq!(checkers(&history, None), ["writer-overlap"]);
    }

    #[test]
    fn a_fence_accepted_after_its_deadline_is_stale_unless_an_unknown_renewal_may_have_moved_it() {
        let mut history = Vec::new();
        grant(&mut history, 0, 1, 10, "r-1");
        used(&mut history, 300, 1, 10); // ttl 100 ms: over by 200 ms
        assert_eq!(checkers(&history, None), ["stale-fence"]);
        history.push(event(50, 1, Op::Renew, Kind::Invoke, 10, "r-1"));
        history.push(event(51, 1, Op::Renew, Kind::Unknown, 10, "timed out"));
        assert!(checkers(&history, None).is_empty());
    }

    #[test]
    fn a_tickets_grant_counts_as_requested_at_its_first_send() {
        // The ticket was placed at 0 and handed over before its re-send at 30 learned of it; a
        // grant invoked at 10 with a larger fence is no fence-order violation.
        let history = vec![
            event(0, 1, Op::Queue, Kind::Invoke, 0, "r-1 ticket=300"),
            event(1, 1, Op::Queue, Kind::Fail, 0, "queued"),
            event(10, 2, Op::Acquire, Kind::Invoke, 0, "r-2"),
            event(11, 2, Op::Acquire, Kind::Ok, 12, "r-2"),
            event(30, 1, Op::Queue, Kind::Invoke, 0, "r-1 ticket=300"),
            event(31, 1, Op::Queue, Kind::Ok, 11, "r-1"),
        ];
        assert!(!checkers(&history, None).contains(&"fence-order"));
    }
}
