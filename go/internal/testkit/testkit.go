// Package testkit starts real servers for the tests: redis-server (or $DLOCK_SERVER, e.g. a
// valkey-server) with the dlock module on its own port and directory, a Redis Cluster of three
// primaries, a primary with a replica and a sentinel (the same binary with --sentinel), and a
// throwaway PostgreSQL. Each has a start-up deadline and is stopped by the
// test's cleanup. Nothing assumes port 6379 or a server that is already running.
package testkit

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startDeadline: how long a server may take to answer PING after start.
const startDeadline = 20 * time.Second

// RepoRoot is the repository's top directory (the one with Cargo.toml above go/).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "Cargo.toml")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "go")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no repository root above the working directory")
		}
		dir = parent
	}
}

// ModulePath is the module under test: $DLOCK_MODULE, else the newest of the repository's
// target/release and target/debug builds.
func ModulePath() (string, error) {
	if path := os.Getenv("DLOCK_MODULE"); path != "" {
		return filepath.Abs(path)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	newest, newestTime := "", time.Time{}
	for _, candidate := range []string{"target/release/libdlock.so", "target/debug/libdlock.so"} {
		path := filepath.Join(root, candidate)
		if info, err := os.Stat(path); err == nil && info.ModTime().After(newestTime) {
			newest, newestTime = path, info.ModTime()
		}
	}
	if newest == "" {
		return "", fmt.Errorf("libdlock.so not found: run `cargo build -p dlock` or set DLOCK_MODULE")
	}
	return newest, nil
}

// ServerBinary is the server under test: $DLOCK_SERVER, or redis-server.
func ServerBinary() string {
	if binary := os.Getenv("DLOCK_SERVER"); binary != "" {
		return binary
	}
	return "redis-server"
}

// FreePort is a loopback port nobody listens on right now.
func FreePort() (int, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port, nil
}

// Server is one running server with the module.
type Server struct {
	Port int
	Dir  string
	cmd  *exec.Cmd
	args []string
	// sentinel: a redis-sentinel (the server binary with --sentinel and a config file of its
	// own), without the module.
	sentinel bool
}

// Addr is "127.0.0.1:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// Client is a new go-redis client of this server (RESP3, go-redis's defaults otherwise),
// closed by the test's cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	client := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// Log is the server's log so far.
func (s *Server) Log() string {
	text, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
	return string(text)
}

// Pause freezes the process (SIGSTOP); Resume lets it go on (SIGCONT).
func (s *Server) Pause() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume after Pause.
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// Stop kills the server (SIGKILL) and waits for it.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		_ = s.cmd.Process.Kill()
		_, _ = s.cmd.Process.Wait()
		s.cmd = nil
	}
}

// StartServer starts a server without persistence; extra arguments come after the defaults.
// The test fails if it does not answer within the deadline.
func StartServer(t testing.TB, args ...string) *Server {
	t.Helper()
	server, err := Start(append([]string{"--save", "", "--appendonly", "no"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		server.Stop()
		_ = os.RemoveAll(server.Dir)
	})
	return server
}

// Start starts a server with args (the caller stops it and removes its Dir), on another port if
// the first one was taken meanwhile.
func Start(args []string) (*Server, error) {
	return start(args, false)
}

func start(args []string, sentinel bool) (*Server, error) {
	module, err := ModulePath()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "dlock-go-test-")
	if err != nil {
		return nil, err
	}
	var last error
	for try := 0; try < 5; try++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		server := &Server{Port: port, Dir: dir, args: args, sentinel: sentinel}
		if last = server.spawn(module); last == nil {
			return server, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, last
}

func (s *Server) spawn(module string) error {
	args := []string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--dir", s.Dir,
		"--logfile", filepath.Join(s.Dir, "server.log"), "--loglevel", "verbose",
	}
	if s.sentinel {
		// Sentinel rewrites its config file: one of its own, in its directory.
		conf := filepath.Join(s.Dir, "sentinel.conf")
		if err := os.WriteFile(conf, nil, 0o644); err != nil {
			return err
		}
		args = append([]string{conf, "--sentinel"}, args...)
	} else {
		args = append(args, "--enable-debug-command", "yes", "--loadmodule", module)
	}
	args = append(args, s.args...)
	s.cmd = exec.Command(ServerBinary(), args...)
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("%s must be installed (make deps): %w", ServerBinary(), err)
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	client := redis.NewClient(&redis.Options{Addr: s.Addr(), Protocol: 2, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second})
	defer client.Close()
	deadline := time.Now().Add(startDeadline)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			s.cmd = nil
			return fmt.Errorf("%s exited: %v; log:\n%s", ServerBinary(), err, s.Log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		// Another test's server may hold the port: only our own process counts as ready.
		text, err := client.Info(ctx, "server").Result()
		if err == nil && strings.Contains(text, fmt.Sprintf("process_id:%d\r", s.cmd.Process.Pid)) &&
			client.Ping(ctx).Err() == nil {
			cancel()
			// Wait no more for the process: Stop waits on it.
			go func() { <-exited }()
			return nil
		}
		cancel()
		time.Sleep(20 * time.Millisecond)
	}
	_ = s.cmd.Process.Kill()
	<-exited
	s.cmd = nil
	return fmt.Errorf("%s not ready after %v; log:\n%s", ServerBinary(), startDeadline, s.Log())
}

// Cluster is a Redis Cluster of three primaries, the module on each, and with
// StartClusterWithReplicas a replica of each.
type Cluster struct {
	Nodes []*Server // the primaries first, then the replicas
}

// Addrs are the nodes' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client is a new go-redis ClusterClient of the cluster, closed by the test's cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// Other is a node of the cluster other than not (in a cluster without replicas, another
// primary).
func (c *Cluster) Other(not *Server) *Server {
	for _, n := range c.Nodes {
		if n != not {
			return n
		}
	}
	return nil
}

// Owner is the node serving key's slot now.
func (c *Cluster) Owner(t testing.TB, key string) *Server {
	t.Helper()
	ctx := context.Background()
	var client *redis.Client
	for _, n := range c.Nodes {
		if n.cmd != nil { // not stopped
			client = n.Client(t)
			break
		}
	}
	slot, err := client.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	slots, err := client.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range slots {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			for _, n := range c.Nodes {
				if n.Addr() == r.Nodes[0].Addr {
					return n
				}
			}
		}
	}
	t.Fatalf("no node serves slot %d", slot)
	return nil
}

// StartCluster starts three nodes and joins them with redis-cli --cluster create; it returns
// once every node says the cluster is ok.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	return startCluster(t, 0, 15*time.Second)
}

// StartClusterWithReplicas is StartCluster with a replica of each primary (six nodes) and
// nodeTimeout (cluster-node-timeout: how long a primary may not answer before its replica is
// elected in its place); it returns once every node says the cluster is ok and every replica's
// link is up.
func StartClusterWithReplicas(t testing.TB, nodeTimeout time.Duration) *Cluster {
	t.Helper()
	return startCluster(t, 1, nodeTimeout)
}

func startCluster(t testing.TB, replicas int, nodeTimeout time.Duration) *Cluster {
	t.Helper()
	cluster := &Cluster{}
	for i := 0; i < 3*(1+replicas); i++ {
		cluster.Nodes = append(cluster.Nodes, StartServer(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
			"--repl-diskless-sync-delay", "0"))
	}
	args := append([]string{"--cluster", "create"}, cluster.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if output, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, output)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, node := range cluster.Nodes {
		client := node.Client(t)
		for {
			info, err := client.ClusterInfo(context.Background()).Result()
			replication, _ := client.Info(context.Background(), "replication").Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				(!strings.Contains(replication, "role:slave") || strings.Contains(replication, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok on %s: %v %s %s", node.Addr(), err, info, replication)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return cluster
}

// ReplicaOf is the replica streaming from primary (its link up).
func (c *Cluster) ReplicaOf(t testing.TB, primary *Server) *Server {
	t.Helper()
	port := "master_port:" + strconv.Itoa(primary.Port) + "\r"
	clients := make([]*redis.Client, len(c.Nodes))
	for i, n := range c.Nodes {
		clients[i] = n.Client(t)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		for i, n := range c.Nodes {
			info, _ := clients[i].Info(context.Background(), "replication").Result()
			if strings.Contains(info, port) && strings.Contains(info, "master_link_status:up") {
				return n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no replica of %s", primary.Addr())
		}
	}
}

// Failover promotes replica (CLUSTER FAILOVER TAKEOVER on it: it takes its primary's slots
// without waiting for the primary's offset, which the module's timers may keep moving past the
// manual failover's 5 s, nor for a vote; make sure the replica has what matters first, with
// WAIT) and returns once every node's slot map names it the primary of its shard's slots.
func (c *Cluster) Failover(t testing.TB, replica *Server) {
	t.Helper()
	if err := replica.Client(t).Do(context.Background(), "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER: %v", err)
	}
	c.awaitPrimary(t, replica)
}

// KillPrimary kills primary (SIGKILL) and returns once its replica was elected in its place
// (after the cluster's node timeout) in the slot map of every node still running.
func (c *Cluster) KillPrimary(t testing.TB, primary, replica *Server) {
	t.Helper()
	primary.Stop()
	c.awaitPrimary(t, replica)
}

// awaitPrimary returns once every running node's slot map names node a primary with slots.
func (c *Cluster) awaitPrimary(t testing.TB, node *Server) {
	t.Helper()
	ctx := context.Background()
	id, err := node.Client(t).Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	var clients []*redis.Client
	for _, n := range c.Nodes {
		if n.cmd != nil {
			clients = append(clients, n.Client(t))
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		promoted := true
		for _, n := range clients {
			nodes, _ := n.ClusterNodes(ctx).Result()
			if !primaryIn(nodes, id) {
				promoted = false
			}
		}
		if promoted {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not promoted; its log:\n%s", node.Addr(), node.Log())
		}
	}
}

// primaryIn: whether CLUSTER NODES's text names the node id a primary with slots.
func primaryIn(nodes, id string) bool {
	for _, line := range strings.Split(nodes, "\n") {
		fields := strings.Fields(line)
		if len(fields) > 8 && fields[0] == id && strings.Contains(fields[2], "master") {
			return true
		}
	}
	return false
}

// MoveSlot moves key's slot (and its keys) from the node serving it to to, the way redis-cli
// --cluster reshard does: IMPORTING, MIGRATING, MIGRATE of the keys, then SETSLOT NODE on every
// node.
func (c *Cluster) MoveSlot(t testing.TB, key string, to *Server) {
	t.Helper()
	move := c.BeginSlotMove(t, key, to)
	move.MigrateKeys(t)
	move.Finish(t)
}

// SlotMove is a slot on its way from one node to another.
type SlotMove struct {
	cluster  *Cluster
	Slot     int
	From, To *Server
	toID     string
}

// BeginSlotMove marks key's slot IMPORTING on to and MIGRATING on the node serving it: from
// then on that node answers ASK for the slot's keys it no longer has.
func (c *Cluster) BeginSlotMove(t testing.TB, key string, to *Server) *SlotMove {
	t.Helper()
	ctx := context.Background()
	from := c.Owner(t, key)
	if from == to {
		t.Fatalf("%s already serves %q", to.Addr(), key)
	}
	src, dst := from.Client(t), to.Client(t)
	slot, err := src.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	srcID, err := src.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	dstID, err := dst.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		t.Fatal(err)
	}
	return &SlotMove{cluster: c, Slot: int(slot), From: from, To: to, toID: dstID}
}

// MigrateKeys moves every key of the slot to the importing node (MIGRATE).
func (m *SlotMove) MigrateKeys(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	src := m.From.Client(t)
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, m.Slot, 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			return
		}
		args := []any{"MIGRATE", "127.0.0.1", m.To.Port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// Finish gives the slot to the importing node on every node (SETSLOT NODE).
func (m *SlotMove) Finish(t testing.TB) {
	t.Helper()
	for _, node := range m.cluster.Nodes {
		if err := node.Client(t).Do(context.Background(), "CLUSTER", "SETSLOT", m.Slot, "NODE", m.toID).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// Asking runs command on the importing node after ASKING (as a client does after ASK), on one
// connection.
func (m *SlotMove) Asking(t testing.TB, command ...any) (any, error) {
	t.Helper()
	ctx := context.Background()
	conn := m.To.Client(t).Conn()
	defer conn.Close()
	var cmd *redis.Cmd
	_, _ = conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Do(ctx, "ASKING")
		cmd = pipe.Do(ctx, command...)
		return nil
	})
	return cmd.Result()
}

// Sentinel is a primary with the module, a replica of it, and one redis-sentinel (quorum 1)
// watching them under the name Master.
type Sentinel struct {
	Master   string
	Primary  *Server
	Replica  *Server
	Sentinel *Server
}

// StartSentinel starts a primary, its replica and a sentinel, and returns once the replica is in
// sync and the sentinel knows it (a failover can promote it).
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	s := &Sentinel{Master: "dlock"}
	s.Primary = StartServer(t)
	s.Replica = StartServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(s.Primary.Port))
	sentinel, err := start([]string{
		"--sentinel", "monitor", s.Master, "127.0.0.1", strconv.Itoa(s.Primary.Port), "1",
		"--sentinel", "down-after-milliseconds", s.Master, "2000",
		"--sentinel", "failover-timeout", s.Master, "10000",
	}, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sentinel.Stop()
		_ = os.RemoveAll(sentinel.Dir)
	})
	s.Sentinel = sentinel
	ctx := context.Background()
	replica, watcher := s.Replica.Client(t), s.Sentinel.Client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, _ := replica.Info(ctx, "replication").Result()
		known, _ := watcher.Do(ctx, "SENTINEL", "REPLICAS", s.Master).Slice()
		if strings.Contains(info, "master_link_status:up") && len(known) > 0 {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel setup not ready: replica %q, sentinel knows %v", info, known)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Failover makes the sentinel promote the replica (SENTINEL FAILOVER) and returns once the
// sentinel names it the primary and it says so itself. Primary and Replica swap.
func (s *Sentinel) Failover(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	watcher, promoted := s.Sentinel.Client(t), s.Replica.Client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Refused (NOGOODSLAVE, INPROG) until the sentinel has a replica it may promote.
		err := watcher.Do(ctx, "SENTINEL", "FAILOVER", s.Master).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SENTINEL FAILOVER: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		addr, _ := watcher.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.Master).StringSlice()
		role, _ := promoted.Do(ctx, "ROLE").Slice()
		if len(addr) == 2 && addr[1] == strconv.Itoa(s.Replica.Port) && len(role) > 0 && role[0] == "master" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover: the sentinel names %v, the replica's role is %v", addr, role)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Primary, s.Replica = s.Replica, s.Primary
}
