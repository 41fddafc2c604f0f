package dlock

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// maxHoldRounding: a lease cut to end with MaxHold ends up to this much before it (milliseconds
// round down).
const maxHoldRounding = 2 * time.Millisecond

// Lease is a granted lease: its token owns the resource with Fence until the server's deadline,
// kept alive by renewals (every ttl/3, with FENCE) until Release or the loss. An operator's
// DLOCK.REVOKE of its fence, heard on the resource's channel, loses it at once (ReasonRevoked).
// Context is cancelled when the lease is lost or released; Err says why.
//
// A set (Locks.HoldAll) runs on a Lease too, hidden in its *SetLease: the same lifecycle, with
// the set's commands (RENEWALL, RELEASEALL) over all its members.
type Lease struct {
	locks    *Locks
	resource string
	token    string
	fence    uint64
	mode     mode
	ttl      time.Duration
	set      settings
	log      *slog.Logger
	metrics  Metrics
	granted  time.Time
	holdEnd  time.Time // zero: no MaxHold

	// Every resource the lease holds with its fence: the one resource and fence above, or a
	// set's members in the caller's order (resource and fence are then the first member's,
	// where the set's commands are routed). isSet: renewed and released as a set.
	members []string
	fences  []uint64
	isSet   bool

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu          sync.Mutex
	localExpiry time.Time // conservative: the answered request's send time plus the ttl
	nextRenewal time.Time
	// renewing counts the RENEWs sent and not yet answered (nor timed out); renewalFailed says
	// that the last one to end got no answer. At the local expiry they pick the loss's reason:
	// unreachable if a renewal is awaited or failed, else stalled (the process did not run in
	// time to send the renewal that was due).
	renewing      int
	renewalFailed bool
	ended         error // *LeaseLostError or ErrReleased, once
	released      error // Release's result, once it ran
	releasing     bool

	stop     chan struct{} // closed by Release: the renewer exits
	finished chan struct{} // closed by the renewer when it exits
	once     sync.Once

	// The lease's watches on its resources' channels, where a revocation of a fence is heard,
	// from the grant until the lease ends.
	watches []*watch
	leave   sync.Once

	// claim: a lease started on its ticket's granted message, claimed by a RENEW sent at the
	// grant; its answer is the first renewal (nil: none, or read by Renew).
	claim *pendingClaim
}

// pendingClaim is the claim of a lease started on its ticket's message: done is closed once
// its RENEW was answered (renewed, as renewOnce's) or failed (err).
type pendingClaim struct {
	done    chan struct{}
	renewed bool
	err     error
}

// newLease starts the lease an attempt was granted with fences (one per member of the
// attempt's set, else one) by a request sent at sent.
func newLease(ctx context.Context, a *attempt, fences []uint64, sent time.Time) *Lease {
	return startLease(ctx, a, fences, sent.Add(asSent(a.ttl)), sent.Add(renewEvery(a.ttl)), false)
}

// startedLease starts the lease a ticket's own channel announced (granted with fence, held
// until expiry unless claimed): its claim, a RENEW with the fence that sets the full ttl, is
// sent at once on a goroutine of its own, not awaited; its answer is the lease's first renewal
// (1: renewed from the claim's send; 0: lost, renewal_refused), which the renewer (or Renew)
// reads instead of sending its own.
func startedLease(ctx context.Context, a *attempt, fence uint64, expiry time.Time) *Lease {
	return startLease(ctx, a, []uint64{fence}, expiry, expiry, true)
}

// startLease starts a lease of fences held until localExpiry, renewed first at nextRenewal, or
// by a claim sent now (claim: nextRenewal waits for its answer).
func startLease(ctx context.Context, a *attempt, fences []uint64, localExpiry, nextRenewal time.Time, claim bool) *Lease {
	l := a.locks
	logger, metrics := a.set.observe()
	lease := &Lease{
		locks: l, resource: a.resource, token: a.token, fence: fences[0], mode: a.mode, ttl: a.ttl,
		set: a.set, log: logger, metrics: metrics, granted: time.Now(), holdEnd: a.holdEnd,
		members: a.resources(), fences: fences, isSet: a.members != nil,
		localExpiry: localExpiry, nextRenewal: nextRenewal,
		stop: make(chan struct{}), finished: make(chan struct{}),
	}
	var pending *pendingClaim
	if claim {
		pending = &pendingClaim{done: make(chan struct{})}
		lease.claim = pending
		lease.renewing++ // the claim: awaited from now on
	}
	// The caller's values, not its cancellation: the caller's context bounded the wait only.
	lease.ctx, lease.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	// Listening for a revocation starts now, without waiting for the subscription's
	// confirmation (docs/protocol.md, section 4): one that races it is caught by the renewal.
	for i, member := range lease.members {
		lease.watches = append(lease.watches, l.router.channels.hold(member, fences[i], lease.revoke))
	}
	if pending != nil {
		claimDone := l.router.use()
		go func() {
			defer claimDone()
			pending.renewed, pending.err = lease.renewSent(context.Background())
			close(pending.done)
		}()
	}
	done := l.router.use()
	go func() {
		defer done()
		lease.renew()
	}()
	return lease
}

// Resource is the locked resource (the Redis key of the lock).
func (l *Lease) Resource() string { return l.resource }

// Token is the lease's owner token: random, made before the first ACQUIRE, secret to the holder.
func (l *Lease) Token() string { return l.token }

// Fence is the fencing token: larger for every newer grant of the resource. Send it with every
// write the lease protects (Fenced, or a `WHERE fence <= $fence` guard in SQL).
func (l *Lease) Fence() uint64 { return l.fence }

// Mode is "exclusive" (Hold, Write, Campaign) or "shared" (Read, Semaphore).
func (l *Lease) Mode() string { return l.mode.name() }

// TTL is the lease's length; it is renewed every third of it.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Context is cancelled when the lease is lost (its cause, context.Cause, is the
// *LeaseLostError) or released (ErrReleased). It carries the values of the context Hold got, not
// its cancellation. Run the protected work under it.
func (l *Lease) Context() context.Context { return l.ctx }

// Done is closed when the lease is lost or released.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err is nil while the lease is held; then a *LeaseLostError (errors.Is ErrLeaseLost) if it was
// lost, or ErrReleased once released.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ended
}

// LocalExpiry is a conservative end of the lease on this process's monotonic clock: counted from
// before the last answered ACQUIRE or RENEW was sent, never after the server's deadline. A lease
// a ticket started on its own channel's message (Tickets) has the claim window, counted from
// before an ACQUIRE the server read before the grant, until its claim's answer is read.
func (l *Lease) LocalExpiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.localExpiry
}

// Check returns the *LeaseLostError if the lease is lost, or if its local expiry passed without
// an answered renewal (it counts as lost from then on: ReasonUnreachable or ReasonStalled); nil
// while it holds.
func (l *Lease) Check() error {
	l.loseIfExpired(time.Now())
	return l.lost()
}

// loseIfExpired loses the lease if its local expiry is not after now: ReasonUnreachable when the
// last renewal sent got no answer (it failed, timed out or is still awaited), ReasonStalled when
// none was awaited (the process did not run in time to send the one that was due, or to read
// its answer). True if the local expiry passed (lost now or before).
func (l *Lease) loseIfExpired(now time.Time) bool {
	l.mu.Lock()
	if now.Before(l.localExpiry) {
		l.mu.Unlock()
		return false
	}
	reason := ReasonStalled
	if l.renewing > 0 || l.renewalFailed {
		reason = ReasonUnreachable
	}
	l.mu.Unlock()
	l.lose(reason)
	return true
}

// lost is the *LeaseLostError if the lease was lost, else nil.
func (l *Lease) lost() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lost *LeaseLostError
	if errors.As(l.ended, &lost) {
		return lost
	}
	return nil
}

// lose marks the lease lost (once): cancels its context, logs, counts.
func (l *Lease) lose(reason string) bool { return l.loseWith(reason, "") }

// loseWith is lose with a detail (a revocation's reason).
func (l *Lease) loseWith(reason, detail string) bool {
	l.mu.Lock()
	if l.ended != nil {
		l.mu.Unlock()
		return false
	}
	lost := &LeaseLostError{Resource: l.resource, Fence: l.fence, Reason: reason, Detail: detail}
	if l.isSet {
		lost.Resources, lost.Fences = l.members, l.fences
	}
	l.ended = lost
	l.mu.Unlock()
	l.cancel(lost)
	l.metrics.LeaseLost(reason)
	attrs := []slog.Attr{slog.String("reason", reason)}
	if detail != "" {
		attrs = append(attrs, slog.String("detail", detail))
	}
	l.logLine(slog.LevelWarn, logLost, attrs...)
	return true
}

// logLine logs one of the lease's lines: a set's resource and fence fields are its members' and
// their fences, each joined by ",".
func (l *Lease) logLine(level slog.Level, msg string, attrs ...slog.Attr) {
	if !l.isSet {
		logLease(l.log, level, msg, l.resource, l.token, slog.Uint64Value(l.fence), attrs...)
		return
	}
	logLease(l.log, level, msg, strings.Join(l.members, ","), l.token, slog.StringValue(joinFences(l.fences)), attrs...)
}

// revoke: the channel said that an operator revoked this lease (a set: one of its members)
// (DLOCK.REVOKE), for reason.
func (l *Lease) revoke(reason string) { l.loseWith(ReasonRevoked, reason) }

// leaveChannel stops listening for a revocation, once the lease ended.
func (l *Lease) leaveChannel() {
	l.leave.Do(func() {
		for _, w := range l.watches {
			l.locks.router.channels.leave(w)
		}
	})
}

// renewArgs is the lease's RENEW (a set's RENEWALL) of ttlMS for the server at addr.
func (l *Lease) renewArgs(addr string, ttlMS int64) []any {
	if l.isSet {
		return renewAllArgs(l.members, l.token, ttlMS, l.fences)
	}
	return renewArgs(l.resource, l.token, ttlMS, l.locks.fenceArg(addr, cmdRenew, l.fence))
}

// releaseArgs is the lease's RELEASE (a set's RELEASEALL), with its fences, for the server at
// addr. Answered len(members) when everything was released.
func (l *Lease) releaseArgs(addr string) []any {
	if l.isSet {
		return releaseAllArgs(l.members, l.token, l.fences)
	}
	return releaseArgs(l.resource, l.token, l.locks.fenceArg(addr, cmdRelease, l.fence))
}

// renew runs until Release or the loss: a RENEW every ttl/3, retried every ttl/10 after a
// failure, until the local expiry.
func (l *Lease) renew() {
	defer close(l.finished)
	var claimed <-chan struct{} // a pending claim's answer: the first renewal
	l.mu.Lock()
	if l.claim != nil {
		claimed = l.claim.done
	}
	l.mu.Unlock()
	for {
		l.mu.Lock()
		due := l.nextRenewal
		if l.localExpiry.Before(due) {
			due = l.localExpiry
		}
		if !l.holdEnd.IsZero() && l.holdEnd.Add(-maxHoldRounding).Before(due) {
			due = l.holdEnd.Add(-maxHoldRounding)
		}
		l.mu.Unlock()
		timer := time.NewTimer(time.Until(due))
		select {
		case <-l.stop:
			timer.Stop()
			return
		case <-l.ctx.Done():
			timer.Stop()
			l.forgetAfterLoss()
			l.leaveChannel()
			return
		case <-l.locks.router.primaryMoved():
			// Sentinel named another primary: renew there now, while the lease it replicated
			// still holds (the old primary's answers extended nothing there).
			timer.Stop()
			l.mu.Lock()
			l.nextRenewal = time.Now()
			l.mu.Unlock()
		case <-claimed:
			// The claim answered (its answer already counted, as a renewal's): the next
			// renewal is due ttl/3 from now, or sooner after a failure.
			timer.Stop()
			claimed = nil
			l.mu.Lock()
			l.claim = nil // read: Renew sends a RENEW of its own from now on
			l.mu.Unlock()
			continue
		case <-timer.C:
		}
		now := time.Now()
		if !l.holdEnd.IsZero() && !now.Before(l.holdEnd.Add(-maxHoldRounding)) {
			l.lose(ReasonMaxHold)
			continue
		}
		// The expiry first: a renewal found due after it is not sent.
		if l.loseIfExpired(now) {
			continue
		}
		l.mu.Lock()
		dueNow := !now.Before(l.nextRenewal)
		l.mu.Unlock()
		if dueNow {
			l.renewOnce(context.Background())
		}
	}
}

// renewOnce sends one RENEW: true renewed, false refused (the lease is lost), an error when no
// answer came in time (retried after ttl/10 until the local expiry).
func (l *Lease) renewOnce(ctx context.Context) (bool, error) {
	l.mu.Lock()
	l.renewing++
	l.mu.Unlock()
	return l.renewSent(ctx)
}

// renewSent is renewOnce with its RENEW already counted as awaited (renewing).
func (l *Lease) renewSent(ctx context.Context) (bool, error) {
	ttl := l.ttl
	if !l.holdEnd.IsZero() {
		// Never past MaxHold: the server's lease ends with the hold.
		ttl = min(ttl, time.Until(l.holdEnd))
	}
	sent := time.Now()
	timeout := min(l.set.requestTimeout, l.LocalExpiry().Sub(sent))
	if timeout <= 0 {
		timeout = time.Millisecond
	}
	reply, err := l.locks.call(ctx, l.resource, timeout, func(addr string) []any {
		return l.renewArgs(addr, millis(ttl))
	})
	var n int64
	if err == nil {
		n, err = asInt(reply)
	}
	l.mu.Lock()
	l.renewing--
	l.renewalFailed = err != nil
	if err == nil && n == 1 {
		l.localExpiry = sent.Add(asSent(ttl))
		l.nextRenewal = time.Now().Add(renewEvery(l.ttl))
	}
	l.mu.Unlock()
	if err == nil && n == 1 {
		return true, nil
	}
	if err == nil {
		l.metrics.RenewalFailed("refused")
		l.logLine(slog.LevelWarn, logRenewalFailed, slog.String("reason", "refused"))
		l.mu.Lock()
		releasing := l.releasing
		l.mu.Unlock()
		if !releasing { // a RENEW in flight as Release ran may be refused: not a loss
			l.lose(ReasonRenewalRefused)
		}
		return false, nil
	}
	l.metrics.RenewalFailed("error")
	l.logLine(slog.LevelWarn, logRenewalFailed, slog.String("reason", "error"), slog.String("error", err.Error()))
	l.mu.Lock()
	l.nextRenewal = time.Now().Add(renewRetry(l.ttl))
	l.mu.Unlock()
	return false, err
}

// Renew sends a RENEW now (the renewer also does, every ttl/3): true renewed; false refused, and
// the lease is lost (ReasonRenewalRefused); an error when no answer came in time. Past the local
// expiry nothing is sent: the lease is lost (as for Check) and that is the error.
func (l *Lease) Renew(ctx context.Context) (bool, error) {
	if err := l.Err(); err != nil {
		return false, err
	}
	// A lease started on its ticket's message answers with its claim first (sent at the grant).
	l.mu.Lock()
	claim := l.claim
	l.claim = nil
	l.mu.Unlock()
	if claim != nil {
		select {
		case <-claim.done:
			return claim.renewed, claim.err
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	if l.loseIfExpired(time.Now()) {
		return false, l.Err()
	}
	return l.renewOnce(ctx)
}

// forgetAfterLoss: a best-effort RELEASE with FENCE after a loss (a lease the server still
// holds passes on at once instead of at its ttl); none after a revocation, which ended the
// lease on the server (a set's RELEASEALL still goes: the members not revoked are held).
func (l *Lease) forgetAfterLoss() {
	if lost, ok := l.lost().(*LeaseLostError); ok && lost.Reason == ReasonRevoked && !l.isSet {
		l.metrics.Held(time.Since(l.granted))
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), l.set.release())
	defer cancel()
	_, _ = l.locks.call(ctx, l.resource, l.set.release(), l.releaseArgs)
	l.metrics.Held(time.Since(l.granted))
}

// Release stops the renewals and releases the lease (DLOCK.RELEASE with FENCE), in one request
// bounded by the release timeout, whether or not ctx is cancelled (ctx gives its values only).
// It returns nil when released; the *LeaseLostError when the lease was lost before, or is found
// lost now: gone on the server (ReasonEnded), or its local expiry passed (ReasonStalled or
// ReasonUnreachable, as for Check; a best-effort RELEASE is still sent); a *ReleaseError when
// the server did not answer (the lease then ends with its ttl). Only that last one counts as a
// release failure (Metrics.ReleaseFailed, logged "dlock: release failed"); a loss is counted
// once, as a loss. Later calls return the same.
func (l *Lease) Release(ctx context.Context) error {
	l.once.Do(func() {
		l.mu.Lock()
		l.releasing = true
		l.mu.Unlock()
		close(l.stop)
		<-l.finished
		defer l.leaveChannel() // after the RELEASE: a revocation until then is still heard
		if lost := l.lost(); lost != nil {
			l.released = lost
			return
		}
		if l.loseIfExpired(time.Now()) {
			// Past the local expiry the lease counts as lost (Check): the work's end was not
			// protected. The RELEASE that follows is the best effort after a loss.
			l.forgetAfterLoss()
			l.released = l.lost()
			return
		}
		l.released = l.release(ctx)
	})
	return l.released
}

func (l *Lease) release(ctx context.Context) error {
	timeout := l.set.release()
	call, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	reply, err := l.locks.call(call, l.resource, timeout, l.releaseArgs)
	l.metrics.Held(time.Since(l.granted))
	var n int64
	if err == nil {
		n, err = asInt(reply)
	}
	if err == nil && n == int64(len(l.members)) {
		l.mu.Lock()
		l.ended = ErrReleased
		l.mu.Unlock()
		l.cancel(ErrReleased)
		l.logLine(slog.LevelInfo, logReleased)
		return nil
	}
	if err == nil {
		// Gone before the work ended (a set: some member was): the end of the work was not
		// protected. That is the loss (ended), logged and counted as one, not a release
		// failure as well.
		l.lose(ReasonEnded)
		return l.lost()
	}
	// No answer (or an error reply) for a lease believed live: a release failure.
	l.metrics.ReleaseFailed()
	l.logLine(slog.LevelWarn, logReleaseFailed, slog.String("error", err.Error()))
	if !time.Now().Before(l.LocalExpiry()) {
		l.lose(ReasonUnreachable)
		return l.lost()
	}
	l.mu.Lock()
	l.ended = ErrReleased
	l.mu.Unlock()
	l.cancel(ErrReleased)
	failed := &ReleaseError{Resource: l.resource, Fence: l.fence, Err: err}
	if l.isSet {
		failed.Resources, failed.Fences = l.members, l.fences
	}
	return failed
}

// Fenced runs command (its name and arguments, as for go-redis's Do) in the server only if this
// lease's fence still holds the resource (DLOCK.FENCED), atomically, and returns its reply (nil
// for a nil reply). A stale fence returns a *StaleError (errors.Is ErrStale): nothing ran. In
// Redis Cluster every key of command must hash to the resource's slot (ErrCrossSlot otherwise).
// Never retried: a retried write after a lost reply could run twice.
func (l *Lease) Fenced(ctx context.Context, command ...any) (any, error) {
	return l.locks.Fenced(ctx, l.resource, l.fence, command...)
}

// FenceCheck says whether this lease's fence still holds the resource on the server.
func (l *Lease) FenceCheck(ctx context.Context) (bool, error) {
	return l.locks.FenceCheck(ctx, l.resource, l.fence)
}
