package testkit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Await calls check every 10 ms until it returns nil, and fails the test with check's last error
// if that did not happen within the given time.
func Await(t testing.TB, within time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Outcome is what a call started by Go returned.
type Outcome[T any] struct {
	Value T
	Err   error
}

// Go runs call on a goroutine of its own (a waiter, say) and sends its outcome on the channel it
// returns, which has room for it: nobody needs to read it.
func Go[T any](call func() (T, error)) <-chan Outcome[T] {
	done := make(chan Outcome[T], 1)
	go func() {
		value, err := call()
		done <- Outcome[T]{value, err}
	}()
	return done
}

// Subscribers is how many clients the server has subscribed to channel (PUBSUB NUMSUB, or
// SHARDNUMSUB for a shard channel).
func Subscribers(t testing.TB, rdb *redis.Client, channel string, sharded bool) int64 {
	t.Helper()
	var (
		counts map[string]int64
		err    error
	)
	if sharded {
		counts, err = rdb.PubSubShardNumSub(context.Background(), channel).Result()
	} else {
		counts, err = rdb.PubSubNumSub(context.Background(), channel).Result()
	}
	if err != nil {
		t.Fatal(err)
	}
	return counts[channel]
}

// AwaitSubscribers waits (5 s at most) until the server counts want subscribers of channel.
func AwaitSubscribers(t testing.TB, rdb *redis.Client, channel string, sharded bool, want int64) {
	t.Helper()
	Await(t, 5*time.Second, func() error {
		if n := Subscribers(t, rdb, channel, sharded); n != want {
			return fmt.Errorf("%s: %d subscribers, not %d", channel, n, want)
		}
		return nil
	})
}

// InfoField reads one field of a DLOCK.INFO reply (a RESP3 map or a RESP2 flat list); "" when
// there is no lease or no such field.
func InfoField(reply any, field string) string {
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
