package dlock

import (
	"context"
	"log/slog"
	"time"
)

// Metrics receives the client's figures. The names docs/protocol.md (section 13) gives them, as
// the Prometheus adapter (sub-package prometheus) exports them:
//
//   - AcquireAttempt: dlock_client_acquire_attempts_total
//   - AcquireFailed: dlock_client_acquire_failures_total{reason}: held, unreachable, unknown,
//     server
//   - Acquired: dlock_client_acquire_seconds (from the first send to the grant)
//   - Held: dlock_client_hold_seconds (from the grant to the release or the loss)
//   - RenewalFailed: dlock_client_renewal_failures_total{reason}: refused, error
//   - ReleaseFailed: dlock_client_release_failures_total: a RELEASE with no answer (or an error
//     reply) for a lease believed live. Not a RELEASE answered 0 (that is the loss ended,
//     counted by LeaseLost), nor the best-effort RELEASE after a loss already counted.
//   - LeaseLost: dlock_client_leases_lost_total{reason}: the loss reasons (renewal_refused,
//     unreachable, stalled, max_hold, ended, revoked), once per lease
//   - StaleWrite: dlock_client_stale_writes_total
//   - Redirect: dlock_client_redirects_total (MOVED and ASK followed)
//
// Implementations must be safe for concurrent use and must not block.
type Metrics interface {
	AcquireAttempt()
	AcquireFailed(reason string)
	Acquired(took time.Duration)
	Held(held time.Duration)
	RenewalFailed(reason string)
	ReleaseFailed()
	LeaseLost(reason string)
	StaleWrite()
	Redirect()
}

// NoMetrics discards every figure (the default).
type NoMetrics struct{}

func (NoMetrics) AcquireAttempt()                    {}
func (NoMetrics) AcquireFailed(string)               {}
func (NoMetrics) Acquired(time.Duration)             {}
func (NoMetrics) Held(time.Duration)                 {}
func (NoMetrics) RenewalFailed(string)               {}
func (NoMetrics) ReleaseFailed()                     {}
func (NoMetrics) LeaseLost(string)                   {}
func (NoMetrics) StaleWrite()                        {}
func (NoMetrics) Redirect()                          {}
func (s *settings) observe() (*slog.Logger, Metrics) { return s.log(), s.figures() }

func (s *settings) log() *slog.Logger {
	if s.logger != nil {
		return s.logger
	}
	return slog.Default()
}

func (s *settings) figures() Metrics {
	if s.metrics != nil {
		return s.metrics
	}
	return NoMetrics{}
}

// The log lines (docs/protocol.md, section 13), with the fields resource, owner (the token),
// fence and reason.
const (
	logAcquired      = "dlock: lease acquired"
	logRenewalFailed = "dlock: renewal failed"
	logReleased      = "dlock: lease released"
	logReleaseFailed = "dlock: release failed"
	logLost          = "dlock: lease lost"
	logStale         = "dlock: stale operation rejected"
)

// logLease logs one line of a lease: fence is its fence (a set's: its members' fences joined by
// ",", as its resource is its members).
func logLease(logger *slog.Logger, level slog.Level, msg, resource, token string, fence slog.Value, attrs ...slog.Attr) {
	all := append([]slog.Attr{
		slog.String("resource", resource), slog.String("owner", token), {Key: "fence", Value: fence},
	}, attrs...)
	logger.LogAttrs(context.Background(), level, msg, all...)
}
