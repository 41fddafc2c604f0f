//! Client-side figures through the [`metrics`] facade and ownership transitions as [`tracing`]
//! events; the application installs the recorder and subscriber it likes (Prometheus, OTLP …).
//!
//! Metric names (counters unless noted):
//! - `dlock_client_acquire_attempts_total`
//! - `dlock_client_acquire_failures_total{reason}`: `held`, `unreachable`, `unknown`,
//!   `not_replicated`, `server`
//! - `dlock_client_acquire_seconds` (histogram): from the first send to the grant
//! - `dlock_client_hold_seconds` (histogram): from the grant to the release or the loss
//! - `dlock_client_renewal_failures_total{reason}`: `refused`, `error`
//! - `dlock_client_release_failures_total`: a RELEASE whose outcome is unknown (no answer, a
//!   connection or server error); one answered 0 is the loss `ended`, and the best-effort
//!   RELEASE after a loss is not counted
//! - `dlock_client_leases_lost_total{reason}`: `renewal_refused`, `unreachable`, `stalled`,
//!   `ended`, `revoked`
//! - `dlock_client_stale_writes_total`: fenced writes refused (DLOCK.FENCED STALE or SQL)
//! - `dlock_client_redirects_total`: `MOVED` and `ASK` replies followed (Redis Cluster)
//!
//! A set of resources ([`SetLease`](crate::SetLease)) counts and logs as one lease: one
//! attempt, one grant, one loss; its log lines name its members joined by `,` as `resource`
//! and their fences, likewise joined, as `fence`.

use std::time::Duration;

use crate::lease::Grants;
use crate::{Lease, LossReason};

/// A log line about `grants`: `resource` and `fence` as the lease's, or the set's members and
/// fences joined by `,`, then the fields and the message given.
macro_rules! log_line {
    ($level:ident, $grants:expr, $($rest:tt)+) => {
        match ($grants.fences(), $grants.is_set()) {
            ([fence], false) => {
                tracing::$level!(resource = %$grants.label(), fence = *fence, $($rest)+)
            }
            (fences, _) => {
                let fences: Vec<String> = fences.iter().map(u64::to_string).collect();
                tracing::$level!(resource = %$grants.label(), fence = %fences.join(","), $($rest)+)
            }
        }
    };
}

pub(crate) fn acquire_attempt() {
    metrics::counter!("dlock_client_acquire_attempts_total").increment(1);
}

pub(crate) fn acquire_failed(reason: &'static str) {
    metrics::counter!("dlock_client_acquire_failures_total", "reason" => reason).increment(1);
}

pub(crate) fn acquired(lease: &Lease, took: Duration) {
    metrics::histogram!("dlock_client_acquire_seconds").record(took.as_secs_f64());
    let (owner, mode) = (lease.token(), lease.mode().name());
    log_line!(info, lease.grants, owner, mode, "dlock: lease acquired");
}

pub(crate) fn renewal_failed(grants: &Grants, token: &str, refused: bool) {
    let reason = if refused { "refused" } else { "error" };
    metrics::counter!("dlock_client_renewal_failures_total", "reason" => reason).increment(1);
    log_line!(warn, grants, owner = token, reason, "dlock: renewal failed");
}

/// The end of a hold by RELEASE: `Some(true)` released; `Some(false)` answered 0, the lease had
/// already ended on the server (the loss `ended`, not a release failure); `None` the outcome is
/// unknown (no answer, a connection or server error): a release failure.
pub(crate) fn released(grants: &Grants, token: &str, held: Duration, released: Option<bool>) {
    metrics::histogram!("dlock_client_hold_seconds").record(held.as_secs_f64());
    match released {
        Some(true) => log_line!(info, grants, owner = token, "dlock: lease released"),
        Some(false) => {
            let reason = "ended";
            metrics::counter!("dlock_client_leases_lost_total", "reason" => reason).increment(1);
            log_line!(warn, grants, owner = token, reason, "dlock: lease lost");
        }
        None => {
            metrics::counter!("dlock_client_release_failures_total").increment(1);
            log_line!(warn, grants, owner = token, "dlock: release failed");
        }
    }
}

pub(crate) fn lost(grants: &Grants, token: &str, held: Duration, lost: &LossReason) {
    metrics::histogram!("dlock_client_hold_seconds").record(held.as_secs_f64());
    let reason = lost.kind();
    metrics::counter!("dlock_client_leases_lost_total", "reason" => reason).increment(1);
    match lost {
        // The operator's reason, as they gave it.
        LossReason::Revoked(detail) => log_line!(
            warn,
            grants,
            owner = token,
            reason,
            detail = detail.as_str(),
            "dlock: lease lost, work cancelled"
        ),
        _ => log_line!(warn, grants, owner = token, reason, "dlock: lease lost, work cancelled"),
    }
}

pub(crate) fn stale_write_refused() {
    metrics::counter!("dlock_client_stale_writes_total").increment(1);
}

pub(crate) fn redirected() {
    metrics::counter!("dlock_client_redirects_total").increment(1);
}
