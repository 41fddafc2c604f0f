package dlock_test

// The reason of a loss at the local expiry (stalled or unreachable), and which releases count as
// failed (docs/protocol.md, sections 3 and 5).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// stalledHolderEnv names, in the child process TestAStoppedHolderLosesItsLeaseAsStalled starts
// (this test binary again), the server to hold a lease on.
const stalledHolderEnv = "DLOCK_TEST_STALLED_HOLDER"

// stalledHolder is the child process of TestAStoppedHolderLosesItsLeaseAsStalled (TestMain runs
// it instead of the tests): it holds a lease (ttl 900 ms) on the server at addr, says "held", and
// once told "release" (after it was stopped past its ttl and resumed) releases it and says what
// it saw. Its exit status.
func stalledHolder(addr string) int {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	seen := &revocationsSeen{}
	var logged lockedBuffer
	locks := dlock.New(rdb, dlock.WithMetrics(seen),
		dlock.Logger(slog.New(slog.NewTextHandler(&logged, nil))))
	defer locks.Close()
	lease, err := locks.Hold(context.Background(), "stalled", dlock.TTL(900*time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("held")
	if line, _ := bufio.NewReader(os.Stdin).ReadString('\n'); line != "release\n" {
		fmt.Fprintf(os.Stderr, "told %q\n", line)
		return 1
	}
	// The renewer, woken late, or Release, whichever runs first, finds the local expiry passed.
	released := lease.Release(context.Background())
	var lost *dlock.LeaseLostError
	if !errors.As(released, &lost) || !errors.Is(lease.Err(), dlock.ErrLeaseLost) {
		fmt.Fprintf(os.Stderr, "released: %v, lease: %v\n", released, lease.Err())
		return 1
	}
	fmt.Printf("lost=%s losses=%v release_failures=%d release_failed_logged=%v\n", lost.Reason,
		seen.losses(), seen.failed.Load(), strings.Contains(logged.String(), "release failed"))
	return 0
}

// A holder whose process was stopped (SIGSTOP) past its ttl, while the server stayed reachable,
// loses its lease as stalled, not unreachable: no renewal was waiting for an answer. Its release
// then sends a best-effort RELEASE, which counts no release failure. (A stopped server instead:
// TestAPausedServerPastTheTTLLosesTheLeaseAtItsLocalExpiry, unreachable.)
func TestAStoppedHolderLosesItsLeaseAsStalled(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), stalledHolderEnv+"="+server.Addr())
	child.Stderr = os.Stderr
	toChild, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	fromChild, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	lines := make(chan string, 16)
	go func() {
		scanner := bufio.NewScanner(fromChild)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
		close(lines)
	}()
	expect := func(prefix string) string {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("the child ended before %q", prefix)
				}
				if strings.HasPrefix(line, prefix) {
					return line
				}
			case <-timeout:
				t.Fatalf("no %q from the child", prefix)
			}
		}
	}
	expect("held")
	time.Sleep(100 * time.Millisecond) // between the grant and the first renewal (ttl/3)
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // past the ttl (900 ms): the server let the lease expire
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintln(toChild, "release"); err != nil {
		t.Fatal(err)
	}
	got := expect("lost=")
	if want := "lost=stalled losses=[stalled] release_failures=0 release_failed_logged=false"; got != want {
		t.Fatalf("the child saw %q, want %q", got, want)
	}
}

// A lease lost and then released counts no release failure and logs no "release failed": a
// RELEASE answered 0 is the loss ended (counted once, as a loss), and a release after a loss
// already reported is not a failure either.
func TestALostLeaseReleasedCountsNoReleaseFailure(t *testing.T) {
	t.Parallel()
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	seen := &revocationsSeen{}
	var logged lockedBuffer
	locks := newLocks(t, rdb, dlock.WithMetrics(seen),
		dlock.Logger(slog.New(slog.NewTextHandler(&logged, nil))))
	ctx := context.Background()
	ttl := 900 * time.Millisecond
	lostAs := func(err error, reason string) {
		t.Helper()
		var lost *dlock.LeaseLostError
		if !errors.As(err, &lost) || lost.Reason != reason {
			t.Fatalf("got %v, want a loss (%s)", err, reason)
		}
	}

	// Deleted, then released before a renewal noticed: the RELEASE is answered 0 (ended).
	ended, err := locks.Hold(ctx, "ended", dlock.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, "ended") // an operator's DEL
	lostAs(ended.Release(ctx), dlock.ReasonEnded)

	// Deleted, the next renewal refused (the loss), then released.
	refused, err := locks.Hold(ctx, "refused", dlock.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, "refused")
	select {
	case <-refused.Done():
	case <-time.After(2 * ttl):
		t.Fatal("the deleted lease was not lost")
	}
	lostAs(refused.Release(ctx), dlock.ReasonRenewalRefused)

	if losses := fmt.Sprint(seen.losses()); losses != "[ended renewal_refused]" {
		t.Fatalf("losses counted: %s", losses)
	}
	if n := seen.failed.Load(); n != 0 {
		t.Fatalf("%d release failures counted", n)
	}
	if log := logged.String(); strings.Contains(log, "release failed") ||
		strings.Count(log, "dlock: lease lost") != 2 {
		t.Fatalf("log:\n%s", log)
	}
}
