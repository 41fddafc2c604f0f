package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	dlock "github.com/dlock-dev/dlock/go"
	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// A session as the harness runs one: requests in, one reply per id, events unprompted.
func TestTheDriverAnswersEveryRequestAndReportsALoss(t *testing.T) {
	server := testkit.StartServer(t)
	admin := server.Client(t)
	in, toDriver := io.Pipe()
	fromDriver, out := io.Pipe()
	done := make(chan int)
	go func() { done <- run(in, out, "redis://"+server.Addr()); _ = out.Close() }()
	lines := make(chan map[string]any, 100)
	go func() {
		scanner := bufio.NewScanner(fromDriver)
		for scanner.Scan() {
			var line map[string]any
			if err := json.Unmarshal(scanner.Bytes(), &line); err != nil {
				t.Errorf("not JSON on stdout: %q", scanner.Text())
			}
			lines <- line
		}
		close(lines)
	}()
	next := func() map[string]any {
		select {
		case line := <-lines:
			return line
		case <-time.After(5 * time.Second):
			t.Fatal("no line from the driver")
			return nil
		}
	}
	send := func(request string) map[string]any {
		if _, err := fmt.Fprintln(toDriver, request); err != nil {
			t.Fatal(err)
		}
		return next()
	}
	if ready := next(); ready["event"] != "ready" || ready["client"] != "dlock (Go) "+dlock.Version {
		t.Fatalf("first line %v", ready)
	}
	granted := send(`{"id":1,"op":"hold","lease":"a","resource":"r","ttl_ms":900}`)
	if ok, _ := granted["ok"].(map[string]any); ok == nil || ok["fence"] == nil || ok["token"] == nil {
		t.Fatalf("hold: %v", granted)
	}
	if held := send(`{"id":2,"op":"hold","lease":"b","resource":"r","ttl_ms":900,"wait_ms":100}`); held["error"].(map[string]any)["kind"] != "held" {
		t.Fatalf("a second hold: %v", held)
	}
	if work := send(`{"id":3,"op":"run","lease":"a","work_ms":50,"fail":true}`); work["error"].(map[string]any)["kind"] != "work" {
		t.Fatalf("a failing work: %v", work)
	}
	send(`{"id":4,"op":"hold","lease":"c","resource":"r","ttl_ms":900}`)
	admin.Del(context.Background(), "r") // an operator's DEL: lost within ttl/3
	lost := next()
	if lost["event"] != "lost" || lost["lease"] != "c" || lost["reason"] != "renewal_refused" {
		t.Fatalf("expected the loss of c, got %v", lost)
	}
	stale := send(`{"id":5,"op":"fenced","lease":"c","command":["SET","r:data","x"]}`)
	if stale["error"].(map[string]any)["kind"] != "stale" || stale["id"] != float64(5) {
		t.Fatalf("a stale fenced write: %v", stale)
	}
	if bad := send(`{"id":6,"op":"semaphore","lease":"s","resource":"p","permits":0,"ttl_ms":900}`); bad["error"].(map[string]any)["kind"] != "usage" {
		t.Fatalf("0 permits: %v", bad)
	}
	_ = toDriver.Close()
	if status := <-done; status != 0 {
		t.Fatalf("exit status %d", status)
	}
}
