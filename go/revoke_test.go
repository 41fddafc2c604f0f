package dlock_test

// DLOCK.REVOKE against real servers: the holder hears of it on its resource's channel at once
// (docs/protocol.md, section 4, "Hearing of a revocation").

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// connectionsReceived is how many connections the server accepted so far.
func connectionsReceived(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	text, err := rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(text, "\r\n") {
		if value, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
			n, err := strconv.Atoi(value)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("INFO stats has no total_connections_received")
	return 0
}

// revocationsSeen counts the losses and releases the metrics hook is told of.
type revocationsSeen struct {
	dlock.NoMetrics
	mu     sync.Mutex
	lost   []string
	failed atomic.Int64
}

func (m *revocationsSeen) LeaseLost(reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lost = append(m.lost, reason)
}

func (m *revocationsSeen) ReleaseFailed() { m.failed.Add(1) }

func (m *revocationsSeen) losses() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.lost)
}

// lockedBuffer is a log destination safe for the client's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// revokedAs checks that err is the loss of lease by a revocation for reason.
func revokedAs(t *testing.T, err error, lease *dlock.Lease, reason string) {
	t.Helper()
	var lost *dlock.LeaseLostError
	if !errors.Is(err, dlock.ErrLeaseLost) || !errors.As(err, &lost) {
		t.Fatalf("not a lost lease: %v", err)
	}
	if lost.Reason != dlock.ReasonRevoked || lost.Detail != reason || lost.Fence != lease.Fence() ||
		lost.Resource != lease.Resource() {
		t.Fatalf("lost %+v, want revoked (%q) of fence %d", lost, reason, lease.Fence())
	}
}

func TestARevokedHolderLosesItsLeaseAtOnceWithTheOperatorsReason(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	operator := server.Client(t) // another connection: the operator's
	seen := &revocationsSeen{}
	logs := &lockedBuffer{}
	locks := newLocks(t, server.Client(t), dlock.WithMetrics(seen),
		dlock.Logger(slog.New(slog.NewTextHandler(logs, nil))))
	ctx := context.Background()
	const resource, reason = "report:7", "stuck since 03:00"
	channel := dlock.ChannelName(resource)

	const rounds = 20
	latencies := make([]time.Duration, 0, rounds)
	connections := 0
	for i := 0; i < rounds; i++ {
		if i == 1 {
			connections = connectionsReceived(t, operator)
		}
		// ttl 30 s: before the first renewal (10 s) only the channel can tell the holder.
		lease, err := locks.Hold(ctx, resource, dlock.TTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		testkit.AwaitSubscribers(t, operator, channel, false, 1)
		lostAt := make(chan time.Time, 1)
		go func() {
			<-lease.Done()
			lostAt <- time.Now()
		}()
		n, err := operator.Do(ctx, "DLOCK.REVOKE", resource, "REASON", reason).Int()
		replied := time.Now()
		if err != nil || n != 1 {
			t.Fatalf("DLOCK.REVOKE: %d, %v", n, err)
		}
		latencies = append(latencies, (<-lostAt).Sub(replied))
		revokedAs(t, lease.Err(), lease, reason)
		revokedAs(t, context.Cause(lease.Context()), lease, reason)
		revokedAs(t, lease.Release(ctx), lease, reason)
		// The lease ended: the channel is left (nobody else listens there).
		testkit.AwaitSubscribers(t, operator, channel, false, 0)
	}
	// One pub/sub connection served every lease: none was opened after the first round.
	if opened := connectionsReceived(t, operator) - connections; opened != 0 {
		t.Fatalf("%d connections opened for %d leases after the first", opened, rounds-1)
	}
	slices.Sort(latencies)
	t.Logf("from the REVOKE reply to the loss, %d revocations: median %v, max %v (negative: the loss came first)",
		rounds, latencies[rounds/2], latencies[rounds-1])

	// The work of Do is cancelled with the loss as its cause, and Do reports it.
	started, done := make(chan struct{}), make(chan error, 1)
	var cause error
	go func() {
		done <- locks.Do(ctx, resource, func(work context.Context, _ *dlock.Lease) error {
			close(started)
			<-work.Done()
			cause = context.Cause(work)
			return nil
		}, dlock.TTL(30*time.Second))
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatal(err)
	}
	testkit.AwaitSubscribers(t, operator, channel, false, 1)
	if n, err := operator.Do(ctx, "DLOCK.REVOKE", resource, "REASON", reason).Int(); err != nil || n != 1 {
		t.Fatalf("DLOCK.REVOKE: %d, %v", n, err)
	}
	err := <-done
	var lost *dlock.LeaseLostError
	if !errors.As(err, &lost) || lost.Reason != dlock.ReasonRevoked || !errors.Is(cause, dlock.ErrLeaseLost) ||
		!strings.Contains(err.Error(), "revoked: "+reason) {
		t.Fatalf("Do after a revocation: %v (the work's cause: %v)", err, cause)
	}

	if losses := seen.losses(); len(losses) != rounds+1 || slices.IndexFunc(losses, func(r string) bool { return r != dlock.ReasonRevoked }) >= 0 {
		t.Fatalf("leases lost counted: %v", losses)
	}
	// No RELEASE followed a revocation (the lease was gone), and none was counted as failed.
	if sent := serverCount(t, operator, "release_ok") + serverCount(t, operator, "release_not_owner"); sent != 0 {
		t.Fatalf("%d RELEASE after a revocation", sent)
	}
	if seen.failed.Load() != 0 || serverCount(t, operator, "leases_revoked") != rounds+1 {
		t.Fatal("releases failed, or not every revocation counted by the server")
	}
	if log := logs.String(); strings.Count(log, `msg="dlock: lease lost"`) != rounds+1 ||
		!strings.Contains(log, `reason=revoked detail="stuck since 03:00"`) {
		t.Fatalf("the loss log lines:\n%s", log)
	}
}

func TestARevocationOfAnotherLeaseLeavesTheHolderAlone(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	operator := server.Client(t)
	locks := newLocks(t, server.Client(t))
	ctx := context.Background()
	const resource = "doc"
	// Three readers of one lock, through one Locks: one channel, three watchers.
	var readers []*dlock.Lease
	for i := 0; i < 3; i++ {
		reader, err := locks.Read(ctx, resource, dlock.TTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer reader.Release(ctx)
		readers = append(readers, reader)
	}
	holder, other, last := readers[0], readers[1], readers[2]
	testkit.AwaitSubscribers(t, operator, dlock.ChannelName(resource), false, 1)
	for _, revoked := range []*dlock.Lease{other, last} {
		if n, err := operator.Do(ctx, "DLOCK.REVOKE", resource, "FENCE", revoked.Fence()).Int(); err != nil || n != 1 {
			t.Fatalf("DLOCK.REVOKE FENCE: %d, %v", n, err)
		}
	}
	// The messages are dispatched in order: once the last revoked reader knows, the first
	// message was dispatched too.
	<-last.Done()
	revokedAs(t, last.Err(), last, "")
	revokedAs(t, other.Err(), other, "")
	if err := holder.Err(); err != nil {
		t.Fatalf("the holder was touched by another reader's revocation: %v", err)
	}
	if renewed, err := holder.Renew(ctx); !renewed || err != nil {
		t.Fatalf("the holder's renewal: %v, %v", renewed, err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.AwaitSubscribers(t, operator, dlock.ChannelName(resource), false, 0)
}
