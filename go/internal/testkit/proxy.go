package testkit

import (
	"bytes"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// ProxyOptions say what a Proxy does to the connections that carry a request containing Match
// (say "DLOCK.ACQUIRE"); every other connection, and each of these until that request, is
// forwarded as it is.
type ProxyOptions struct {
	Match string
	// Swallow: the server's replies on such a connection are dropped from that request on: the
	// request arrives and runs, its answer never comes back (a reply lost on the way).
	Swallow bool
	// Delay: the server's replies on such a connection are held this long each (a slow path).
	Delay time.Duration
	// Refuse: such a request is not forwarded; this error reply (without "-" and CRLF) is
	// answered in its place (a server that does not know an option of it).
	Refuse string
	// Connections: only the first this many such connections are acted on (0: all of them).
	Connections int
	// Rewrites replace byte strings by others of the same length on every connection, in what
	// clients send or (Replies) in what the server answers. With both directions a test plays
	// an older server: a new option renamed on the way in, the server's complaint about the new
	// name renamed back on the way out. A string split between two reads is not seen (small
	// requests on loopback are read whole).
	Rewrites []Rewrite
}

// Rewrite is one byte string a Proxy replaces by another of the same length.
type Rewrite struct {
	From, To string
	Replies  bool
}

// rewrite applies the rewrites of one direction to data, in place.
func rewrite(data []byte, rewrites []Rewrite, replies bool) {
	for _, r := range rewrites {
		if r.Replies != replies || len(r.From) != len(r.To) || r.From == "" {
			continue
		}
		for at := 0; ; {
			found := bytes.Index(data[at:], []byte(r.From))
			if found < 0 {
				break
			}
			copy(data[at+found:], r.To)
			at += found + len(r.From)
		}
	}
}

// Proxy forwards loopback connections to a server, acting on some as its ProxyOptions say.
type Proxy struct {
	Port int
	opts ProxyOptions

	mu       sync.Mutex
	requests [][]byte // every client chunk that contained Match, as sent
	acted    int      // connections acted on so far
	listener net.Listener
}

// Addr is "127.0.0.1:port".
func (p *Proxy) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.Port) }

// Swallowed are the requests that contained Match (their replies dropped, with Swallow).
func (p *Proxy) Swallowed() [][]byte { return p.Matched() }

// Matched are the requests that contained Match, as the client sent them (refused ones too).
func (p *Proxy) Matched() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.requests...)
}

// StartProxy listens on a free loopback port and forwards to target until the test ends; the
// replies on a connection are dropped once it carried a request containing swallow.
func StartProxy(t testing.TB, target string, swallow string) *Proxy {
	t.Helper()
	return StartProxyWith(t, target, ProxyOptions{Match: swallow, Swallow: true})
}

// StartProxyWith listens on a free loopback port and forwards to target until the test ends,
// acting on connections as opts say.
func StartProxyWith(t testing.TB, target string, opts ProxyOptions) *Proxy {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Port: listener.Addr().(*net.TCPAddr).Port, opts: opts, listener: listener}
	match := []byte(opts.Match)
	var wg sync.WaitGroup
	var conns []net.Conn
	var connsMu sync.Mutex
	t.Cleanup(func() {
		_ = listener.Close()
		connsMu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		connsMu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := listener.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			connsMu.Lock()
			conns = append(conns, client, server)
			connsMu.Unlock()
			var state sync.Mutex
			matched, acting := false, false // acting: this connection is one the options act on
			var toClient sync.Mutex         // one writer at a time to the client
			wg.Add(2)
			go func() { // client → server
				defer wg.Done()
				defer server.Close()
				buf := make([]byte, 64*1024)
				for {
					n, err := client.Read(buf)
					if n > 0 {
						chunk := append([]byte(nil), buf[:n]...)
						refuse := false
						matches := len(match) > 0 && bytes.Contains(chunk, match)
						rewrite(chunk, opts.Rewrites, false)
						if matches {
							p.mu.Lock()
							p.requests = append(p.requests, chunk)
							state.Lock()
							if !matched {
								matched = true
								if opts.Connections == 0 || p.acted < opts.Connections {
									p.acted++
									acting = true
								}
							}
							refuse = acting && opts.Refuse != ""
							state.Unlock()
							p.mu.Unlock()
						}
						if refuse {
							toClient.Lock()
							_, err := client.Write([]byte("-" + opts.Refuse + "\r\n"))
							toClient.Unlock()
							if err != nil {
								return
							}
						} else if _, err := server.Write(chunk); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() { // server → client
				defer wg.Done()
				defer client.Close()
				buf := make([]byte, 64*1024)
				for {
					n, err := server.Read(buf)
					state.Lock()
					act := acting
					state.Unlock()
					if n > 0 {
						rewrite(buf[:n], opts.Rewrites, true)
					}
					if n > 0 && !(act && opts.Swallow) {
						if act && opts.Delay > 0 {
							time.Sleep(opts.Delay)
						}
						toClient.Lock()
						_, err := client.Write(buf[:n])
						toClient.Unlock()
						if err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}
