// Command recompute checks a reproduction report: it recomputes every figure of
// reproduction.json and reproduction.md from the JSON's per-run latencies and counts
// (reproduce.Recompute) and exits 1, listing each figure that differs, on a mismatch.
//
//	cd e2e/reproduce && go run ./cmd/recompute [-json ../../docs/reproduction.json] [-md ../../docs/reproduction.md]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgeflow/edgeflow/e2e/reproduce"
	"github.com/edgeflow/edgeflow/internal/testkit"
)

func main() {
	docs := filepath.Join(testkit.RepoRoot(), "docs")
	js := flag.String("json", filepath.Join(docs, "reproduction.json"), "the report's JSON")
	md := flag.String("md", filepath.Join(docs, "reproduction.md"), "the report's Markdown")
	flag.Parse()
	if err := reproduce.Recompute(*js, *md); err != nil {
		if errors.Is(err, reproduce.ErrNoRunValues) {
			fmt.Fprintf(os.Stderr, "recompute: %v\n(a report written before schema 2 keeps pooled figures only; write it again from its saved outcome with make reproduce-report, or run make reproduce)\n", err)
		} else {
			fmt.Fprintf(os.Stderr, "recompute: %v\n", err)
		}
		os.Exit(1)
	}
	fmt.Printf("recompute: every figure of %s and %s follows from the JSON\n", *js, *md)
}
