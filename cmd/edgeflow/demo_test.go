package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/edgeflow/edgeflow/optimizer"
)

// TestDemoShort runs `edgeflow demo` in-process on the bundled topology with a short duration
// and checks the table, LATA's observed split, and that the demo stopped everything it started.
func TestDemoShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs four policies on an emulated cluster (~15 s)")
	}
	ignore := goleak.IgnoreCurrent()
	code, out, errOut := runCLI(t, "", "demo", "--duration", "2s", "--rounds", "2", "--warmup", "500ms", "--rate", "100")
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, errOut)
	}
	table := parseTable(t, out)
	for _, p := range optimizer.Policies() {
		row := table[string(p)]
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
		if want := "—"; p != optimizer.RoundRobin {
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

func TestDemoBadInput(t *testing.T) {
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
		{"missing file", []string{"--topology", filepath.Join(dir, "nope.yaml")}, "nope.yaml"},
		{"unplaced pods", []string{"--topology", unplaced}, "no placed pods"},
		{"no ingress", []string{"--topology", noIngress}, "ingress"},
		{"argument", []string{"extra"}, "no arguments"},
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
