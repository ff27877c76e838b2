// Command testreport reads `go test -json` streams, as make test writes them under bin/test/,
// and says what ran and where the time went.
//
//	go test -json ./... | testreport -stream unit > bin/test/unit.json
//	testreport bin/test/*.json
//
// With -stream it copies the JSON from stdin to stdout unchanged and prints to stderr, as the
// run goes, one line per package (as go test does) and the whole output of every failed test.
// Without it, it reads the files and prints each suite's wall time, each package's, the 20
// slowest tests, every skipped test, each failed test's last log lines (those go test prefixes
// with a file and line: t.Log, t.Error, t.Fatal; a failure's cause is among them, where its
// whole output may be cut from a CI log), and the totals on the last line:
// "tests: N passed, N failed, N skipped" — followed, with -want, by a line naming any wanted
// suite that wrote no results.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

func main() {
	stream := flag.String("stream", "", "copy stdin to stdout and print progress to stderr, naming the suite")
	slowest := flag.Int("slowest", 20, "how many of the slowest tests to list")
	want := flag.String("want", "", "comma-separated suites that must have written results (a suite that failed before go test ran has none)")
	flag.Parse()
	if *stream != "" {
		if err := streamRun(*stream, os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(1)
		}
		return
	}
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: testreport [-slowest N] FILE.json ... | testreport -stream SUITE")
		os.Exit(2)
	}
	var suites []*suite
	for _, f := range flag.Args() {
		s, err := readSuite(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			os.Exit(1)
		}
		suites = append(suites, s)
	}
	report(os.Stdout, suites, *slowest)
	if m := missingSuites(suites, *want); len(m) > 0 {
		fmt.Printf("no results from suite %s: it failed before its tests ran (see make's output)\n", strings.Join(m, ", "))
	}
}

// missingSuites lists the suites of want (comma-separated) that are not among suites.
func missingSuites(suites []*suite, want string) []string {
	have := map[string]bool{}
	for _, s := range suites {
		have[s.name] = true
	}
	var out []string
	for _, w := range strings.Split(want, ",") {
		if w = strings.TrimSpace(w); w != "" && !have[w] {
			out = append(out, w)
		}
	}
	return out
}

// streamRun copies in to out and prints go test's usual per-package lines and every failed
// test's output to progress.
func streamRun(name string, in io.Reader, out, progress io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	outputs := map[[2]string][]string{} // package, test → output lines, until the test ends
	for sc.Scan() {
		line := sc.Bytes()
		if _, err := out.Write(append(line, '\n')); err != nil {
			return err
		}
		var e event
		if json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(progress, "%s\n", line) // not JSON: a build error or a line a process wrote
			continue
		}
		key := [2]string{e.Package, e.Test}
		switch e.Action {
		case "output", "build-output":
			if e.Test != "" || e.Action == "build-output" {
				outputs[key] = append(outputs[key], e.Output)
			}
		case "fail", "build-fail":
			if e.Test != "" {
				fmt.Fprintf(progress, "--- FAIL: %s %s (%.1fs)\n%s", e.Package, e.Test, e.Elapsed, strings.Join(outputs[key], ""))
			} else {
				fmt.Fprintf(progress, "%s", strings.Join(outputs[key], ""))
				fmt.Fprintf(progress, "FAIL\t%s\t%.1fs\t[%s]\n", e.Package, e.Elapsed, name)
			}
			delete(outputs, key)
		case "pass", "skip":
			if e.Test == "" {
				fmt.Fprintf(progress, "ok  \t%s\t%.1fs\t[%s]\n", e.Package, e.Elapsed, name)
			}
			delete(outputs, key)
		}
	}
	return sc.Err()
}

type testResult struct {
	pkg, name string
	action    string
	elapsed   float64
}

type suite struct {
	name        string
	first, last time.Time
	packages    map[string]float64 // package → its test binary's run time
	failedPkgs  []string
	tests       []testResult // top-level and subtests, as they ended
	// failedLogs holds each failed test's last log lines (logLine), "package test" → lines.
	failedLogs map[string][]string
}

// logLine matches a line of a test's log as go test prints it: indented, then file:line: (the
// first line of a t.Log, t.Error or t.Fatal message).
var logLine = regexp.MustCompile(`^\s+[\w.-]+\.go:\d+: `)

// Of a failed test's log lines, the report shows the last tailLines, each cut at tailWidth bytes.
const (
	tailLines = 10
	tailWidth = 300
)

func readSuite(path string) (*suite, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := &suite{name: strings.TrimSuffix(filepath.Base(path), ".json"), packages: map[string]float64{}, failedLogs: map[string][]string{}}
	logs := map[string][]string{} // "package test" → its last log lines, until it ends
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Action == "" {
			continue
		}
		if !e.Time.IsZero() {
			if s.first.IsZero() || e.Time.Before(s.first) {
				s.first = e.Time
			}
			if e.Time.After(s.last) {
				s.last = e.Time
			}
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			if e.Test != "" && logLine.MatchString(e.Output) {
				l := strings.TrimSpace(e.Output)
				if len(l) > tailWidth {
					n := tailWidth
					for n > 0 && !utf8.RuneStart(l[n]) {
						n--
					}
					l = l[:n] + " …"
				}
				logs[key] = append(logs[key], l)
				if len(logs[key]) > tailLines {
					logs[key] = logs[key][1:]
				}
			}
		case "pass", "fail", "skip":
			if e.Action == "fail" && e.Test != "" {
				s.failedLogs[key] = logs[key]
			}
			delete(logs, key)
			if e.Test == "" {
				s.packages[e.Package] = e.Elapsed
				if e.Action == "fail" {
					s.failedPkgs = append(s.failedPkgs, e.Package)
				}
				continue
			}
			s.tests = append(s.tests, testResult{pkg: e.Package, name: e.Test, action: e.Action, elapsed: e.Elapsed})
		case "build-fail":
			s.failedPkgs = append(s.failedPkgs, e.Package+" (build)")
		}
	}
	return s, sc.Err()
}

func report(w io.Writer, suites []*suite, slowest int) {
	var all []testResult
	passed, failed, skipped := 0, 0, 0
	fmt.Fprintln(w, "== where the time went (go test -json under bin/test/)")
	fmt.Fprintln(w, "suite            wall    packages")
	for _, s := range suites {
		wall := s.last.Sub(s.first)
		fmt.Fprintf(w, "%-14s %6.0fs   %d\n", s.name, wall.Seconds(), len(s.packages))
	}
	fmt.Fprintln(w, "\npackage                                              test time  suite")
	type pkgTime struct {
		suite, pkg string
		s          float64
	}
	var pkgs []pkgTime
	outcome := map[string]string{} // "package test" → fail, pass or skip over every suite
	for _, s := range suites {
		for p, t := range s.packages {
			pkgs = append(pkgs, pkgTime{s.name, p, t})
		}
		for _, t := range s.tests {
			if strings.Contains(t.name, "/") {
				continue // subtests: counted through their parent
			}
			all = append(all, t)
			key := t.pkg + " " + t.name
			switch {
			case t.action == "fail" || outcome[key] == "fail":
				outcome[key] = "fail"
			case t.action == "pass" || outcome[key] == "pass":
				outcome[key] = "pass"
			default:
				outcome[key] = "skip"
			}
		}
	}
	// A test that skips in one suite (the timing tests under -race) and runs in another is
	// counted once, by what it did where it ran.
	for _, o := range outcome {
		switch o {
		case "pass":
			passed++
		case "fail":
			failed++
		default:
			skipped++
		}
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].s > pkgs[j].s })
	for _, p := range pkgs {
		if p.s < 1 {
			continue
		}
		fmt.Fprintf(w, "%-52s %8.1fs  %s\n", strings.TrimPrefix(p.pkg, "github.com/edgeflow/edgeflow/"), p.s, p.suite)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].elapsed > all[j].elapsed })
	fmt.Fprintf(w, "\nthe %d slowest tests\n", slowest)
	for i, t := range all {
		if i == slowest {
			break
		}
		fmt.Fprintf(w, "%7.1fs  %s %s\n", t.elapsed, strings.TrimPrefix(t.pkg, "github.com/edgeflow/edgeflow/"), t.name)
	}
	var skips []string
	for key, o := range outcome {
		if o == "skip" {
			skips = append(skips, strings.TrimPrefix(key, "github.com/edgeflow/edgeflow/"))
		}
	}
	if len(skips) > 0 {
		sort.Strings(skips)
		fmt.Fprintf(w, "\nskipped in every suite (go test -v says why):\n  %s\n", strings.Join(skips, "\n  "))
	}
	for _, s := range suites {
		keys := make([]string, 0, len(s.failedLogs))
		for k := range s.failedLogs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "\n--- FAIL: %s [%s], its last log lines:\n", strings.TrimPrefix(k, "github.com/edgeflow/edgeflow/"), s.name)
			for _, l := range s.failedLogs[k] {
				fmt.Fprintf(w, "    %s\n", l)
			}
		}
	}
	for _, s := range suites {
		for _, p := range s.failedPkgs {
			fmt.Fprintf(w, "FAIL %s [%s]\n", p, s.name)
		}
	}
	fmt.Fprintf(w, "\ntests: %d passed, %d failed, %d skipped\n", passed, failed, skipped)
}
