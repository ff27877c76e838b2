package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestMissingSuites(t *testing.T) {
	suites := []*suite{{name: "unit"}, {name: "e2e"}}
	if got := missingSuites(suites, "unit, e2e,ui,,quiet"); !slices.Equal(got, []string{"ui", "quiet"}) {
		t.Errorf("missing %q, want [ui quiet]", got)
	}
	if got := missingSuites(suites, ""); len(got) != 0 {
		t.Errorf("nothing wanted: missing %q", got)
	}
}

// A failed test's last log lines reach the report (a failure's cause, where a CI log cut its
// whole output); a passing test's do not, nor a failed test's lines that are no log line.
func TestFailedTestsLastLogLines(t *testing.T) {
	var events []string
	add := func(action, test, output string) {
		b, err := json.Marshal(event{Time: time.Unix(1, 0), Action: action, Package: "github.com/edgeflow/edgeflow/e2e/x", Test: test, Output: output})
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, string(b))
	}
	add("run", "TestGood", "")
	add("output", "TestGood", "    good_test.go:3: all is well\n")
	add("pass", "TestGood", "")
	add("run", "TestBad", "")
	for i := range tailLines + 2 {
		add("output", "TestBad", fmt.Sprintf("    bad_test.go:%d: step %d\n", 10+i, i))
	}
	add("output", "TestBad", "    serve.go:63: timed out after 1m30s waiting for the plan\n")
	add("output", "TestBad", "goroutine 16 [select]:\n")
	add("output", "TestBad", "    "+strings.Repeat("é", tailWidth)+"\n") // no file:line: not a log line
	add("output", "TestBad", "    bad_test.go:99: "+strings.Repeat("é", tailWidth)+"\n")
	add("fail", "TestBad", "")
	add("fail", "", "")
	path := filepath.Join(t.TempDir(), "e2e.json")
	if err := os.WriteFile(path, []byte(strings.Join(events, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := readSuite(path)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	report(&out, []*suite{s}, 5)
	got := out.String()
	_, section, ok := strings.Cut(got, "--- FAIL: e2e/x TestBad [e2e], its last log lines:\n")
	if !ok {
		t.Fatalf("no last log lines of TestBad in the report:\n%s", got)
	}
	lines := strings.Split(strings.TrimRight(strings.Split(section, "\nFAIL ")[0], "\n"), "\n")
	if len(lines) != tailLines {
		t.Errorf("%d lines of TestBad's log, want the last %d:\n%s", len(lines), tailLines, section)
	}
	for _, want := range []string{"serve.go:63: timed out after 1m30s", "bad_test.go:21: step 11"} {
		if !strings.Contains(section, want) {
			t.Errorf("TestBad's last log lines miss %q:\n%s", want, section)
		}
	}
	for _, not := range []string{"step 0", "goroutine 16", "all is well"} {
		if strings.Contains(got, not) {
			t.Errorf("the report shows %q:\n%s", not, got)
		}
	}
	last := lines[len(lines)-1]
	if !utf8.ValidString(last) || !strings.HasSuffix(last, " …") || len(last) > 4+tailWidth+len(" …") {
		t.Errorf("a long line is not cut at %d bytes on a rune's boundary: %q", tailWidth, last)
	}
}
