package dlock

// The resources' channels, and tickets' own channels (in their resources' slots): one pub/sub
// connection per server, shared by every ticket waiter, observer and held lease of that server,
// open while anyone watches there and channelIdleClose after (a loop of holds reuses it instead
// of connecting for each). The server publishes every change of ownership of a resource on
// ChannelName(resource) (in Redis Cluster a shard channel, SSUBSCRIBE on the primary of the
// resource's slot), and tells a ticket sent with NOTIFY alone of its grant on
// TicketChannelName(resource, token). A message only wakes: whoever waits re-sends its ACQUIRE
// (or reads DLOCK.INFO again), so a lost message costs one refresh, never a grant. Two messages
// do more: a revocation (revoked <fence> <reason>), which loses the held lease with that fence
// at once (docs/protocol.md, section 4; a lost one is caught by the lease's next renewal), and a
// ticket's granted message, kept for the woken waiter, which may start its lease on it.
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

// channelIdleClose: a pub/sub connection with no channel left is closed after this long, unless
// a channel is subscribed there again meanwhile.
const channelIdleClose = 30 * time.Second

// Pauses between the attempts to find where a channel goes: rerouteRetry, doubled up to
// maxRerouteRetry while no owner answers.
const (
	rerouteRetry    = 100 * time.Millisecond
	maxRerouteRetry = time.Second
)

// watch is one waiter's, observer's or held lease's registration on a channel. wake gets a
// signal on every message that concerns it (an observer, tag "": every message; a ticket waiter:
// a hand-over to its token) and on every (re)subscription (messages may have been missed). A
// held lease's watch has no wake; revoked is called (outside the channels' lock, on the reader's
// goroutine) with the reason of a revocation of its fence.
type watch struct {
	channel string
	tag     string
	wake    chan struct{}
	fence   uint64
	revoked func(reason string)
	// own: a ticket's own channel (TicketChannelName), woken by every message there; heard is
	// the last granted message (guarded by channels.mu), kept before the waiter is woken.
	own   bool
	heard *granted
}

func (w *watch) signal() {
	if w.wake == nil {
		return
	}
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
	conns  map[*node]*pubsubConn
	closed bool
}

// pubsubConn is one node's pub/sub connection.
type pubsubConn struct {
	pubsub  *redis.PubSub
	sending sync.Mutex // one (un)subscription sent at a time (see sync)
	// leaving counts, per channel, the unsubscriptions sent whose confirmation has not come
	// yet: that confirmation is the answer to dlock's own request, not the server dropping the
	// channel. Guarded by channels.mu.
	leaving map[string]int
	idle    *time.Timer // closes it once no channel is left (guarded by channels.mu)
}

func newChannels(r *router, sharded bool) *channels {
	return &channels{router: r, sharded: sharded,
		subs: map[string]*subscription{}, conns: map[*node]*pubsubConn{}}
}

// add registers w on resource's channel; created: the channel had no watcher (it is to be
// routed and subscribed).
func (c *channels) add(resource string, w *watch) (sub *subscription, created bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sub, ok := c.subs[w.channel]
	if !ok {
		sub = &subscription{resource: resource, watches: map[*watch]struct{}{}, ready: make(chan struct{})}
		c.subs[w.channel] = sub
	}
	sub.watches[w] = struct{}{}
	return sub, !ok
}

// join registers a watch on resource's channel and returns once the server confirmed the
// subscription (or timeout passed: the watcher's own refreshes cover that).
func (c *channels) join(ctx context.Context, resource, tag string, timeout time.Duration) *watch {
	return c.joinWaking(ctx, resource, tag, timeout, make(chan struct{}, 1))
}

// joinWaking is join with the wake channel given: a waiter on several channels (a set's members)
// shares one.
func (c *channels) joinWaking(ctx context.Context, resource, tag string, timeout time.Duration, wake chan struct{}) *watch {
	return c.joinWatch(ctx, resource, &watch{channel: ChannelName(resource), tag: tag, wake: wake}, timeout)
}

// joinOwn registers a ticket waiter on its ticket's own channel (TicketChannelName of resource
// and token), in resource's slot, where the server tells that ticket alone of its grant: woken
// by every message there, the last granted one kept (heard). It returns as join does.
func (c *channels) joinOwn(ctx context.Context, resource, token string, timeout time.Duration) *watch {
	w := &watch{channel: TicketChannelName(resource, token), wake: make(chan struct{}, 1), own: true}
	return c.joinWatch(ctx, resource, w, timeout)
}

// heard is the last granted message on w's own channel, if any.
func (c *channels) heard(w *watch) (granted, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.heard == nil {
		return granted{}, false
	}
	return *w.heard, true
}

// joinWatch registers w on its channel, subscribed on resource's node, and returns once the
// server confirmed the subscription (or timeout passed).
func (c *channels) joinWatch(ctx context.Context, resource string, w *watch, timeout time.Duration) *watch {
	sub, created := c.add(resource, w)
	if created {
		c.route(ctx, w.channel, sub, timeout)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-sub.ready:
	case <-timer.C:
	case <-ctx.Done():
	}
	return w
}

// hold registers a held lease's watch on resource's channel and returns at once: a channel
// not subscribed yet is routed and subscribed on a goroutine of its own (a revocation that
// races it is caught by the lease's next renewal). revoked is called with the reason of a
// revocation of fence.
func (c *channels) hold(resource string, fence uint64, revoked func(reason string)) *watch {
	w := &watch{channel: ChannelName(resource), fence: fence, revoked: revoked}
	if sub, created := c.add(resource, w); created {
		go c.route(context.Background(), w.channel, sub, c.router.timeout)
	}
	return w
}

// route subscribes a channel that just got its first watcher on the node of its resource's
// slot, or starts looking for that node.
func (c *channels) route(ctx context.Context, channel string, sub *subscription, timeout time.Duration) {
	pick, cancel := context.WithTimeout(ctx, timeout)
	n, err := c.router.forResource(pick, sub.resource)
	cancel()
	c.mu.Lock()
	switch {
	case c.subs[channel] != sub || sub.node != nil || c.closed:
		c.mu.Unlock()
	case err != nil:
		c.reroute(channel, sub, false)
		c.mu.Unlock()
	default:
		sub.node = n
		c.open(n)
		c.mu.Unlock()
		c.sync(n, channel, timeout)
	}
}

// open makes n's pub/sub connection (without a channel yet, nothing sent) if needed. Called
// with c.mu held.
func (c *channels) open(n *node) {
	if _, ok := c.conns[n]; ok {
		return
	}
	var pubsub *redis.PubSub
	if c.sharded {
		pubsub = n.cmd.SSubscribe(context.Background())
	} else {
		pubsub = n.cmd.Subscribe(context.Background())
	}
	c.conns[n] = &pubsubConn{pubsub: pubsub, leaving: map[string]int{}}
	go c.read(n, pubsub)
}

// sync sends SSUBSCRIBE (SUBSCRIBE on a single server) for channel on n's connection, or its
// unsubscription, whichever matches what is wanted when it is sent: the channel subscribed on
// n while it has watchers. Joins, leaves and reroutes each call it after changing what is
// wanted; its sends on one connection go one at a time, each deciding as it goes, so the last
// one leaves the connection as wanted whatever order they came in. An error means a broken
// connection: go-redis makes it again and subscribes what it tracks, or read sees the failure
// and routes the channels again.
func (c *channels) sync(n *node, channel string, timeout time.Duration) {
	c.mu.Lock()
	conn := c.conns[n]
	c.mu.Unlock()
	if conn == nil {
		return // closed, and every channel with it
	}
	conn.sending.Lock()
	defer conn.sending.Unlock()
	c.mu.Lock()
	sub := c.subs[channel]
	wanted := sub != nil && sub.node == n
	if c.conns[n] != conn {
		c.mu.Unlock()
		return
	}
	if !wanted {
		conn.leaving[channel]++
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var err error
	switch {
	case wanted && c.sharded:
		err = conn.pubsub.SSubscribe(ctx, channel)
	case wanted:
		err = conn.pubsub.Subscribe(ctx, channel)
	case c.sharded:
		err = conn.pubsub.SUnsubscribe(ctx, channel)
	default:
		err = conn.pubsub.Unsubscribe(ctx, channel)
	}
	if err != nil && !wanted {
		c.mu.Lock()
		conn.unleave(channel)
		c.mu.Unlock()
	}
}

// unleave counts one unsubscription of channel as answered (or never sent): true if there was
// one. Called with channels.mu held.
func (p *pubsubConn) unleave(channel string) bool {
	if p.leaving[channel] == 0 {
		return false
	}
	if p.leaving[channel]--; p.leaving[channel] == 0 {
		delete(p.leaving, channel)
	}
	return true
}

// release takes channel off n's pub/sub connection, which closes channelIdleClose after no
// channel is left there. Called with c.mu held; the returned func does the sending, without it.
func (c *channels) release(n *node, channel string) func() {
	conn, ok := c.conns[n]
	if !ok {
		return func() {}
	}
	if !c.usedOn(n) {
		if conn.idle != nil {
			conn.idle.Stop()
		}
		conn.idle = time.AfterFunc(channelIdleClose, func() { c.closeIdle(n, conn) })
	}
	timeout := c.router.timeout
	return func() { c.sync(n, channel, timeout) }
}

// usedOn: whether a channel is subscribed on n (or on its way there). Called with c.mu held.
func (c *channels) usedOn(n *node) bool {
	for _, sub := range c.subs {
		if sub.node == n {
			return true
		}
	}
	return false
}

// closeIdle closes n's pub/sub connection conn if still no channel is subscribed there.
func (c *channels) closeIdle(n *node, conn *pubsubConn) {
	c.mu.Lock()
	if c.conns[n] != conn || c.usedOn(n) {
		c.mu.Unlock()
		return
	}
	delete(c.conns, n)
	c.mu.Unlock()
	_ = conn.pubsub.Close() // ends read
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
			// next receive, with the channels it still has): the channels here may belong
			// elsewhere now, and no answer comes to an unsubscription sent on it.
			c.mu.Lock()
			if conn := c.conns[n]; conn != nil && conn.pubsub == pubsub {
				clear(conn.leaving)
			}
			c.mu.Unlock()
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
	var revoked []func()
	c.mu.Lock()
	switch message := event.(type) {
	case *redis.Subscription:
		if message.Kind == "unsubscribe" || message.Kind == "sunsubscribe" {
			if conn := c.conns[n]; conn != nil && conn.unleave(message.Channel) {
				break // the answer to dlock's own unsubscription
			}
		}
		sub, ok := c.subs[message.Channel]
		if !ok || sub.node != n {
			break // a channel that left, or moved elsewhere
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
		if !ok {
			break
		}
		// A revocation names its lease's fence, which is news wherever it comes from (a node the
		// channel is leaving served the resource until then).
		if fence, reason, ok := revokedMessage(message.Payload); ok {
			for w := range sub.watches {
				if w.revoked != nil && w.fence == fence {
					lose := w.revoked
					revoked = append(revoked, func() { lose(reason) })
				}
			}
		}
		if sub.node != n {
			break
		}
		told, isGranted := grantedMessage(message.Payload)
		for w := range sub.watches {
			if w.own && isGranted {
				heard := told
				w.heard = &heard // before the wake: the woken waiter reads it
			}
			if wakes(message.Payload, w.tag) {
				w.signal()
			}
		}
	}
	c.mu.Unlock()
	for _, lose := range revoked {
		lose()
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
		c.open(owner)
		c.mu.Unlock()
		leaveOld()
		c.sync(owner, channel, c.router.timeout)
		return
	}
}

func (c *channels) close() {
	c.mu.Lock()
	c.closed = true
	conns := c.conns
	c.conns = map[*node]*pubsubConn{}
	for _, conn := range conns {
		if conn.idle != nil {
			conn.idle.Stop()
		}
	}
	c.mu.Unlock()
	for _, conn := range conns {
		_ = conn.pubsub.Close()
	}
}
