// Command dlock-conformance-driver drives the Go client for the conformance harness, as
// docs/protocol.md (section 14) says: one JSON request per line on stdin, one JSON reply (or
// event) per line on stdout, logs on stderr. It connects to $DLOCK_URL (a redis:// URL, or several
// separated by commas for a cluster's seeds), writes {"event": "ready"}, serves requests
// concurrently, and exits when stdin closes (after answering the requests already read, for at
// most 2 s), releasing nothing on purpose.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock-dev/dlock/go"
)

type request struct {
	ID        *int64   `json:"id"`
	Op        string   `json:"op"`
	Lease     string   `json:"lease"`
	Resource  string   `json:"resource"`
	Resources []string `json:"resources"`
	Name      string   `json:"name"`
	Address   string   `json:"address"`
	TTLMS     int64    `json:"ttl_ms"`
	WaitMS    *int64   `json:"wait_ms"`
	TicketMS  int64    `json:"ticket_ms"`
	Strategy  string   `json:"strategy"`
	Meta      *string  `json:"meta"`
	MaxHold   *int64   `json:"max_hold_ms"`
	Mode      string   `json:"mode"`
	Permits   int      `json:"permits"`
	Command   []string `json:"command"`
	WorkMS    int64    `json:"work_ms"`
	Fail      bool     `json:"fail"`
}

// failure is an error reply's body.
type failure struct {
	Kind     string `json:"kind"`
	Detail   string `json:"detail"`
	Token    string `json:"token,omitempty"`
	Released *bool  `json:"released,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// errWork is the work's own failure (run with fail set).
var errWork = errors.New("the work failed")

type driver struct {
	locks *dlock.Locks
	out   *json.Encoder
	outMu sync.Mutex

	inFlight sync.WaitGroup

	mu     sync.Mutex
	leases map[string]held
}

// held is a lease the driver holds by name: a single lease, or a set (hold_all).
type held struct {
	lease *dlock.Lease
	set   *dlock.SetLease
}

func (h held) done() <-chan struct{} {
	if h.set != nil {
		return h.set.Done()
	}
	return h.lease.Done()
}

func (h held) err() error {
	if h.set != nil {
		return h.set.Err()
	}
	return h.lease.Err()
}

func (h held) release(ctx context.Context) error {
	if h.set != nil {
		return h.set.Release(ctx)
	}
	return h.lease.Release(ctx)
}

// run runs work under the lease (the client's own Run) and releases it.
func (h held) run(ctx context.Context, work func(ctx context.Context) error) error {
	if h.set != nil {
		return h.set.Run(ctx, func(ctx context.Context, _ *dlock.SetLease) error { return work(ctx) })
	}
	return h.lease.Run(ctx, func(ctx context.Context, _ *dlock.Lease) error { return work(ctx) })
}

// fenced sends command under the lease's fence (a set's: the fence of its member resource).
func (h held) fenced(ctx context.Context, resource string, command []any) (any, error) {
	if h.set != nil {
		return h.set.Fenced(ctx, resource, command...)
	}
	return h.lease.Fenced(ctx, command...)
}

// closingGrace: after stdin closes, how long requests already read may take to be answered.
const closingGrace = 2 * time.Second

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	os.Exit(run(os.Stdin, os.Stdout, os.Getenv("DLOCK_URL")))
}

// run serves the requests of in on out until in closes; its exit status.
func run(in io.Reader, out io.Writer, url string) int {
	rdb, err := connect(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dlock-conformance-driver:", err)
		return 2
	}
	d := &driver{locks: dlock.New(rdb), out: json.NewEncoder(out), leases: map[string]held{}}
	d.write(map[string]any{"event": "ready", "client": "dlock (Go) " + dlock.Version})
	scanner := bufio.NewScanner(in)
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" {
			continue
		}
		var req request
		if err := json.Unmarshal([]byte(line), &req); err != nil || req.ID == nil {
			fmt.Fprintf(os.Stderr, "dlock-conformance-driver: not a request: %q (%v)\n", line, err)
			continue
		}
		d.inFlight.Add(1)
		go func() {
			defer d.inFlight.Done()
			d.serve(req)
		}()
	}
	// stdin closed: the requests already read get their replies (waiting at most
	// closingGrace), then the driver exits, releasing nothing.
	answered := make(chan struct{})
	go func() { d.inFlight.Wait(); close(answered) }()
	select {
	case <-answered:
	case <-time.After(closingGrace):
	}
	return 0
}

// connect makes a client of url: a *redis.Client, or a *redis.ClusterClient for several URLs.
func connect(url string) (redis.UniversalClient, error) {
	if url == "" {
		return nil, errors.New("DLOCK_URL is not set")
	}
	urls := strings.Split(url, ",")
	first, err := redis.ParseURL(strings.TrimSpace(urls[0]))
	if err != nil {
		return nil, err
	}
	if len(urls) == 1 {
		return redis.NewClient(first), nil
	}
	addrs := []string{}
	for _, u := range urls {
		o, err := redis.ParseURL(strings.TrimSpace(u))
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, o.Addr)
	}
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: first.Username,
		Password: first.Password, TLSConfig: first.TLSConfig}), nil
}

func (d *driver) write(value any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	if err := d.out.Encode(value); err != nil {
		fmt.Fprintln(os.Stderr, "dlock-conformance-driver: stdout:", err)
		os.Exit(1)
	}
}

func (d *driver) serve(req request) {
	ok, err := d.handle(req)
	if err != nil {
		d.write(map[string]any{"id": *req.ID, "error": describe(err)})
		return
	}
	d.write(map[string]any{"id": *req.ID, "ok": ok})
}

func (d *driver) held(name string) (held, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.leases[name]
	if !ok {
		return held{}, &dlock.ServerError{Class: dlock.ClassUsage, Reply: fmt.Sprintf("no lease named %q", name)}
	}
	return h, nil
}

// lease is the single lease named name (a set has no renew).
func (d *driver) lease(name string) (*dlock.Lease, error) {
	h, err := d.held(name)
	if err == nil && h.lease == nil {
		err = &dlock.ServerError{Class: dlock.ClassUsage, Reply: fmt.Sprintf("%q is a set", name)}
	}
	return h.lease, err
}

func (d *driver) handle(req request) (any, error) {
	ctx := context.Background()
	switch req.Op {
	case "hold", "wait", "ticket", "shared", "semaphore":
		return d.hold(ctx, req)
	case "hold_all":
		opts := []dlock.Option{dlock.TTL(ms(req.TTLMS)), dlock.Wait(0)}
		if req.WaitMS != nil {
			opts = append(opts, dlock.Wait(ms(*req.WaitMS)))
		}
		set, err := d.locks.HoldAll(ctx, req.Resources, opts...)
		if err != nil {
			return nil, err
		}
		d.keep(req.Lease, held{set: set})
		return map[string]any{"fences": set.Fences(), "token": set.Token()}, nil
	case "campaign":
		opts := []dlock.Option{dlock.TTL(ms(req.TTLMS))}
		if req.WaitMS != nil {
			opts = append(opts, dlock.Wait(ms(*req.WaitMS)))
		}
		lease, err := d.locks.Campaign(ctx, req.Name, req.Address, opts...)
		if err != nil {
			return nil, err
		}
		d.keep(req.Lease, held{lease: lease})
		return map[string]any{"fence": lease.Fence()}, nil
	case "renew":
		lease, err := d.lease(req.Lease)
		if err != nil {
			return nil, err
		}
		renewed, err := lease.Renew(ctx)
		var lost *dlock.LeaseLostError
		if errors.As(err, &lost) {
			return map[string]any{"renewed": false}, nil
		}
		if err != nil {
			return nil, err
		}
		return map[string]any{"renewed": renewed}, nil
	case "release":
		h, err := d.held(req.Lease)
		if err != nil {
			return nil, err
		}
		err = h.release(ctx)
		var lost *dlock.LeaseLostError
		if errors.As(err, &lost) {
			return map[string]any{"released": false}, nil
		}
		if err != nil {
			return nil, err
		}
		return map[string]any{"released": true}, nil
	case "fenced":
		h, err := d.held(req.Lease)
		if err != nil {
			return nil, err
		}
		command := make([]any, len(req.Command))
		for i, arg := range req.Command {
			command[i] = arg
		}
		reply, err := h.fenced(ctx, req.Resource, command)
		if err != nil {
			return nil, err
		}
		return map[string]any{"reply": encode(reply)}, nil
	case "run":
		h, err := d.held(req.Lease)
		if err != nil {
			return nil, err
		}
		err = h.run(ctx, func(ctx context.Context) error {
			timer := time.NewTimer(ms(req.WorkMS))
			defer timer.Stop()
			select {
			case <-timer.C:
			case <-ctx.Done():
				if !req.Fail {
					return ctx.Err()
				}
			}
			if req.Fail {
				return errWork
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		return map[string]any{"output": "done"}, nil
	case "observe":
		leaders := d.locks.Observe(context.Background(), req.Name)
		go func() {
			for leader := range leaders {
				var shown any
				if leader != nil {
					shown = map[string]any{"token": leader.Token, "fence": leader.Fence, "address": leader.Address}
				}
				d.write(map[string]any{"event": "leader", "name": req.Name, "leader": shown})
			}
		}()
		return map[string]any{}, nil
	}
	return nil, &dlock.ServerError{Class: dlock.ClassUsage, Reply: fmt.Sprintf("unknown op %q", req.Op)}
}

func (d *driver) hold(ctx context.Context, req request) (any, error) {
	opts := []dlock.Option{dlock.TTL(ms(req.TTLMS)), dlock.Wait(0)}
	if req.WaitMS != nil {
		opts = append(opts, dlock.Wait(ms(*req.WaitMS)))
	}
	if req.Meta != nil {
		opts = append(opts, dlock.Meta(*req.Meta))
	}
	if req.MaxHold != nil {
		opts = append(opts, dlock.MaxHold(ms(*req.MaxHold)))
	}
	strategy, mode := req.Strategy, req.Mode
	switch req.Op {
	case "wait":
		strategy = "block"
	case "ticket":
		strategy = "tickets"
	case "shared":
		mode = "shared"
	case "semaphore":
		mode = "permits"
	}
	switch strategy {
	case "tickets":
		opts = append(opts, dlock.Tickets(ms(req.TicketMS)))
	case "", "block":
		opts = append(opts, dlock.Blocking())
	default:
		return nil, &dlock.ServerError{Class: dlock.ClassUsage, Reply: fmt.Sprintf("unknown strategy %q", strategy)}
	}
	var (
		lease *dlock.Lease
		err   error
	)
	switch mode {
	case "", "exclusive":
		lease, err = d.locks.Hold(ctx, req.Resource, opts...)
	case "shared":
		lease, err = d.locks.Read(ctx, req.Resource, opts...)
	case "permits":
		lease, err = d.locks.Semaphore(ctx, req.Resource, req.Permits, opts...)
	default:
		return nil, &dlock.ServerError{Class: dlock.ClassUsage, Reply: fmt.Sprintf("unknown mode %q", mode)}
	}
	if err != nil {
		return nil, err
	}
	d.keep(req.Lease, held{lease: lease})
	return map[string]any{"fence": lease.Fence(), "token": lease.Token()}, nil
}

// keep names a held lease and reports its loss the moment the client knows it.
func (d *driver) keep(name string, h held) {
	d.mu.Lock()
	d.leases[name] = h
	d.mu.Unlock()
	go func() {
		<-h.done()
		var lost *dlock.LeaseLostError
		if errors.As(h.err(), &lost) {
			d.write(map[string]any{"event": "lost", "lease": name, "reason": lost.Reason})
		}
	}()
}

// describe is an error reply's body: its kind (docs/protocol.md, section 14) and details.
func describe(err error) failure {
	f := failure{Detail: err.Error()}
	var (
		acquire *dlock.AcquireError
		lost    *dlock.LeaseLostError
		release *dlock.ReleaseError
		stale   *dlock.StaleError
	)
	switch {
	case errors.Is(err, errWork):
		f.Kind = "work"
	case errors.Is(err, dlock.ErrInvalidArgument):
		f.Kind = dlock.ClassUsage
	case errors.As(err, &lost):
		f.Kind, f.Reason = "lost", lost.Reason
	case errors.As(err, &release):
		f.Kind = "not_released"
	case errors.As(err, &stale):
		f.Kind = "stale"
	case errors.As(err, &acquire):
		switch acquire.Outcome {
		case dlock.OutcomeHeld, dlock.OutcomeUnreachable:
			f.Kind = acquire.Outcome
		case dlock.OutcomeUnknown:
			f.Kind, f.Token = "unknown", acquire.Token
			f.Released = &acquire.Released
		default:
			f.Kind = classOr(acquire.Err, "server")
		}
	default:
		f.Kind = classOr(err, "unknown")
	}
	return f
}

func classOr(err error, otherwise string) string {
	if class := dlock.Class(err); class != "" {
		return class
	}
	return otherwise
}

// encode writes an inner reply as replies.json does: null, integers, strings, lists, and
// {"map": [[name, value], …]} for a RESP3 map. go-redis reads a status reply as a string, so a
// status ("OK") is written as a string.
func encode(reply any) any {
	switch v := reply.(type) {
	case []any:
		out := make([]any, len(v))
		for i, item := range v {
			out[i] = encode(item)
		}
		return out
	case map[any]any:
		pairs := [][]any{}
		for key, value := range v {
			pairs = append(pairs, []any{encode(key), encode(value)})
		}
		return map[string]any{"map": pairs}
	}
	return reply
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
