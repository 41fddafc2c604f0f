package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// addr is the server the examples talk to, started by TestMain.
var addr string

func TestMain(m *testing.M) {
	server, err := testkit.Start([]string{"--save", "", "--appendonly", "no"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	addr = server.Addr()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil))) // the examples print only their output
	code := m.Run()
	server.Stop()
	_ = os.RemoveAll(server.Dir)
	os.Exit(code)
}

// The quick start: a fenced lease, work under it, a loss that cancels the work.
func ExampleLocks_Do() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	locks := dlock.New(rdb)
	err := locks.Do(context.Background(), "invoice:42", func(ctx context.Context, lease *dlock.Lease) error {
		// ctx is cancelled if the lease is lost; send lease.Fence() with every write.
		fmt.Println("paying under fence", lease.Fence() > 0)
		return nil
	}, dlock.TTL(30*time.Second), dlock.Wait(10*time.Second))
	fmt.Println(err)
	// Output:
	// paying under fence true
	// <nil>
}

func ExampleLocks_Hold() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	locks := dlock.New(rdb)
	ctx := context.Background()
	lease, err := locks.Hold(ctx, "report", dlock.TTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	_, err = locks.Hold(ctx, "report", dlock.Wait(100*time.Millisecond))
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired))
	// Output: true
}

func ExampleLease_Fenced() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	locks := dlock.New(rdb)
	ctx := context.Background()
	lease, err := locks.Hold(ctx, "invoice:{7}")
	if err != nil {
		log.Fatal(err)
	}
	// Runs only while the lease's fence holds invoice:{7}; keys share its hash tag.
	_, err = lease.Fenced(ctx, "HSET", "invoice:{7}:data", "status", "paid")
	fmt.Println(err)

	rdb.Del(ctx, "invoice:{7}") // the lease ends (an operator, an expiry)
	_, err = lease.Fenced(ctx, "HSET", "invoice:{7}:data", "status", "refunded")
	fmt.Println(errors.Is(err, dlock.ErrStale), rdb.HGet(ctx, "invoice:{7}:data", "status").Val())
	// Output:
	// <nil>
	// true paid
}

func ExampleLocks_Campaign() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	locks := dlock.New(rdb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leaders := locks.Observe(ctx, "scheduler")
	fmt.Println("leader:", <-leaders)

	term, err := locks.Campaign(ctx, "scheduler", "10.0.0.5:7000")
	if err != nil {
		log.Fatal(err)
	}
	leader := <-leaders
	fmt.Println("leader:", *leader.Address, leader.Fence == term.Fence())
	_ = term.Resign(ctx)
	// Output:
	// leader: <nil>
	// leader: 10.0.0.5:7000 true
}
