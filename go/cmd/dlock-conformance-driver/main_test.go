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
	set := send(`{"id":7,"op":"hold_all","lease":"s","resources":["{s}:2","{s}:1"],"ttl_ms":900}`)
	if ok, _ := set["ok"].(map[string]any); ok == nil || len(ok["fences"].([]any)) != 2 || ok["token"] == nil {
		t.Fatalf("hold_all: %v", set)
	}
	if wrote := send(`{"id":8,"op":"fenced","lease":"s","resource":"{s}:1","command":["SET","{s}:data","x"]}`); wrote["ok"].(map[string]any)["reply"] != "OK" {
		t.Fatalf("a fenced write under a member's fence: %v", wrote)
	}
	if outside := send(`{"id":9,"op":"fenced","lease":"s","resource":"{s}:3","command":["SET","{s}:data","y"]}`); outside["error"].(map[string]any)["kind"] != "usage" {
		t.Fatalf("a fenced write under a resource outside the set: %v", outside)
	}
	if work := send(`{"id":10,"op":"run","lease":"s","work_ms":10,"fail":false}`); work["ok"].(map[string]any)["output"] != "done" {
		t.Fatalf("a set's work: %v", work)
	}
	if n := admin.Exists(context.Background(), "{s}:1", "{s}:2").Val(); n != 0 {
		t.Fatalf("%d members held after the set's work", n)
	}
	_ = toDriver.Close()
	if status := <-done; status != 0 {
		t.Fatalf("exit status %d", status)
	}
}
