package dlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// A Sentinel failover (SENTINEL FAILOVER, the old primary alive): the deposed primary goes on
// answering as a primary for seconds, until the sentinel reconfigures it. The lease, its
// waiters and new holds follow the primary the sentinel names: the new primary holds the lease
// (renewed there) every moment the client says it is held.
func TestWithSentinelALeaseAndItsWaitersFollowTheFailover(t *testing.T) {
	t.Parallel()
	s := testkit.StartSentinel(t)
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{MasterName: s.Master, Addrs: []string{s.Sentinel.Addr()}})
	defer rdb.Close()
	locks := newLocks(t, rdb)
	ctx := context.Background()
	const resource = "report"
	ttl := 4500 * time.Millisecond

	lease, err := locks.Hold(ctx, resource, dlock.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	var granted []<-chan testkit.Outcome[*dlock.Lease]
	for _, strategy := range []dlock.Option{dlock.Blocking(), dlock.Tickets(3 * time.Second)} {
		granted = append(granted, testkit.Go(func() (*dlock.Lease, error) {
			return locks.Hold(ctx, resource, dlock.TTL(ttl), dlock.Wait(30*time.Second), strategy)
		}))
	}
	// Both wait in the old primary's line, and the replica has the lease.
	replica := newLocks(t, s.Replica.Client(t))
	testkit.Await(t, 5*time.Second, func() error {
		onPrimary, err := locks.Info(ctx, resource)
		if err != nil {
			return err
		}
		onReplica, _ := replica.Info(ctx, resource)
		if onPrimary.Waiters != 1 || onPrimary.Tickets != 1 || onReplica == nil || onReplica.Owner == nil {
			return fmt.Errorf("waiters not queued: %+v, the replica: %+v", onPrimary, onReplica)
		}
		return nil
	})

	started := time.Now()
	s.Failover(t)
	t.Logf("failover: %v", time.Since(started).Round(time.Millisecond))
	// For longer than the ttl the replica had at its promotion, the new primary holds the lease
	// whenever the client says it is held: renewals went there, not to the deposed primary.
	for until := time.Now().Add(ttl + time.Second); time.Now().Before(until); time.Sleep(50 * time.Millisecond) {
		info, err := replica.Info(ctx, resource)
		if lease.Err() != nil {
			t.Fatalf("the lease was lost: %v", lease.Err())
		}
		if err != nil || info == nil || info.Owner == nil || *info.Owner != lease.Token() || *info.Fence != lease.Fence() {
			t.Fatalf("%v after the failover the client holds fence %d, the new primary: %+v, %v",
				time.Since(started).Round(time.Millisecond), lease.Fence(), info, err)
		}
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("the release on the new primary: %v", err)
	}
	// The waiters of the old primary's line waited again on the new one: each gets the lease
	// there in turn.
	last := lease.Fence()
	for i := 0; i < 2; i++ {
		var waiter testkit.Outcome[*dlock.Lease]
		select {
		case waiter = <-granted[0]:
		case waiter = <-granted[1]:
		}
		if waiter.Err != nil {
			t.Fatalf("a waiter: %v", waiter.Err)
		}
		next := waiter.Value
		info, err := replica.Info(ctx, resource)
		if err != nil || info == nil || *info.Owner != next.Token() || next.Fence() <= last {
			t.Fatalf("a waiter holds fence %d (the last %d); the new primary: %+v, %v", next.Fence(), last, info, err)
		}
		last = next.Fence()
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A new hold is granted by the new primary.
	again, err := locks.Hold(ctx, resource, dlock.Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := replica.Info(ctx, resource); err != nil || info == nil || *info.Owner != again.Token() || again.Fence() <= last {
		t.Fatalf("a new hold of fence %d; the new primary: %+v, %v", again.Fence(), info, err)
	}
	_ = again.Release(ctx)
}
