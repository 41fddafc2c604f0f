package dlock

// The resources' channels: one pub/sub connection per server, shared by every ticket waiter and
// observer of that server, open while anyone watches there. The server publishes every change
// of ownership of a resource on ChannelName(resource) (in Redis Cluster a shard channel,
// SSUBSCRIBE on the primary of the resource's slot). A message only wakes: whoever waits
// re-sends its ACQUIRE (or reads DLOCK.INFO again), so a lost message costs one refresh, never a
// grant.
//
// In a Cluster a channel follows its slot. When the server drops a subscription (the slot moved
// away: it sends sunsubscribe), when the pub/sub connection to a node fails, or when a request
// to that node got no answer, the channels there are routed again: the resource's owner is asked
// (DLOCK.INFO, which follows MOVED; during a migration the source, which serves the slot's shard
// channels until the slot has moved) until one answers, and the channel is subscribed there.
// Every (re)subscription wakes its watchers, who send again (messages may have been missed).

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// channelHealthEvery: a pub/sub connection silent this long is pinged; silent as long again,
// its channels are routed again (a node that stopped answering).
const channelHealthEvery = 3 * time.Second

// Pauses between the attempts to find where a channel goes: rerouteRetry, doubled up to
// maxRerouteRetry while no owner answers.
const (
	rerouteRetry    = 100 * time.Millisecond
	maxRerouteRetry = time.Second
)

// watch is one waiter's (or observer's) registration on a channel. wake gets a signal on every
// message that concerns it (an observer, tag "": every message; a ticket waiter: a hand-over to
// its token) and on every (re)subscription (messages may have been missed).
type watch struct {
	channel string
	tag     string
	wake    chan struct{}
}

func (w *watch) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// subscription is one channel and its watchers, subscribed on one node.
type subscription struct {
	resource  string
	node      *node // where it is subscribed; nil: nowhere yet
	watches   map[*watch]struct{}
	ready     chan struct{} // closed once a subscription was confirmed
	rerouting bool          // a goroutine looks for its node
	forced    bool          // subscribe again even on the same node (the server dropped it)
}

type channels struct {
	router  *router
	sharded bool

	mu     sync.Mutex
	subs   map[string]*subscription // by channel name
	conns  map[*node]*redis.PubSub
	closed bool
}

func newChannels(r *router, sharded bool) *channels {
	return &channels{router: r, sharded: sharded,
		subs: map[string]*subscription{}, conns: map[*node]*redis.PubSub{}}
}

// join registers a watch on resource's channel and returns once the server confirmed the
// subscription (or timeout passed: the watcher's own refreshes cover that).
func (c *channels) join(ctx context.Context, resource, tag string, timeout time.Duration) *watch {
	w := &watch{channel: ChannelName(resource), tag: tag, wake: make(chan struct{}, 1)}
	c.mu.Lock()
	sub, ok := c.subs[w.channel]
	if !ok {
		sub = &subscription{resource: resource, watches: map[*watch]struct{}{}, ready: make(chan struct{})}
		c.subs[w.channel] = sub
	}
	sub.watches[w] = struct{}{}
	ready := sub.ready
	c.mu.Unlock()
	if !ok {
		pick, cancel := context.WithTimeout(ctx, timeout)
		n, err := c.router.forResource(pick, resource)
		cancel()
		c.mu.Lock()
		switch {
		case c.subs[w.channel] != sub || sub.node != nil || c.closed:
		case err != nil:
			c.reroute(w.channel, sub, false)
		default:
			sub.node = n
			pubsub := c.open(n)
			c.mu.Unlock()
			c.subscribe(pubsub, w.channel, timeout)
			c.mu.Lock()
		}
		c.mu.Unlock()
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-ready:
	case <-timer.C:
	case <-ctx.Done():
	}
	return w
}

// open is n's pub/sub connection, made (without a channel yet, nothing sent) if needed. Called
// with c.mu held.
func (c *channels) open(n *node) *redis.PubSub {
	if pubsub, ok := c.conns[n]; ok {
		return pubsub
	}
	var pubsub *redis.PubSub
	if c.sharded {
		pubsub = n.cmd.SSubscribe(context.Background())
	} else {
		pubsub = n.cmd.Subscribe(context.Background())
	}
	c.conns[n] = pubsub
	go c.read(n, pubsub)
	return pubsub
}

// subscribe sends SSUBSCRIBE (SUBSCRIBE on a single server) for channel on pubsub. An error
// means a broken connection: go-redis makes it again and subscribes everything, or read sees
// the failure and routes the channel again.
func (c *channels) subscribe(pubsub *redis.PubSub, channel string, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if c.sharded {
		_ = pubsub.SSubscribe(ctx, channel)
	} else {
		_ = pubsub.Subscribe(ctx, channel)
	}
}

// release takes channel off n's pub/sub connection, and closes it when no channel is left there.
// Called with c.mu held; the returned func does the sending, without it.
func (c *channels) release(n *node, channel string) func() {
	pubsub, ok := c.conns[n]
	if !ok {
		return func() {}
	}
	for _, sub := range c.subs {
		if sub.node == n {
			timeout := c.router.timeout
			return func() {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				if c.sharded {
					_ = pubsub.SUnsubscribe(ctx, channel)
				} else {
					_ = pubsub.Unsubscribe(ctx, channel)
				}
			}
		}
	}
	delete(c.conns, n)
	return func() { _ = pubsub.Close() } // ends read
}

func (c *channels) leave(w *watch) {
	c.mu.Lock()
	sub, ok := c.subs[w.channel]
	if !ok {
		c.mu.Unlock()
		return
	}
	delete(sub.watches, w)
	if len(sub.watches) > 0 {
		c.mu.Unlock()
		return
	}
	delete(c.subs, w.channel)
	done := func() {}
	if sub.node != nil {
		done = c.release(sub.node, w.channel)
	}
	c.mu.Unlock()
	done()
}

// read dispatches pubsub's messages until it is closed; a failed connection routes its channels
// again.
func (c *channels) read(n *node, pubsub *redis.PubSub) {
	failing, pinged := false, false
	for {
		event, err := pubsub.ReceiveTimeout(context.Background(), channelHealthEvery)
		if errors.Is(err, redis.ErrClosed) {
			return
		}
		var timeout interface{ Timeout() bool }
		if errors.As(err, &timeout) && timeout.Timeout() && !pinged {
			pinged = true
			ctx, cancel := context.WithTimeout(context.Background(), c.router.timeout)
			_ = pubsub.Ping(ctx)
			cancel()
			continue
		}
		if err != nil {
			// No answer to the ping, or a broken connection (go-redis connects again at the
			// next receive): the channels here may belong elsewhere now.
			if !failing {
				failing = true
				c.nodeFailed(n)
			}
			pinged = false
			time.Sleep(rerouteRetry)
			continue
		}
		failing, pinged = false, false
		c.dispatch(n, event)
	}
}

func (c *channels) dispatch(n *node, event any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch message := event.(type) {
	case *redis.Subscription:
		sub, ok := c.subs[message.Channel]
		if !ok || sub.node != n {
			return // a channel that left, or moved elsewhere
		}
		switch message.Kind {
		case "subscribe", "ssubscribe":
			select {
			case <-sub.ready:
			default:
				close(sub.ready)
			}
			for w := range sub.watches {
				w.signal()
			}
		case "unsubscribe", "sunsubscribe":
			// Not asked for (a channel that still has watchers here): the server dropped it,
			// its slot moved away.
			c.reroute(message.Channel, sub, true)
		}
	case *redis.Message:
		sub, ok := c.subs[message.Channel]
		if !ok || sub.node != n {
			return
		}
		for w := range sub.watches {
			if wakes(message.Payload, w.tag) {
				w.signal()
			}
		}
	}
}

// nodeFailed routes again the channels subscribed on n.
func (c *channels) nodeFailed(n *node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for channel, sub := range c.subs {
		if sub.node == n {
			c.reroute(channel, sub, false)
		}
	}
}

// nodeFailedAt is nodeFailed for the node at addr (a request there got no answer).
func (c *channels) nodeFailedAt(addr string) {
	c.mu.Lock()
	var failed *node
	for n := range c.conns {
		if n.addr == addr {
			failed = n
		}
	}
	c.mu.Unlock()
	if failed != nil {
		c.nodeFailed(failed)
	}
}

// reroute starts looking for the node of channel (one search at a time); force subscribes again
// even on the node it is on. Called with c.mu held.
func (c *channels) reroute(channel string, sub *subscription, force bool) {
	if force {
		sub.forced = true
	}
	if sub.rerouting || c.closed {
		return
	}
	sub.rerouting = true
	go c.rerouteLoop(channel, sub)
}

func (c *channels) rerouteLoop(channel string, sub *subscription) {
	pause := rerouteRetry
	for {
		ctx, cancel := context.WithTimeout(context.Background(), c.router.timeout)
		owner, err := c.router.owner(ctx, sub.resource)
		cancel()
		c.mu.Lock()
		if c.subs[channel] != sub || c.closed {
			c.mu.Unlock()
			return
		}
		if err != nil {
			c.mu.Unlock()
			time.Sleep(pause)
			pause = min(2*pause, maxRerouteRetry)
			continue
		}
		sub.rerouting = false
		if owner == sub.node && !sub.forced {
			c.mu.Unlock()
			return
		}
		sub.forced = false
		old := sub.node
		sub.node = owner
		leaveOld := func() {}
		if old != nil && old != owner {
			leaveOld = c.release(old, channel)
		}
		pubsub := c.open(owner)
		c.mu.Unlock()
		leaveOld()
		c.subscribe(pubsub, channel, c.router.timeout)
		return
	}
}

func (c *channels) close() {
	c.mu.Lock()
	c.closed = true
	conns := c.conns
	c.conns = map[*node]*redis.PubSub{}
	c.mu.Unlock()
	for _, pubsub := range conns {
		_ = pubsub.Close()
	}
}
