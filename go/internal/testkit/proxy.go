package testkit

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// Proxy forwards loopback connections to a server. Once a connection carries a request that
// contains Swallow (say "DLOCK.ACQUIRE"), the server's replies on that connection are dropped:
// the request arrives and runs, its answer never comes back (a reply lost on the way).
type Proxy struct {
	Port    int
	Swallow []byte

	mu       sync.Mutex
	requests [][]byte // every client chunk that contained Swallow, as sent
	listener net.Listener
}

// Addr is "127.0.0.1:port".
func (p *Proxy) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.Port) }

// Swallowed are the requests whose replies were dropped.
func (p *Proxy) Swallowed() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.requests...)
}

// StartProxy listens on a free loopback port and forwards to target until the test ends.
func StartProxy(t testing.TB, target string, swallow string) *Proxy {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Port: listener.Addr().(*net.TCPAddr).Port, Swallow: []byte(swallow), listener: listener}
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
			var swallowing sync.Mutex
			swallow := false
			wg.Add(2)
			go func() { // client → server
				defer wg.Done()
				defer server.Close()
				buf := make([]byte, 64*1024)
				for {
					n, err := client.Read(buf)
					if n > 0 {
						chunk := append([]byte(nil), buf[:n]...)
						if len(p.Swallow) > 0 && bytes.Contains(chunk, p.Swallow) {
							swallowing.Lock()
							swallow = true
							swallowing.Unlock()
							p.mu.Lock()
							p.requests = append(p.requests, chunk)
							p.mu.Unlock()
						}
						if _, err := server.Write(chunk); err != nil {
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
					swallowing.Lock()
					drop := swallow
					swallowing.Unlock()
					if n > 0 && !drop {
						if _, err := client.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						if err != io.EOF {
							return
						}
						return
					}
				}
			}()
		}
	}()
	return p
}
