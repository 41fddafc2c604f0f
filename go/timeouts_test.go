package dlock_test

// What go-redis's defaults do to DLOCK.ACQUIRE … WAIT (README: "Timeouts and retries"), measured
// against a lock another client holds, next to what this client does.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

func TestGoRedisDefaultsCutAWaitAt3SecondsAndSendItAgainButLocksWaitOnce(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	admin := server.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "DLOCK.ACQUIRE", "r", "someone-else", 60000).Err(); err != nil {
		t.Fatal(err)
	}

	// The naive way: go-redis's defaults (ReadTimeout 3 s, MaxRetries 3) and a 4 s WAIT. The
	// read times out at 3 s; go-redis drops that connection (the server drops the waiter with
	// it) and sends the same ACQUIRE again on a new one, four times in all.
	naive := redis.NewClient(&redis.Options{Addr: server.Addr()})
	defer naive.Close()
	started := time.Now()
	err := naive.Do(ctx, "DLOCK.ACQUIRE", "r", "naive-token", 30000, "WAIT", 4000).Err()
	took := time.Since(started)
	var timeout interface{ Timeout() bool }
	if !errors.As(err, &timeout) || !timeout.Timeout() {
		t.Fatalf("the naive WAIT ended with %v, not a client-side timeout", err)
	}
	waits := serverCount(t, admin, "waits_started")
	t.Logf("go-redis defaults, WAIT 4000: %v after %v, %d waits in the server", err, took.Round(10*time.Millisecond), waits)
	if waits != 4 || took < 11*time.Second || took > 14*time.Second {
		t.Fatalf("expected 4 waits cut at 3 s each, measured %d waits in %v", waits, took)
	}
	if serverCount(t, admin, "waits_timed_out") != 0 {
		t.Fatal("a naive wait ran to its end in the server")
	}

	// A deadline in the context does not cut the read either (ContextTimeoutEnabled is off by
	// default): the call returns when the server answers.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	started = time.Now()
	err = naive.Do(short, "DLOCK.ACQUIRE", "r", "naive-token-2", 30000, "WAIT", 1500).Err()
	took = time.Since(started)
	t.Logf("go-redis defaults, 500 ms context deadline, WAIT 1500: %v after %v", err, took.Round(10*time.Millisecond))
	if !errors.Is(err, redis.Nil) || took < 1400*time.Millisecond {
		t.Fatalf("expected the server's nil after 1.5 s, got %v after %v", err, took)
	}

	// This client on the same go-redis defaults: one wait, ended by the server.
	locks := newLocks(t, naive)
	before := serverCount(t, admin, "waits_started")
	beforeTimedOut := serverCount(t, admin, "waits_timed_out")
	started = time.Now()
	_, err = locks.Hold(ctx, "r", dlock.Wait(4*time.Second))
	took = time.Since(started)
	t.Logf("dlock.Hold, Wait 4 s: %v after %v", err, took.Round(10*time.Millisecond))
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("got %v", err)
	}
	if serverCount(t, admin, "waits_started")-before != 1 || serverCount(t, admin, "waits_timed_out")-beforeTimedOut != 1 {
		t.Fatal("not one wait, timed out by the server")
	}
	if took < 3900*time.Millisecond || took > 5*time.Second {
		t.Fatalf("the wait took %v", took)
	}
}
