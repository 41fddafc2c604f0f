package dlock_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/go/internal/testkit"
)

// goBlocks are the code of README.md's ```go blocks, in order.
func goBlocks(readme string) []string {
	var blocks []string
	var block []string
	inside := false
	for _, line := range strings.Split(readme, "\n") {
		switch {
		case !inside && line == "```go":
			inside, block = true, nil
		case inside && line == "```":
			inside = false
			blocks = append(blocks, strings.Join(block, "\n"))
		case inside:
			block = append(block, line)
		}
	}
	return blocks
}

// readmeRegions are the lines between "// README:begin" and "// README:end" in source, in
// order, one tab less indented (the function body's).
func readmeRegions(source string) []string {
	var regions []string
	var region []string
	inside := false
	for _, line := range strings.Split(source, "\n") {
		switch strings.TrimSpace(line) {
		case "// README:begin":
			inside, region = true, nil
			continue
		case "// README:end":
			inside = false
			regions = append(regions, strings.Join(region, "\n"))
			continue
		}
		if inside {
			region = append(region, strings.TrimPrefix(line, "\t"))
		}
	}
	return regions
}

// README.md's first Go block is the quick start, examples/quickstart/main.go as it is; every other
// Go block is code of example_test.go, where it compiles and runs.
func TestTheReadmesGoBlocksAreTheExamplesCode(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	examples, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	quickstart, err := os.ReadFile(quickStartFile)
	if err != nil {
		t.Fatal(err)
	}
	blocks, regions := goBlocks(string(readme)), readmeRegions(string(examples))
	if len(blocks) == 0 || blocks[0]+"\n" != string(quickstart) {
		t.Fatalf("README.md's first Go block is not %s as it is", quickStartFile)
	}
	blocks = blocks[1:]
	if len(blocks) == 0 || len(blocks) != len(regions) {
		t.Fatalf("README.md has %d Go blocks, example_test.go %d README regions", len(blocks), len(regions))
	}
	for i := range blocks {
		if blocks[i] != regions[i] {
			t.Errorf("README.md's Go block %d is not example_test.go's region %d; the code is:\n%s", i+2, i+1, regions[i])
		}
	}
}

// quickStartFile is the quick start of README.md, a program of the examples module.
const quickStartFile = "examples/quickstart/main.go"

// The quick start, built in the examples module and run against a server given as REDIS_URL:
// it prints the fence it worked under and releases the lease.
func TestTheQuickStartRuns(t *testing.T) {
	t.Parallel()
	binary := filepath.Join(t.TempDir(), "quickstart")
	build := exec.Command("go", "build", "-o", binary, "./quickstart")
	build.Dir = "examples"
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./quickstart: %v\n%s", err, out)
	}
	server := testkit.StartServer(t)
	run := exec.Command(binary)
	run.Env = append(os.Environ(), "REDIS_URL=redis://"+server.Addr())
	var stderr strings.Builder
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil || !regexp.MustCompile(`^paid under fence \d+\n$`).Match(out) {
		t.Fatalf("the quick start: %v\n%s%s", err, out, stderr.String())
	}
	if server.Client(t).Exists(context.Background(), "invoice:42").Val() != 0 {
		t.Fatal("the quick start left its lease")
	}
}
