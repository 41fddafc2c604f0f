// Package dlock is the Go client of dlock, lease locks with fencing tokens in a Redis (or Valkey)
// module, on go-redis v9.
//
//	locks := dlock.New(rdb)
//	err := locks.Do(ctx, "invoice:42", func(ctx context.Context, lease *dlock.Lease) error {
//		return pay(ctx, lease.Fence()) // ctx is cancelled if the lease is lost
//	}, dlock.TTL(30*time.Second), dlock.Wait(10*time.Second))
//
// It follows the client contract (docs/protocol.md in the repository): a token made before the
// first send and reused for ambiguous retries; a wait on a connection of its own whose read
// deadline is above the wait, always with a claim window; renewal with the grant's fence every
// ttl/3 against a conservative local expiry; a bounded release that never masks the work's own
// error; the release of an attempt's token when its outcome stayed unknown.
package dlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// unlimitedWaitSlice: how long one server-side wait lasts at most when the caller waits without
// limit; each slice is one WAIT with the same token.
const unlimitedWaitSlice = time.Hour

// cutShort: a WAIT answered nil earlier than this before the caller's deadline was cut short
// (the key migrated or was deleted, a newer wait of the token took its place), not timed out;
// the attempt waits again after waitAgainPause.
const (
	cutShort       = 50 * time.Millisecond
	waitAgainPause = 10 * time.Millisecond
)

// Pauses between retries of an ambiguous failure: retryPause after the first, doubled after each
// further one in a row, at most maxRetryPause.
const (
	retryPause    = 50 * time.Millisecond
	maxRetryPause = 400 * time.Millisecond
)

// forgetAgainAfter: the RELEASE of an attempt's token that found nothing is sent once more after
// this pause (it may have overtaken the ACQUIRE), and no more.
const forgetAgainAfter = 100 * time.Millisecond

// campaignRound: a campaign waits in rounds of this length, each with a fresh token.
const campaignRound = 30 * time.Second

// Locks takes leases on the servers of a go-redis client. It is safe for concurrent use.
type Locks struct {
	router *router
	err    error // New's, returned by every call
	set    settings
	opts   []Option // New's options (a campaign applies them over its own defaults)

	mu      sync.Mutex
	refused map[string]bool // options a server refused ("127.0.0.1:6379 DLOCK.RENEW FENCE"): not sent to it again
}

// New makes a Locks on rdb: a *redis.Client (a single server, or Sentinel's
// redis.NewFailoverClient) or a *redis.ClusterClient. dlock opens connections of its own to the
// same servers with the same settings (credentials, database, TLS, protocol, dialer), but with
// its own timeouts and without go-redis's retries; rdb itself only tells a ClusterClient's slot
// map. Any other client type makes every call fail. The options are the defaults of every call.
func New(rdb redis.UniversalClient, opts ...Option) *Locks {
	set := defaults()
	for _, opt := range opts {
		opt(&set)
	}
	l := &Locks{set: set, opts: opts, refused: map[string]bool{}}
	l.router, l.err = newRouter(rdb, set.requestTimeout, set.figures())
	return l
}

// Close closes dlock's own connections (rdb stays open). Leases still held end with their ttl.
func (l *Locks) Close() error {
	if l.router == nil {
		return nil
	}
	return l.router.close()
}

func (l *Locks) settings(opts []Option) settings {
	set := l.set
	for _, opt := range opts {
		opt(&set)
	}
	return set
}

// Hold acquires an exclusive lease on resource, waiting in the server's queue up to the Wait
// option (default 10 s) and no longer than ctx allows, and keeps it renewed until Release or
// its loss. Errors: *AcquireError (errors.Is ErrNotAcquired when it stayed held, ErrUnreachable,
// ErrUnknownOutcome), or a caller's mistake (a ttl of 0).
func (l *Locks) Hold(ctx context.Context, resource string, opts ...Option) (*Lease, error) {
	return l.acquire(ctx, resource, mode{}, l.settings(opts))
}

// Write is the writer's side of a read-write lock: an exclusive lease on resource, the one Read
// shares (the same as Hold).
func (l *Locks) Write(ctx context.Context, resource string, opts ...Option) (*Lease, error) {
	return l.Hold(ctx, resource, opts...)
}

// Read is the reader's side of a read-write lock: a shared lease (DLOCK.ACQUIRE … SHARED), held
// together with other readers, never with a writer. Every reader has its own token, fence and
// renewals. A server without shared leases answers ErrUnsupported.
func (l *Locks) Read(ctx context.Context, resource string, opts ...Option) (*Lease, error) {
	return l.acquire(ctx, resource, mode{shared: true}, l.settings(opts))
}

// Semaphore takes one permit of the counting semaphore name (SHARED LIMIT permits): granted only
// while fewer than permits (1 to MaxPermits) live. Every user of name must give the same permits.
func (l *Locks) Semaphore(ctx context.Context, name string, permits int, opts ...Option) (*Lease, error) {
	if permits < 1 || permits > MaxPermits {
		return nil, fmt.Errorf("%w: permits must be from 1 to %d, not %d", ErrInvalidArgument, MaxPermits, permits)
	}
	return l.acquire(ctx, name, mode{shared: true, permits: permits}, l.settings(opts))
}

// Do runs fn under an exclusive lease on resource (see Hold) and releases it when fn returns.
// fn's context is cancelled when the lease is lost. fn's error is returned as it is (joined with
// the *LeaseLostError if the lease was lost meanwhile); when fn succeeded, a loss returns the
// *LeaseLostError and a failed release a *ReleaseError: a loss is never silent.
func (l *Locks) Do(ctx context.Context, resource string, fn func(ctx context.Context, lease *Lease) error, opts ...Option) error {
	lease, err := l.Hold(ctx, resource, opts...)
	if err != nil {
		return err
	}
	return lease.Run(ctx, fn)
}

// Run runs fn under the lease and releases it when fn returns, with Do's rules for errors. fn's
// context is ctx, also cancelled when the lease is lost. If fn panics (or calls runtime.Goexit),
// the lease is released all the same and the panic goes on.
func (l *Lease) Run(ctx context.Context, fn func(ctx context.Context, lease *Lease) error) error {
	return runUnder(ctx, l, l, fn)
}

// runUnder is Run for the lease l, whose holder (the *Lease, or the *SetLease around it) fn gets.
func runUnder[H any](ctx context.Context, l *Lease, holder H, fn func(ctx context.Context, holder H) error) error {
	work, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	returned := false
	defer func() {
		if !returned { // a panic on its way up: release, and let it go on unchanged
			stop()
			cancel(nil)
			_ = l.Release(ctx)
		}
	}()
	err := fn(work, holder)
	returned = true
	stop()
	cancel(nil)
	released := l.Release(ctx)
	lost := l.lost()
	switch {
	case err != nil && lost != nil:
		return errors.Join(err, lost)
	case err != nil:
		return err // a failed release was logged and counted
	case lost != nil:
		return lost
	}
	return released
}

// Fenced runs command in the server only if fence still holds resource (DLOCK.FENCED); see
// Lease.Fenced.
func (l *Locks) Fenced(ctx context.Context, resource string, fence uint64, command ...any) (any, error) {
	if l.err != nil {
		return nil, l.err
	}
	reply, err := l.router.do(ctx, resource, l.set.requestTimeout, fencedArgs(resource, fence, command)...)
	reply, err = fencedOutcome(resource, fence, reply, err)
	var stale *StaleError
	if errors.As(err, &stale) {
		l.set.figures().StaleWrite()
		l.set.log().LogAttrs(ctx, slog.LevelWarn, logStale, slog.String("resource", resource),
			slog.Uint64("fence", fence), slog.String("reason", stale.Detail))
	}
	return reply, err
}

// fencedOutcome is what a DLOCK.FENCED reply means: the inner command's reply, or a stale fence
// (*StaleError), or another error reply as a *ServerError with its class.
func fencedOutcome(resource string, fence uint64, reply any, err error) (any, error) {
	if err == nil {
		return reply, nil
	}
	text := errorReply(err)
	if text == "" {
		return nil, err
	}
	if class := ErrorClass(text); class == ClassStale {
		return nil, &StaleError{Resource: resource, Fence: fence, Detail: text}
	} else {
		return nil, &ServerError{Class: class, Reply: text}
	}
}

// FenceCheck says whether fence still holds resource on the server (DLOCK.FENCECHECK).
func (l *Locks) FenceCheck(ctx context.Context, resource string, fence uint64) (bool, error) {
	if l.err != nil {
		return false, l.err
	}
	reply, err := l.router.do(ctx, resource, l.set.requestTimeout, fenceCheckArgs(resource, fence)...)
	if err != nil {
		return false, serverError(err)
	}
	n, err := asInt(reply)
	return n == 1, err
}

// Info reads DLOCK.INFO resource: nil when there is no lease and nobody waits.
func (l *Locks) Info(ctx context.Context, resource string) (*Info, error) {
	if l.err != nil {
		return nil, l.err
	}
	reply, err := l.router.do(ctx, resource, l.set.requestTimeout, infoArgs(resource)...)
	if err != nil {
		return nil, serverError(err)
	}
	return parseInfo(reply)
}

// serverError gives a server's error reply its class (*ServerError); other errors pass.
func serverError(err error) error {
	if text := errorReply(err); text != "" {
		return &ServerError{Class: ErrorClass(text), Reply: text}
	}
	return err
}

func asInt(reply any) (int64, error) {
	switch v := reply.(type) {
	case nil:
		return 0, nil
	case int64:
		return v, nil
	case string:
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, fmt.Errorf("dlock: unexpected reply %v", reply)
}

// call sends the command build makes for the server at addr to resource's server; when that
// server refuses an option as unknown (an older module) that may be dropped (CLAIM, META, FENCE,
// QUEUE, NOTIFY), it is not sent to that server again by this Locks and the command goes once
// more without it (NOTIFY: the refusal is returned, and the ticket's wait sends again once it
// listens on the resource's channel). Refusals are kept per server address: in a Cluster
// upgraded one node at a time, a node that has FENCE keeps getting it.
func (l *Locks) call(ctx context.Context, resource string, timeout time.Duration, build func(addr string) []any) (any, error) {
	if l.err != nil {
		return nil, l.err
	}
	for {
		reply, addr, args, err := l.router.doBuilt(ctx, resource, timeout, build)
		if !l.dropRefused(addr, args, err) {
			return reply, err
		}
		if droppableOption(errorReply(err)) == "NOTIFY" {
			// Marked, and returned: the ticket listens on the resource's channel before its
			// ACQUIRE goes again without NOTIFY.
			return reply, err
		}
	}
}

// dropRefused: whether err, from the server at addr, refused an option of args that can be left
// out; it is then marked for that server.
func (l *Locks) dropRefused(addr string, args []any, err error) bool {
	option := droppableOption(errorReply(err))
	if option == "" {
		return false
	}
	key := addr + " " + args[0].(string) + " " + option
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refused[key] {
		return false
	}
	l.refused[key] = true
	return true
}

// isRefused: whether the server at addr refused option on command.
func (l *Locks) isRefused(addr, command, option string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refused[addr+" "+command+" "+option]
}

// fenceArg is fence, or 0 (no FENCE) for the server at addr if it refused FENCE on command:
// only a server that has no FENCE gets a RENEW or RELEASE without it.
func (l *Locks) fenceArg(addr, command string, fence uint64) uint64 {
	if l.isRefused(addr, command, "FENCE") {
		return 0
	}
	return fence
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux (it panics if it could)
	return hex.EncodeToString(b[:])
}

// acquire runs one attempt (one token) and counts and logs its outcome.
func (l *Locks) acquire(ctx context.Context, resource string, m mode, set settings) (*Lease, error) {
	return l.try(ctx, &attempt{locks: l, resource: resource, mode: m, set: set})
}

// try runs the attempt a (one token) and counts and logs its outcome.
func (l *Locks) try(ctx context.Context, a *attempt) (*Lease, error) {
	set := a.set
	if l.err != nil {
		return nil, l.err
	}
	if set.ttl < time.Millisecond {
		return nil, fmt.Errorf("%w: ttl must be at least 1 ms, not %v", ErrInvalidArgument, set.ttl)
	}
	if set.requestTimeout <= 0 {
		return nil, fmt.Errorf("%w: request timeout must be positive, not %v", ErrInvalidArgument, set.requestTimeout)
	}
	metrics := set.figures()
	metrics.AcquireAttempt()
	started := time.Now()
	a.token, a.started = newToken(), started
	done := l.router.use()
	lease, err := a.run(ctx)
	done()
	if err != nil {
		reason := OutcomeServer
		var failed *AcquireError
		if errors.As(err, &failed) {
			reason = failed.Outcome
		}
		metrics.AcquireFailed(reason)
		return nil, err
	}
	metrics.Acquired(time.Since(started))
	lease.logLine(slog.LevelInfo, logAcquired, slog.String("mode", a.mode.name()))
	return lease, nil
}

// attempt is one acquire: its token, its deadline, and what it learned so far.
type attempt struct {
	locks    *Locks
	resource string   // a set's first member, where its commands go
	members  []string // a set's resources (HoldAll), in the caller's order; nil for one resource
	mode     mode
	set      settings
	token    string
	started  time.Time

	waitUntil  time.Time // zero: no limit
	holdEnd    time.Time
	ttl        time.Duration
	maxWait    time.Duration // the server's longest WAIT, once it refused a longer one
	reached    bool          // a request may have reached the server unanswered (it may still arrive)
	answered   bool          // the last request was answered
	fenced     bool          // a fence was answered to the token: a grant exists or existed
	failures   int           // ambiguous failures in a row
	failingFor time.Time     // since the first of them
	lastErr    error
}

// name is the resource as errors and log lines name it: a set's members joined by ",".
func (a *attempt) name() string {
	if a.members != nil {
		return strings.Join(a.members, ",")
	}
	return a.resource
}

// resources is every resource the attempt asks for.
func (a *attempt) resources() []string {
	if a.members != nil {
		return a.members
	}
	return []string{a.resource}
}

func (a *attempt) left() time.Duration {
	if a.waitUntil.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return time.Until(a.waitUntil)
}

// form is the ACQUIRE to send to the server at addr (without the options it refused).
func (a *attempt) form(addr string, waitMS int64, hasWait bool, queueMS int64) acquireForm {
	f := acquireForm{resource: a.resource, token: a.token, ttlMS: millis(a.ttl), mode: a.mode,
		hasWait: hasWait, waitMS: waitMS, queueMS: queueMS}
	if !a.locks.isRefused(addr, cmdAcquire, "CLAIM") {
		f.claimMS = claimWindowMS(a.set.requestTimeout, queueMS)
	}
	if a.set.hasMeta && !a.locks.isRefused(addr, cmdAcquire, "META") {
		f.meta, f.hasMeta = a.set.meta, true
	}
	return f
}

func (a *attempt) run(ctx context.Context) (*Lease, error) {
	a.ttl = a.set.ttl
	if a.set.maxHold > 0 {
		a.holdEnd = a.started.Add(a.set.maxHold)
		a.ttl = min(a.ttl, a.set.maxHold)
	}
	if a.set.wait >= 0 {
		a.waitUntil = a.started.Add(a.set.wait)
	}
	if deadline, ok := ctx.Deadline(); ok && (a.waitUntil.IsZero() || deadline.Before(a.waitUntil)) {
		a.waitUntil = deadline
	}
	if a.members != nil {
		return a.all(ctx)
	}
	if a.set.tickets && a.left() > 0 {
		lease, err, fallBack := a.tickets(ctx)
		if !fallBack {
			return lease, err
		}
	}
	return a.blocking(ctx)
}

// blocking: a plain ACQUIRE first; while time is left, an ACQUIRE … WAIT … CLAIM on a connection
// of its own; after a grant from the queue, the same ACQUIRE without WAIT claims it.
func (a *attempt) blocking(ctx context.Context) (*Lease, error) {
	waitNext := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, a.giveUp(ctx, err)
		}
		var (
			reply any
			err   error
			sent  = time.Now()
		)
		waited := false
		if waitNext && a.left() > 0 {
			wait := min(a.left(), unlimitedWaitSlice)
			if a.maxWait > 0 {
				wait = min(wait, a.maxWait)
			}
			waited = true
			waitMS := millisUp(wait)
			var (
				addr string
				args []any
			)
			reply, addr, args, err = a.locks.router.blockingWait(ctx, a.resource, time.Duration(waitMS)*time.Millisecond, a.set.requestTimeout,
				func(addr string) []any { return a.form(addr, waitMS, true, 0).args() })
			if a.locks.dropRefused(addr, args, err) {
				continue
			}
		} else {
			reply, err = a.locks.call(ctx, a.resource, a.set.requestTimeout, func(addr string) []any { return a.form(addr, 0, false, 0).args() })
		}
		if err != nil {
			if retry, failure := a.failed(err); retry {
				waitNext = a.left() > 0
				if !sleep(ctx, a.retryPause()) {
					return nil, a.giveUp(ctx, ctx.Err())
				}
				continue
			} else {
				return nil, failure
			}
		}
		fence, err := fenceOf(reply)
		if err != nil {
			return nil, a.serverFailure(err)
		}
		a.answer(fence)
		if ctx.Err() != nil {
			// The caller gave up (a cancelled ctx does not stop a read already under way, so a
			// fence may have come all the same): a grant now would be nobody's.
			return nil, a.giveUp(ctx, ctx.Err())
		}
		if fence != 0 && !waited {
			return newLease(ctx, a, []uint64{fence}, sent), nil
		}
		if fence != 0 {
			// Granted from the queue at some instant of the wait: claim it now (the same
			// ACQUIRE without WAIT answers the same fence and starts the full ttl).
			waitNext = false
			continue
		}
		// nil: held (or a claim whose window passed)
		if a.left() <= func() time.Duration {
			if waited {
				return cutShort
			}
			return 0
		}() {
			// The server answered nil at the wait's end (it timed the wait out, or the claim's
			// window passed): this answer leaves the token nothing. A request of this attempt that
			// failed on the way may still arrive after it, though (docs/protocol.md §2, after a
			// failed wait): then the token is released, once more 100 ms later if that found
			// nothing. Without such a failure nothing can come later, and nothing is sent.
			released := false
			if a.reached {
				released = a.forget(ctx)
			}
			return nil, &AcquireError{Resource: a.name(), Outcome: OutcomeHeld, Token: a.token, Released: released}
		}
		if waited && !sleep(ctx, min(waitAgainPause, a.left())) {
			return nil, a.giveUp(ctx, ctx.Err())
		}
		waitNext = true
	}
}

// tickets: subscribed before the first ACQUIRE … QUEUE to the ticket's own channel, where the
// server tells this ticket alone of its grant (every ACQUIRE numbered by NOTIFY, its send time
// kept); the same ACQUIRE again on every (re)subscription and every ticket/3. The lease starts
// on the channel's granted message (started), its claim sent beside the work; with too little
// of the window left, or a request not the attempt's, the next ACQUIRE claims the turn. A
// server without NOTIFY is waited on through the resource's channel: the ACQUIRE again on a
// hand-over to this token. fallBack: the server has no QUEUE (the blocking wait takes over).
func (a *attempt) tickets(ctx context.Context) (lease *Lease, err error, fallBack bool) {
	ticket := a.set.ticket
	pick, cancel := context.WithTimeout(ctx, a.set.requestTimeout)
	serving, routeErr := a.locks.router.forResource(pick, a.resource)
	cancel()
	if routeErr == nil && a.locks.isRefused(serving.addr, cmdAcquire, "QUEUE") {
		return nil, nil, true
	}
	notify := routeErr != nil || !a.locks.isRefused(serving.addr, cmdAcquire, "NOTIFY")
	// Subscribed before the first ticket; the subscription follows the resource's slot (a
	// failover, a migration) and every resubscription wakes the waiter: no hand-over goes
	// unheard.
	channels := a.locks.router.channels
	var w *watch
	if notify {
		w = channels.joinOwn(ctx, a.resource, a.token, a.set.requestTimeout)
	} else {
		w = channels.join(ctx, a.resource, TokenTag(a.token), a.set.requestTimeout)
	}
	defer func() { channels.leave(w) }()
	var sends []time.Time // each ACQUIRE's send time, by its NOTIFY number (from 1)
	queued := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, a.withdraw(ctx, queued, err), false
		}
		if queued && a.left() <= 0 {
			return nil, a.withdraw(ctx, queued, nil), false
		}
		select {
		case <-w.wake: // a message from now on means: send again
		default:
		}
		sent := time.Now()
		queued = true
		var request uint64
		if notify {
			sends = append(sends, sent)
			request = uint64(len(sends))
		}
		reply, err := a.locks.call(ctx, a.resource, a.set.requestTimeout, func(addr string) []any {
			f := a.form(addr, 0, false, millis(ticket))
			f.notify = request
			return f.args()
		})
		if err != nil {
			switch unsupportedOption(errorReply(err)) {
			case "QUEUE":
				// This server has no tickets (marked by call): the blocking wait takes over.
				return nil, nil, true
			case "NOTIFY":
				if notify {
					// An older server (marked by call): the resource's channel, subscribed
					// before the ACQUIRE goes again without NOTIFY.
					notify = false
					channels.leave(w)
					w = channels.join(ctx, a.resource, TokenTag(a.token), a.set.requestTimeout)
					continue
				}
			}
			if retry, failure := a.failed(err); retry {
				if !sleep(ctx, a.retryPause()) {
					return nil, a.withdraw(ctx, queued, ctx.Err()), false
				}
				continue
			} else {
				return nil, failure, false
			}
		}
		fence, err := fenceOf(reply)
		if err != nil {
			return nil, a.serverFailure(err), false
		}
		a.answer(fence)
		if fence != 0 {
			if ctx.Err() != nil {
				return nil, a.giveUp(ctx, ctx.Err()), false
			}
			return newLease(ctx, a, []uint64{fence}, sent), nil, false
		}
		refresh := time.NewTimer(max(0, min(ticket/3, a.left())))
		select {
		case <-w.wake:
		case <-refresh.C:
		case <-ctx.Done():
		}
		refresh.Stop()
		if told, ok := channels.heard(w); ok && notify && ctx.Err() == nil {
			if expiry, starts := startsOn(told, sends, time.Now(), a.set.requestTimeout); starts {
				return startedLease(ctx, a, told.fence, expiry), nil, false
			}
		}
	}
}

// withdraw: at the deadline a RELEASE without FENCE takes the ticket out of line, or frees what
// it was granted meanwhile.
func (a *attempt) withdraw(ctx context.Context, queued bool, cause error) error {
	if queued {
		a.forget(ctx)
	}
	return &AcquireError{Resource: a.name(), Outcome: OutcomeHeld, Token: a.token, Err: cause}
}

// failed classifies a failed request: retry (with the same token, until the deadline), or the
// error to return.
func (a *attempt) failed(err error) (bool, error) {
	a.lastErr = err
	a.answered = false
	text := errorReply(err)
	if text != "" {
		class := ErrorClass(text)
		if longest := waitTooLong(text); longest > 0 && a.maxWait == 0 {
			// A wait longer than the server allows: wait in slices of its longest.
			a.maxWait = longest
			return true, nil
		}
		switch class {
		case ClassRedirect, ClassRetry, ClassFailover:
		case ClassUnblocked:
			a.reached = true
		default:
			return false, a.serverFailure(err)
		}
	} else if !notSent(err) {
		a.reached = true
	}
	a.failures++
	now := time.Now()
	if a.failures == 1 {
		a.failingFor = now
	}
	if !a.waitUntil.IsZero() {
		if !now.Before(a.waitUntil.Add(a.set.requestTimeout)) {
			return false, a.unsettled(context.Background())
		}
	} else if now.Sub(a.failingFor) >= max(5*a.set.requestTimeout, time.Second) {
		return false, a.unsettled(context.Background())
	}
	return true, nil
}

// notSent: a failure after which the request surely did not reach a server (a refused
// connection, no connection from the pool, no node known for the slot).
func notSent(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.Is(err, redis.ErrClosed) || errors.Is(err, errDeposed)
}

// answer records an answered ACQUIRE: its fence (0 for nil) means the token holds a grant.
func (a *attempt) answer(fence uint64) {
	a.answered = true
	a.failures = 0
	if fence != 0 {
		a.fenced = true
	}
}

func (a *attempt) retryPause() time.Duration {
	pause := retryPause << min(max(a.failures-1, 0), 8)
	return max(retryPause, min(pause, maxRetryPause, max(a.left(), 0)))
}

// unsettled: the retries ran out without an answer: unreachable if nothing could have arrived,
// else unknown, after the release of the attempt's token.
func (a *attempt) unsettled(ctx context.Context) error {
	if !a.reached && !a.fenced {
		return &AcquireError{Resource: a.name(), Outcome: OutcomeUnreachable, Token: a.token, Err: a.lastErr}
	}
	released := a.forget(ctx)
	return &AcquireError{Resource: a.name(), Outcome: OutcomeUnknown, Token: a.token, Released: released, Err: a.lastErr}
}

// giveUp: the caller's context ended the attempt. Whatever may have been granted to the token (a
// fence answered after the caller gave up, or a request still on its way) is released; the
// outcome is held if the server answered last, else as unsettled.
func (a *attempt) giveUp(ctx context.Context, cause error) error {
	if a.answered {
		released := false
		if a.reached || a.fenced {
			released = a.forget(ctx)
		}
		return &AcquireError{Resource: a.name(), Outcome: OutcomeHeld, Token: a.token, Released: released, Err: cause}
	}
	if !a.reached && !a.fenced {
		return &AcquireError{Resource: a.name(), Outcome: OutcomeUnreachable, Token: a.token, Err: cause}
	}
	released := a.forget(ctx)
	return &AcquireError{Resource: a.name(), Outcome: OutcomeUnknown, Token: a.token, Released: released, Err: cause}
}

func (a *attempt) serverFailure(err error) error {
	if a.reached || a.fenced {
		a.forget(context.Background())
	}
	return &AcquireError{Resource: a.name(), Outcome: OutcomeServer, Token: a.token, Err: serverError(err)}
}

// forget releases the attempt's token (no FENCE: the fence is unknown; the token is this
// attempt's alone; a set's RELEASEALL without FENCES) from a connection opened for it, once
// more after forgetAgainAfter if the first found nothing. True if a grant (or ticket) was found
// and freed.
func (a *attempt) forget(ctx context.Context) bool {
	ctx = context.WithoutCancel(ctx)
	timeout := a.set.release()
	for try := 0; try < 2; try++ {
		if try > 0 {
			time.Sleep(forgetAgainAfter)
		}
		args := releaseArgs(a.resource, a.token, 0)
		if a.members != nil {
			args = releaseAllArgs(a.members, a.token, nil)
		}
		released, err := a.locks.router.alone(ctx, a.resource, timeout, args)
		if err != nil {
			a.set.log().LogAttrs(ctx, slog.LevelDebug, "dlock: could not release an unknown grant",
				slog.String("resource", a.name()), slog.String("error", err.Error()))
			return false
		}
		if n, _ := asInt(released); n > 0 {
			return true
		}
	}
	return false
}

// fenceOf reads an ACQUIRE reply: a fence, or 0 for nil.
func fenceOf(reply any) (uint64, error) {
	switch v := reply.(type) {
	case nil:
		return 0, nil
	case int64:
		if v > 0 {
			return uint64(v), nil
		}
	}
	return 0, fmt.Errorf("dlock: unexpected DLOCK.ACQUIRE reply %v", reply)
}

// sleep pauses d, or less if ctx ends first (false then).
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
