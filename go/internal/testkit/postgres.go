package testkit

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// PGUser is the database user the tests connect as (trust authentication).
const PGUser = "dlock"

// pgBin is the directory of initdb and postgres: $DLOCK_PG_BIN, or the newest
// /usr/lib/postgresql/<version>/bin; "" if there is none.
func pgBin() string {
	if dir := os.Getenv("DLOCK_PG_BIN"); dir != "" {
		return dir
	}
	entries, _ := os.ReadDir("/usr/lib/postgresql")
	var versions []int
	for _, entry := range entries {
		if v, err := strconv.Atoi(entry.Name()); err == nil {
			if _, err := os.Stat(filepath.Join("/usr/lib/postgresql", entry.Name(), "bin/initdb")); err == nil {
				versions = append(versions, v)
			}
		}
	}
	if len(versions) == 0 {
		return ""
	}
	sort.Ints(versions)
	return filepath.Join("/usr/lib/postgresql", strconv.Itoa(versions[len(versions)-1]), "bin")
}

// asPostgres runs program as the postgres user when running as root (initdb refuses root).
func asPostgres(program string, args ...string) *exec.Cmd {
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", program}, args...)...)
	}
	return exec.Command(program, args...)
}

// StartPostgres creates a PostgreSQL cluster in a temporary directory, starts it on a free
// loopback port and returns its connection URL; stopped and removed by the test's cleanup.
// Without PostgreSQL's binaries the test is skipped, or fails when $DLOCK_REQUIRE_POSTGRES is set
// (scripts/go.sh sets it after installing them).
func StartPostgres(t testing.TB) string {
	t.Helper()
	bin := pgBin()
	if bin == "" {
		if os.Getenv("DLOCK_REQUIRE_POSTGRES") != "" {
			t.Fatal("PostgreSQL is required ($DLOCK_REQUIRE_POSTGRES) but no /usr/lib/postgresql/*/bin/initdb exists")
		}
		t.Skip("skipped: no PostgreSQL binaries (/usr/lib/postgresql/*/bin or $DLOCK_PG_BIN); scripts/go.sh installs them")
	}
	dir, err := os.MkdirTemp("", "dlock-go-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		if output, err := exec.Command("chown", "-R", "postgres:postgres", dir).CombinedOutput(); err != nil {
			t.Fatalf("chown: %v %s", err, output)
		}
	}
	data := filepath.Join(dir, "data")
	if output, err := asPostgres(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", PGUser,
		"--no-sync", "-E", "UTF8", "--locale=C").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, output)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	server := asPostgres(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	server.Stdout, server.Stderr = log, log
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = server.Wait(); close(exited) }()
	t.Cleanup(func() {
		// The child may be runuser: stop the server by its pid file.
		if pid, err := os.ReadFile(filepath.Join(data, "postmaster.pid")); err == nil {
			first, _, _ := strings.Cut(string(pid), "\n")
			_ = exec.Command("kill", "-INT", strings.TrimSpace(first)).Run()
		}
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = server.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			_ = conn.Close()
			ready := exec.Command(filepath.Join(bin, "pg_isready"), "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", PGUser)
			if ready.Run() == nil {
				return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", PGUser, port)
			}
		}
		select {
		case <-exited:
			logText, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			t.Fatalf("postgres exited:\n%s", logText)
		case <-time.After(50 * time.Millisecond):
		}
	}
	logText, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
	t.Fatalf("postgres did not start on port %d:\n%s", port, logText)
	return ""
}
