package dlock_test

// Sets of resources (Locks.HoldAll: DLOCK.ACQUIREALL, RENEWALL, RELEASEALL) against real servers
// (docs/protocol.md, section 7, "Sets of resources").

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// calls is how many times the server ran command (INFO commandstats).
func calls(t *testing.T, rdb *redis.Client, command string) int {
	t.Helper()
	text, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\r\n") {
		if stats, ok := strings.CutPrefix(line, "cmdstat_"+command+":calls="); ok {
			n, err := strconv.Atoi(strings.SplitN(stats, ",", 2)[0])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// tally is what the metrics hook was told.
type tally struct {
	attempts, acquired, held, releaseFailures int
	failed, lost                              []string
}

// figures records what the metrics hook is told.
type figures struct {
	mu sync.Mutex
	t  tally
}

func (f *figures) add(do func(t *tally)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	do(&f.t)
}
func (f *figures) AcquireAttempt()        { f.add(func(t *tally) { t.attempts++ }) }
func (f *figures) AcquireFailed(r string) { f.add(func(t *tally) { t.failed = append(t.failed, r) }) }
func (f *figures) Acquired(time.Duration) { f.add(func(t *tally) { t.acquired++ }) }
func (f *figures) Held(time.Duration)     { f.add(func(t *tally) { t.held++ }) }
func (f *figures) RenewalFailed(string)   {}
func (f *figures) ReleaseFailed()         { f.add(func(t *tally) { t.releaseFailures++ }) }
func (f *figures) LeaseLost(r string)     { f.add(func(t *tally) { t.lost = append(t.lost, r) }) }
func (f *figures) StaleWrite()            {}
func (f *figures) Redirect()              {}

func (f *figures) snapshot() tally {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

// owner is DLOCK.INFO's owner of resource ("" when nobody holds it).
func owner(t *testing.T, locks *dlock.Locks, resource string) string {
	t.Helper()
	info, err := locks.Info(context.Background(), resource)
	if err != nil {
		t.Fatal(err)
	}
	if info == nil || info.Owner == nil {
		return ""
	}
	return *info.Owner
}

// lostSet checks that err is the whole set's loss for reason.
func lostSet(t *testing.T, err error, set *dlock.SetLease, reason string) *dlock.LeaseLostError {
	t.Helper()
	var lost *dlock.LeaseLostError
	if !errors.Is(err, dlock.ErrLeaseLost) || !errors.As(err, &lost) {
		t.Fatalf("not a lost set: %v", err)
	}
	if lost.Reason != reason || !slices.Equal(lost.Resources, set.Resources()) ||
		!slices.Equal(lost.Fences, set.Fences()) || lost.Resource != set.Resources()[0] ||
		lost.Fence != set.Fences()[0] {
		t.Fatalf("lost %+v, want %s of the set %v %v", lost, reason, set.Resources(), set.Fences())
	}
	return lost
}

var accounts = []string{"{acct}:bob", "{acct}:alice"} // not in key order: the caller's order counts

func TestASetIsCheckedBeforeAnythingIsSent(t *testing.T) {
	t.Parallel()
	// Nothing listens there: a call that sent anything would fail as unreachable instead.
	locks := newLocks(t, redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}))
	ctx := context.Background()
	many := make([]string, dlock.MaxSetSize+1)
	for i := range many {
		many[i] = fmt.Sprintf("k%d", i)
	}
	for _, resources := range [][]string{nil, {"a", "b", "a"}, many} {
		if _, err := locks.HoldAll(ctx, resources); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Fatalf("HoldAll(%d resources): %v", len(resources), err)
		}
	}
	if _, err := locks.HoldAll(ctx, []string{"a"}, dlock.TTL(0)); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("a ttl of 0: %v", err)
	}
}

func TestASetWhoseRepliesAreLostIsUnknownAndItsGrantReleased(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	proxy := testkit.StartProxy(t, server.Addr(), "DLOCK.ACQUIREALL") // the set is granted, unanswered
	locks := newLocks(t, redis.NewClient(&redis.Options{Addr: proxy.Addr()}), dlock.RequestTimeout(200*time.Millisecond))
	ctx := context.Background()
	for _, wait := range []time.Duration{0, 500 * time.Millisecond} {
		_, err := locks.HoldAll(ctx, accounts, dlock.Wait(wait))
		var failed *dlock.AcquireError
		if !errors.Is(err, dlock.ErrUnknownOutcome) || !errors.As(err, &failed) || !failed.Released {
			t.Fatalf("Wait(%v), every reply lost: %v", wait, err)
		}
		if n := rdb.Exists(ctx, accounts...).Val(); n != 0 {
			t.Fatalf("Wait(%v): %d members left held by the unknown grant", wait, n)
		}
	}
}

func TestASetIsGrantedWholeRenewedAndReleasedWhole(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	seen := &figures{}
	logs := &lockedBuffer{}
	locks := newLocks(t, server.Client(t), dlock.WithMetrics(seen),
		dlock.Logger(slog.New(slog.NewTextHandler(logs, nil))))
	ctx := context.Background()

	set, err := locks.HoldAll(ctx, accounts, dlock.TTL(600*time.Millisecond), dlock.Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	fences := set.Fences()
	if !slices.Equal(set.Resources(), accounts) || len(fences) != 2 || !(fences[1] > fences[0] && fences[0] > 0) {
		t.Fatalf("resources %v, fences %v: a fence per member, in the order asked", set.Resources(), fences)
	}
	for i, resource := range accounts {
		if fence, ok := set.Fence(resource); !ok || fence != fences[i] {
			t.Fatalf("Fence(%s) = %d, %v; want %d", resource, fence, ok, fences[i])
		}
		if holder := owner(t, locks, resource); holder != set.Token() {
			t.Fatalf("%s is owned by %q, not the set's token", resource, holder)
		}
	}
	if _, ok := set.Fence("{acct}:carol"); ok {
		t.Fatal("a fence for a resource outside the set")
	}
	if _, err := set.Fenced(ctx, "{acct}:carol", "SET", "{acct}:ledger", "0"); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("a fenced write under a resource outside the set: %v", err)
	}
	if reply, err := set.Fenced(ctx, accounts[1], "SET", "{acct}:ledger", "1"); err != nil || reply != "OK" {
		t.Fatalf("a fenced write under a member's fence: %v, %v", reply, err)
	}
	time.Sleep(900 * time.Millisecond) // past the ttl: renewals (RENEWALL) keep every member
	if err := set.Check(); err != nil {
		t.Fatal(err)
	}
	for i, resource := range accounts {
		if ok, err := locks.FenceCheck(ctx, resource, fences[i]); err != nil || !ok {
			t.Fatalf("%s past the ttl: %v, %v", resource, ok, err)
		}
	}
	if n := calls(t, rdb, "dlock.renewall"); n < 2 {
		t.Fatalf("%d RENEWALLs in 900 ms of a 600 ms set", n)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(set.Err(), dlock.ErrReleased) || set.Context().Err() == nil {
		t.Fatalf("after Release: Err %v, context %v", set.Err(), set.Context().Err())
	}
	if n := rdb.Exists(ctx, accounts...).Val(); n != 0 {
		t.Fatalf("%d members left after the release", n)
	}
	if calls(t, rdb, "dlock.releaseall") != 1 || calls(t, rdb, "dlock.release") != 0 || calls(t, rdb, "dlock.renew") != 0 {
		t.Fatal("not one RELEASEALL, or single-lease commands sent")
	}
	got := seen.snapshot()
	if got.attempts != 1 || got.acquired != 1 || got.held != 1 || len(got.lost) != 0 || got.releaseFailures != 0 {
		t.Fatalf("figures %+v: one attempt, one grant, one hold", got)
	}
	joined := fmt.Sprintf("resource=%s,%s owner=%s fence=%d,%d", accounts[0], accounts[1], set.Token(), fences[0], fences[1])
	for _, line := range []string{"dlock: lease acquired", "dlock: lease released"} {
		if n := strings.Count(logs.String(), `msg="`+line+`" `+joined); n != 1 {
			t.Fatalf("%d lines %q with %s in:\n%s", n, line, joined, logs)
		}
	}
}

func TestASetWithAHeldMemberIsNotAcquiredAndTakesNothing(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	seen := &figures{}
	locks := newLocks(t, server.Client(t), dlock.WithMetrics(seen))
	ctx := context.Background()
	held, err := locks.Hold(ctx, accounts[1], dlock.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)

	_, err = locks.HoldAll(ctx, accounts, dlock.Wait(0))
	var failed *dlock.AcquireError
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.As(err, &failed) || failed.Resource != strings.Join(accounts, ",") {
		t.Fatalf("a set with a held member: %v", err)
	}
	if rdb.Exists(ctx, accounts[0]).Val() != 0 || owner(t, locks, accounts[1]) != held.Token() {
		t.Fatal("the set took something")
	}
	// A wait that ends unsatisfied: its tickets leave every line.
	started := time.Now()
	if _, err := locks.HoldAll(ctx, accounts, dlock.Wait(300*time.Millisecond)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a set whose wait ended: %v", err)
	}
	if took := time.Since(started); took > 2*time.Second {
		t.Fatalf("a 300 ms wait took %v", took)
	}
	info, err := locks.Info(ctx, accounts[1])
	if err != nil || info.Tickets != 0 || rdb.Exists(ctx, accounts[0]).Val() != 0 {
		t.Fatalf("the set's tickets stayed in line: %+v, %v", info, err)
	}
	// The withdrawal is the release of an attempt's token: sent once more 100 ms later when the
	// first found no grant.
	if n := calls(t, rdb, "dlock.releaseall"); n < 1 || n > 2 {
		t.Fatalf("%d RELEASEALLs withdrew the tickets", n)
	}
	got := seen.snapshot()
	if !slices.Equal(got.failed, []string{dlock.OutcomeHeld, dlock.OutcomeHeld}) {
		t.Fatalf("acquire failures %v", got.failed)
	}
}

func TestAWaitingSetIsGrantedWhenTheMemberFreesAheadOfALaterSingleWaiter(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	locks := newLocks(t, server.Client(t))
	ctx := context.Background()
	held, err := locks.Hold(ctx, accounts[1], dlock.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	waiting := testkit.Go(func() (*dlock.SetLease, error) {
		return locks.HoldAll(ctx, accounts, dlock.TTL(10*time.Second), dlock.Wait(8*time.Second))
	})
	// The set holds nothing while it waits, and keeps the free member for itself.
	testkit.Await(t, 3*time.Second, func() error {
		if info, err := locks.Info(ctx, accounts[0]); err != nil || info == nil || info.Tickets != 1 || info.Holders != 0 {
			return fmt.Errorf("the free member shows %+v (%v)", info, err)
		}
		return nil
	})
	single := testkit.Go(func() (*dlock.Lease, error) {
		return locks.Hold(ctx, accounts[0], dlock.TTL(10*time.Second), dlock.Wait(8*time.Second))
	})
	testkit.Await(t, 3*time.Second, func() error {
		if info, err := locks.Info(ctx, accounts[0]); err != nil || info == nil || info.Waiters != 1 || info.Holders != 0 {
			return fmt.Errorf("the free member shows %+v (%v)", info, err)
		}
		return nil
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	var set *dlock.SetLease
	select {
	case outcome := <-waiting:
		if outcome.Err != nil {
			t.Fatal(outcome.Err)
		}
		set = outcome.Value
	case outcome := <-single:
		t.Fatalf("the later single request came first: %v", outcome.Err)
	case <-time.After(2 * time.Second):
		t.Fatal("the set was not granted when the member freed")
	}
	if took := time.Since(released); took > 500*time.Millisecond {
		t.Fatalf("granted %v after the release: not woken by the member's channel", took)
	}
	fences := set.Fences()
	if fences[1] <= held.Fence() || owner(t, locks, accounts[0]) != set.Token() {
		t.Fatalf("fences %v after %d", fences, held.Fence())
	}
	if info, err := locks.Info(ctx, accounts[0]); err != nil || info.Waiters != 1 {
		t.Fatalf("the single waiter left the line: %+v, %v", info, err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case outcome := <-single:
		if outcome.Err != nil {
			t.Fatal(outcome.Err)
		}
		defer outcome.Value.Release(ctx)
		if outcome.Value.Fence() <= fences[0] {
			t.Fatalf("the single waiter's fence %d after the set's %d", outcome.Value.Fence(), fences[0])
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the single waiter was not handed the member the set released")
	}
}

func TestAnOperatorsDelOfOneMemberLosesTheWholeSet(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	operator := server.Client(t)
	seen := &figures{}
	locks := newLocks(t, server.Client(t), dlock.WithMetrics(seen))
	ctx := context.Background()
	const ttl = 900 * time.Millisecond
	set, err := locks.HoldAll(ctx, accounts, dlock.TTL(ttl), dlock.Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := operator.Del(ctx, accounts[1]).Err(); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	select {
	case <-set.Done():
	case <-time.After(ttl/3 + time.Second):
		t.Fatal("the set was not lost")
	}
	if took := time.Since(deleted); took > ttl/3+300*time.Millisecond {
		t.Fatalf("lost %v after the DEL", took)
	}
	lostSet(t, set.Err(), set, dlock.ReasonRenewalRefused)
	lostSet(t, context.Cause(set.Context()), set, dlock.ReasonRenewalRefused)
	// The rest of the set is released, not left to its ttl.
	testkit.Await(t, 500*time.Millisecond, func() error {
		if n := operator.Exists(ctx, accounts[0]).Val(); n != 0 {
			return errors.New("the other member is still held")
		}
		return nil
	})
	if _, err := set.Fenced(ctx, accounts[0], "SET", "{acct}:ledger", "late"); !errors.Is(err, dlock.ErrStale) {
		t.Fatalf("a fenced write after the loss: %v", err)
	}
	if operator.Exists(ctx, "{acct}:ledger").Val() != 0 {
		t.Fatal("a stale write ran")
	}
	lostSet(t, set.Release(ctx), set, dlock.ReasonRenewalRefused)
	got := seen.snapshot()
	if !slices.Equal(got.lost, []string{dlock.ReasonRenewalRefused}) || got.releaseFailures != 0 {
		t.Fatalf("figures %+v: one loss", got)
	}
}

func TestRevokingOneMemberLosesTheSetAsRevoked(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	operator := server.Client(t)
	locks := newLocks(t, server.Client(t))
	ctx := context.Background()
	const reason = "stuck transfer"
	started := make(chan *dlock.SetLease, 1)
	outcome := testkit.Go(func() (struct{}, error) {
		return struct{}{}, locks.DoAll(ctx, accounts, func(ctx context.Context, set *dlock.SetLease) error {
			started <- set
			<-ctx.Done() // the work stops when the set is lost
			return ctx.Err()
		}, dlock.TTL(30*time.Second), dlock.Wait(0))
	})
	set := <-started
	testkit.AwaitSubscribers(t, operator, dlock.ChannelName(accounts[1]), false, 1)
	fence, _ := set.Fence(accounts[1])
	if err := operator.Do(ctx, "DLOCK.REVOKE", accounts[1], "FENCE", fence, "REASON", reason).Err(); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	select {
	case result := <-outcome:
		if took := time.Since(revoked); took > time.Second {
			t.Fatalf("the work stopped %v after the revocation", took)
		}
		if !errors.Is(result.Err, context.Canceled) {
			t.Fatalf("the work's own error is not kept: %v", result.Err)
		}
		if lost := lostSet(t, result.Err, set, dlock.ReasonRevoked); lost.Detail != reason {
			t.Fatalf("detail %q, want the operator's reason", lost.Detail)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a revoked member did not end the set's work")
	}
	// The members not revoked are released at once.
	if n := operator.Exists(ctx, accounts...).Val(); n != 0 {
		t.Fatalf("%d members still held after the set was lost", n)
	}
}

func TestAMemberGoneBeforeTheReleaseIsTheLossEnded(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	operator := server.Client(t)
	seen := &figures{}
	locks := newLocks(t, server.Client(t), dlock.WithMetrics(seen))
	ctx := context.Background()
	set, err := locks.HoldAll(ctx, accounts, dlock.TTL(30*time.Second), dlock.Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := operator.Del(ctx, accounts[0]).Err(); err != nil {
		t.Fatal(err)
	}
	lostSet(t, set.Release(ctx), set, dlock.ReasonEnded)
	if n := operator.Exists(ctx, accounts...).Val(); n != 0 {
		t.Fatalf("%d members still held after the release", n)
	}
	got := seen.snapshot()
	if !slices.Equal(got.lost, []string{dlock.ReasonEnded}) || got.releaseFailures != 0 {
		t.Fatalf("figures %+v: the loss ended, once, and no release failure", got)
	}
}
