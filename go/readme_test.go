package dlock_test

import (
	"os"
	"strings"
	"testing"
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

// Every Go block of README.md is code of example_test.go, where it compiles and runs.
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
	blocks, regions := goBlocks(string(readme)), readmeRegions(string(examples))
	if len(blocks) == 0 || len(blocks) != len(regions) {
		t.Fatalf("README.md has %d Go blocks, example_test.go %d README regions", len(blocks), len(regions))
	}
	for i := range blocks {
		if blocks[i] != regions[i] {
			t.Errorf("README.md's Go block %d is not example_test.go's region %d; the code is:\n%s", i+1, i+1, regions[i])
		}
	}
}
