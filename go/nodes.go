package dlock

// The connections dlock makes of its own, per server, with the caller's settings (address,
// credentials, database, TLS, protocol, dialer) but none of go-redis's retries and no read
// timeout of go-redis's own: every request carries a deadline in its context
// (ContextTimeoutEnabled), the request timeout, or for a WAIT the wait plus the request timeout.
// The caller's client is used only to find the server of a resource (a ClusterClient's slot
// map). Redirects (MOVED, ASK) are followed here, at most maxRedirects times per request.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// maxRedirects is how many MOVED or ASK replies one request follows.
const maxRedirects = 5

// reloadEvery: the slot map is read again at most this often (after MOVED, after a node failed
// to answer).
const reloadEvery = 100 * time.Millisecond

// waitPoolSize bounds the blocking waits in flight per server (each holds a connection);
// connections are made only when needed.
const waitPoolSize = 10_000

// node is one server: a pool for requests and a pool for blocking waits.
type node struct {
	addr string
	cmd  *redis.Client
	wait *redis.Client
}

type router struct {
	caller  redis.UniversalClient
	cluster *redis.ClusterClient
	base    *redis.Options // the caller's settings (a single server's, or a cluster node's)
	timeout time.Duration  // for pool waits and writes
	metrics Metrics

	mu       sync.Mutex
	nodes    map[string]*node
	moved    map[int]string // slot → primary, as MOVED replies said, until that primary fails
	one      *node          // a single server (or Sentinel's primary)
	reloaded time.Time      // when the caller's slot map was last asked to reload
	watch    *primaryWatch  // Sentinel: where the primary is (nil otherwise)
	channels *channels
}

func newRouter(caller redis.UniversalClient, requestTimeout time.Duration, metrics Metrics) (*router, error) {
	r := &router{caller: caller, timeout: requestTimeout, metrics: metrics,
		nodes: map[string]*node{}, moved: map[int]string{}}
	_, sharded := caller.(*redis.ClusterClient)
	r.channels = newChannels(r, sharded)
	switch client := caller.(type) {
	case *redis.Client:
		r.base = client.Options()
		if r.base.Addr == failoverAddr && r.base.Dialer != nil {
			r.watch = newPrimaryWatch(r.base.Dialer, r.base.Network, requestTimeout)
		}
		r.one = r.newNode(client.Options().Addr, client.Options())
	case *redis.ClusterClient:
		r.cluster = client
	default:
		return nil, fmt.Errorf("dlock: %T is not supported: give a *redis.Client (single server or Sentinel) or a *redis.ClusterClient", caller)
	}
	return r, nil
}

// own is the caller's settings with dlock's timeouts and no retries.
func (r *router) own(base *redis.Options, addr string, poolSize int) *redis.Options {
	o := *base
	o.Addr = addr
	o.MaxRetries = -1
	o.ReadTimeout = -1 // the request's context sets the deadline
	o.WriteTimeout = r.timeout
	o.ContextTimeoutEnabled = true
	o.PoolTimeout = r.timeout
	o.MinIdleConns = 0
	o.MaxActiveConns = 0
	if r.watch != nil {
		o.Dialer = r.watch.dialer
	}
	detach(&o)
	if poolSize > 0 {
		o.PoolSize = poolSize
		o.MaxIdleConns = 16
	}
	return &o
}

// detach gives options copied from another client's a push processor of their own (the other
// client's has its handlers registered already: a second client registering them fails, and
// logs it) and no maintenance notifications: their settings are a pointer shared with the other
// client, which go-redis changes as it connects (a data race), and dlock's own connections keep
// their own timeouts whatever the server announces.
func detach(o *redis.Options) {
	o.PushNotificationProcessor = nil
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

func (r *router) newNode(addr string, base *redis.Options) *node {
	n := &node{addr: addr}
	n.cmd = redis.NewClient(r.own(base, addr, 0))
	n.wait = redis.NewClient(r.own(base, addr, waitPoolSize))
	return n
}

// use marks dlock in use until the returned func is called (with Sentinel: the primary is
// watched meanwhile).
func (r *router) use() func() {
	if r.watch == nil {
		return func() {}
	}
	return r.watch.use()
}

// primaryMoved is closed when the primary moves (Sentinel), else nil.
func (r *router) primaryMoved() <-chan struct{} {
	if r.watch == nil {
		return nil
	}
	return r.watch.movedTo()
}

// at is the node at addr, made on first use with the settings of the cluster's nodes.
func (r *router) at(ctx context.Context, addr string, base *redis.Options) (*node, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.one != nil {
		return r.one, nil
	}
	if n, ok := r.nodes[addr]; ok {
		return n, nil
	}
	if base == nil {
		base = r.base
	}
	if base == nil {
		// No node known yet: the settings of whichever node serves a key.
		client, err := r.cluster.MasterForKey(ctx, "dlock")
		if err != nil {
			return nil, err
		}
		base = client.Options()
	}
	if r.base == nil {
		r.base = base
	}
	n := r.newNode(addr, base)
	r.nodes[addr] = n
	return n, nil
}

// forResource is the node serving resource's slot now.
func (r *router) forResource(ctx context.Context, resource string) (*node, error) {
	if r.one != nil {
		return r.one, nil
	}
	slot := KeySlot(resource)
	r.mu.Lock()
	addr, ok := r.moved[slot]
	r.mu.Unlock()
	if ok {
		return r.at(ctx, addr, nil)
	}
	client, err := r.cluster.MasterForKey(ctx, resource)
	if err != nil {
		return nil, err
	}
	return r.at(ctx, client.Options().Addr, client.Options())
}

// learnMoved records where a MOVED sent a slot and asks the caller's client to refresh its map.
func (r *router) learnMoved(slot int, addr string) {
	if r.cluster == nil {
		return
	}
	r.mu.Lock()
	r.moved[slot] = addr
	r.mu.Unlock()
	r.reload()
}

// reload asks the caller's client to read the slot map again, at most every reloadEvery.
func (r *router) reload() {
	r.mu.Lock()
	due := time.Since(r.reloaded) >= reloadEvery
	if due {
		r.reloaded = time.Now()
	}
	r.mu.Unlock()
	if due {
		r.cluster.ReloadState(context.Background())
	}
}

// failed is told of a request to addr that got no answer (a transport error or a timeout, not
// the caller's own cancellation): the slots MOVED replies sent there are routed by the slot map
// again, and the map is read again (docs/protocol.md, section 10), so a slot never stays
// routed to a dead node.
func (r *router) failed(caller context.Context, addr string, err error) {
	if r.cluster == nil || err == nil || errorReply(err) != "" || errors.Is(err, redis.Nil) || caller.Err() != nil {
		return
	}
	r.mu.Lock()
	for slot, to := range r.moved {
		if to == addr {
			delete(r.moved, slot)
		}
	}
	r.mu.Unlock()
	r.reload()
	r.channels.nodeFailedAt(addr)
}

// owner is the node that owns resource's slot now: the one that answers DLOCK.INFO after the
// MOVED replies (during a migration the source, which answered ASK).
func (r *router) owner(ctx context.Context, resource string) (*node, error) {
	if r.one != nil {
		return r.one, nil
	}
	_, _, owner, _, err := r.doRouted(ctx, resource, r.timeout, func(string) []any { return infoArgs(resource) })
	if err != nil {
		return nil, err
	}
	return owner, nil
}

// redirect reads a MOVED or ASK reply: its kind ("moved", "ask"), slot and address.
func redirect(err error) (kind string, slot int, addr string) {
	reply := errorReply(err)
	words := strings.Fields(reply)
	if len(words) != 3 || (words[0] != "MOVED" && words[0] != "ASK") {
		return "", 0, ""
	}
	slot, convErr := strconv.Atoi(words[1])
	if convErr != nil {
		return "", 0, ""
	}
	return strings.ToLower(words[0]), slot, words[2]
}

// do sends args to the server of resource and returns its reply (nil for a nil reply) within
// timeout, following redirects.
func (r *router) do(caller context.Context, resource string, timeout time.Duration, args ...any) (any, error) {
	reply, _, _, err := r.doBuilt(caller, resource, timeout, func(string) []any { return args })
	return reply, err
}

// doBuilt is do for the command build makes for each server it goes to (the options that
// server refused left out): the reply, the address of the server that gave it and the command
// it was given.
func (r *router) doBuilt(caller context.Context, resource string, timeout time.Duration, build func(addr string) []any) (any, string, []any, error) {
	reply, answered, _, args, err := r.doRouted(caller, resource, timeout, build)
	addr := ""
	if answered != nil {
		addr = answered.addr
	}
	return reply, addr, args, err
}

// doRouted is doBuilt that also tells the node that answered and the slot's owner: the node the
// last MOVED named, which sent the ASK when an ASK was followed (during a migration the source
// still owns the slot, and serves its shard channels).
func (r *router) doRouted(caller context.Context, resource string, timeout time.Duration, build func(addr string) []any) (reply any, answered, owner *node, args []any, err error) {
	ctx, cancel := context.WithTimeout(caller, timeout)
	defer cancel()
	n, err := r.forResource(ctx, resource)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	owner = n
	asking, redialed := false, false
	for hop := 0; ; hop++ {
		args = build(n.addr)
		if asking {
			reply, err = askingDo(ctx, n.cmd, args)
		} else {
			reply, err = n.cmd.Do(ctx, args...).Result()
		}
		if errors.Is(err, redis.Nil) {
			return nil, n, owner, args, nil
		}
		if errors.Is(err, errDeposed) && !redialed {
			// Not sent: the pool's connection went to a deposed primary. Once more, on a new
			// connection (to the new primary).
			redialed = true
			hop--
			continue
		}
		r.failed(caller, n.addr, err)
		kind, slot, addr := redirect(err)
		if kind == "" || hop == maxRedirects || ctx.Err() != nil {
			return reply, n, owner, args, err
		}
		r.metrics.Redirect()
		if kind == "moved" {
			r.learnMoved(slot, addr)
		}
		if n, err = r.at(ctx, addr, nil); err != nil {
			return nil, nil, nil, nil, err
		}
		asking = kind == "ask"
		if !asking {
			owner = n
		}
	}
}

// askingDo sends ASKING and args on one connection (ASKING holds for the next command only).
func askingDo(ctx context.Context, client *redis.Client, args []any) (any, error) {
	conn := client.Conn()
	defer conn.Close()
	var cmd *redis.Cmd
	_, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Do(ctx, "ASKING")
		cmd = pipe.Do(ctx, args...)
		return nil
	})
	if cmd != nil {
		return cmd.Result()
	}
	return nil, err
}

// blockingWait sends an ACQUIRE … WAIT on a connection of its own whose read deadline is the
// wait plus the request timeout, so go-redis never gives up while the server holds the waiter's
// place. When ctx ends first, CLIENT UNBLOCK (from another connection) ends the wait in the
// server, which answers it nil. A redirect is followed (after ASKING for an ASK: the wait then
// blocks on the node importing the slot), at most maxRedirects times.
func (r *router) blockingWait(ctx context.Context, resource string, wait, requestTimeout time.Duration, build func(addr string) []any) (any, string, []any, error) {
	pick, cancelPick := context.WithTimeout(ctx, requestTimeout)
	n, err := r.forResource(pick, resource)
	cancelPick()
	if err != nil {
		return nil, "", nil, err
	}
	asking := false
	for hop := 0; ; hop++ {
		args := build(n.addr)
		reply, err := r.waitOn(ctx, n, asking, wait, requestTimeout, args)
		if errors.Is(err, redis.Nil) {
			return nil, n.addr, args, nil
		}
		r.failed(ctx, n.addr, err)
		kind, slot, addr := redirect(err)
		if kind == "" || hop == maxRedirects || ctx.Err() != nil {
			return reply, n.addr, args, err
		}
		r.metrics.Redirect()
		if kind == "moved" {
			r.learnMoved(slot, addr)
		}
		next, atErr := r.at(ctx, addr, nil)
		if atErr != nil {
			return reply, n.addr, args, err
		}
		n, asking = next, kind == "ask"
	}
}

// waitOn sends args (a blocking ACQUIRE … WAIT) on a connection of n's wait pool, after ASKING
// if asking; CLIENT UNBLOCK through n's request pool ends it when ctx ends first.
func (r *router) waitOn(ctx context.Context, n *node, asking bool, wait, requestTimeout time.Duration, args []any) (any, error) {
	conn := n.wait.Conn()
	defer conn.Close()
	// The deadline is the wait's own, not the caller's: the caller's end is CLIENT UNBLOCK's job.
	idCtx, cancelID := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	id, err := conn.ClientID(idCtx).Result()
	cancelID()
	if err != nil {
		return nil, err
	}
	call, cancelCall := context.WithTimeout(context.WithoutCancel(ctx), wait+requestTimeout)
	defer cancelCall()
	stop := context.AfterFunc(ctx, func() {
		unblock, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		n.cmd.ClientUnblock(unblock, id)
	})
	defer stop()
	if !asking {
		return conn.Do(call, args...).Result()
	}
	var cmd *redis.Cmd
	_, err = conn.Pipelined(call, func(pipe redis.Pipeliner) error {
		pipe.Do(call, "ASKING")
		cmd = pipe.Do(call, args...)
		return nil
	})
	if cmd != nil {
		return cmd.Result()
	}
	return nil, err
}

func (r *router) close() error {
	if r.watch != nil {
		r.watch.close()
	}
	r.channels.close()
	r.mu.Lock()
	defer r.mu.Unlock()
	all := make([]*node, 0, len(r.nodes)+1)
	if r.one != nil {
		all = append(all, r.one)
	}
	for _, n := range r.nodes {
		all = append(all, n)
	}
	var errs []error
	for _, n := range all {
		errs = append(errs, n.cmd.Close(), n.wait.Close())
	}
	return errors.Join(errs...)
}

// alone sends args on a connection opened for it and closed after: the RELEASE of an attempt's
// token goes neither on the failed connection nor on a pooled one that may have gone silent
// with it. Redirects are followed, each on a connection of its own, at most maxRedirects times.
func (r *router) alone(caller context.Context, resource string, timeout time.Duration, args []any) (any, error) {
	ctx, cancel := context.WithTimeout(caller, timeout)
	defer cancel()
	n, err := r.forResource(ctx, resource)
	if err != nil {
		return nil, err
	}
	asking := false
	for hop := 0; ; hop++ {
		o := *n.cmd.Options()
		o.PoolSize, o.MaxIdleConns, o.MinIdleConns = 1, 0, 0
		detach(&o)
		client := redis.NewClient(&o)
		var reply any
		if asking {
			reply, err = askingDo(ctx, client, args)
		} else {
			reply, err = client.Do(ctx, args...).Result()
		}
		_ = client.Close()
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		r.failed(caller, n.addr, err)
		kind, slot, addr := redirect(err)
		if kind == "" || hop == maxRedirects || ctx.Err() != nil {
			return reply, err
		}
		r.metrics.Redirect()
		if kind == "moved" {
			r.learnMoved(slot, addr)
		}
		if n, err = r.at(ctx, addr, nil); err != nil {
			return nil, err
		}
		asking = kind == "ask"
	}
}
