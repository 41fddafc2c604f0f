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

// infoField reads one field of a DLOCK.INFO reply (a RESP3 map or a RESP2 flat list); "" when
// there is no lease or no such field.
func infoField(reply any, field string) string {
	switch v := reply.(type) {
	case map[any]any:
		if value, ok := v[field]; ok && value != nil {
			return fmt.Sprint(value)
		}
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			if v[i] == field && v[i+1] != nil {
				return fmt.Sprint(v[i+1])
			}
		}
	}
	return ""
}

// otherNode is a node of cluster other than not.
func otherNode(cluster *testkit.Cluster, not *testkit.Server) *testkit.Server {
	for _, n := range cluster.Nodes {
		if n != not {
			return n
		}
	}
	return nil
}

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
	type outcome struct {
		lease *dlock.Lease
		err   error
	}
	waited := make(chan outcome, 1)
	go func() {
		next, err := locks.Hold(ctx, resource, dlock.TTL(ttl), dlock.Wait(15*time.Second))
		waited <- outcome{next, err}
	}()
	from := cluster.Owner(t, resource)
	source := from.Client(t)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if infoField(source.Do(ctx, "DLOCK.INFO", resource).Val(), "waiters") == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter is not in line on the slot's node")
		}
	}

	// The lease's key moves to the importing node: the source cuts its wait short and answers
	// ASK from then on.
	move := cluster.BeginSlotMove(t, resource, otherNode(cluster, from))
	move.MigrateKeys(t)
	migrated := time.Now()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := move.Asking(t, "DLOCK.INFO", resource)
		if err == nil && infoField(info, "waiters") == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter did not follow ASK to the importing node: %v %v", info, err)
		}
	}
	// Renewals follow ASK: the lease outlives its ttl on the importing node.
	time.Sleep(time.Until(migrated.Add(ttl + 500*time.Millisecond)))
	info, err := move.Asking(t, "DLOCK.INFO", resource)
	if lease.Err() != nil || err != nil || infoField(info, "owner") != lease.Token() {
		t.Fatalf("the lease during the migration: %v; the importing node: %v, %v", lease.Err(), info, err)
	}
	// A resource of the slot without a key anywhere is granted by the importing node.
	other, err := locks.Hold(ctx, "report:{5}", dlock.Wait(2*time.Second))
	if err != nil {
		t.Fatalf("a new resource of the migrating slot: %v", err)
	}
	if info, _ := move.Asking(t, "DLOCK.INFO", "report:{5}"); infoField(info, "owner") != other.Token() {
		t.Fatalf("the new resource is not held on the importing node: %v", info)
	}
	// The release follows ASK, and the importing node hands the lease to the waiter in its line.
	released := time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("the release during the migration: %v", err)
	}
	next := <-waited
	if next.err != nil {
		t.Fatalf("the waiter: %v", next.err)
	}
	if took := time.Since(released); took > time.Second {
		t.Fatalf("the waiter got the lease %v after the release", took)
	}
	if info, _ := move.Asking(t, "DLOCK.INFO", resource); infoField(info, "owner") != next.lease.Token() || next.lease.Fence() <= lease.Fence() {
		t.Fatalf("the waiter's fence %d (the first %d); the importing node: %v", next.lease.Fence(), lease.Fence(), info)
	}
	move.Finish(t)
	if err := next.lease.Release(ctx); err != nil {
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
	move := cluster.BeginSlotMove(t, resource, otherNode(cluster, from))
	// The importing node takes the resource (it answers TRYAGAIN until the source told it its
	// fence counter), and frees it again.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := move.Asking(t, "DLOCK.ACQUIRE", resource, "someone-else", 30000); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the importing node grants nothing: %v", err)
		}
	}
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
	if info, err := move.Asking(t, "DLOCK.INFO", resource); (err != nil && !errors.Is(err, redis.Nil)) || infoField(info, "owner") != "" {
		t.Fatalf("the unknown grant is still held on the importing node: %v %v", info, err)
	}
	if !failed.Released {
		t.Fatalf("the error does not say the grant was released: %v", err)
	}
	move.Finish(t)
}
