//! Checkers of the line on the mixed workers' resources: tickets that kept refreshing are served
//! first in, first out, and nobody passes them; an abandoned grant (a waiter that never read its
//! reply, a ticket that stopped refreshing) lives no longer than its claim window; a ticket no
//! longer refreshed leaves the line; and what the observer read on the primary itself (the
//! holders of each resource and its line) never shows a writer beside anyone, more permits than
//! the limit, or a line that stands still with nobody holding the resource.

use std::collections::{BTreeMap, HashMap};

use crate::check::{Fault, Finding, Operation, RESTARTS, Report, Settings, field, token_of};
use crate::history::{Kind, Op};
use crate::info::Sample;

/// Rounding of the times the server counts in (a ticket's life, a claim window).
const TOLERANCE_NS: u64 = 20_000_000;
/// How long a line may stand with nobody holding the resource (the hand-over is immediate; the
/// rest is the observer's own delay and the expiry timer under load).
const STUCK_NS: u64 = 750_000_000;
/// Two readings further apart than this do not show that the state lasted between them.
const READINGS_APART_NS: u64 = 250_000_000;

/// What the checkers of the line saw.
#[derive(Debug, Default)]
pub struct LineReport {
    /// Readings of `DLOCK.INFO` by the observer.
    pub samples: usize,
    /// Waiters abandoned (sent, never read), and those seen in line behind the worker's lease.
    pub abandoned: usize,
    pub abandoned_queued: usize,
    /// Abandoned grants the observer saw holding the resource.
    pub abandoned_held: usize,
    /// Tickets that stopped refreshing, and those the observer saw granted afterwards.
    pub stopped: usize,
    pub stopped_held: usize,
    /// The longest an abandoned grant was seen holding, and its claim window (ms).
    pub longest_abandoned: (u64, u64),
    /// Tickets that kept refreshing until granted (their line order checked).
    pub tickets_kept: usize,
    /// Pairs of a ticket and a later request checked for first in, first out.
    pub fifo_pairs: usize,
    /// Per semaphore, the most permits the observer saw live at once.
    pub most_permits_seen: BTreeMap<String, usize>,
    /// The most readers the observer saw live at once.
    pub most_readers_seen: usize,
}

/// A reading of the observer: when it was invoked and completed, and what it showed.
struct Reading<'a> {
    at: &'a Operation,
    sample: Sample,
}

pub fn check(
    operations: &[Operation],
    grants: &[&Operation],
    samples: &[Operation],
    faults: &[Fault],
    settings: &Settings,
    report: &mut Report,
) {
    let mut readings: BTreeMap<&str, Vec<Reading>> = BTreeMap::new();
    for at in samples.iter().filter(|o| o.op == Op::Observe && o.outcome == Kind::Ok) {
        if let Some(sample) = Sample::decode(&at.detail) {
            readings.entry(&at.resource).or_default().push(Reading { at, sample });
        }
    }
    for list in readings.values_mut() {
        list.sort_by_key(|r| r.at.invoked);
    }
    report.lines.samples = readings.values().map(Vec::len).sum();
    claim_windows(operations, &readings, settings, report);
    fifo(operations, grants, faults, settings, report);
    readings_hold(&readings, faults, settings, report);
}

/// The last refresh the server answered of a ticket that stopped: `None` when a later one's
/// outcome is unknown (it may still arrive and refresh the ticket).
fn last_refresh<'a>(
    operations: &'a [Operation],
    stop: &Operation,
    token: &str,
) -> Option<&'a Operation> {
    let mine = operations.iter().filter(|o| {
        o.op == Op::Queue
            && o.worker == stop.worker
            && o.resource == stop.resource
            && o.invoked < stop.invoked
            && token_of(&o.request) == token
    });
    let mut last = None;
    for o in mine {
        match o.outcome {
            Kind::Unknown => return None,
            Kind::Fail if o.detail == "queued" => last = Some(o),
            _ => {}
        }
    }
    last
}

/// Abandoned grants live no longer than their claim windows (the observer's readings of them);
/// a stopped ticket leaves the line within its life.
fn claim_windows(
    operations: &[Operation],
    readings: &BTreeMap<&str, Vec<Reading>>,
    settings: &Settings,
    report: &mut Report,
) {
    let ms = |name: &str, detail: &str| field(detail, name).and_then(|v| v.parse::<u64>().ok());
    for abandon in operations.iter().filter(|o| o.op == Op::Abandon) {
        let token = token_of(&abandon.detail);
        let stopped = abandon.detail.ends_with(" stopped") || abandon.detail.ends_with(" gave-up");
        let (window_ms, refreshed) = if stopped {
            report.lines.stopped += 1;
            let Some(ticket) = ms("ticket", &abandon.detail) else { continue };
            let Some(refresh) = last_refresh(operations, abandon, token) else { continue };
            (ticket.min(settings.ttl_ns / 1_000_000), Some((refresh, ticket)))
        } else {
            report.lines.abandoned += 1;
            if abandon.outcome != Kind::Ok || !abandon.detail.ends_with(" queued") {
                continue;
            }
            report.lines.abandoned_queued += 1;
            let (Some(claim), Some(ttl)) =
                (ms("claim", &abandon.detail), ms("ttl", &abandon.detail))
            else {
                continue;
            };
            (claim.min(ttl), None)
        };
        let list = readings.get(abandon.resource.as_str()).map_or(&[][..], Vec::as_slice);
        // Each grant of the token on its own: a ticket whose turn lapsed unclaimed (its worker
        // was stopped) and that a late refresh put back in line is granted again, anew.
        let mut grants: BTreeMap<u64, Vec<(&Reading, u64)>> = BTreeMap::new();
        for r in list {
            if let Some(holder) = r.sample.holders.iter().find(|h| h.token == token) {
                grants.entry(holder.fence).or_default().push((r, holder.ttl_ms));
            }
        }
        if !grants.is_empty() {
            if stopped {
                report.lines.stopped_held += 1;
            } else {
                report.lines.abandoned_held += 1;
            }
        }
        for (fence, held) in &grants {
            let (Some((first, _)), Some((last, _))) = (held.first(), held.last()) else { continue };
            // Live at both readings: at least this long.
            let span = last.at.invoked.saturating_sub(first.at.completed);
            if !stopped && span / 1_000_000 > report.lines.longest_abandoned.0 {
                report.lines.longest_abandoned = (span / 1_000_000, window_ms);
            }
            let most_left = held.iter().map(|(_, ttl)| *ttl).max().unwrap_or_default();
            if most_left > window_ms + 1 || span > window_ms * 1_000_000 + TOLERANCE_NS {
                report.violations.push(Finding {
                    checker: "claim-window",
                    message: format!(
                        "the grant of {token} (fence {fence}), never claimed, held the resource for at least {} ms with up to {most_left} ms left; its claim window is {window_ms} ms",
                        span / 1_000_000
                    ),
                    resource: abandon.resource.clone(),
                    from: first.at.invoked.min(abandon.invoked),
                    to: last.at.completed,
                });
            }
        }
        if let Some((refresh, ticket)) = refreshed {
            let lapsed_by = refresh.completed.saturating_add(ticket * 1_000_000 + TOLERANCE_NS);
            let late = list
                .iter()
                .find(|r| r.at.invoked > lapsed_by && r.sample.next.iter().any(|t| t == token));
            if let Some(late) = late {
                report.violations.push(Finding {
                    checker: "ticket-lapse",
                    message: format!(
                        "ticket {token} ({ticket} ms) still in line {} ms after its last refresh",
                        late.at.invoked.saturating_sub(refresh.completed) / 1_000_000
                    ),
                    resource: abandon.resource.clone(),
                    from: refresh.invoked,
                    to: late.at.completed,
                });
            }
        }
    }
}

/// A ticket that kept refreshing: in line from `placed` at least until `in_line_until`, and
/// perhaps granted at its end.
struct Kept<'a> {
    worker: u32,
    resource: &'a str,
    token: &'a str,
    /// The first refresh answered nil: the ticket stood in line by its completion.
    placed: u64,
    /// The invoke of the last refresh in the chain answered nil: still in line then.
    in_line_until: u64,
    /// The re-send that answered the fence, when the chain ends with the ticket's turn.
    granted: Option<&'a Operation>,
}

/// Faults after which a line is gone (tickets are neither persisted nor replicated).
fn clears_lines(fault: &Fault) -> bool {
    RESTARTS.contains(&fault.kind)
}

/// Every ticket's chain of refreshes, each answered before the previous one's place could have
/// lapsed (its invoke plus the ticket's life), with no fault that clears lines in between. Its
/// claim window is its life: kept refreshing, it was claimed in time too.
fn kept_tickets<'a>(operations: &'a [Operation], faults: &[Fault]) -> Vec<Kept<'a>> {
    let mut tickets: HashMap<(u32, &str, &str), Vec<&Operation>> = HashMap::new();
    for o in operations.iter().filter(|o| o.op == Op::Queue) {
        tickets.entry((o.worker, &o.resource, token_of(&o.request))).or_default().push(o);
    }
    let mut kept = Vec::new();
    for ((worker, resource, token), mut sends) in tickets {
        // A set's ticket keeps its places by another rule (it may rejoin every line at the
        // back): its line order is the property test's (`core::sets_tests`), not this one's.
        if token.starts_with("s-") {
            continue;
        }
        sends.sort_by_key(|o| o.invoked);
        let answered: Vec<&Operation> = sends
            .into_iter()
            .filter(|o| o.outcome == Kind::Ok || (o.outcome == Kind::Fail && o.detail == "queued"))
            .collect();
        let Some(&first) = answered.first() else { continue };
        let Some(life) = field(&first.request, "ticket").and_then(|v| v.parse::<u64>().ok()) else {
            continue;
        };
        if first.outcome == Kind::Ok {
            continue; // granted at once: never in line
        }
        let mut chain = Kept {
            worker,
            resource,
            token,
            placed: first.completed,
            in_line_until: first.invoked,
            granted: None,
        };
        for pair in answered.windows(2) {
            let (previous, next) = (pair[0], pair[1]);
            let in_time = next.completed + TOLERANCE_NS < previous.invoked + life * 1_000_000;
            let cleared = faults
                .iter()
                .any(|f| clears_lines(f) && f.start <= next.completed && f.end >= first.invoked);
            if !in_time || cleared {
                break;
            }
            if next.outcome == Kind::Ok {
                chain.granted = Some(next);
                break;
            }
            chain.in_line_until = next.invoked;
        }
        kept.push(chain);
    }
    kept
}

/// When the server may have made `grant` at the earliest: when its request was sent, or for a
/// ticket, when the refresh before it answered that it was still in line.
fn granted_after(grant: &Operation, operations: &[Operation]) -> u64 {
    if grant.op != Op::Queue {
        return grant.invoked;
    }
    let token = token_of(&grant.request);
    operations
        .iter()
        .filter(|o| {
            o.op == Op::Queue
                && o.worker == grant.worker
                && o.resource == grant.resource
                && o.outcome == Kind::Fail
                && o.detail == "queued"
                && o.completed <= grant.invoked
                && token_of(&o.request) == token
        })
        .map(|o| o.completed)
        .max()
        .unwrap_or(grant.requested)
}

/// Nobody requested after a ticket took its place is granted while the ticket still stands in
/// line, nor before the ticket's own turn.
fn fifo(
    operations: &[Operation],
    grants: &[&Operation],
    faults: &[Fault],
    settings: &Settings,
    report: &mut Report,
) {
    let mut by_resource: HashMap<&str, Vec<&Operation>> = HashMap::new();
    for &grant in grants.iter().filter(|g| settings.mixed.contains_key(&g.resource)) {
        by_resource.entry(&grant.resource).or_default().push(grant);
    }
    let mut kept = kept_tickets(operations, faults);
    kept.sort_by_key(|k| (k.placed, k.worker));
    for ticket in &kept {
        report.lines.tickets_kept += usize::from(ticket.granted.is_some());
        let own = ticket.granted;
        let later =
            by_resource.get(ticket.resource).into_iter().flatten().filter(|g| {
                g.requested > ticket.placed && own.is_none_or(|own| g.fence != own.fence)
            });
        for grant in later {
            let passed_in_line = grant.completed < ticket.in_line_until;
            // A smaller fence is an earlier grant, unless it surely came after the ticket's own
            // was answered (fences that fell, with a clock stepped back across a restart without
            // persistence: the fence checkers' finding, not this one's).
            let served_first = own.is_some_and(|own| {
                grant.fence < own.fence && granted_after(grant, operations) < own.completed
            });
            if grant.completed < ticket.in_line_until || ticket.granted.is_some() {
                report.lines.fifo_pairs += 1;
            }
            if !passed_in_line && !served_first {
                continue;
            }
            let how =
                if passed_in_line { "while it still stood in line" } else { "before its turn" };
            report.violations.push(Finding {
                checker: "ticket-fifo",
                message: format!(
                    "fence {} ({}, worker {}), requested after ticket {} (worker {}) took its place, was granted {how}",
                    grant.fence,
                    token_of(&grant.detail),
                    grant.worker,
                    ticket.token,
                    ticket.worker
                ),
                resource: ticket.resource.to_owned(),
                from: ticket.placed,
                to: grant.completed.max(ticket.granted.map_or(0, |g| g.completed)),
            });
        }
    }
}

/// What the observer read: never an exclusive lease (or a writer's) beside another lease, never
/// more permits than the limit, and never a line standing for long with no lease live, except
/// around a restart, a promotion or a write pause (the grant delay holds new grants back).
fn readings_hold(
    readings: &BTreeMap<&str, Vec<Reading>>,
    faults: &[Fault],
    settings: &Settings,
    report: &mut Report,
) {
    for (&resource, list) in readings {
        let limit = settings.mixed.get(resource).copied().flatten();
        let mut bad_mode = None;
        let mut too_many = None;
        for reading in list {
            let sample = &reading.sample;
            let live = sample.holders.len().max(sample.live as usize);
            let writer = sample
                .holders
                .iter()
                .any(|h| h.token.starts_with("w-") || h.token.starts_with("s-"));
            if live > 1 && (sample.exclusive == Some(true) || writer) && bad_mode.is_none() {
                bad_mode = Some(reading);
            }
            match limit {
                Some(n) => {
                    let most =
                        report.lines.most_permits_seen.entry(resource.to_owned()).or_default();
                    *most = (*most).max(live);
                    if live > n as usize && too_many.is_none() {
                        too_many = Some(reading);
                    }
                }
                None if sample.exclusive == Some(false) => {
                    report.lines.most_readers_seen = report.lines.most_readers_seen.max(live);
                }
                None => {}
            }
        }
        if let Some(reading) = bad_mode {
            report.violations.push(Finding {
                checker: "writer-overlap",
                message: format!(
                    "the primary showed a writer beside others: {}",
                    reading.sample.encode()
                ),
                resource: resource.to_owned(),
                from: reading.at.invoked,
                to: reading.at.completed,
            });
        }
        if let Some(reading) = too_many {
            report.violations.push(Finding {
                checker: "permit-limit",
                message: format!(
                    "the primary showed more than {} permits live: {}",
                    limit.unwrap_or_default(),
                    reading.sample.encode()
                ),
                resource: resource.to_owned(),
                from: reading.at.invoked,
                to: reading.at.completed,
            });
        }
        stuck_lines(resource, list, readings, faults, settings, report);
    }
}

/// Whether the set whose ticket heads the line of `resource` in reading `r` waits for another
/// of its members: the last reading of that member shows a lease live or another request at
/// the head of its line (a set's ticket at the head keeps the member for its set until every
/// member is free for it). No reading of the member: taken as waiting.
fn set_waits_elsewhere(
    resource: &str,
    r: &Reading,
    readings: &BTreeMap<&str, Vec<Reading>>,
) -> bool {
    let Some(head) = r.sample.next.first() else { return false };
    let Some(members) = crate::mirror_check::set_members(head) else { return false };
    members.iter().filter(|member| member.as_str() != resource).any(|member| {
        let last = readings
            .get(member.as_str())
            .and_then(|list| list.iter().rev().find(|o| o.at.invoked <= r.at.completed));
        last.is_none_or(|o| {
            !o.sample.holders.is_empty() || o.sample.live > 0 || o.sample.next.first() != Some(head)
        })
    })
}

/// Runs of readings, each soon after the last, that show requests in line and no lease live
/// (a set's ticket at the head waiting for another member is not a stand).
fn stuck_lines(
    resource: &str,
    list: &[Reading],
    readings: &BTreeMap<&str, Vec<Reading>>,
    faults: &[Fault],
    settings: &Settings,
    report: &mut Report,
) {
    let stuck = |r: &Reading| {
        r.sample.holders.is_empty()
            && r.sample.live == 0
            && r.sample.waiters + r.sample.tickets > 0
            && !set_waits_elsewhere(resource, r, readings)
    };
    let excused = |from: u64, to: u64| {
        faults.iter().any(|f| {
            (RESTARTS.contains(&f.kind) || f.kind == "pause-writes")
                && f.start <= to
                && f.end.saturating_add(settings.grant_delay_ns + settings.slack_ns) >= from
        })
    };
    let mut run: Option<(&Reading, &Reading)> = None;
    let mut previous: Option<&Reading> = None;
    for reading in list {
        let soon =
            previous.is_some_and(|p| reading.at.invoked < p.at.completed + READINGS_APART_NS);
        run = match (run, stuck(reading)) {
            (Some((first, _)), true) if soon => Some((first, reading)),
            (_, true) => Some((reading, reading)),
            (_, false) => None,
        };
        previous = Some(reading);
        let Some((first, last)) = run else { continue };
        let stood = last.at.invoked.saturating_sub(first.at.completed);
        if stood > STUCK_NS && !excused(first.at.invoked, last.at.completed) {
            report.violations.push(Finding {
                checker: "line-stuck",
                message: format!(
                    "requests stood in line for {} ms with no lease live: {}",
                    stood / 1_000_000,
                    last.sample.encode()
                ),
                resource: resource.to_owned(),
                from: first.at.invoked,
                to: last.at.completed,
            });
            run = None; // one finding per stand
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::check::{State, check};
    use crate::history::Event;
    use crate::info::Holder;
    use crate::observer::OBSERVER;

    const MS: u64 = 1_000_000;

    fn event(at: u64, worker: u32, op: Op, kind: Kind, fence: u64, detail: &str) -> Event {
        Event { at: at * MS, worker, op, kind, resource: "m".into(), fence, detail: detail.into() }
    }

    fn settings() -> Settings {
        Settings {
            ttl_ns: 1_000 * MS,
            grant_delay_ns: 0,
            slack_ns: 100 * MS,
            durable: false,
            run_end: 100_000 * MS,
            mixed: BTreeMap::from([("m".to_owned(), Some(2))]),
        }
    }

    fn checkers(history: &[Event]) -> Vec<&'static str> {
        let report = check(history, &[], &State::default(), &settings());
        report.violations.iter().map(|v| v.checker).collect()
    }

    /// A ticket of `token` sent at each of `sends` (ms), answered nil 1 ms later, and granted
    /// `fence` at `granted`.
    fn ticket(
        history: &mut Vec<Event>,
        worker: u32,
        token: &str,
        sends: &[u64],
        granted: Option<(u64, u64)>,
    ) {
        let request = format!("{token} ticket=300");
        for &at in sends {
            history.push(event(at, worker, Op::Queue, Kind::Invoke, 0, &request));
            history.push(event(at + 1, worker, Op::Queue, Kind::Fail, 0, "queued"));
        }
        if let Some((at, fence)) = granted {
            history.push(event(at, worker, Op::Queue, Kind::Invoke, 0, &request));
            history.push(event(at + 1, worker, Op::Queue, Kind::Ok, fence, token));
        }
    }

    fn reading(history: &mut Vec<Event>, at: u64, sample: &Sample) {
        history.push(event(at, OBSERVER, Op::Observe, Kind::Invoke, 0, ""));
        history.push(event(at + 1, OBSERVER, Op::Observe, Kind::Ok, 0, &sample.encode()));
    }

    fn holding(token: &str, ttl_ms: u64) -> Sample {
        let holder = Holder { token: token.into(), fence: 5, ttl_ms };
        Sample { holders: vec![holder], exclusive: Some(false), live: 1, ..Sample::default() }
    }

    #[test]
    fn tickets_served_in_order_are_clean_and_one_passed_is_caught() {
        let mut history = Vec::new();
        ticket(&mut history, 1, "p-1", &[0, 100], Some((200, 10)));
        ticket(&mut history, 2, "p-2", &[10, 110, 210], Some((310, 11)));
        assert!(checkers(&history).is_empty());
        let mut history = Vec::new();
        ticket(&mut history, 1, "p-1", &[0, 100], Some((200, 11)));
        ticket(&mut history, 2, "p-2", &[10, 110], Some((150, 10)));
        assert_eq!(checkers(&history), ["ticket-fifo"]);
    }

    #[test]
    fn a_smaller_fence_granted_surely_after_a_tickets_own_grant_is_no_ticket_served_first() {
        // Fences fell (a clock stepped back across a restart without persistence): p-2 was still
        // in line at 211, after p-1's grant was answered, yet got a smaller fence.
        let mut history = Vec::new();
        ticket(&mut history, 1, "p-1", &[0, 100], Some((200, 11)));
        ticket(&mut history, 2, "p-2", &[10, 110, 210], Some((310, 10)));
        assert!(checkers(&history).is_empty());
        // Still in line only until 111: it may have been granted before p-1, and was.
        let mut history = Vec::new();
        ticket(&mut history, 1, "p-1", &[0, 100], Some((200, 11)));
        ticket(&mut history, 2, "p-2", &[10, 110], Some((310, 10)));
        assert_eq!(checkers(&history), ["ticket-fifo"]);
    }

    #[test]
    fn a_grant_while_a_kept_ticket_stands_in_line_is_caught_unless_it_lapsed_or_a_restart_cleared_it()
     {
        let mut history = Vec::new();
        ticket(&mut history, 1, "p-1", &[0, 100, 200, 300], None);
        history.push(event(50, 2, Op::Acquire, Kind::Invoke, 0, "p-2"));
        history.push(event(51, 2, Op::Acquire, Kind::Ok, 10, "p-2"));
        assert_eq!(checkers(&history), ["ticket-fifo"]);
        let restart =
            Fault { kind: "kill-primary", start: 20 * MS, end: 30 * MS, may_lose_leases: false };
        let report = check(&history, &[restart], &State::default(), &settings());
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        // Refreshed too late (the 300 ms life ran out): no longer surely in line.
        let mut history = Vec::new();
        ticket(&mut history, 1, "p-1", &[0, 400], None);
        history.push(event(50, 2, Op::Acquire, Kind::Invoke, 0, "p-2"));
        history.push(event(51, 2, Op::Acquire, Kind::Ok, 10, "p-2"));
        assert!(checkers(&history).is_empty());
    }

    #[test]
    fn a_retry_that_learns_of_an_earlier_attempts_grant_counts_as_requested_by_that_attempt() {
        let mut history = Vec::new();
        // p-2's first attempt (granted, its reply lost) came before p-1 took its place.
        history.push(event(0, 2, Op::Acquire, Kind::Invoke, 0, "p-2"));
        history.push(event(4, 2, Op::Acquire, Kind::Unknown, 0, "timed out"));
        ticket(&mut history, 1, "p-1", &[5, 100, 200], None);
        history.push(event(50, 2, Op::Acquire, Kind::Invoke, 0, "p-2"));
        history.push(event(51, 2, Op::Acquire, Kind::Ok, 10, "p-2"));
        assert!(checkers(&history).is_empty());
    }

    #[test]
    fn an_abandoned_grant_seen_past_its_claim_window_is_caught() {
        let detail = "a-1 claim=200 ttl=1000";
        let mut history = vec![
            event(0, 1, Op::Abandon, Kind::Invoke, 0, detail),
            event(1, 1, Op::Abandon, Kind::Ok, 0, &format!("{detail} queued")),
        ];
        reading(&mut history, 10, &holding("a-1", 200));
        reading(&mut history, 150, &holding("a-1", 60));
        assert!(checkers(&history).is_empty());
        reading(&mut history, 400, &holding("a-1", 900));
        assert_eq!(checkers(&history), ["claim-window"]);
    }

    #[test]
    fn a_stopped_tickets_two_grants_are_each_held_to_the_window() {
        let mut history = Vec::new();
        ticket(&mut history, 1, "p-1", &[0, 100, 1_000], None);
        history.push(event(1_005, 1, Op::Abandon, Kind::Ok, 0, "p-1 ticket=300 stopped"));
        // Its turn came while its worker was stopped, lapsed, and came again after the stop.
        reading(
            &mut history,
            150,
            &Sample {
                holders: vec![Holder { token: "p-1".into(), fence: 5, ttl_ms: 290 }],
                ..holding("p-1", 0)
            },
        );
        reading(
            &mut history,
            400,
            &Sample {
                holders: vec![Holder { token: "p-1".into(), fence: 5, ttl_ms: 40 }],
                ..holding("p-1", 0)
            },
        );
        reading(
            &mut history,
            1_100,
            &Sample {
                holders: vec![Holder { token: "p-1".into(), fence: 9, ttl_ms: 280 }],
                ..holding("p-1", 0)
            },
        );
        assert!(checkers(&history).is_empty());
        reading(
            &mut history,
            1_500,
            &Sample {
                holders: vec![Holder { token: "p-1".into(), fence: 9, ttl_ms: 10 }],
                ..holding("p-1", 0)
            },
        );
        assert_eq!(checkers(&history), ["claim-window"]);
    }

    #[test]
    fn a_stopped_ticket_seen_in_line_past_its_life_is_caught() {
        let mut history = Vec::new();
        ticket(&mut history, 1, "p-1", &[0], None);
        history.push(event(5, 1, Op::Abandon, Kind::Ok, 0, "p-1 ticket=300 stopped"));
        let waiting = Sample { tickets: 1, next: vec!["p-1".into()], ..holding("p-9", 500) };
        reading(&mut history, 200, &waiting);
        assert!(checkers(&history).is_empty());
        reading(&mut history, 400, &waiting);
        assert_eq!(checkers(&history), ["ticket-lapse"]);
    }

    #[test]
    fn the_observer_catches_too_many_permits_and_a_line_standing_still() {
        let mut history = Vec::new();
        let mut three = holding("p-1", 500);
        three.live = 3;
        reading(&mut history, 0, &three);
        assert_eq!(checkers(&history), ["permit-limit"]);
        let mut history = Vec::new();
        let line = Sample { waiters: 1, next: vec!["p-2".into()], ..Sample::default() };
        for at in (0..1_000).step_by(50) {
            reading(&mut history, at, &line);
        }
        assert_eq!(checkers(&history), ["line-stuck"]);
    }

    #[test]
    fn a_set_heading_a_free_line_stands_only_while_another_member_is_not_free_for_it() {
        let set = "s-1-ab-3-0.1";
        let on = |at: u64, resource: &str, sample: &Sample| {
            let mut pair = [
                event(at, OBSERVER, Op::Observe, Kind::Invoke, 0, ""),
                event(at + 1, OBSERVER, Op::Observe, Kind::Ok, 0, &sample.encode()),
            ];
            for e in &mut pair {
                e.resource = resource.into();
            }
            pair
        };
        let headed = Sample { tickets: 1, next: vec![set.into()], ..Sample::default() };
        let settings = Settings {
            mixed: BTreeMap::from([("rw:{0}".to_owned(), None), ("rw:{1}".to_owned(), None)]),
            ..settings()
        };
        let run = |other: &Sample| {
            let mut history = Vec::new();
            for at in (0..1_000).step_by(50) {
                history.extend(on(at, "rw:{0}", &headed));
                history.extend(on(at + 10, "rw:{1}", other));
            }
            let report = check(&history, &[], &State::default(), &settings);
            report.violations.iter().map(|v| v.checker).collect::<Vec<_>>()
        };
        let held = Sample { next: vec![set.into()], tickets: 1, ..holding("w-9", 500) };
        assert!(run(&held).is_empty(), "the set waits for rw:{{1}}'s lease");
        assert_eq!(run(&headed), ["line-stuck", "line-stuck"], "both free for it: stuck");
    }
}
