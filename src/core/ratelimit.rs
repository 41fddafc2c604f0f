//! A one-second window limit for notice-level log lines, so a storm of anomalies (a mass
//! expiry, a client retrying a stale release in a loop) cannot flood the server log.

use super::Micros;

/// What to do with one more line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it.
    Log,
    /// Log it, after a line saying how many were suppressed in the last window.
    LogAfterSuppressed(u64),
    /// Drop it (counted, and reported with the next logged line).
    Suppress,
}

/// At most `per_second` lines in each one-second window.
#[derive(Clone, Debug, Default)]
pub struct RateLimit {
    window_start: Micros,
    logged: u32,
    suppressed: u64,
}

impl RateLimit {
    /// Decides for a line at `now_mono`.
    pub fn check(&mut self, now_mono: Micros, per_second: u32) -> Verdict {
        if now_mono.saturating_sub(self.window_start) >= 1_000_000 {
            self.window_start = now_mono;
            self.logged = 0;
        }
        if self.logged >= per_second {
            self.suppressed += 1;
            return Verdict::Suppress;
        }
        self.logged += 1;
        match std::mem::take(&mut self.suppressed) {
            0 => Verdict::Log,
            n => Verdict::LogAfterSuppressed(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storm_logs_the_first_lines_of_each_second_and_counts_the_rest() {
        let mut limit = RateLimit::default();
        let start = 5_000_000;
        let verdicts: Vec<Verdict> = (0..5).map(|i| limit.check(start + i, 3)).collect();
        assert_eq!(
            verdicts,
            [Verdict::Log, Verdict::Log, Verdict::Log, Verdict::Suppress, Verdict::Suppress]
        );
        assert_eq!(limit.check(start + 1_000_000, 3), Verdict::LogAfterSuppressed(2));
        assert_eq!(limit.check(start + 1_000_001, 3), Verdict::Log);
    }
}
