package dlock_test

// A slot on its way between two nodes (MIGRATING on one, IMPORTING on the other, the keys moved
// with MIGRATE): the source answers ASK for the keys it no longer has, and every request of the
// client, its blocking waits and its releases of unknown grants included, follows it.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

func TestInAClusterALeaseAndAWaiterFollowASKWhileTheirSlotMigrates(t *testing.T) {
	t.Parallel()
	cluster := testkit.StartCluster(t)
	locks := newLocks(t, cluster.Client(t))
	ctx := context.Background()
	const resource = "job:{5}"
	ttl := 1500 * time.Millisecond

	lease, err := locks.Hold(ctx, resource, dlock.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	waited := testkit.Go(func() (*dlock.Lease, error) {
		return locks.Hold(ctx, resource, dlock.TTL(ttl), dlock.Wait(15*time.Second))
	})
	from := cluster.Owner(t, resource)
	source := from.Client(t)
	testkit.Await(t, 5*time.Second, func() error {
		if info := source.Do(ctx, "DLOCK.INFO", resource).Val(); testkit.InfoField(info, "waiters") != "1" {
			return fmt.Errorf("the waiter is not in line on the slot's node: %v", info)
		}
		return nil
	})

	// The lease's key moves to the importing node: the source cuts its wait short and answers
	// ASK from then on.
	move := cluster.BeginSlotMove(t, resource, cluster.Other(from))
	move.MigrateKeys(t)
	migrated := time.Now()
	testkit.Await(t, 5*time.Second, func() error {
		if info, err := move.Asking(t, "DLOCK.INFO", resource); err != nil || testkit.InfoField(info, "waiters") != "1" {
			return fmt.Errorf("the waiter did not follow ASK to the importing node: %v %v", info, err)
		}
		return nil
	})
	// Renewals follow ASK: the lease outlives its ttl on the importing node.
	time.Sleep(time.Until(migrated.Add(ttl + 500*time.Millisecond)))
	info, err := move.Asking(t, "DLOCK.INFO", resource)
	if lease.Err() != nil || err != nil || testkit.InfoField(info, "owner") != lease.Token() {
		t.Fatalf("the lease during the migration: %v; the importing node: %v, %v", lease.Err(), info, err)
	}
	// A resource of the slot without a key anywhere is granted by the importing node.
	other, err := locks.Hold(ctx, "report:{5}", dlock.Wait(2*time.Second))
	if err != nil {
		t.Fatalf("a new resource of the migrating slot: %v", err)
	}
	if info, _ := move.Asking(t, "DLOCK.INFO", "report:{5}"); testkit.InfoField(info, "owner") != other.Token() {
		t.Fatalf("the new resource is not held on the importing node: %v", info)
	}
	// The release follows ASK, and the importing node hands the lease to the waiter in its line.
	released := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("the release during the migration: %v", err)
	}
	waiter := <-waited
	if waiter.Err != nil {
		t.Fatalf("the waiter: %v", waiter.Err)
	}
	next := waiter.Value
	if took := time.Since(released); took > time.Second {
		t.Fatalf("the waiter got the lease %v after the release", took)
	}
	if info, _ := move.Asking(t, "DLOCK.INFO", resource); testkit.InfoField(info, "owner") != next.Token() || next.Fence() <= lease.Fence() {
		t.Fatalf("the waiter's fence %d (the first %d); the importing node: %v", next.Fence(), lease.Fence(), info)
	}
	move.Finish(t)
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestInAClusterAnUnknownGrantOnTheImportingNodeIsReleasedThroughASK(t *testing.T) {
	t.Parallel()
	cluster := testkit.StartCluster(t)
	const resource = "invoice:{3}"
	from := cluster.Owner(t, resource)
	move := cluster.BeginSlotMove(t, resource, cluster.Other(from))
	// The importing node takes the resource (it answers TRYAGAIN until the source told it its
	// fence counter), and frees it again.
	testkit.Await(t, 5*time.Second, func() error {
		if _, err := move.Asking(t, "DLOCK.ACQUIRE", resource, "someone-else", 30000); err != nil {
			return fmt.Errorf("the importing node grants nothing: %w", err)
		}
		return nil
	})
	if _, err := move.Asking(t, "DLOCK.RELEASE", resource, "someone-else"); err != nil {
		t.Fatal(err)
	}
	// The importing node's replies to ACQUIRE never come back: the grant is made there and the
	// client never learns it.
	proxy := testkit.StartProxy(t, move.To.Addr(), "DLOCK.ACQUIRE")
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == move.To.Addr() {
				addr = proxy.Addr()
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}})
	defer rdb.Close()
	locks := newLocks(t, rdb, dlock.RequestTimeout(300*time.Millisecond))

	_, err := locks.Hold(context.Background(), resource, dlock.Wait(0))
	var failed *dlock.AcquireError
	if !errors.Is(err, dlock.ErrUnknownOutcome) || !errors.As(err, &failed) {
		t.Fatalf("got %v, want an unknown outcome", err)
	}
	if len(proxy.Swallowed()) == 0 {
		t.Fatal("no ACQUIRE reached the importing node")
	}
	// The RELEASE of the token followed ASK to the importing node and freed the grant.
	if info, err := move.Asking(t, "DLOCK.INFO", resource); (err != nil && !errors.Is(err, redis.Nil)) || testkit.InfoField(info, "owner") != "" {
		t.Fatalf("the unknown grant is still held on the importing node: %v %v", info, err)
	}
	if !failed.Released {
		t.Fatalf("the error does not say the grant was released: %v", err)
	}
	move.Finish(t)
}
