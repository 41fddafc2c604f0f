package dlock_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// tests/clients/snippet.go, the go-redis snippet that docs/clients.md prints, built and run as
// it is: with the lock free it writes under the fence and releases; with the lock held by
// another owner it waits once in the server (5 s), gives up and writes nothing.
func TestTheGoRedisSnippetOfDocsClientsMdRuns(t *testing.T) {
	t.Parallel()
	root, err := testkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(t.TempDir(), "snippet")
	// Built in this module, with its go-redis.
	if out, err := exec.Command("go", "build", "-o", binary, filepath.Join(root, "tests/clients/snippet.go")).CombinedOutput(); err != nil {
		t.Fatalf("go build tests/clients/snippet.go: %v\n%s", err, out)
	}
	server := testkit.StartServer(t)
	rdb := server.Client(t)
	ctx := context.Background()
	run := func() (string, error) {
		out, err := exec.Command(binary, strconv.Itoa(server.Port)).CombinedOutput()
		return string(out), err
	}

	out, err := run()
	if err != nil || !strings.Contains(out, "paid under fence ") {
		t.Fatalf("the snippet with the lock free: %v\n%s", err, out)
	}
	if status := rdb.HGet(ctx, "invoice:{123}:data", "status").Val(); status != "paid" {
		t.Fatalf("status %q after the snippet", status)
	}
	if rdb.Exists(ctx, "invoice:{123}").Val() != 0 {
		t.Fatal("the snippet left its lease")
	}

	if err := rdb.Do(ctx, "DLOCK.ACQUIRE", "invoice:{123}", "someone-else", 60000).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, "invoice:{123}:data")
	out, err = run()
	if err == nil || !strings.Contains(out, "held by someone else") {
		t.Fatalf("the snippet with the lock held: %v\n%s", err, out)
	}
	if rdb.Exists(ctx, "invoice:{123}:data").Val() != 0 {
		t.Fatal("the snippet wrote without the lock")
	}
	// One wait in the server, timed out there: no client-side timeout gave up first, and no retry
	// queued the token again.
	if started, timedOut := serverCount(t, rdb, "waits_started"), serverCount(t, rdb, "waits_timed_out"); started != 1 || timedOut != 1 {
		t.Fatalf("%d waits started, %d timed out by the server; want 1 and 1", started, timedOut)
	}
}
