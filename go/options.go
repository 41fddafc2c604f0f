package dlock

import (
	"log/slog"
	"time"
)

// Option sets one setting. Given to New, it is the default of every call of that Locks; given to
// a call (Hold, Do, Read, Write, Semaphore, Campaign), it applies to that call only.
type Option func(*settings)

// settings are a call's options, defaults first.
type settings struct {
	ttl            time.Duration
	wait           time.Duration // < 0: no limit but the caller's context
	requestTimeout time.Duration
	releaseTimeout time.Duration // 0: requestTimeout
	tickets        bool
	ticket         time.Duration
	maxHold        time.Duration // 0: none
	meta           string
	hasMeta        bool
	logger         *slog.Logger
	metrics        Metrics
}

func defaults() settings {
	return settings{
		ttl:            30 * time.Second,
		wait:           10 * time.Second,
		requestTimeout: 2 * time.Second,
		ticket:         6 * time.Second,
	}
}

// TTL is the lease's length (default 30 s); it is renewed every third of it while held.
func TTL(ttl time.Duration) Option { return func(s *settings) { s.ttl = ttl } }

// Wait bounds how long an acquire waits in the server's queue for a held resource (default 10
// s; 0: no wait, one try). The caller's context bounds it too.
func Wait(wait time.Duration) Option { return func(s *settings) { s.wait = wait } }

// WaitForever waits in the server's queue until granted or until the caller's context ends.
func WaitForever() Option { return func(s *settings) { s.wait = -1 } }

// RequestTimeout bounds one request to the server (default 2 s); a wait adds its own length.
// It also sets the claim window (twice it, at least 1 s, at most the ttl).
func RequestTimeout(timeout time.Duration) Option {
	return func(s *settings) { s.requestTimeout = timeout }
}

// ReleaseTimeout bounds the RELEASE at the end of a hold (default: the request timeout). The
// release never waits for the caller's context: a cancelled caller still releases.
func ReleaseTimeout(timeout time.Duration) Option {
	return func(s *settings) { s.releaseTimeout = timeout }
}

// Tickets waits with QUEUE tickets instead of a blocking WAIT on a connection per waiter: each
// told of its turn on its own channel (one pub/sub connection per server, shared by every
// waiter), where the lease starts on the server's message, claimed by a RENEW sent beside the
// work; a server without NOTIFY wakes them on the resource's channel. ticket is the ticket's
// life (default 6 s), refreshed every third of it.
func Tickets(ticket time.Duration) Option {
	return func(s *settings) {
		s.tickets = true
		if ticket > 0 {
			s.ticket = ticket
		}
	}
}

// Blocking waits with DLOCK.ACQUIRE … WAIT on a connection of its own (the default).
func Blocking() Option { return func(s *settings) { s.tickets = false } }

// MaxHold bounds the whole hold: renewals never go past it, and the lease is lost (ReasonMaxHold)
// when it passes.
func MaxHold(maxHold time.Duration) Option { return func(s *settings) { s.maxHold = maxHold } }

// Meta describes the holder (DLOCK.ACQUIRE … META): DLOCK.INFO shows it; an election's candidate
// gives its address here. Left out for a server that does not know META.
func Meta(meta string) Option {
	return func(s *settings) {
		s.meta = meta
		s.hasMeta = true
	}
}

// Logger sets where the ownership log lines go (default slog.Default()).
func Logger(logger *slog.Logger) Option { return func(s *settings) { s.logger = logger } }

// WithMetrics sets where the client's figures go (default: nowhere). See Metrics, and the
// Prometheus adapter in the sub-package prometheus.
func WithMetrics(metrics Metrics) Option { return func(s *settings) { s.metrics = metrics } }

func (s *settings) release() time.Duration {
	if s.releaseTimeout > 0 {
		return s.releaseTimeout
	}
	return s.requestTimeout
}
