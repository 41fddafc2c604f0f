//! When the module's one timer must fire, as a sans-I/O state machine.
//!
//! Everything the server does at a moment rather than in answer to a command is due through
//! this schedule: lease deadlines and ticket lapses (the expiry index), waiters' time-outs,
//! gone waiters and lost grants to clean up, a sweep that yielded with work left, a look after
//! a write pause, and the propagation of the fence counter. The glue tells it what happened
//! ([`Schedule::fired`], [`Schedule::want_propagation`], …) and, before the event loop sleeps,
//! asks [`Schedule::plan`] whether to (re)arm the one module timer; `timer.rs` performs the
//! answer and is the only place that creates or stops a module timer.
//!
//! Time is passed in (monotonic µs), so wall-clock steps, which hold up Redis's module timers,
//! are tested here with a virtual clock.

use super::Micros;

/// How far past its due (monotonic) the armed timer may be before it is taken for one held up
/// by a step back of the wall clock (Redis runs module timers on it) and replaced by one due at
/// once: well above a busy event loop's turn, well below a lease.
pub const LATE_US: Micros = 20_000;
/// While writes are paused the timer looks again this often, to catch up soon after the pause.
pub const PAUSED_POLL_US: Micros = 10_000;
/// Longest timer period: a far deadline is approached in steps (Redis timers take i64 ms).
pub const MAX_DELAY_MS: u64 = 3_600_000;

/// The earliest moments the sweep has work, as the glue finds them when [`Schedule::plan`]
/// asks (only when something changed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepWork {
    /// The first deadline in the expiry index.
    pub index: Option<Micros>,
    /// The first waiter's time-out.
    pub time_out: Option<Micros>,
    /// Gone waiters or lost grants wait to be cleaned up.
    pub clean_up: bool,
}

/// What to do with the module timer before the event loop sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The armed timer (or none) is right.
    Keep,
    /// Stop the armed timer (`stop`, if any) and arm one `delay_ms` from now; it is recorded as
    /// due at `due` with [`Schedule::armed`].
    Arm {
        /// The armed timer to stop first.
        stop: Option<u64>,
        /// Whole milliseconds from now.
        delay_ms: u64,
        /// The monotonic instant it is for.
        due: Micros,
    },
}

/// What a firing of the timer must do besides the sweep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fired {
    /// Propagate the fence counter now.
    pub propagate: bool,
}

/// The schedule of the one module timer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// The armed module timer: its id and the monotonic instant it is for.
    armed: Option<(u64, Micros)>,
    /// When the fence counter must be propagated.
    propagate_at: Option<Micros>,
    /// Writes were paused when the timer last fired: leases are left alone, and the timer looks
    /// again at this instant.
    paused_until: Option<Micros>,
    /// The sweep yielded with due work left: resume right after this turn's clients.
    backlog: bool,
    /// Something changed since the last plan that may want the timer earlier.
    requested: bool,
}

impl Schedule {
    /// Something may want the timer earlier (an index entry, a waiter, a clean-up): the next
    /// [`Schedule::plan`] looks.
    pub fn request(&mut self) {
        self.requested = true;
    }

    /// The fence counter must be propagated at `at` (or earlier, if already wanted).
    pub fn want_propagation(&mut self, at: Micros) {
        if self.propagate_at.is_none_or(|wanted| at < wanted) {
            self.propagate_at = Some(at);
            self.requested = true;
        }
    }

    /// The timer `id` was armed for `due`, as [`Plan::Arm`] said.
    pub fn armed(&mut self, id: u64, due: Micros) {
        self.armed = Some((id, due));
    }

    /// The armed timer fired at `now`: it is gone, and this is what it must do besides sweeping.
    pub fn fired(&mut self, now: Micros) -> Fired {
        self.armed = None;
        self.paused_until = None;
        self.backlog = false;
        self.requested = true;
        let propagate = self.propagate_at.is_some_and(|at| at <= now);
        if propagate {
            self.propagate_at = None;
        }
        Fired { propagate }
    }

    /// The timer found writes paused at `now`: nothing is expired, handed over or propagated
    /// until a look [`PAUSED_POLL_US`] later (a propagation that was due waits for it too).
    pub fn writes_paused(&mut self, now: Micros, propagation_missed: bool) {
        let again = now.saturating_add(PAUSED_POLL_US);
        self.paused_until = Some(again);
        if propagation_missed {
            self.want_propagation(again);
        }
        self.requested = true;
    }

    /// The sweep stopped at its budget with due entries left.
    pub fn yielded(&mut self) {
        self.backlog = true;
    }

    /// Forgets the armed timer without stopping it (the server dropped it, or a replica keeps
    /// no schedule): returns its id.
    pub fn disarm(&mut self) -> Option<u64> {
        self.armed.take().map(|(id, _)| id)
    }

    /// Before the event loop sleeps at `now`: whether to (re)arm the timer. `work` says where
    /// the sweep's work lies; it is asked only when something changed since the last plan.
    pub fn plan(&mut self, now: Micros, work: impl FnOnce() -> SweepWork) -> Plan {
        let stop = self.armed.map(|(id, _)| id);
        let late = self.armed.is_some_and(|(_, due)| now > due.saturating_add(LATE_US));
        if std::mem::take(&mut self.backlog) || late {
            self.armed = None;
            return Plan::Arm { stop, delay_ms: 0, due: now };
        }
        if !std::mem::take(&mut self.requested) {
            return Plan::Keep;
        }
        let work = work();
        let sweep = match self.paused_until {
            // During a write pause only time-outs are answered (that changes no data).
            Some(again) => earliest(Some(again), work.time_out),
            None => earliest(if work.clean_up { Some(now) } else { work.index }, work.time_out),
        };
        let Some(next) = earliest(sweep, self.propagate_at) else { return Plan::Keep };
        if self.armed.is_some_and(|(_, due)| due <= next) {
            return Plan::Keep;
        }
        let delay_ms = next.saturating_sub(now).div_ceil(1_000).min(MAX_DELAY_MS);
        // It fires at `next` or up to 1 ms after (whole milliseconds), or earlier when the delay
        // was capped. Recording the rounded-up firing time instead made every later want for the
        // same `next` re-arm it. An overdue `next` is due now, not in the past (that would read
        // as a late timer on the next turn).
        let due = now.saturating_add(delay_ms * 1_000).min(next).max(now);
        self.armed = None;
        Plan::Arm { stop, delay_ms, due }
    }
}

fn earliest(a: Option<Micros>, b: Option<Micros>) -> Option<Micros> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Micros = 1_000;

    fn index_at(at: Micros) -> impl FnOnce() -> SweepWork {
        move || SweepWork { index: Some(at), ..SweepWork::default() }
    }

    /// Performs a plan as the glue does, with timer ids counting up.
    fn perform(schedule: &mut Schedule, plan: Plan, next_id: &mut u64) -> Option<u64> {
        match plan {
            Plan::Keep => None,
            Plan::Arm { due, .. } => {
                *next_id += 1;
                schedule.armed(*next_id, due);
                Some(*next_id)
            }
        }
    }

    #[test]
    fn nothing_changed_nothing_armed() {
        let mut schedule = Schedule::default();
        assert_eq!(schedule.plan(0, || panic!("not asked")), Plan::Keep);
    }

    #[test]
    fn a_deadline_arms_the_timer_once_and_an_earlier_one_replaces_it() {
        let mut schedule = Schedule::default();
        schedule.request();
        let plan = schedule.plan(0, index_at(30 * MS));
        assert_eq!(plan, Plan::Arm { stop: None, delay_ms: 30, due: 30 * MS });
        schedule.armed(7, 30 * MS);
        schedule.request();
        assert_eq!(schedule.plan(MS, index_at(30 * MS)), Plan::Keep, "armed early enough");
        schedule.request();
        assert_eq!(schedule.plan(MS, index_at(50 * MS)), Plan::Keep, "a later deadline waits");
        schedule.request();
        assert_eq!(
            schedule.plan(MS, index_at(10 * MS)),
            Plan::Arm { stop: Some(7), delay_ms: 9, due: 10 * MS }
        );
    }

    #[test]
    fn a_fraction_of_a_millisecond_rounds_up_and_is_recorded_as_the_deadline() {
        let mut schedule = Schedule::default();
        schedule.request();
        assert_eq!(
            schedule.plan(0, index_at(2_500)),
            Plan::Arm { stop: None, delay_ms: 3, due: 2_500 }
        );
    }

    #[test]
    fn a_far_deadline_is_approached_in_capped_steps() {
        let mut schedule = Schedule::default();
        schedule.request();
        let far = (MAX_DELAY_MS + 5) * MS;
        let due = MAX_DELAY_MS * MS;
        assert_eq!(
            schedule.plan(0, index_at(far)),
            Plan::Arm { stop: None, delay_ms: MAX_DELAY_MS, due }
        );
    }

    #[test]
    fn clean_up_and_backlog_run_at_once() {
        let mut schedule = Schedule::default();
        schedule.request();
        let work = || SweepWork { index: Some(90 * MS), time_out: None, clean_up: true };
        assert_eq!(schedule.plan(5 * MS, work), Plan::Arm { stop: None, delay_ms: 0, due: 5 * MS });
        schedule.armed(1, 5 * MS);
        schedule.fired(5 * MS);
        schedule.yielded();
        assert_eq!(
            schedule.plan(7 * MS, || panic!("a backlog needs no look")),
            Plan::Arm { stop: None, delay_ms: 0, due: 7 * MS }
        );
    }

    #[test]
    fn a_timer_held_up_by_a_wall_clock_step_back_is_replaced_once_late() {
        let mut schedule = Schedule::default();
        let mut ids = 0;
        schedule.request();
        let plan = schedule.plan(0, index_at(100 * MS));
        perform(&mut schedule, plan, &mut ids);
        // The wall clock stepped back a minute: Redis does not fire it; the monotonic clock runs on.
        assert_eq!(schedule.plan(100 * MS + LATE_US, || panic!("unchanged")), Plan::Keep);
        let now = 100 * MS + LATE_US + 1;
        assert_eq!(
            schedule.plan(now, || panic!("late")),
            Plan::Arm { stop: Some(1), delay_ms: 0, due: now }
        );
        perform(&mut schedule, Plan::Arm { stop: Some(1), delay_ms: 0, due: now }, &mut ids);
        assert_eq!(
            schedule.plan(now + MS, || panic!("unchanged")),
            Plan::Keep,
            "not again at once"
        );
    }

    #[test]
    fn a_write_pause_leaves_leases_alone_but_answers_time_outs() {
        let mut schedule = Schedule::default();
        schedule.armed(1, 0);
        assert_eq!(schedule.fired(0), Fired { propagate: false });
        schedule.writes_paused(0, false);
        let work = || SweepWork { index: Some(0), time_out: Some(3 * MS), clean_up: true };
        assert_eq!(schedule.plan(0, work), Plan::Arm { stop: None, delay_ms: 3, due: 3 * MS });
        schedule.armed(2, 3 * MS);
        schedule.fired(3 * MS);
        schedule.writes_paused(3 * MS, false);
        let work = || SweepWork { index: Some(0), time_out: None, clean_up: false };
        let again = 3 * MS + PAUSED_POLL_US;
        assert_eq!(schedule.plan(3 * MS, work), Plan::Arm { stop: None, delay_ms: 10, due: again });
        schedule.armed(3, again);
        schedule.fired(again);
        // Writes resumed: the overdue deadline is swept at once.
        assert_eq!(
            schedule.plan(again, index_at(0)),
            Plan::Arm { stop: None, delay_ms: 0, due: again }
        );
    }

    #[test]
    fn the_counter_is_propagated_when_due_and_after_a_pause() {
        let mut schedule = Schedule::default();
        schedule.want_propagation(4 * MS);
        schedule.want_propagation(9 * MS);
        let plan = schedule.plan(0, SweepWork::default);
        assert_eq!(plan, Plan::Arm { stop: None, delay_ms: 4, due: 4 * MS });
        schedule.armed(1, 4 * MS);
        assert_eq!(schedule.fired(4 * MS), Fired { propagate: true });
        assert_eq!(schedule.plan(4 * MS, SweepWork::default), Plan::Keep, "done");
        schedule.want_propagation(5 * MS);
        schedule.armed(2, 5 * MS);
        assert_eq!(schedule.fired(5 * MS), Fired { propagate: true });
        schedule.writes_paused(5 * MS, true);
        let again = 5 * MS + PAUSED_POLL_US;
        assert_eq!(
            schedule.plan(5 * MS, SweepWork::default),
            Plan::Arm { stop: None, delay_ms: 10, due: again }
        );
        schedule.armed(3, again);
        assert_eq!(schedule.fired(again), Fired { propagate: true });
    }

    #[test]
    fn a_timer_that_fired_early_for_a_capped_step_leaves_the_propagation_for_later() {
        let mut schedule = Schedule::default();
        schedule.want_propagation(8 * MS);
        schedule.armed(1, 2 * MS);
        assert_eq!(schedule.fired(2 * MS), Fired { propagate: false });
        assert_eq!(
            schedule.plan(2 * MS, SweepWork::default),
            Plan::Arm { stop: None, delay_ms: 6, due: 8 * MS }
        );
    }
}
