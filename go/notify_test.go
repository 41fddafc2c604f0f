package dlock_test

// Tickets told on their own channel (ACQUIRE … QUEUE … NOTIFY), against a real server: the
// lease starts on the channel's granted message and is claimed by one RENEW; a server without
// NOTIFY (played by a proxy) is waited on through the resource's channel.

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// awaitChannels waits (5 s at most) until the channels with subscribers that match pattern
// (PUBSUB CHANNELS) are want of them, and returns them.
func awaitChannels(t *testing.T, rdb *redis.Client, pattern string, want int) []string {
	t.Helper()
	var channels []string
	testkit.Await(t, 5*time.Second, func() error {
		var err error
		channels, err = rdb.PubSubChannels(context.Background(), pattern).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(channels) != want {
			return fmt.Errorf("%d channels like %s, not %d: %v", len(channels), pattern, want, channels)
		}
		return nil
	})
	return channels
}

// awaitTicketChannels waits (5 s at most) until want tickets' own channels of resource have
// subscribers on rdb (PUBSUB SHARDCHANNELS for shard channels, else PUBSUB CHANNELS).
func awaitTicketChannels(t *testing.T, rdb *redis.Client, resource string, sharded bool, want int) {
	t.Helper()
	pattern := dlock.ChannelName(resource) + ":*"
	testkit.Await(t, 5*time.Second, func() error {
		var channels []string
		var err error
		if sharded {
			channels, err = rdb.PubSubShardChannels(context.Background(), pattern).Result()
		} else {
			channels, err = rdb.PubSubChannels(context.Background(), pattern).Result()
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(channels) != want {
			return fmt.Errorf("%d ticket channels like %s, not %d: %v", len(channels), pattern, want, channels)
		}
		return nil
	})
}

// infoField is one field of DLOCK.INFO resource, read on rdb ("" without it).
func infoField(t *testing.T, rdb *redis.Client, resource, field string) string {
	t.Helper()
	reply, err := rdb.Do(context.Background(), "DLOCK.INFO", resource).Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return testkit.InfoField(reply, field)
}

// awaitTickets waits (5 s at most) until resource has want tickets in line.
func awaitTickets(t *testing.T, rdb *redis.Client, resource string, want int) {
	t.Helper()
	testkit.Await(t, 5*time.Second, func() error {
		if got := infoField(t, rdb, resource, "tickets"); got != strconv.Itoa(want) {
			return fmt.Errorf("%s: %q tickets, not %d", resource, got, want)
		}
		return nil
	})
}

// A ticket told of its grant on its own channel starts on that message: no ACQUIRE follows the
// release to claim the turn; the claim is one RENEW with the fence, sent at once without the
// caller asking and not awaited before Hold returns (its answer is held back 2 s by a proxy,
// while the server has already run it), and until its answer is read the lease's local expiry
// is the claim window counted from an ACQUIRE sent before the grant. The first renewal reads
// that answer: the full ttl, and no second RENEW.
func TestATicketStartsOnItsOwnMessageAndClaimsWithOneRenewal(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	direct := server.Client(t)
	// The claim's answer held back 2 s: well within the request timeout (5 s), and long after
	// the test reads it with Renew.
	proxy := testkit.StartProxyWith(t, server.Addr(), testkit.ProxyOptions{Match: "DLOCK.RENEW", Delay: 2 * time.Second})
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	// The claim window: the ticket's life (more than twice the request timeout).
	const ticket, ttl = 12 * time.Second, 60 * time.Second
	locks := newLocks(t, rdb, dlock.Tickets(ticket), dlock.RequestTimeout(5*time.Second))
	ctx := context.Background()
	if err := direct.Do(ctx, "DLOCK.ACQUIRE", "gate", "holder", 30000).Err(); err != nil {
		t.Fatal(err)
	}
	waiter := testkit.Go(func() (*dlock.Lease, error) {
		return locks.Hold(ctx, "gate", dlock.TTL(ttl), dlock.Wait(20*time.Second))
	})
	awaitTickets(t, direct, "gate", 1)
	channels := awaitChannels(t, direct, "dlock:{gate}:*", 1)
	if n := testkit.Subscribers(t, direct, dlock.ChannelName("gate"), false); n != 0 {
		t.Fatalf("the waiter listens on the resource's channel too (%d subscribers)", n)
	}
	time.Sleep(100 * time.Millisecond) // the first ACQUIRE answered
	acquires := calls(t, direct, "dlock.acquire")
	released := time.Now()
	if n, err := direct.Do(ctx, "DLOCK.RELEASE", "gate", "holder").Int(); err != nil || n != 1 {
		t.Fatalf("RELEASE: %d, %v", n, err)
	}
	var lease *dlock.Lease
	select {
	case outcome := <-waiter:
		if outcome.Err != nil {
			t.Fatal(outcome.Err)
		}
		lease = outcome.Value
	case <-time.After(5 * time.Second):
		t.Fatal("the ticket was not granted within 5 s of the release")
	}
	took := time.Since(released)
	window := lease.LocalExpiry().Sub(released)
	if channels[0] != dlock.TicketChannelName("gate", lease.Token()) {
		t.Fatalf("the waiter listened on %s, not its ticket's channel", channels[0])
	}
	if took >= 900*time.Millisecond {
		t.Fatalf("started %v after the release: not on the message", took)
	}
	// The claim's answer is held back by the proxy: Hold did not wait for it.
	if window > ticket || window <= ticket/2 {
		t.Fatalf("the local expiry is %v after the release, not within the claim window %v", window, ticket)
	}
	// The claim went out without being asked for: the server's lease runs the full ttl.
	testkit.Await(t, 5*time.Second, func() error {
		left, _ := strconv.ParseInt(infoField(t, direct, "gate", "ttl-ms"), 10, 64)
		if left <= ticket.Milliseconds() {
			return fmt.Errorf("never claimed: %d ms left", left)
		}
		return nil
	})
	if fence := infoField(t, direct, "gate", "fence"); fence != strconv.FormatUint(lease.Fence(), 10) {
		t.Fatalf("the server's fence %s, the lease's %d", fence, lease.Fence())
	}
	if got := calls(t, direct, "dlock.acquire"); got != acquires {
		t.Fatalf("%d ACQUIREs after the release: the turn was claimed by ACQUIRE", got-acquires)
	}
	// The first renewal reads the claim's answer: the full ttl from the claim's send.
	renewed, err := lease.Renew(ctx)
	if err != nil || !renewed {
		t.Fatalf("the claim's answer: %v, %v", renewed, err)
	}
	if left := time.Until(lease.LocalExpiry()); left < ttl-3*time.Second {
		t.Fatalf("the ttl does not count after the claim: %v left", left)
	}
	if n := calls(t, direct, "dlock.renew"); n != 1 {
		t.Fatalf("%d RENEWs: the claim was not the one renewal", n)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := calls(t, direct, "dlock.acquire"); got != acquires {
		t.Fatalf("%d ACQUIREs after the release", got-acquires)
	}
}

// A server that does not know NOTIFY (played by a proxy that renames the option on its way in
// and the server's complaint about it on its way out) is waited on through the resource's
// channel: the waiter subscribes there, not to a ticket's channel, is woken by the handoff
// naming its token and claims with an ACQUIRE, twice in a row; NOTIFY is asked once, and never
// again of that server.
func TestAServerWithoutNotifyIsWaitedOnThroughTheResourcesChannel(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	direct := server.Client(t)
	proxy := testkit.StartProxyWith(t, server.Addr(), testkit.ProxyOptions{
		Match: "$6\r\nNOTIFY\r\n",
		Rewrites: []testkit.Rewrite{
			{From: "$6\r\nNOTIFY\r\n", To: "$6\r\nXOTIFY\r\n"},
			{From: "'XOTIFY'", To: "'NOTIFY'", Replies: true},
		},
	})
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	locks := newLocks(t, rdb, dlock.Tickets(9*time.Second))
	ctx := context.Background()
	for round := 0; round < 2; round++ {
		if err := direct.Do(ctx, "DLOCK.ACQUIRE", "old", "holder", 30000).Err(); err != nil {
			t.Fatal(err)
		}
		waiter := testkit.Go(func() (*dlock.Lease, error) {
			return locks.Hold(ctx, "old", dlock.TTL(30*time.Second), dlock.Wait(20*time.Second))
		})
		awaitTickets(t, direct, "old", 1)
		testkit.AwaitSubscribers(t, direct, dlock.ChannelName("old"), false, 1)
		awaitChannels(t, direct, "dlock:{old}:*", 0)
		time.Sleep(300 * time.Millisecond)
		released := time.Now()
		if n, err := direct.Do(ctx, "DLOCK.RELEASE", "old", "holder").Int(); err != nil || n != 1 {
			t.Fatalf("round %d: RELEASE: %d, %v", round, n, err)
		}
		var lease *dlock.Lease
		select {
		case outcome := <-waiter:
			if outcome.Err != nil {
				t.Fatalf("round %d: %v", round, outcome.Err)
			}
			lease = outcome.Value
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: not granted within 5 s of the release", round)
		}
		if took := time.Since(released); took >= time.Second {
			t.Fatalf("round %d: granted %v after the release: by the refresh, not the channel", round, took)
		}
		if left := time.Until(lease.LocalExpiry()); left < 20*time.Second {
			t.Fatalf("round %d: %v left: not claimed by its ACQUIRE", round, left)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if asked := len(proxy.Matched()); asked != 1 {
		t.Fatalf("NOTIFY asked %d times of a server that refused it once", asked)
	}
}
