package dlock_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

func TestInAClusterALeaseAndItsFencedWritesFollowTheSlotToAnotherPrimary(t *testing.T) {
	t.Parallel()
	cluster := testkit.StartCluster(t)
	rdb := cluster.Client(t)
	redirects := &countedRedirects{}
	locks := newLocks(t, rdb, dlock.WithMetrics(redirects))
	ctx := context.Background()
	ttl := 1500 * time.Millisecond

	lease, err := locks.Hold(ctx, "invoice:{7}", dlock.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.Fenced(ctx, "HSET", "invoice:{7}:data", "status", "draft"); err != nil {
		t.Fatal(err)
	}
	// A key of another slot is refused: every key of a fenced command shares the resource's slot.
	if _, err := lease.Fenced(ctx, "SET", "elsewhere", "x"); dlock.Class(err) != dlock.ClassCrossSlot {
		t.Fatalf("a key of another slot: %v", err)
	}

	from := cluster.Owner(t, "invoice:{7}")
	to := cluster.Nodes[0]
	if to == from {
		to = cluster.Nodes[1]
	}
	cluster.MoveSlot(t, "invoice:{7}", to)
	if cluster.Owner(t, "invoice:{7}") != to {
		t.Fatal("the slot did not move")
	}

	// The next fenced write is answered MOVED by the old primary and follows it.
	if _, err := lease.Fenced(ctx, "HSET", "invoice:{7}:data", "status", "paid"); err != nil {
		t.Fatalf("a fenced write after the move: %v", err)
	}
	if redirects.n.Load() == 0 {
		t.Fatal("no MOVED was followed")
	}
	if status := to.Client(t).HGet(ctx, "invoice:{7}:data", "status").Val(); status != "paid" {
		t.Fatalf("status on the new primary: %q", status)
	}
	// Renewals follow it too: the lease outlives two ttls.
	time.Sleep(2 * ttl)
	if lease.Err() != nil {
		t.Fatalf("the lease was lost after the move: %v", lease.Err())
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A waiter on the new primary gets the resource next, with a larger fence.
	next, err := locks.Hold(ctx, "invoice:{7}", dlock.Wait(0))
	if err != nil || next.Fence() <= lease.Fence() {
		t.Fatalf("the next holder: %v", err)
	}
	_ = next.Release(ctx)
}

func TestInAClusterASlotMovedToANodeThatDiedIsRoutedByTheSlotMapAgain(t *testing.T) {
	t.Parallel()
	cluster := testkit.StartCluster(t)
	rdb := cluster.Client(t)
	locks := newLocks(t, rdb)
	ctx := context.Background()
	const resource = "job:{9}"
	if _, err := locks.Info(ctx, resource); err != nil { // the slot map is read
		t.Fatal(err)
	}
	first := cluster.Owner(t, resource)
	var others []*testkit.Server
	for _, n := range cluster.Nodes {
		if n != first {
			others = append(others, n)
		}
	}
	second, third := others[0], others[1]
	// The slot moves: the old primary answers MOVED, and the client routes the slot there.
	cluster.MoveSlot(t, resource, second)
	if _, err := locks.Info(ctx, resource); err != nil {
		t.Fatal(err)
	}
	// It moves again, and the node the MOVED named dies.
	cluster.MoveSlot(t, resource, third)
	second.Stop()
	lease, err := locks.Hold(ctx, resource, dlock.Wait(3*time.Second))
	if err != nil {
		t.Fatalf("the slot stayed routed to the dead node: %v", err)
	}
	if owner := third.Client(t).Do(ctx, "DLOCK.INFO", resource).Val(); owner == nil {
		t.Fatal("the lease is not on the slot's new primary")
	}
	_ = lease.Release(ctx)
}

func TestInAClusterOnlyTheNodeThatRefusedFenceGetsReleasesWithoutIt(t *testing.T) {
	t.Parallel()
	cluster := testkit.StartCluster(t)
	old, current := cluster.Nodes[0], cluster.Nodes[1]
	// The connections to one node go through a proxy that answers a FENCE as a module older
	// than FENCE does; those to another through one that records its RELEASEs.
	refusing := testkit.StartProxyWith(t, old.Addr(), testkit.ProxyOptions{Match: "$5\r\nFENCE\r\n",
		Refuse: "ERR syntax error: unexpected argument 'FENCE'"})
	recording := testkit.StartProxyWith(t, current.Addr(), testkit.ProxyOptions{Match: "DLOCK.RELEASE"})
	through := map[string]string{old.Addr(): refusing.Addr(), current.Addr(): recording.Addr()}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if proxy, ok := through[addr]; ok {
				addr = proxy
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}})
	defer rdb.Close()
	locks := newLocks(t, rdb)
	ctx := context.Background()
	keyOn := func(node *testkit.Server) string {
		for i := 0; ; i++ {
			if key := "r{" + strconv.Itoa(i) + "}"; cluster.Owner(t, key) == node {
				return key
			}
		}
	}

	onOld, err := locks.Hold(ctx, keyOn(old))
	if err != nil {
		t.Fatal(err)
	}
	if err := onOld.Release(ctx); err != nil { // refused with FENCE, released without it
		t.Fatalf("the release on the node without FENCE: %v", err)
	}
	if len(refusing.Matched()) == 0 {
		t.Fatal("no FENCE was refused")
	}
	onCurrent, err := locks.Hold(ctx, keyOn(current))
	if err != nil {
		t.Fatal(err)
	}
	if err := onCurrent.Release(ctx); err != nil {
		t.Fatal(err)
	}
	releases := recording.Matched()
	if len(releases) == 0 {
		t.Fatal("no RELEASE went to the other node")
	}
	for _, release := range releases {
		if !bytes.Contains(release, []byte("$5\r\nFENCE\r\n")) {
			t.Fatalf("a RELEASE without FENCE to a node that never refused it: %q", release)
		}
	}
}

type countedRedirects struct {
	dlock.NoMetrics
	n atomic.Int64
}

func (c *countedRedirects) Redirect() { c.n.Add(1) }

// A resource's slot moves: the old node drops its shard channel's subscribers (sunsubscribe), and
// the ticket waiters and observers of the resource subscribe again on the new node at once,
// without waiting for their refresh (a third of the ticket, 10 s here; 5 s for an observer).
func TestInAClusterSubscriptionsFollowTheirSlotToItsNewNode(t *testing.T) {
	t.Parallel()
	cluster := testkit.StartCluster(t)
	locks := newLocks(t, cluster.Client(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const resource = "queue:{8}"

	holder, leaders, granted := watchedHold(t, ctx, locks, resource)
	from := cluster.Owner(t, resource)

	awaitTicketChannels(t, from.Client(t), resource, true, 1)
	// The lease's key moves with the slot; the ticket does not (the waiter queues again, its own
	// channel subscribed on the new primary).
	to := cluster.Other(from)
	cluster.MoveSlot(t, resource, to)
	awaitTicketChannels(t, to.Client(t), resource, true, 1)
	time.Sleep(300 * time.Millisecond)
	released := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := handedOver(t, granted, leaders, "the release")
	t.Logf("the ticket waiter got the lease %v after the release", time.Since(released).Round(time.Millisecond))
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// In a Cluster the holder listens on its resource's shard channel (SSUBSCRIBE on the slot's
// primary), and keeps listening there after the slot moved to another primary.
func TestInAClusterARevokedHolderHearsItOnItsShardChannelWhereverTheSlotIs(t *testing.T) {
	t.Parallel()
	cluster := testkit.StartCluster(t)
	locks := newLocks(t, cluster.Client(t))
	ctx := context.Background()
	const resource = "invoice:{11}"
	channel := dlock.ChannelName(resource)

	for _, move := range []bool{false, true} {
		lease, err := locks.Hold(ctx, resource, dlock.TTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		owner := cluster.Owner(t, resource)
		testkit.AwaitSubscribers(t, owner.Client(t), channel, true, 1)
		if move {
			// The old primary drops the shard channel's subscribers; the holder subscribes
			// again on the new one.
			owner = cluster.Other(owner)
			cluster.MoveSlot(t, resource, owner)
			testkit.AwaitSubscribers(t, owner.Client(t), channel, true, 1)
		}
		reason := "incident " + strconv.FormatBool(move)
		if n, err := owner.Client(t).Do(ctx, "DLOCK.REVOKE", resource, "REASON", reason).Int(); err != nil || n != 1 {
			t.Fatalf("DLOCK.REVOKE: %d, %v", n, err)
		}
		<-lease.Done()
		revokedAs(t, lease.Err(), lease, reason)
		revokedAs(t, lease.Release(ctx), lease, reason)
		testkit.AwaitSubscribers(t, owner.Client(t), channel, true, 0)
	}
}

// The primary of a resource's slot fails over to its replica under a held lease and an
// observer of the resource, which listen on its shard channel, and a ticket waiter, which
// listens on its ticket's own shard channel in the same slot (SSUBSCRIBE on the slot's
// primary): by CLUSTER FAILOVER (the old primary drops its shard channels' subscribers), or
// killed (the pub/sub connection breaks, and the replica is elected after the node timeout).
// The subscriptions follow to the new primary, where an operator's revocation
// after the failover reaches the holder, and the hand-over to the ticket waiter (which its
// refresh, a third of its 30 s ticket, would not cover) and the new leader reach the waiter and
// the observer.
func TestInAClusterSubscriptionsFollowTheirSlotsFailoverToTheReplica(t *testing.T) {
	t.Parallel()
	// One cluster, two shards: one fails over by CLUSTER FAILOVER, the other's primary is
	// killed (elected after 2 s).
	cluster := testkit.StartClusterWithReplicas(t, 2*time.Second)
	const taken = "invoice:{13}"
	killed := "job:{0}"
	for i := 1; cluster.Owner(t, killed) == cluster.Owner(t, taken); i++ {
		killed = "job:{" + strconv.Itoa(i) + "}"
	}
	t.Run("failover", func(t *testing.T) {
		subscriptionsFollowFailover(t, cluster, taken, func(primary, replica *testkit.Server) {
			cluster.Failover(t, replica)
		})
	})
	t.Run("primary killed", func(t *testing.T) {
		subscriptionsFollowFailover(t, cluster, killed, func(primary, replica *testkit.Server) {
			cluster.KillPrimary(t, primary, replica)
		})
	})
}

func subscriptionsFollowFailover(t *testing.T, cluster *testkit.Cluster, resource string, failover func(primary, replica *testkit.Server)) {
	locks := newLocks(t, cluster.Client(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	channel := dlock.ChannelName(resource)

	holder, leaders, granted := watchedHold(t, ctx, locks, resource)
	primary := cluster.Owner(t, resource)
	testkit.AwaitSubscribers(t, primary.Client(t), channel, true, 1)
	awaitTicketChannels(t, primary.Client(t), resource, true, 1)
	// The replica has the lease and the ticket before it takes over.
	if n, err := primary.Client(t).Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT: %d, %v", n, err)
	}

	replica := cluster.ReplicaOf(t, primary)
	failover(primary, replica)
	if cluster.Owner(t, resource) != replica {
		t.Fatal("the replica does not serve the slot")
	}
	testkit.AwaitSubscribers(t, replica.Client(t), channel, true, 1)
	awaitTicketChannels(t, replica.Client(t), resource, true, 1)

	const reason = "failed over"
	if n, err := replica.Client(t).Do(ctx, "DLOCK.REVOKE", resource, "REASON", reason).Int(); err != nil || n != 1 {
		t.Fatalf("DLOCK.REVOKE on the new primary: %d, %v", n, err)
	}
	select {
	case <-holder.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the revocation on the new primary did not reach the holder within 2 s")
	}
	revokedAs(t, holder.Err(), holder, reason)
	next := handedOver(t, granted, leaders, "the revocation")
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// watchedHold holds resource (ttl 20 s) and watches it, through locks: an observer (which
// reports the holder first), and a ticket waiter (its ticket 30 s, refreshed every 10 s; its
// wait 20 s), in line when watchedHold returns.
func watchedHold(t *testing.T, ctx context.Context, locks *dlock.Locks, resource string) (
	holder *dlock.Lease, leaders <-chan *dlock.Leader, granted <-chan testkit.Outcome[*dlock.Lease],
) {
	t.Helper()
	holder, err := locks.Hold(ctx, resource, dlock.TTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	leaders = locks.Observe(ctx, resource)
	if leader := <-leaders; leader == nil || leader.Token != holder.Token() {
		t.Fatalf("the first leader observed: %+v", leader)
	}
	granted = testkit.Go(func() (*dlock.Lease, error) {
		return locks.Hold(ctx, resource, dlock.Tickets(30*time.Second), dlock.Wait(20*time.Second))
	})
	testkit.Await(t, 5*time.Second, func() error {
		if info, err := locks.Info(ctx, resource); err != nil || info.Tickets != 1 {
			return fmt.Errorf("the ticket is not in line: %+v, %v", info, err)
		}
		return nil
	})
	return holder, leaders, granted
}

// handedOver is the lease watchedHold's ticket waiter was granted within 3 s (after the end of
// the holder's, which the channel told it, not its refresh), once the observer reported it
// (within 2 s more).
func handedOver(t *testing.T, granted <-chan testkit.Outcome[*dlock.Lease], leaders <-chan *dlock.Leader, after string) *dlock.Lease {
	t.Helper()
	var next *dlock.Lease
	select {
	case waiter := <-granted:
		if waiter.Err != nil {
			t.Fatalf("the ticket waiter: %v", waiter.Err)
		}
		next = waiter.Value
	case <-time.After(3 * time.Second):
		t.Fatalf("the ticket waiter was not handed the lease within 3 s of %s", after)
	}
	for deadline := time.After(2 * time.Second); ; {
		select {
		case leader := <-leaders:
			if leader != nil && leader.Token == next.Token() {
				return next
			}
		case <-deadline:
			t.Fatal("the observer did not report the new leader within 2 s")
		}
	}
}
