// Package prometheus exports a dlock.Locks' figures to Prometheus (client_golang), under the
// names docs/protocol.md (section 13) gives every client. It is a module of its own, so the dlock
// module pulls in no metrics library.
//
//	metrics := prometheus.New(prom.DefaultRegisterer)
//	locks := dlock.New(rdb, dlock.WithMetrics(metrics))
package prometheus

import (
	"time"

	prom "github.com/prometheus/client_golang/prometheus"

	dlock "github.com/dlock-dev/dlock/go"
)

// Metrics is a dlock.Metrics that feeds Prometheus collectors.
type Metrics struct {
	acquireAttempts prom.Counter
	acquireFailures *prom.CounterVec
	acquireSeconds  prom.Histogram
	holdSeconds     prom.Histogram
	renewalFailures *prom.CounterVec
	releaseFailures prom.Counter
	leasesLost      *prom.CounterVec
	staleWrites     prom.Counter
	redirects       prom.Counter
}

var _ dlock.Metrics = (*Metrics)(nil)

// New makes the collectors and registers them with registerer (nil: not registered; use
// Collectors to register them yourself). It panics if they are registered already, as
// prometheus.MustRegister does.
func New(registerer prom.Registerer) *Metrics {
	m := &Metrics{
		acquireAttempts: prom.NewCounter(prom.CounterOpts{Name: "dlock_client_acquire_attempts_total",
			Help: "Acquire attempts (one per Hold, Read, Write, Semaphore or campaign round)."}),
		acquireFailures: prom.NewCounterVec(prom.CounterOpts{Name: "dlock_client_acquire_failures_total",
			Help: "Acquire attempts that ended without a lease, by outcome (held, unreachable, unknown, server)."}, []string{"reason"}),
		acquireSeconds: prom.NewHistogram(prom.HistogramOpts{Name: "dlock_client_acquire_seconds",
			Help: "From the first send to the grant.", Buckets: prom.ExponentialBuckets(0.001, 4, 10)}),
		holdSeconds: prom.NewHistogram(prom.HistogramOpts{Name: "dlock_client_hold_seconds",
			Help: "From the grant to the release or the loss.", Buckets: prom.ExponentialBuckets(0.01, 4, 10)}),
		renewalFailures: prom.NewCounterVec(prom.CounterOpts{Name: "dlock_client_renewal_failures_total",
			Help: "Renewals refused by the server or not answered in time."}, []string{"reason"}),
		releaseFailures: prom.NewCounter(prom.CounterOpts{Name: "dlock_client_release_failures_total",
			Help: "Releases of a lease believed live that got no answer or an error reply (the lease ends with its ttl)."}),
		leasesLost: prom.NewCounterVec(prom.CounterOpts{Name: "dlock_client_leases_lost_total",
			Help: "Leases lost before their work ended, by loss reason."}, []string{"reason"}),
		staleWrites: prom.NewCounter(prom.CounterOpts{Name: "dlock_client_stale_writes_total",
			Help: "Fenced writes the server refused as stale."}),
		redirects: prom.NewCounter(prom.CounterOpts{Name: "dlock_client_redirects_total",
			Help: "MOVED and ASK replies followed."}),
	}
	if registerer != nil {
		registerer.MustRegister(m.Collectors()...)
	}
	return m
}

// Collectors are every collector of m.
func (m *Metrics) Collectors() []prom.Collector {
	return []prom.Collector{m.acquireAttempts, m.acquireFailures, m.acquireSeconds, m.holdSeconds,
		m.renewalFailures, m.releaseFailures, m.leasesLost, m.staleWrites, m.redirects}
}

func (m *Metrics) AcquireAttempt()             { m.acquireAttempts.Inc() }
func (m *Metrics) AcquireFailed(reason string) { m.acquireFailures.WithLabelValues(reason).Inc() }
func (m *Metrics) Acquired(took time.Duration) { m.acquireSeconds.Observe(took.Seconds()) }
func (m *Metrics) Held(held time.Duration)     { m.holdSeconds.Observe(held.Seconds()) }
func (m *Metrics) RenewalFailed(reason string) { m.renewalFailures.WithLabelValues(reason).Inc() }
func (m *Metrics) ReleaseFailed()              { m.releaseFailures.Inc() }
func (m *Metrics) LeaseLost(reason string)     { m.leasesLost.WithLabelValues(reason).Inc() }
func (m *Metrics) StaleWrite()                 { m.staleWrites.Inc() }
func (m *Metrics) Redirect()                   { m.redirects.Inc() }
