package redsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
	"github.com/dlock-dev/dlock/go/redsync"
)

// Code written for redsync's Mutex, unchanged but for the constructor.
func TestRedsyncShapedCodeRunsOnDlock(t *testing.T) {
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	locks := dlock.New(rdb)
	defer locks.Close()
	rs := redsync.New(locks)

	mutex := rs.NewMutex("invoice:42", redsync.WithExpiry(900*time.Millisecond), redsync.WithWait(100*time.Millisecond))
	if err := mutex.Lock(); err != nil {
		t.Fatal(err)
	}
	if mutex.Value() == "" || mutex.Fence() == 0 || time.Until(mutex.Until()) <= 0 {
		t.Fatalf("a held mutex shows value %q, fence %d, until %v", mutex.Value(), mutex.Fence(), mutex.Until())
	}
	other := rs.NewMutex("invoice:42", redsync.WithWait(100*time.Millisecond))
	if err := other.Lock(); !errors.Is(err, redsync.ErrFailed) {
		t.Fatalf("a second Lock: %v", err)
	}
	// Held past its expiry: renewed underneath, unlike redsync.
	time.Sleep(1200 * time.Millisecond)
	if ok, err := mutex.Valid(); !ok || err != nil {
		t.Fatalf("Valid after the expiry: %v %v", ok, err)
	}
	if ok, err := mutex.Extend(); !ok || err != nil {
		t.Fatalf("Extend: %v %v", ok, err)
	}
	if ok, err := mutex.Unlock(); !ok || err != nil {
		t.Fatalf("Unlock: %v %v", ok, err)
	}
	if err := other.TryLock(); err != nil {
		t.Fatalf("TryLock of a free mutex: %v", err)
	}
	rdb.Del(context.Background(), "invoice:42")
	if ok, err := other.Unlock(); ok || !errors.Is(err, redsync.ErrLockAlreadyExpired) {
		t.Fatalf("Unlock of a deleted lock: %v %v", ok, err)
	}
}
