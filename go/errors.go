package dlock

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Sentinel errors, for errors.Is. dlock's typed errors (below) match them and carry the details
// (errors.As).
var (
	// ErrNotAcquired: the resource stayed held by others until the wait ended (the Wait option,
	// or the caller's context). Nothing is held.
	ErrNotAcquired = errors.New("dlock: not acquired")
	// ErrUnreachable: no request of the attempt could have reached a server: nothing was granted.
	ErrUnreachable = errors.New("dlock: server unreachable")
	// ErrUnknownOutcome: a request may have reached the server and no answer came before the
	// deadline; the attempt's token was released (AcquireError.Released says whether a grant was
	// found).
	ErrUnknownOutcome = errors.New("dlock: outcome of the acquire unknown")
	// ErrLeaseLost: the lease ended before the work did; work after that was not protected.
	ErrLeaseLost = errors.New("dlock: lease lost")
	// ErrNotReleased: the lease's release got no answer in time: it ends with its ttl. (A lease
	// found gone at the release is a *LeaseLostError with ReasonEnded, not this.)
	ErrNotReleased = errors.New("dlock: lease not released")
	// ErrStale: a fenced write was refused because its fence no longer holds: nothing ran.
	ErrStale = errors.New("dlock: stale fence")
	// ErrCrossSlot: a fenced command's key is outside the resource's slot (Redis Cluster).
	ErrCrossSlot = errors.New("dlock: key outside the resource's slot")
	// ErrModeConflict: the token holds the other mode (shared or exclusive): a caller's bug.
	ErrModeConflict = errors.New("dlock: lock mode conflict")
	// ErrUnsupported: the server's dlock module is too old for the request.
	ErrUnsupported = errors.New("dlock: not supported by the server")
	// ErrInvalidArgument: a caller's mistake found before anything was sent (a ttl of 0, a
	// semaphore of 0 permits).
	ErrInvalidArgument = errors.New("dlock: invalid argument")
	// ErrReleased: the lease was released by its holder (Lease.Err after Release).
	ErrReleased = errors.New("dlock: lease released")
)

// Loss reasons (docs/protocol.md, section 4): LeaseLostError.Reason, the metrics' reason label
// and the log field.
const (
	ReasonRenewalRefused = "renewal_refused"
	ReasonUnreachable    = "unreachable"
	// ReasonStalled: the local expiry passed with no renewal awaiting an answer: this process
	// did not run in time to send the renewal that was due (a stopped process, a long pause),
	// while the server, as far as the client knows, was reachable. ReasonUnreachable instead
	// when the last renewal sent failed, timed out or was still awaited.
	ReasonStalled = "stalled"
	ReasonMaxHold = "max_hold"
	ReasonEnded   = "ended"
	ReasonRevoked = "revoked"
)

// Outcomes of an acquire that did not grant (AcquireError.Outcome).
const (
	OutcomeHeld        = "held"
	OutcomeUnreachable = "unreachable"
	OutcomeUnknown     = "unknown"
	OutcomeServer      = "server"
)

// AcquireError is why Hold (or Do, Read, Write, Semaphore, Campaign) returned no lease.
type AcquireError struct {
	Resource string
	// Outcome: OutcomeHeld (errors.Is ErrNotAcquired), OutcomeUnreachable (ErrUnreachable),
	// OutcomeUnknown (ErrUnknownOutcome) or OutcomeServer (the server refused: Err is its
	// *ServerError).
	Outcome string
	// Token is the attempt's token (with OutcomeUnknown: the one that was released).
	Token string
	// Released: whether the release of Token found a grant and freed it (OutcomeUnknown, or
	// OutcomeHeld when a grant was answered after the caller's context ended).
	Released bool
	// Err is the cause: the caller's context error, the last transport error, or the server's.
	Err error
}

func (e *AcquireError) Error() string {
	switch e.Outcome {
	case OutcomeHeld:
		if e.Err != nil {
			return fmt.Sprintf("dlock: %q not acquired: held by another owner (%v)", e.Resource, e.Err)
		}
		return fmt.Sprintf("dlock: %q not acquired: held by another owner", e.Resource)
	case OutcomeUnknown:
		return fmt.Sprintf("dlock: %q: outcome unknown (token released: %v): %v", e.Resource, e.Released, e.Err)
	}
	return fmt.Sprintf("dlock: %q not acquired (%s): %v", e.Resource, e.Outcome, e.Err)
}

// Unwrap gives the cause.
func (e *AcquireError) Unwrap() error { return e.Err }

// Is matches the sentinel of the outcome.
func (e *AcquireError) Is(target error) bool {
	switch e.Outcome {
	case OutcomeHeld:
		return target == ErrNotAcquired
	case OutcomeUnreachable:
		return target == ErrUnreachable
	case OutcomeUnknown:
		return target == ErrUnknownOutcome
	}
	return false
}

// LeaseLostError says which lease was lost and why. A set (HoldAll) is lost whole: Resources
// and Fences name every member in the caller's order, Resource and Fence are the first one's.
type LeaseLostError struct {
	Resource string
	Fence    uint64
	// Resources and Fences: a set's members and their fences; nil for a single lease.
	Resources []string
	Fences    []uint64
	// Reason: ReasonRenewalRefused, ReasonUnreachable, ReasonStalled, ReasonMaxHold,
	// ReasonEnded or ReasonRevoked.
	Reason string
	// Detail: with ReasonRevoked, the reason the operator gave DLOCK.REVOKE (empty if none);
	// empty for the other reasons.
	Detail string
}

func (e *LeaseLostError) Error() string {
	what := fmt.Sprintf("lease on %q (fence %d)", e.Resource, e.Fence)
	if e.Resources != nil {
		what = fmt.Sprintf("set lease on %s (fences %s)", quoteAll(e.Resources), joinFences(e.Fences))
	}
	if e.Detail != "" {
		return fmt.Sprintf("dlock: %s lost: %s: %s", what, e.Reason, e.Detail)
	}
	return fmt.Sprintf("dlock: %s lost: %s", what, e.Reason)
}

// Is matches ErrLeaseLost.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// ReleaseError: the release of a lease got no answer in time (Err: the transport error or the
// timeout); the lease ends with its ttl. Release returns it, and Run or Do when the work
// succeeded. A release that finds the lease gone returns the *LeaseLostError (ReasonEnded)
// instead.
type ReleaseError struct {
	Resource string
	Fence    uint64
	// Resources and Fences: a set's members and their fences (Resource and Fence are the first
	// one's); nil for a single lease.
	Resources []string
	Fences    []uint64
	Err       error
}

func (e *ReleaseError) Error() string {
	if e.Resources != nil {
		return fmt.Sprintf("dlock: set lease on %s (fences %s) not released: %v", quoteAll(e.Resources), joinFences(e.Fences), e.Err)
	}
	return fmt.Sprintf("dlock: lease on %q (fence %d) not released: %v", e.Resource, e.Fence, e.Err)
}

// quoteAll is resources quoted, joined by ", ".
func quoteAll(resources []string) string {
	quoted := make([]string, len(resources))
	for i, resource := range resources {
		quoted[i] = strconv.Quote(resource)
	}
	return strings.Join(quoted, ", ")
}

// joinFences is fences joined by "," (a set's fence in its log lines).
func joinFences(fences []uint64) string {
	text := make([]string, len(fences))
	for i, fence := range fences {
		text[i] = unum(fence)
	}
	return strings.Join(text, ",")
}

// Unwrap gives the cause.
func (e *ReleaseError) Unwrap() error { return e.Err }

// Is matches ErrNotReleased.
func (e *ReleaseError) Is(target error) bool { return target == ErrNotReleased }

// StaleError: the server refused a fenced write (DLOCK.FENCED): Fence no longer holds Resource.
// Nothing was written. Detail is the server's message.
type StaleError struct {
	Resource string
	Fence    uint64
	Detail   string
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("dlock: stale fence %d on %q, write refused: %s", e.Fence, e.Resource, e.Detail)
}

// Is matches ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// ServerError is an error reply of the server with its class (docs/protocol.md, section 9).
type ServerError struct {
	Class string
	Reply string
}

func (e *ServerError) Error() string { return e.Reply }

// Is matches ErrCrossSlot, ErrModeConflict, ErrUnsupported or ErrStale by class.
func (e *ServerError) Is(target error) bool {
	switch e.Class {
	case ClassCrossSlot:
		return target == ErrCrossSlot
	case ClassModeConflict:
		return target == ErrModeConflict
	case ClassUnsupported:
		return target == ErrUnsupported
	case ClassStale:
		return target == ErrStale
	}
	return false
}

// Class is the class of the server error reply err carries (ClassStale, ClassCrossSlot, …), or ""
// for an error of the client's own side (a connection, a timeout) and for nil.
func Class(err error) string {
	var server *ServerError
	if errors.As(err, &server) {
		return server.Class
	}
	var stale *StaleError
	if errors.As(err, &stale) {
		return ClassStale
	}
	if reply := errorReply(err); reply != "" {
		return ErrorClass(reply)
	}
	return ""
}

// errorReply is the server's error reply err carries (go-redis keeps the whole text, code
// first), or "" for any other error (redis.Nil included).
func errorReply(err error) string {
	if err == nil || errors.Is(err, redis.Nil) {
		return ""
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return reply.Error()
	}
	return ""
}
