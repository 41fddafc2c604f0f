package dlock

// Sets of resources (docs/protocol.md, section 7, "Sets of resources"): one token over several
// resources, granted whole or not at all (DLOCK.ACQUIREALL), each member with a fence of its
// own, renewed (DLOCK.RENEWALL … FENCES) and released (DLOCK.RELEASEALL … FENCES) as one lease.
// The lifecycle is a Lease's (renewal, local expiry, loss, release), run on the set's commands.

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// SetLease is a granted set (Locks.HoldAll): its token owns every one of Resources, each with
// its own fence (Fences, in the same order; Fence for one member), kept alive by renewals of
// the whole set (every ttl/3, DLOCK.RENEWALL with the fences) until Release or the loss. The set
// is lost whole: a renewal refused (some member expired, was deleted or revoked:
// ReasonRenewalRefused), an operator's DLOCK.REVOKE of any member's fence heard on its channel
// (ReasonRevoked, at once; the other members are then released), the local expiry without an
// answered renewal (ReasonUnreachable or ReasonStalled), MaxHold, or a release that found a
// member gone (ReasonEnded). Context is cancelled when the set is lost or released; Err says
// why. It counts and logs as one lease, its resource field the members joined by ",", its fence
// field their fences joined by ",".
type SetLease struct {
	lease *Lease
}

// HoldAll acquires an exclusive lease on every one of resources (1 to MaxSetSize, each once, in
// Redis Cluster all in one slot: give them a common hash tag), or on none: a set, granted whole
// in one command (DLOCK.ACQUIREALL), with a fence per resource in the order given. Without a
// wait (Wait(0)) one try; with one (the Wait option, default 10 s, and no longer than ctx
// allows), the set waits in every member's line, first come first served (QUEUE tickets as long
// as the wait, from 1 s to 30 s; 30 s without a limit), holding nothing meanwhile, woken by any
// message on any member's channel; at the wait's end its tickets are withdrawn. The Tickets and
// Blocking options do not apply: a set always waits with tickets. The set is kept renewed until
// Release or its loss. Errors: *AcquireError (errors.Is ErrNotAcquired when some member stayed
// held; its Resource names the members joined by ","), or a caller's mistake (ErrInvalidArgument:
// no resource, too many, one named twice, a ttl of 0).
func (l *Locks) HoldAll(ctx context.Context, resources []string, opts ...Option) (*SetLease, error) {
	if len(resources) < 1 || len(resources) > MaxSetSize {
		return nil, fmt.Errorf("%w: a set has 1 to %d resources, not %d", ErrInvalidArgument, MaxSetSize, len(resources))
	}
	seen := make(map[string]bool, len(resources))
	for _, resource := range resources {
		if seen[resource] {
			return nil, fmt.Errorf("%w: resource %q appears twice in the set", ErrInvalidArgument, resource)
		}
		seen[resource] = true
	}
	members := slices.Clone(resources)
	lease, err := l.try(ctx, &attempt{locks: l, resource: members[0], members: members, set: l.settings(opts)})
	if err != nil {
		return nil, err
	}
	return &SetLease{lease: lease}, nil
}

// DoAll runs fn under a set of exclusive leases on resources (see HoldAll) and releases it when
// fn returns, with Do's rules: fn's context is cancelled when the set is lost; fn's error is
// returned as it is (joined with the *LeaseLostError if the set was lost meanwhile); when fn
// succeeded, a loss returns the *LeaseLostError and a failed release a *ReleaseError.
func (l *Locks) DoAll(ctx context.Context, resources []string, fn func(ctx context.Context, set *SetLease) error, opts ...Option) error {
	set, err := l.HoldAll(ctx, resources, opts...)
	if err != nil {
		return err
	}
	return set.Run(ctx, fn)
}

// Resources are the set's resources, in the order HoldAll was given them.
func (s *SetLease) Resources() []string { return slices.Clone(s.lease.members) }

// Fences are the members' fencing tokens, in the order of Resources: each larger for every
// newer grant of its resource.
func (s *SetLease) Fences() []uint64 { return slices.Clone(s.lease.fences) }

// Fence is the fencing token of the member resource; false if resource is not in the set.
func (s *SetLease) Fence(resource string) (uint64, bool) {
	if i := slices.Index(s.lease.members, resource); i >= 0 {
		return s.lease.fences[i], true
	}
	return 0, false
}

// Token is the set's owner token, the same for every member: random, made before the first
// ACQUIREALL, secret to the holder.
func (s *SetLease) Token() string { return s.lease.token }

// TTL is each member's lease length; the set is renewed every third of it.
func (s *SetLease) TTL() time.Duration { return s.lease.ttl }

// Context is cancelled when the set is lost (its cause, context.Cause, is the *LeaseLostError)
// or released (ErrReleased). It carries the values of the context HoldAll got, not its
// cancellation. Run the protected work under it.
func (s *SetLease) Context() context.Context { return s.lease.ctx }

// Done is closed when the set is lost or released.
func (s *SetLease) Done() <-chan struct{} { return s.lease.Done() }

// Err is nil while the set is held; then a *LeaseLostError (errors.Is ErrLeaseLost; Resources
// and Fences name every member) if it was lost, or ErrReleased once released.
func (s *SetLease) Err() error { return s.lease.Err() }

// LocalExpiry is a conservative end of the set on this process's monotonic clock: counted from
// before the last answered ACQUIREALL or RENEWALL was sent, never after any member's deadline
// on the server.
func (s *SetLease) LocalExpiry() time.Time { return s.lease.LocalExpiry() }

// Check returns the *LeaseLostError if the set is lost, or if its local expiry passed without
// an answered renewal (lost from then on: ReasonUnreachable or ReasonStalled); nil while held.
func (s *SetLease) Check() error { return s.lease.Check() }

// Renew sends a RENEWALL now (the renewer also does, every ttl/3): true renewed, every member;
// false refused (some member is gone: the set is lost, ReasonRenewalRefused); an error when no
// answer came in time. Past the local expiry nothing is sent: the set is lost and that is the
// error.
func (s *SetLease) Renew(ctx context.Context) (bool, error) { return s.lease.Renew(ctx) }

// Release stops the renewals and releases every member (DLOCK.RELEASEALL with the fences), in
// one request bounded by the release timeout, whether or not ctx is cancelled. It returns nil
// when every member was released; the *LeaseLostError when the set was lost before, or is found
// lost now: fewer members released than the set has (one ended before: ReasonEnded; the others
// are released), or its local expiry passed (ReasonStalled or ReasonUnreachable); a
// *ReleaseError when the server did not answer (the members then end with their ttl). Later
// calls return the same.
func (s *SetLease) Release(ctx context.Context) error { return s.lease.Release(ctx) }

// Run runs fn under the set and releases it when fn returns, with Do's rules for errors (see
// Lease.Run). fn's context is ctx, also cancelled when the set is lost.
func (s *SetLease) Run(ctx context.Context, fn func(ctx context.Context, set *SetLease) error) error {
	return runUnder(ctx, s.lease, s, fn)
}

// Fenced runs command (as for Lease.Fenced) in the server only if the fence of the member
// resource still holds it (DLOCK.FENCED resource fence …), and returns its reply. A stale
// fence returns a *StaleError (errors.Is ErrStale): nothing ran. A resource outside the set is
// ErrInvalidArgument, and nothing is sent. Never retried.
func (s *SetLease) Fenced(ctx context.Context, resource string, command ...any) (any, error) {
	fence, ok := s.Fence(resource)
	if !ok {
		return nil, fmt.Errorf("%w: %q is not a resource of the set", ErrInvalidArgument, resource)
	}
	return s.lease.locks.Fenced(ctx, resource, fence, command...)
}

// all is a set's acquire: DLOCK.ACQUIREALL until it answers fences. Without time to wait, one
// try (nil: held). With a wait, QUEUE tickets as long as the wait (setTicket), subscribed to
// every member's channel before the first; the same ACQUIREALL again on any message on any of
// them (a set's ticket is never handed a lease: any change may be its turn), on every
// (re)subscription and every ticket/3. At the wait's end RELEASEALL without FENCES withdraws the
// tickets (and frees a grant whose reply was lost).
func (a *attempt) all(ctx context.Context) (*Lease, error) {
	var ticket time.Duration // 0: no wait
	if a.left() > 0 {
		ticket = setTicket(a.left())
	}
	var (
		wake    chan struct{} // every member's watch wakes it
		watches []*watch
		queued  bool // a ticket may stand in the members' lines
	)
	defer func() {
		for _, w := range watches {
			a.locks.router.channels.leave(w)
		}
	}()
	// The wait's end: held while the server answered (the tickets withdrawn), else as giveUp
	// says (unreachable, or unknown after the release of the token).
	stop := func(cause error) error {
		if queued && a.answered {
			return a.withdraw(ctx, true, cause)
		}
		return a.giveUp(ctx, cause)
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, stop(err)
		}
		if queued && a.left() <= 0 {
			return nil, stop(nil)
		}
		if ticket > 0 && wake == nil {
			// Subscribed before the first ticket: no change in a line goes unheard.
			wake = make(chan struct{}, 1)
			for _, member := range a.members {
				watches = append(watches, a.locks.router.channels.joinWaking(ctx, member, "", a.set.requestTimeout, wake))
			}
		}
		select {
		case <-wake: // a message from now on means: send again
		default:
		}
		sent := time.Now()
		queued = queued || ticket > 0
		reply, err := a.locks.call(ctx, a.resource, a.set.requestTimeout, func(addr string) []any {
			var queueMS int64
			if ticket > 0 {
				queueMS = millis(ticket)
			}
			meta := a.set.hasMeta && !a.locks.isRefused(addr, cmdAcquireAll, "META")
			return acquireAllArgs(a.members, a.token, millis(a.ttl), queueMS, a.set.meta, meta)
		})
		if err != nil {
			if retry, failure := a.failed(err); retry {
				if !sleep(ctx, a.retryPause()) {
					return nil, stop(ctx.Err())
				}
				continue
			} else {
				return nil, failure
			}
		}
		fences, err := fencesOf(reply, len(a.members))
		if err != nil {
			return nil, a.serverFailure(err)
		}
		if fences == nil {
			a.answer(0)
		} else {
			a.answer(fences[0])
			if ctx.Err() != nil {
				return nil, a.giveUp(ctx, ctx.Err())
			}
			return newLease(ctx, a, fences, sent), nil
		}
		if ticket == 0 {
			// Held, and no wait. A request of this attempt that failed on the way may still
			// arrive: then the token is released.
			released := a.reached && a.forget(ctx)
			return nil, &AcquireError{Resource: a.name(), Outcome: OutcomeHeld, Token: a.token, Released: released}
		}
		refresh := time.NewTimer(max(0, min(ticket/3, a.left())))
		select {
		case <-wake:
		case <-refresh.C:
		case <-ctx.Done():
		}
		refresh.Stop()
	}
}

// fencesOf reads an ACQUIREALL reply: n fences, or nil for nil.
func fencesOf(reply any, n int) ([]uint64, error) {
	if reply == nil {
		return nil, nil
	}
	items, ok := reply.([]any)
	if ok && len(items) == n {
		fences := make([]uint64, n)
		for i, item := range items {
			fence, err := fenceOf(item)
			if err != nil || fence == 0 {
				ok = false
				break
			}
			fences[i] = fence
		}
		if ok {
			return fences, nil
		}
	}
	return nil, fmt.Errorf("dlock: unexpected DLOCK.ACQUIREALL reply %v", reply)
}
