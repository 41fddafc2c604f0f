package dlock

// The resources' channels: one pub/sub connection per server, shared by every ticket waiter and
// observer of that server, open while anyone watches. The server publishes every change of
// ownership of a resource on ChannelName(resource) (in Redis Cluster a shard channel,
// SSUBSCRIBE on the resource's primary). A message only wakes: whoever waits re-sends its
// ACQUIRE (or reads DLOCK.INFO again), so a lost message costs one refresh, never a grant.

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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

type channels struct {
	node    *node
	sharded bool

	mu      sync.Mutex
	pubsub  *redis.PubSub
	watches map[string]map[*watch]struct{}
	ready   map[string]chan struct{} // closed once the channel's subscription is confirmed
}

func newChannels(n *node, sharded bool) *channels {
	return &channels{node: n, sharded: sharded,
		watches: map[string]map[*watch]struct{}{}, ready: map[string]chan struct{}{}}
}

// join registers a watch on resource's channel and returns once the server confirmed the
// subscription (or timeout passed: the watcher's own refreshes cover that).
func (c *channels) join(ctx context.Context, resource, tag string, timeout time.Duration) *watch {
	w := &watch{channel: ChannelName(resource), tag: tag, wake: make(chan struct{}, 1)}
	c.mu.Lock()
	watchers, ok := c.watches[w.channel]
	if !ok {
		watchers = map[*watch]struct{}{}
		c.watches[w.channel] = watchers
		c.ready[w.channel] = make(chan struct{})
	}
	watchers[w] = struct{}{}
	ready := c.ready[w.channel]
	if c.pubsub == nil {
		c.pubsub = c.subscribe(ctx, nil, w.channel)
		go c.read(c.pubsub)
	} else if !ok {
		c.subscribe(ctx, c.pubsub, w.channel)
	}
	c.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-ready:
	case <-timer.C:
	case <-ctx.Done():
	}
	return w
}

// subscribe subscribes pubsub (nil: a new one) to channel, SSUBSCRIBE in a cluster.
func (c *channels) subscribe(ctx context.Context, pubsub *redis.PubSub, channel string) *redis.PubSub {
	if pubsub == nil {
		if c.sharded {
			return c.node.cmd.SSubscribe(context.WithoutCancel(ctx), channel)
		}
		return c.node.cmd.Subscribe(context.WithoutCancel(ctx), channel)
	}
	// An error means a broken connection: go-redis makes it again and subscribes everything.
	if c.sharded {
		_ = pubsub.SSubscribe(ctx, channel)
	} else {
		_ = pubsub.Subscribe(ctx, channel)
	}
	return pubsub
}

func (c *channels) leave(w *watch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	watchers := c.watches[w.channel]
	delete(watchers, w)
	if len(watchers) > 0 || c.pubsub == nil {
		return
	}
	delete(c.watches, w.channel)
	delete(c.ready, w.channel)
	if len(c.watches) == 0 {
		_ = c.pubsub.Close() // ends read
		c.pubsub = nil
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.node.cmd.Options().PoolTimeout)
	defer cancel()
	if c.sharded {
		_ = c.pubsub.SUnsubscribe(ctx, w.channel)
	} else {
		_ = c.pubsub.Unsubscribe(ctx, w.channel)
	}
}

// read dispatches pubsub's messages until it is closed.
func (c *channels) read(pubsub *redis.PubSub) {
	for event := range pubsub.ChannelWithSubscriptions(redis.WithChannelSize(1000)) {
		c.mu.Lock()
		switch message := event.(type) {
		case *redis.Subscription:
			if message.Kind == "subscribe" || message.Kind == "ssubscribe" {
				if ready, ok := c.ready[message.Channel]; ok {
					select {
					case <-ready:
					default:
						close(ready)
					}
				}
				for w := range c.watches[message.Channel] {
					w.signal()
				}
			}
		case *redis.Message:
			for w := range c.watches[message.Channel] {
				if wakes(message.Payload, w.tag) {
					w.signal()
				}
			}
		}
		c.mu.Unlock()
	}
}

func (c *channels) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pubsub != nil {
		_ = c.pubsub.Close()
		c.pubsub = nil
	}
}
