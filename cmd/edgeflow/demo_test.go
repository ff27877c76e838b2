package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edgeflow/edgeflow/internal/demo"
	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
	"github.com/edgeflow/edgeflow/optimizer"
)

// TestDemoShort runs `edgeflow demo` in-process on the bundled topology with a short duration
// and checks the table, LATA's observed split, and that the demo stopped everything it started.
func TestDemoShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every row (four policies and least-request) on an emulated cluster (~20 s)")
	}
	ignore := goleak.IgnoreCurrent()
	code, out, errOut := runCLI(t, "", "demo", "--duration", "2s", "--rounds", "2", "--warmup", "500ms", "--rate", "100")
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, errOut)
	}
	table := parseTable(t, out)
	for _, p := range []string{"lata-q", "least-request"} {
		if !regexp.MustCompile(p + ` vs lata: P99 \S+ vs \S+ \([+-]\d+\.\d%\); P99 at or below lata's in [0-2]/2 rounds`).MatchString(out) {
			t.Errorf("no paired comparison of %s with lata in\n%s", p, out)
		}
	}
	for _, p := range demo.RowNames() {
		row := table[p]
		if row == nil {
			t.Errorf("no row for %s in\n%s", p, out)
			continue
		}
		for r := 1; r <= 2; r++ {
			if !strings.Contains(errOut, fmt.Sprintf("[round %d/2] %s", r, p)) {
				t.Errorf("no progress line for %s in round %d on stderr:\n%s", p, r, errOut)
			}
		}
		if _, err := strconv.Atoi(row["ERRORS"]); err != nil {
			t.Errorf("%s: errors %q", p, row["ERRORS"])
		}
		if want := "—"; p != string(optimizer.RoundRobin) {
			if got := row["ROUNDS P99<RR"]; !strings.HasSuffix(got, "/2") {
				t.Errorf("%s: rounds below round-robin %q, want k/2", p, got)
			}
		} else if row["ROUNDS P99<RR"] != want {
			t.Errorf("round-robin: rounds below itself %q, want %q", row["ROUNDS P99<RR"], want)
		}
		for _, col := range []string{"MEAN", "P50", "P90", "P99"} {
			if !strings.HasSuffix(row[col], "ms") {
				t.Errorf("%s: %s = %q", p, col, row[col])
			}
		}
	}
	if lata := table["lata"]; lata != nil {
		dev, err := strconv.ParseFloat(lata["SPLIT DEV(pp)"], 64)
		if err != nil {
			t.Fatalf("lata's split deviation %q: %v", lata["SPLIT DEV(pp)"], err)
		}
		// 75–100 requests per caller pod over 3 s of load: a share's sampling error is ≤ 5.5 pp,
		// so a correct split stays well under 25 pp; a wrong one (weights not applied) is off
		// by 25–75 pp.
		if dev > 25 {
			t.Errorf("lata: observed split deviates %.1f pp from the plan\n%s", dev, out)
		}
		if rate, _ := strconv.ParseFloat(lata["RATE(req/s)"], 64); !(rate > 0) {
			t.Errorf("lata: achieved %q req/s", lata["RATE(req/s)"])
		}
	}
	if strings.Contains(out, "NACK") {
		t.Errorf("xDS NACKs reported:\n%s", out)
	}
	// os/signal keeps its loop for the life of the process once the demo called Notify.
	goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("os/signal.loop"))
}

// parseTable reads the demo's table: rows by policy, cells by column header. tabwriter aligns
// every cell at its header's offset.
func parseTable(t *testing.T, out string) map[string]map[string]string {
	t.Helper()
	lines := strings.Split(out, "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "POLICY ") {
		t.Fatalf("no table header in\n%s", out)
	}
	header := lines[0]
	var cols []string
	var offsets []int
	for _, name := range []string{"POLICY", "MEAN", "P50", "P90", "P99", "P99 vs RR", "ROUNDS P99<RR", "ERRORS", "RATE(req/s)", "MAX QUEUE", "SPLIT DEV(pp)", "WORST ROUTE", "PLAN COST"} {
		i := strings.Index(header, name+" ")
		if name == "PLAN COST" {
			i = strings.Index(header, name)
		}
		if i < 0 {
			t.Fatalf("no column %q in %q", name, header)
		}
		cols, offsets = append(cols, name), append(offsets, i)
	}
	rows := map[string]map[string]string{}
	for _, line := range lines[1:] {
		if strings.TrimSpace(line) == "" {
			break
		}
		row := map[string]string{}
		r := []rune(line)
		for k, name := range cols {
			from := len([]rune(header[:offsets[k]]))
			to := len(r)
			if k+1 < len(cols) {
				to = min(len([]rune(header[:offsets[k+1]])), len(r))
			}
			if from < len(r) {
				row[name] = strings.TrimSpace(string(r[from:to]))
			}
		}
		rows[row["POLICY"]] = row
	}
	return rows
}

func TestParseRates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   []string
		want []float64
	}{
		{[]string{"150", "300", "450"}, []float64{150, 300, 450}},
		{[]string{" 450", "150 "}, []float64{450, 150}}, // in the order given
		{[]string{"2.5e2"}, []float64{250}},
		{[]string{"100000"}, []float64{100000}},
	}
	for _, tc := range tests {
		got, err := parseRates(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseRates(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// TestDemoLeastRequestRates runs a tiny demo of round-robin and least-request at two rates and
// checks one table per rate, in order, each with both rows (least-request compared with
// round-robin round by round, and without a plan cost).
func TestDemoLeastRequestRates(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two rows at two rates on an emulated cluster (~8 s)")
	}
	ignore := goleak.IgnoreCurrent()
	code, out, errOut := runCLI(t, "", "demo", "--policies", "round-robin,least-request", "--rates", "100,200",
		"--duration", "1s", "--rounds", "2", "--warmup", "200ms")
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, errOut)
	}
	parts := strings.Split(out, "== ")
	if len(parts) != 3 || parts[0] != "" {
		t.Fatalf("want two tables, each after a \"== RATE req/s\" line, got\n%s", out)
	}
	for k, rate := range []string{"100", "200"} {
		head, body, _ := strings.Cut(parts[k+1], "\n")
		if want := fmt.Sprintf("%s req/s (%d of 2) ==", rate, k+1); head != want {
			t.Errorf("table %d: heading %q, want %q", k+1, head, want)
		}
		table := parseTable(t, body)
		if len(table) != 2 {
			t.Errorf("%s req/s: %d rows, want round-robin and least-request:\n%s", rate, len(table), body)
		}
		lr := table["least-request"]
		if lr == nil {
			t.Fatalf("%s req/s: no least-request row in\n%s", rate, body)
		}
		if table["round-robin"] == nil {
			t.Errorf("%s req/s: no round-robin row in\n%s", rate, body)
		}
		if got := lr["ROUNDS P99<RR"]; !strings.HasSuffix(got, "/2") {
			t.Errorf("%s req/s: least-request rounds below round-robin %q, want k/2", rate, got)
		}
		if !strings.HasSuffix(lr["P99"], "ms") || lr["PLAN COST"] != "—" {
			t.Errorf("%s req/s: least-request P99 %q, plan cost %q (want a latency and —)", rate, lr["P99"], lr["PLAN COST"])
		}
		if n, err := strconv.Atoi(lr["ERRORS"]); err != nil || n != 0 {
			t.Errorf("%s req/s: least-request errors %q", rate, lr["ERRORS"])
		}
		if !strings.Contains(body, fmt.Sprintf(", %s req/s open-loop", rate)) || !strings.Contains(body, "LEAST_REQUEST (choice_count 2)") {
			t.Errorf("%s req/s: footer does not name the rate and least-request:\n%s", rate, body)
		}
	}
	for _, want := range []string{"[round 1/2] least-request", "[round 2/2] least-request", "100 req/s (1 of 2)", "200 req/s (2 of 2)"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(out, "NACK") {
		t.Errorf("xDS NACKs reported:\n%s", out)
	}
	goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("os/signal.loop"))
}

// TestDemoJSON runs two rows at two rates with -o json on a world edgeflow is not told of (a
// slow node, a slow pod): stdout is one JSON array of the rows, per rate in order, and nothing
// else.
func TestDemoJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two rows at two rates on an emulated cluster (~6 s)")
	}
	code, out, errOut := runCLI(t, "", "demo", "--policies", "round-robin,lata", "--rates", "100,150", "--duration", "1s",
		"--rounds", "1", "--warmup", "200ms", "--node-speed", "n3=0.5", "--slow-pods", "reviews-1=2", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, errOut)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	var rows []demoRow
	if err := dec.Decode(&rows); err != nil {
		t.Fatalf("stdout is not the rows as JSON: %v\n%s", err, out)
	}
	if dec.More() {
		t.Errorf("stdout has more than the JSON rows:\n%s", out)
	}
	var got []string
	for _, r := range rows {
		got = append(got, fmt.Sprintf("%s@%g", r.Policy, r.Rate))
		if !(r.MeanMS > 0 && r.P50MS > 0 && r.P50MS <= r.P90MS && r.P90MS <= r.P99MS && r.Achieved > 0) || r.Errors < 0 {
			t.Errorf("row %+v: want positive, ordered latencies and a positive achieved rate", r)
		}
	}
	if want := []string{"round-robin@100", "lata@100", "round-robin@150", "lata@150"}; !slices.Equal(got, want) {
		t.Errorf("rows %v, want %v", got, want)
	}
	if want := "hidden from edgeflow: node speed n3 ×0.5, pod slowdown reviews-1 ×2"; !strings.Contains(errOut, want) {
		t.Errorf("stderr lacks %q:\n%s", want, errOut)
	}
}

func TestDemoBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	unplaced := filepath.Join(dir, "unplaced.yaml")
	if err := os.WriteFile(unplaced, []byte("nodes: [{name: n1}]\nservices: [{name: a, replicas: 2}]\ningress: [{service: a, rps: 10}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noIngress := filepath.Join(dir, "noingress.yaml")
	if err := os.WriteFile(noIngress, []byte("nodes: [{name: n1}]\nservices: [{name: a, pods: [{name: a-0, node: n1}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"zero duration", []string{"--duration", "0s"}, "--duration"},
		{"negative rate", []string{"--rate", "-5"}, "--rate"},
		{"no workers", []string{"--workers", "0"}, "--workers"},
		{"no rounds", []string{"--rounds", "0"}, "--rounds"},
		{"unknown policy", []string{"--policies", "lata,fastest"}, "fastest"},
		{"policy twice", []string{"--policies", "least-request,lata,least-request"}, "least-request is listed twice"},
		{"rates: not a number", []string{"--rates", "150,abc,450"}, `--rates: "abc" is not a number`},
		{"rates: empty value", []string{"--rates", "150,,450"}, `--rates: "" is not a number`},
		{"rates: zero", []string{"--rates", "150,0"}, `--rates: "0" is not in (0, 100000]`},
		{"rates: negative", []string{"--rates=-5,150"}, `--rates: "-5" is not in (0, 100000]`},
		{"rates: too high", []string{"--rates", "150,1e6"}, `--rates: "1e6" is not in (0, 100000]`},
		{"rates: empty", []string{"--rates="}, "--rates is empty"},
		{"rate and rates", []string{"--rate", "200", "--rates", "150,300"}, "[rate rates] were all set"},
		{"missing file", []string{"--topology", filepath.Join(dir, "nope.yaml")}, "nope.yaml"},
		{"unplaced pods", []string{"--topology", unplaced}, "no placed pods"},
		{"no ingress", []string{"--topology", noIngress}, "ingress"},
		{"argument", []string{"extra"}, "no arguments"},
		{"node speed: unknown node", []string{"--node-speed", "n1=2,n9=0.5"}, `--node-speed: unknown node "n9" (the topology's: n1, n2, n3, n4)`},
		{"node speed: no factor", []string{"--node-speed", "n1"}, `--node-speed: "n1" is not NODE=FACTOR`},
		{"node speed: not a number", []string{"--node-speed", "n1=fast"}, `--node-speed n1: factor "fast" is not a number`},
		{"node speed: zero", []string{"--node-speed", "n1=0"}, `--node-speed n1: factor 0 is not in (0, 1000]`},
		{"node speed: twice", []string{"--node-speed", "n1=2", "--node-speed", "n1=3"}, "--node-speed: node n1 is given twice"},
		{"slow pods: unknown pod", []string{"--slow-pods", "reviews-9=2"}, `--slow-pods: unknown pod "reviews-9"`},
		{"slow pods: negative", []string{"--slow-pods", "reviews-1=-2"}, `--slow-pods reviews-1: factor -2 is not in (0, 1000]`},
		{"l7 penalty: unknown node", []string{"--l7-penalty", "n1:n9=3ms"}, `--l7-penalty n1:n9: unknown node "n9" (the topology's: n1, n2, n3, n4)`},
		{"l7 penalty: no pair", []string{"--l7-penalty", "n1=3ms"}, `--l7-penalty: "n1=3ms" is not FROM:TO=DURATION`},
		{"l7 penalty: not a duration", []string{"--l7-penalty", "n1:n2=3"}, `--l7-penalty n1:n2: "3" is not a duration`},
		{"l7 penalty: zero", []string{"--l7-penalty", "n1:n2=0s"}, `--l7-penalty n1:n2: 0s is not in (0, 10s]`},
		{"l7 penalty: one node", []string{"--l7-penalty", "n2:n2=3ms"}, `--l7-penalty n2:n2: name two nodes`},
		{"l7 penalty: twice", []string{"--l7-penalty", "n1:n2=3ms,n1:n2=4ms"}, `--l7-penalty: n1:n2 is given twice`},
		{"latency correction: not a bool", []string{"--latency-correction=maybe"}, `invalid argument "maybe" for "--latency-correction"`},
		{"output", []string{"-o", "xml"}, `-o: unknown output format "xml" (want table, json or yaml)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", append([]string{"demo"}, tc.args...)...)
			if code != exitBadInput {
				t.Errorf("exit %d, want %d; stderr: %s", code, exitBadInput, errOut)
			}
			if out != "" {
				t.Errorf("stdout not empty: %q", out)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q does not name %q", errOut, tc.want)
			}
		})
	}
}

// TestPairedVsLATA: the comparison with lata counts the rounds at or below lata's P99, and
// says so when lata-q serves lata's own routes (its difference is then the testbed's noise).
func TestPairedVsLATA(t *testing.T) {
	t.Parallel()
	ms := func(v ...int) loadgen.Samples {
		var s loadgen.Samples
		for _, x := range v {
			s = append(s, time.Duration(x)*time.Millisecond)
		}
		return s
	}
	modes := []demo.Row{{Name: "lata", Policy: optimizer.LATA}, {Name: "lata-q", Policy: optimizer.LATAQ}}
	results := [][]*loadgen.Result{
		{{Latency: ms(10)}, {Latency: ms(20)}},
		{{Latency: ms(10)}, {Latency: ms(30)}},
	}
	for _, asLATA := range []bool{false, true} {
		outcomes := []*demo.Outcome{
			{Load: &loadgen.Result{Latency: ms(10, 20)}, Plan: &optimizer.Allocation{Policy: optimizer.LATA}},
			{Load: &loadgen.Result{Latency: ms(10, 30)}, Plan: &optimizer.Allocation{Policy: optimizer.LATAQ, ServedAsLATA: asLATA}},
		}
		got := pairedVsLATA(modes, &demo.Result{Outcomes: outcomes, Rounds: results})
		if len(got) != 1 || !strings.HasPrefix(got[0], "lata-q vs lata: P99 30.00ms vs 20.00ms (+50.0%); P99 at or below lata's in 1/2 rounds") {
			t.Fatalf("served as lata %v: %q", asLATA, got)
		}
		if strings.Contains(got[0], "the same routes") != asLATA {
			t.Errorf("served as lata %v: %q", asLATA, got[0])
		}
	}
}

// FuzzParseFactors: any --node-speed value either fails with a usage error or yields known
// names with factors in (0, maxFactor].
func FuzzParseFactors(f *testing.F) {
	for _, s := range []string{"n1=0.5", "n1=2,n2=3", "n1", "=1", "n9=1", "n1=NaN", "n1=1e400", "n1=-1", "n1=1,n1=2"} {
		f.Add(s)
	}
	nodes := []string{"n1", "n2"}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseFactors("--node-speed", "node", strings.Split(s, ","), nodes)
		if err != nil {
			var usage usageError
			if !errors.As(err, &usage) || !strings.HasPrefix(err.Error(), "--node-speed") {
				t.Fatalf("%q: error %v is not a usage error naming the flag", s, err)
			}
			return
		}
		for name, v := range got {
			if !slices.Contains(nodes, name) || !(v > 0 && v <= maxFactor) {
				t.Fatalf("%q: accepted %s=%v", s, name, v)
			}
		}
	})
}

// FuzzParsePenalties: any --l7-penalty value either fails with a usage error naming the flag
// or yields directed pairs of two known nodes with delays in (0, maxL7Penalty].
func FuzzParsePenalties(f *testing.F) {
	for _, s := range []string{"n1:n2=3ms", "n1:n2=3ms,n2:n1=1ms", "n1:n1=3ms", "n1:n9=1ms", "n1=3ms", ":n2=1ms", "n1:n2=-1ms", "n1:n2=1h"} {
		f.Add(s)
	}
	nodes := []string{"n1", "n2"}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parsePenalties(strings.Split(s, ","), nodes)
		if err != nil {
			var usage usageError
			if !errors.As(err, &usage) || !strings.HasPrefix(err.Error(), "--l7-penalty") {
				t.Fatalf("%q: error %v is not a usage error naming the flag", s, err)
			}
			return
		}
		for p, d := range got {
			if !slices.Contains(nodes, p.From) || !slices.Contains(nodes, p.To) || p.From == p.To || !(d > 0 && d <= maxL7Penalty) {
				t.Fatalf("%q: accepted %v=%v", s, p, d)
			}
		}
	})
}

// TestHiddenWorld: the stderr line names every hidden change, sorted, L7 penalties last.
func TestHiddenWorld(t *testing.T) {
	t.Parallel()
	in := &demoInput{nodeSpeed: map[string]float64{"n3": 0.5}, l7Penalty: map[demo.NodePair]time.Duration{
		{From: "n3", To: "n4"}: 3 * time.Millisecond, {From: "n1", To: "n2"}: 500 * time.Microsecond}}
	want := "node speed n3 ×0.5, L7 penalty n1 → n2 +500µs, L7 penalty n3 → n4 +3ms"
	if got := hiddenWorld(in); got != want {
		t.Errorf("hiddenWorld: %q, want %q", got, want)
	}
}
