package dlock

// Sentinel (redis.NewFailoverClient): dlock's own connections follow the primary the sentinels
// name, as the caller's client does. go-redis's failover client drops its pooled connections to
// the old primary when a sentinel announces +switch-master; dlock's own pools are not the
// caller's, so dlock watches for the switch itself: it asks the caller's sentinel dialer where
// the primary is every primaryCheckEvery while a lease, an acquire or an observer is live, and
// learns it from every connection it opens. A deposed primary goes on answering as a primary
// until the sentinels reconfigure it (several seconds): renewals answered there would keep a
// lease alive that the new primary lets expire. On a switch every connection to the old primary
// is closed (a blocked wait ends and is retried with the same token on the new one; a
// subscription is made again there) and every live lease renews at once on the new primary.

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// failoverAddr is the Addr of the options of a client made by redis.NewFailoverClient (and
// redis.NewUniversalClient with a MasterName): its dialer asks the sentinels for the primary.
const failoverAddr = "FailoverClient"

// primaryCheckEvery: how often the sentinels are asked for the primary while dlock is in use.
const primaryCheckEvery = time.Second

// errDeposed: a request was not sent because its connection goes to a deposed primary.
var errDeposed = errors.New("dlock: not sent: the connection's server is no longer the primary")

type dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// primaryWatch tracks dlock's own connections of a Sentinel client and where the primary is.
type primaryWatch struct {
	dial    dialer // the caller's: dials the primary the sentinels name
	network string
	timeout time.Duration

	mu      sync.Mutex
	primary string // the remote address of the latest connection to the primary
	conns   map[*trackedConn]struct{}
	moved   chan struct{} // closed at the next switch
	users   int
	stop    chan struct{} // closes the running check, nil when none runs
	closed  bool
}

func newPrimaryWatch(dial dialer, network string, timeout time.Duration) *primaryWatch {
	return &primaryWatch{dial: dial, network: network, timeout: timeout,
		conns: map[*trackedConn]struct{}{}, moved: make(chan struct{})}
}

// dialer is the Dialer of dlock's own connections: the caller's, tracked.
func (w *primaryWatch) dialer(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := w.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	remote := conn.RemoteAddr().String()
	tracked := &trackedConn{Conn: conn, watch: w, addr: remote}
	w.saw(remote)
	w.mu.Lock()
	if remote != w.primary || w.closed {
		tracked.deposed.Store(true) // a switch came between the dial and now
	} else {
		w.conns[tracked] = struct{}{}
	}
	w.mu.Unlock()
	if _, ok := conn.(syscall.Conn); ok {
		return trackedSyscallConn{tracked}, nil
	}
	return tracked, nil
}

// saw records that the primary is at addr; if it was elsewhere, every connection there is
// closed and the leases are told (movedTo).
func (w *primaryWatch) saw(addr string) {
	w.mu.Lock()
	if addr == w.primary {
		w.mu.Unlock()
		return
	}
	first := w.primary == ""
	w.primary = addr
	var stale []*trackedConn
	for c := range w.conns {
		if c.addr != addr {
			stale = append(stale, c)
			delete(w.conns, c)
		}
	}
	moved := w.moved
	if !first {
		w.moved = make(chan struct{})
	}
	w.mu.Unlock()
	for _, c := range stale {
		c.depose()
	}
	if !first {
		close(moved)
	}
}

// movedTo is closed at the next switch of the primary.
func (w *primaryWatch) movedTo() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.moved
}

// use marks dlock in use (the checks run) until the returned func is called.
func (w *primaryWatch) use() func() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return func() {}
	}
	w.users++
	if w.stop == nil {
		w.stop = make(chan struct{})
		go w.check(w.stop)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.users--
			if w.users == 0 && w.stop != nil {
				close(w.stop)
				w.stop = nil
			}
		})
	}
}

// check asks for the primary every primaryCheckEvery until stop closes.
func (w *primaryWatch) check(stop chan struct{}) {
	ticker := time.NewTicker(primaryCheckEvery)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
		conn, err := w.dial(ctx, w.network, failoverAddr)
		cancel()
		if err == nil {
			addr := conn.RemoteAddr().String()
			_ = conn.Close()
			w.saw(addr)
		}
	}
}

func (w *primaryWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.stop != nil {
		close(w.stop)
		w.stop = nil
	}
}

func (w *primaryWatch) forget(c *trackedConn) {
	w.mu.Lock()
	delete(w.conns, c)
	w.mu.Unlock()
}

// trackedConn is one of dlock's connections to a Sentinel client's primary. Once deposed it
// writes nothing (errDeposed) and its connection is closed.
type trackedConn struct {
	net.Conn
	watch   *primaryWatch
	addr    string
	deposed atomic.Bool
}

func (c *trackedConn) depose() {
	c.deposed.Store(true)
	_ = c.Conn.Close()
}

func (c *trackedConn) Write(b []byte) (int, error) {
	if c.deposed.Load() {
		return 0, errDeposed
	}
	return c.Conn.Write(b)
}

func (c *trackedConn) Close() error {
	c.watch.forget(c)
	return c.Conn.Close()
}

// trackedSyscallConn lets go-redis's pool check the connection before it reuses it: a deposed
// one fails the check and is replaced by a new one, to the new primary.
type trackedSyscallConn struct{ *trackedConn }

func (c trackedSyscallConn) SyscallConn() (syscall.RawConn, error) {
	if c.deposed.Load() {
		return nil, errDeposed
	}
	return c.Conn.(syscall.Conn).SyscallConn()
}
