package prometheus_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
	"github.com/dlock-dev/dlock/go/prometheus"
)

func TestALeaseItsLossAndAStaleWriteShowUnderTheContractsNames(t *testing.T) {
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	registry := prom.NewRegistry()
	locks := dlock.New(rdb, dlock.WithMetrics(prometheus.New(registry)))
	defer locks.Close()
	ctx := context.Background()

	lease, err := locks.Hold(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locks.Hold(ctx, "r", dlock.Wait(0)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	rdb.Del(ctx, "r")
	if _, err := lease.Fenced(ctx, "SET", "r:data", "x"); !errors.Is(err, dlock.ErrStale) {
		t.Fatal(err)
	}
	// A release answered 0 is the loss (ended), counted once as a loss, not as a failed release.
	if err := lease.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("a release of a deleted lease: %v", err)
	}
	want := `
# HELP dlock_client_acquire_attempts_total Acquire attempts (one per Hold, Read, Write, Semaphore or campaign round).
# TYPE dlock_client_acquire_attempts_total counter
dlock_client_acquire_attempts_total 2
# HELP dlock_client_acquire_failures_total Acquire attempts that ended without a lease, by outcome (held, unreachable, unknown, server).
# TYPE dlock_client_acquire_failures_total counter
dlock_client_acquire_failures_total{reason="held"} 1
# HELP dlock_client_leases_lost_total Leases lost before their work ended, by loss reason.
# TYPE dlock_client_leases_lost_total counter
dlock_client_leases_lost_total{reason="ended"} 1
# HELP dlock_client_release_failures_total Releases of a lease believed live that got no answer or an error reply (the lease ends with its ttl).
# TYPE dlock_client_release_failures_total counter
dlock_client_release_failures_total 0
# HELP dlock_client_stale_writes_total Fenced writes the server refused as stale.
# TYPE dlock_client_stale_writes_total counter
dlock_client_stale_writes_total 1
`
	names := []string{"dlock_client_acquire_attempts_total", "dlock_client_acquire_failures_total",
		"dlock_client_leases_lost_total", "dlock_client_release_failures_total", "dlock_client_stale_writes_total"}
	if err := testutil.GatherAndCompare(registry, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(registry, "dlock_client_acquire_seconds", "dlock_client_hold_seconds"); n != 2 {
		t.Fatalf("%d histograms", n)
	}
}
