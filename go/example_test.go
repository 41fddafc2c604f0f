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
	if holder := os.Getenv(stalledHolderEnv); holder != "" {
		os.Exit(stalledHolder(holder)) // the child process of TestAStoppedHolderLosesItsLeaseAsStalled
	}
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

// The code between "README:begin" and "README:end" in this file is what README.md prints after
// its quick start, block by block, in order (TestTheReadmesGoBlocksAreTheExamplesCode). pay, work and follow stand for
// the caller's own code.

func pay(ctx context.Context, fence uint64) error {
	fmt.Println("paid under fence", fence > 0)
	return ctx.Err()
}

func work(ctx context.Context, fence uint64) {
	fmt.Println("working under fence", fence > 0, ctx.Err())
}

func follow(leader *dlock.Leader) {}

// The quick start's call (examples/quickstart): work under a lease, released at the end.
func ExampleLocks_Do() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	locks := dlock.New(rdb)
	err := locks.Do(ctx, "invoice:42", func(ctx context.Context, lease *dlock.Lease) error {
		// ctx is cancelled if the lease is lost; send lease.Fence() with every write.
		return pay(ctx, lease.Fence())
	}, dlock.TTL(30*time.Second), dlock.Wait(10*time.Second))
	fmt.Println(err)
	// Output:
	// paid under fence true
	// <nil>
}

// holdInvoice is the README's lease.
func holdInvoice(ctx context.Context, locks *dlock.Locks) error {
	// README:begin
	lease, err := locks.Hold(ctx, "invoice:42", dlock.TTL(30*time.Second), dlock.Wait(10*time.Second))
	if errors.Is(err, dlock.ErrNotAcquired) {
		return err // held by another owner until the wait ended: try again later
	}
	if err != nil {
		return err // no lease: nothing to release
	}
	defer lease.Release(context.Background()) // bounded by the release timeout, whatever ctx does
	work(lease.Context(), lease.Fence())      // cancelled when the lease is lost
	// README:end
	return nil
}

func ExampleLocks_Hold() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	ctx := context.Background()
	fmt.Println(holdInvoice(ctx, locks))

	other, err := locks.Hold(ctx, "invoice:42")
	if err != nil {
		log.Fatal(err)
	}
	defer other.Release(ctx)
	busy, cancel := context.WithTimeout(ctx, 200*time.Millisecond) // bounds the wait too
	defer cancel()
	err = holdInvoice(busy, locks)
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired))
	// Output:
	// working under fence true <nil>
	// <nil>
	// true
}

// markPaid is the README's fenced write.
func markPaid(ctx context.Context, lease *dlock.Lease) error {
	// README:begin
	_, err := lease.Fenced(ctx, "HSET", "invoice:{42}:data", "status", "paid")
	if errors.Is(err, dlock.ErrStale) {
		return err // the lease ended: nothing was written
	}
	// README:end
	return err
}

func ExampleLease_Fenced() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	ctx := context.Background()
	lease, err := locks.Hold(ctx, "invoice:{42}")
	if err != nil {
		log.Fatal(err)
	}
	// Runs only while the lease's fence holds invoice:{42}; keys share its hash tag.
	fmt.Println(markPaid(ctx, lease))

	rdb.Del(ctx, "invoice:{42}") // the lease ends (an operator, an expiry)
	_, err = lease.Fenced(ctx, "HSET", "invoice:{42}:data", "status", "refunded")
	fmt.Println(errors.Is(err, dlock.ErrStale), rdb.HGet(ctx, "invoice:{42}:data", "status").Val())
	// Output:
	// <nil>
	// true paid
}

// roles is the README's read-write locks, semaphores and election.
func roles(ctx context.Context, locks *dlock.Locks) error {
	// README:begin
	reader, err := locks.Read(ctx, "doc") // shared with other readers, never with a writer
	if err != nil {
		return err
	}
	defer reader.Release(ctx)
	permit, err := locks.Semaphore(ctx, "pool", 10) // one of 10 permits; every user gives 10
	if err != nil {
		return err
	}
	defer permit.Release(ctx)
	go func() {
		for leader := range locks.Observe(ctx, "scheduler") { // *dlock.Leader or nil, at every change
			follow(leader)
		}
	}()
	term, err := locks.Campaign(ctx, "scheduler", "10.0.0.5:7000") // waits until leading
	if err != nil {
		return err
	}
	defer term.Resign(ctx) // the next candidate leads
	// README:end
	fmt.Println(reader.Mode(), permit.Mode(), term.Fence() > 0)
	return nil
}

func ExampleLocks_Read() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	locks := dlock.New(rdb)
	fmt.Println(roles(ctx, locks))
	writer, err := locks.Write(ctx, "doc", dlock.Wait(0)) // exclusive: free again
	fmt.Println(err, writer.Mode())
	_ = writer.Release(ctx)
	// Output:
	// shared shared true
	// <nil>
	// <nil> exclusive
}

// transfer is the README's set.
func transfer(ctx context.Context, locks *dlock.Locks) error {
	// README:begin
	accounts := []string{"{acct}:alice", "{acct}:bob"} // one hash tag: one slot in a Cluster
	err := locks.DoAll(ctx, accounts, func(ctx context.Context, set *dlock.SetLease) error {
		// Every member is held, each with its own fence; ctx is cancelled if the set is lost.
		if _, err := set.Fenced(ctx, "{acct}:alice", "DECRBY", "{acct}:alice:balance", 10); err != nil {
			return err
		}
		_, err := set.Fenced(ctx, "{acct}:bob", "INCRBY", "{acct}:bob:balance", 10)
		return err
	}, dlock.TTL(30*time.Second), dlock.Wait(10*time.Second))
	// README:end
	return err
}

func ExampleLocks_DoAll() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	locks := dlock.New(rdb)
	fmt.Println(transfer(ctx, locks))
	fmt.Println(rdb.MGet(ctx, "{acct}:alice:balance", "{acct}:bob:balance").Val())
	// Output:
	// <nil>
	// [-10 10]
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
