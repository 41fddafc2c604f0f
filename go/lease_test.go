package dlock_test

// The lifecycle against real servers the tests start (redis-server, or $DLOCK_SERVER).

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// serverCount reads one field of INFO dlock (dlock_<field>).
func serverCount(t *testing.T, rdb *redis.Client, field string) int {
	t.Helper()
	text, err := rdb.Info(context.Background(), "dlock").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\r\n") {
		if value, ok := strings.CutPrefix(line, "dlock_"+field+":"); ok {
			n, err := strconv.Atoi(value)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("INFO dlock has no %s", field)
	return 0
}

func newLocks(t *testing.T, rdb redis.UniversalClient, opts ...dlock.Option) *dlock.Locks {
	locks := dlock.New(rdb, opts...)
	t.Cleanup(func() { _ = locks.Close() })
	return locks
}

func TestAHeldLeaseIsRefusedToOthersAndReleasedOnce(t *testing.T) {
	t.Parallel()
	for _, protocol := range []int{2, 3} {
		server := testkit.StartServer(t)
		rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), Protocol: protocol})
		defer rdb.Close()
		locks := newLocks(t, rdb)
		ctx := context.Background()

		lease, err := locks.Hold(ctx, "invoice:42", dlock.TTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if lease.Fence() == 0 || lease.Mode() != "exclusive" || lease.Err() != nil {
			t.Fatalf("RESP%d: fence %d, mode %s, err %v", protocol, lease.Fence(), lease.Mode(), lease.Err())
		}
		_, err = locks.Hold(ctx, "invoice:42", dlock.Wait(0))
		var failed *dlock.AcquireError
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.As(err, &failed) || failed.Outcome != dlock.OutcomeHeld {
			t.Fatalf("RESP%d: a held lease was not refused: %v", protocol, err)
		}
		info, err := locks.Info(ctx, "invoice:42")
		if err != nil || info == nil || *info.Owner != lease.Token() || *info.Fence != lease.Fence() {
			t.Fatalf("RESP%d: DLOCK.INFO shows %+v (%v)", protocol, info, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(lease.Err(), dlock.ErrReleased) || lease.Context().Err() == nil {
			t.Fatalf("after Release: Err %v, context %v", lease.Err(), lease.Context().Err())
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("a second Release: %v", err)
		}
		if n := rdb.Exists(ctx, "invoice:42").Val(); n != 0 {
			t.Fatal("the lock key is still there")
		}
		if serverCount(t, rdb, "release_ok") != 1 {
			t.Fatal("not released exactly once")
		}
		next, err := locks.Hold(ctx, "invoice:42", dlock.Wait(0))
		if err != nil || next.Fence() <= lease.Fence() {
			t.Fatalf("the next holder: %v, fence %d after %d", err, next.Fence(), lease.Fence())
		}
		_ = next.Release(ctx)
	}
}

func TestAWaiterIsHandedTheLeaseInOneWaitAndClaimsIt(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	locks := newLocks(t, rdb)
	ctx := context.Background()
	first, err := locks.Hold(ctx, "r", dlock.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = first.Release(ctx)
	}()
	started := time.Now()
	second, err := locks.Hold(ctx, "r", dlock.Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	if took := time.Since(started); took > 3*time.Second {
		t.Fatalf("the hand-over took %v", took)
	}
	if second.Fence() <= first.Fence() {
		t.Fatalf("fence %d after %d", second.Fence(), first.Fence())
	}
	if serverCount(t, rdb, "waits_started") != 1 || serverCount(t, rdb, "waits_granted") != 1 ||
		serverCount(t, rdb, "grants_claimed") != 1 {
		t.Fatal("not one wait, granted and claimed")
	}
}

func TestTheCallersContextEndsAWaitInTheServer(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	locks := newLocks(t, rdb)
	ctx := context.Background()
	held, err := locks.Hold(ctx, "r", dlock.TTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)

	// A deadline: the WAIT asks the server for no more than what is left of it.
	deadline, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err = locks.Hold(deadline, "r", dlock.Wait(10*time.Second))
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("got %v", err)
	}
	if took := time.Since(started); took < 350*time.Millisecond || took > 2*time.Second {
		t.Fatalf("the wait took %v for a 400 ms deadline", took)
	}
	if serverCount(t, rdb, "waits_timed_out") != 1 {
		t.Fatal("the server did not time the wait out itself")
	}

	// A cancellation: CLIENT UNBLOCK ends the wait in the server.
	cancelled, cancel2 := context.WithCancel(ctx)
	time.AfterFunc(300*time.Millisecond, cancel2)
	started = time.Now()
	_, err = locks.Hold(cancelled, "r", dlock.Wait(10*time.Second))
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	if took := time.Since(started); took > 2*time.Second {
		t.Fatalf("a cancelled wait returned after %v", took)
	}
	info, err := locks.Info(ctx, "r")
	if err != nil || info.Waiters != 0 {
		t.Fatalf("waiters left in the server: %+v (%v)", info, err)
	}
}

func TestADeletedLeaseIsLostAndTheWorkIsCancelled(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	locks := newLocks(t, rdb)
	ctx := context.Background()
	ttl := 900 * time.Millisecond
	started := time.Now()
	err := locks.Do(ctx, "job", func(ctx context.Context, lease *dlock.Lease) error {
		if err := rdb.Del(ctx, "job").Err(); err != nil { // an operator's DEL
			return err
		}
		<-ctx.Done() // the next renewal (ttl/3) is refused
		return ctx.Err()
	}, dlock.TTL(ttl))
	var lost *dlock.LeaseLostError
	if !errors.As(err, &lost) || lost.Reason != dlock.ReasonRenewalRefused {
		t.Fatalf("got %v, want a loss by a refused renewal", err)
	}
	if !errors.Is(err, context.Canceled) || !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("the work's own error and the loss are not both kept: %v", err)
	}
	if took := time.Since(started); took > ttl {
		t.Fatalf("the loss was noticed after %v (ttl %v)", took, ttl)
	}
}

func TestTheWorksErrorIsNeverMaskedAndALossNeverSilent(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	locks := newLocks(t, rdb)
	ctx := context.Background()
	boom := errors.New("boom")

	// The work fails: its error comes back as it is.
	err := locks.Do(ctx, "a", func(context.Context, *dlock.Lease) error { return boom })
	if err != boom {
		t.Fatalf("got %v, want the work's own error", err)
	}
	// The work succeeds but the lease was gone before its end: not a success.
	err = locks.Do(ctx, "b", func(ctx context.Context, lease *dlock.Lease) error {
		return rdb.Del(ctx, "b").Err()
	})
	var lost *dlock.LeaseLostError
	if !errors.As(err, &lost) || lost.Reason != dlock.ReasonEnded {
		t.Fatalf("got %v, want a loss (ended)", err)
	}
	// The work fails and the lease was gone: both are reported, the work's error first.
	err = locks.Do(ctx, "c", func(ctx context.Context, lease *dlock.Lease) error {
		_ = rdb.Del(ctx, "c").Err()
		return boom
	})
	if !errors.Is(err, boom) || !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("got %v", err)
	}
}

func TestAPausedServerPastTheTTLLosesTheLeaseAtItsLocalExpiry(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	locks := newLocks(t, rdb, dlock.RequestTimeout(200*time.Millisecond))
	ctx := context.Background()
	ttl := 900 * time.Millisecond
	lease, err := locks.Hold(ctx, "r", dlock.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	server.Pause()
	defer server.Resume()
	select {
	case <-lease.Done():
	case <-time.After(3 * ttl):
		t.Fatal("the lease was not lost")
	}
	lostAt := time.Now()
	if took := lostAt.Sub(granted); took > ttl+100*time.Millisecond {
		t.Fatalf("lost %v after the grant, ttl %v", took, ttl)
	}
	// Not before the local expiry either: no renewal was answered, and until then it held.
	if early := lease.LocalExpiry().Sub(lostAt); early > 0 {
		t.Fatalf("lost %v before its local expiry", early)
	}
	var lost *dlock.LeaseLostError
	if !errors.As(lease.Err(), &lost) || lost.Reason != dlock.ReasonUnreachable {
		t.Fatalf("got %v", lease.Err())
	}
	if !errors.As(context.Cause(lease.Context()), &lost) {
		t.Fatal("the context's cause is not the loss")
	}
}

func TestMaxHoldEndsTheHold(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	locks := newLocks(t, server.Client(t))
	lease, err := locks.Hold(context.Background(), "r", dlock.TTL(3*time.Second), dlock.MaxHold(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the hold went past MaxHold")
	}
	var lost *dlock.LeaseLostError
	if !errors.As(lease.Err(), &lost) || lost.Reason != dlock.ReasonMaxHold {
		t.Fatalf("got %v", lease.Err())
	}
}

func TestAStaleFenceWritesNothing(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	locks := newLocks(t, rdb)
	ctx := context.Background()
	old, err := locks.Hold(ctx, "invoice:{7}")
	if err != nil {
		t.Fatal(err)
	}
	if reply, err := old.Fenced(ctx, "HSET", "invoice:{7}:data", "status", "draft"); err != nil || reply != int64(1) {
		t.Fatalf("a live fence's write: %v, %v", reply, err)
	}
	if ok, err := old.FenceCheck(ctx); !ok || err != nil {
		t.Fatalf("FENCECHECK of a live fence: %v %v", ok, err)
	}
	rdb.Del(ctx, "invoice:{7}")
	current, err := locks.Hold(ctx, "invoice:{7}", dlock.Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	defer current.Release(ctx)
	_, err = old.Fenced(ctx, "HSET", "invoice:{7}:data", "status", "paid")
	var stale *dlock.StaleError
	if !errors.Is(err, dlock.ErrStale) || !errors.As(err, &stale) || stale.Fence != old.Fence() {
		t.Fatalf("got %v, want a stale fence", err)
	}
	if status := rdb.HGet(ctx, "invoice:{7}:data", "status").Val(); status != "draft" {
		t.Fatalf("the stale write happened: %q", status)
	}
	if ok, _ := old.FenceCheck(ctx); ok {
		t.Fatal("FENCECHECK passes a stale fence")
	}
	if _, err := current.Fenced(ctx, "HSET", "invoice:{7}:data", "status", "paid"); err != nil {
		t.Fatal(err)
	}
}

func TestReadersShareAndWritersAndPermitsAreBounded(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	locks := newLocks(t, server.Client(t))
	ctx := context.Background()
	r1, err := locks.Read(ctx, "doc")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := locks.Read(ctx, "doc", dlock.Wait(0))
	if err != nil || r2.Mode() != "shared" || r1.Fence() == r2.Fence() {
		t.Fatalf("a second reader: %v", err)
	}
	if _, err := locks.Write(ctx, "doc", dlock.Wait(0)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a writer beside readers: %v", err)
	}
	_ = r1.Release(ctx)
	_ = r2.Release(ctx)
	w, err := locks.Write(ctx, "doc", dlock.Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Release(ctx)

	var permits []*dlock.Lease
	for i := 0; i < 2; i++ {
		p, err := locks.Semaphore(ctx, "pool", 2, dlock.Wait(0))
		if err != nil {
			t.Fatal(err)
		}
		permits = append(permits, p)
	}
	if _, err := locks.Semaphore(ctx, "pool", 2, dlock.Wait(0)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a third permit of two: %v", err)
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		_ = permits[0].Release(ctx)
	}()
	third, err := locks.Semaphore(ctx, "pool", 2, dlock.Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_ = third.Release(ctx)
	_ = permits[1].Release(ctx)
	if _, err := locks.Semaphore(ctx, "pool", 0); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatal("0 permits were sent")
	}
}

func TestTicketWaitersAreWokenByTheirHandOver(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	locks := newLocks(t, rdb, dlock.Tickets(3*time.Second))
	ctx := context.Background()
	first, err := locks.Hold(ctx, "r", dlock.TTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease *dlock.Lease
		err   error
		took  time.Duration
	}
	results := make(chan result, 2)
	for i := 0; i < 2; i++ {
		go func() {
			started := time.Now()
			lease, err := locks.Hold(ctx, "r", dlock.Wait(10*time.Second))
			results <- result{lease, err, time.Since(started)}
			if err == nil {
				time.Sleep(100 * time.Millisecond)
				_ = lease.Release(ctx)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	_ = first.Release(ctx)
	for i := 0; i < 2; i++ {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		// Woken by the channel, not by the ticket's refresh (every second here).
		if r.took > 900*time.Millisecond {
			t.Fatalf("a ticket waiter got the lease after %v", r.took)
		}
	}
	if serverCount(t, rdb, "waits_started") != 0 || serverCount(t, rdb, "tickets_granted") != 2 {
		t.Fatal("not two tickets granted without a blocking wait")
	}
}

func TestAGrantWhoseReplyIsLostIsRetriedWithTheSameTokenThenReleased(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	proxy := testkit.StartProxy(t, server.Addr(), "DLOCK.ACQUIRE")
	through := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	defer through.Close()
	locks := newLocks(t, through, dlock.RequestTimeout(200*time.Millisecond))
	ctx := context.Background()

	_, err := locks.Hold(ctx, "r", dlock.Wait(300*time.Millisecond))
	var failed *dlock.AcquireError
	if !errors.Is(err, dlock.ErrUnknownOutcome) || !errors.As(err, &failed) {
		t.Fatalf("got %v, want an unknown outcome", err)
	}
	if !failed.Released {
		t.Fatal("the grant the client never learned was not released")
	}
	sent := proxy.Swallowed()
	if len(sent) < 2 {
		t.Fatalf("the ACQUIRE was sent %d times: no retry", len(sent))
	}
	for _, request := range sent {
		if !strings.Contains(string(request), failed.Token) {
			t.Fatalf("a retry with another token: %q", request)
		}
	}
	// One grant, answered again to every retry; freed by the RELEASE of its token.
	if serverCount(t, rdb, "acquire_granted") != 1 || serverCount(t, rdb, "acquire_reacquired") < 1 {
		t.Fatal("the retries minted another grant")
	}
	if rdb.Exists(ctx, "r").Val() != 0 {
		t.Fatal("the grant is still held")
	}
}

func TestALeaderIsObservedAndReplacedAfterResigning(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	locks := newLocks(t, server.Client(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leaders := locks.Observe(ctx, "scheduler")
	if first := <-leaders; first != nil {
		t.Fatalf("a leader before any campaign: %+v", first)
	}
	a, err := locks.Campaign(ctx, "scheduler", "10.0.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var b *dlock.Lease
	wg.Add(1)
	go func() {
		defer wg.Done()
		b, err = locks.Campaign(ctx, "scheduler", "10.0.0.2:80")
	}()
	seen := <-leaders
	if seen == nil || *seen.Address != "10.0.0.1:80" || seen.Fence != a.Fence() {
		t.Fatalf("observed %+v", seen)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err != nil || b.Fence() <= a.Fence() {
		t.Fatalf("the second candidate: %v", err)
	}
	for seen = <-leaders; seen == nil; seen = <-leaders {
	}
	if *seen.Address != "10.0.0.2:80" || seen.Fence != b.Fence() {
		t.Fatalf("observed %+v after the hand-over", seen)
	}
	_ = b.Resign(ctx)
}

func TestAGrantAnsweredAfterTheCallerGaveUpIsReleased(t *testing.T) {
	t.Parallel()
	for _, strategy := range []dlock.Option{dlock.Blocking(), dlock.Tickets(3 * time.Second)} {
		server := testkit.StartServer(t)
		rdb := server.Client(t)
		// The ACQUIRE's reply takes 400 ms on the way back: the caller's context is cancelled
		// while it travels, and a cancellation does not stop a read already under way.
		proxy := testkit.StartProxyWith(t, server.Addr(), testkit.ProxyOptions{Match: "DLOCK.ACQUIRE", Delay: 400 * time.Millisecond})
		through := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
		defer through.Close()
		locks := newLocks(t, through, strategy)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(150*time.Millisecond, cancel)
		_, err := locks.Hold(ctx, "r", dlock.TTL(20*time.Second))
		cancel()
		var failed *dlock.AcquireError
		if !errors.As(err, &failed) || !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want a failed acquire cancelled by the caller", err)
		}
		if len(proxy.Matched()) == 0 {
			t.Fatal("no ACQUIRE went through the proxy")
		}
		if n := rdb.Exists(context.Background(), "r").Val(); n != 0 {
			t.Fatalf("the grant answered after the caller gave up is still held (%v)", err)
		}
		if !failed.Released {
			t.Fatalf("the error does not say the grant was released: %v", err)
		}
	}
}

func TestAPanicInTheWorkReleasesTheLeaseAndGoesOn(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	locks := newLocks(t, rdb)
	ctx := context.Background()
	var held *dlock.Lease
	recovered := func() (p any) {
		defer func() { p = recover() }()
		_ = locks.Do(ctx, "job", func(ctx context.Context, lease *dlock.Lease) error {
			held = lease
			panic("boom")
		}, dlock.TTL(20*time.Second))
		return nil
	}()
	if recovered != "boom" {
		t.Fatalf("the work's panic did not go on: %v", recovered)
	}
	if !errors.Is(held.Err(), dlock.ErrReleased) {
		t.Fatalf("after the panic: %v", held.Err())
	}
	if n := rdb.Exists(ctx, "job").Val(); n != 0 {
		t.Fatal("the lease outlived the panic of its work")
	}
}

func TestAHeldOutcomeAfterAFailedRequestReleasesTheToken(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	if err := rdb.Do(context.Background(), "DLOCK.ACQUIRE", "r", "someone-else", 30000).Err(); err != nil {
		t.Fatal(err)
	}
	// The first ACQUIRE's reply is lost: the request failed on the way back, and the attempt
	// goes on with a wait that the server times out.
	proxy := testkit.StartProxyWith(t, server.Addr(), testkit.ProxyOptions{Match: "DLOCK.ACQUIRE", Swallow: true, Connections: 1})
	through := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	defer through.Close()
	locks := newLocks(t, through, dlock.RequestTimeout(200*time.Millisecond))
	before := serverCount(t, rdb, "release_not_owner")
	_, err := locks.Hold(context.Background(), "r", dlock.Wait(time.Second))
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("got %v", err)
	}
	if len(proxy.Matched()) < 2 || serverCount(t, rdb, "waits_timed_out") != 1 {
		t.Fatal("not a lost reply then a wait timed out by the server")
	}
	// The lost request may have been one still on its way: the token is released, and once
	// more 100 ms later since the first found nothing.
	if n := serverCount(t, rdb, "release_not_owner") - before; n != 2 {
		t.Fatalf("%d RELEASEs of the token after the attempt, want 2", n)
	}
}

func TestACampaignTakesTheOptionsGivenToNew(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	ctx := context.Background()
	locks := newLocks(t, rdb, dlock.TTL(3*time.Second), dlock.Wait(300*time.Millisecond))
	leader, err := locks.Campaign(ctx, "scheduler", "10.0.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Resign(ctx)
	if leader.TTL() != 3*time.Second {
		t.Fatalf("the campaign's ttl is %v, not the 3 s given to New", leader.TTL())
	}
	started := time.Now()
	_, err = locks.Campaign(ctx, "scheduler", "10.0.0.2:80")
	if !errors.Is(err, dlock.ErrNotAcquired) || time.Since(started) > 2*time.Second {
		t.Fatalf("a campaign against a leader did not end with New's Wait: %v after %v", err, time.Since(started))
	}
	// A call's own option still comes last.
	other, err := locks.Campaign(ctx, "other", "10.0.0.3:80", dlock.TTL(4*time.Second))
	if err != nil || other.TTL() != 4*time.Second {
		t.Fatalf("a call's TTL: %v, %v", err, other)
	}
	_ = other.Resign(ctx)
}

// goRedisLog collects what go-redis logs.
type goRedisLog struct {
	mu    sync.Mutex
	lines []string
}

func (g *goRedisLog) Printf(_ context.Context, format string, v ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lines = append(g.lines, fmt.Sprintf(format, v...))
}

// stderrLog is go-redis's default logger again.
type stderrLog struct{ *log.Logger }

func (l stderrLog) Printf(_ context.Context, format string, v ...any) { l.Logger.Printf(format, v...) }

// Not parallel: go-redis's logger is global (the parallel tests wait until this one ends).
func TestDlocksOwnClientsLeaveTheCallersPushProcessorAlone(t *testing.T) {
	server := testkit.StartServer(t)
	logged := &goRedisLog{}
	redis.SetLogger(logged)
	defer redis.SetLogger(stderrLog{log.New(os.Stderr, "redis: ", log.LstdFlags)})
	rdb := redis.NewClient(&redis.Options{Addr: server.Addr(), Protocol: 3})
	defer rdb.Close()
	locks := newLocks(t, rdb)
	ctx := context.Background()
	lease, err := locks.Hold(ctx, "r", dlock.Tickets(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	logged.mu.Lock()
	defer logged.mu.Unlock()
	for _, line := range logged.lines {
		if strings.Contains(line, "maintnotifications") || strings.Contains(line, "handler") {
			t.Fatalf("go-redis logged for dlock's own clients: %s", line)
		}
	}
}
