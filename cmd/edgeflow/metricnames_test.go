package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// metricDef is a metric defined in the source: its name and kind (counter, gauge, histogram).
type metricDef struct {
	name, kind, at string
}

// sourceMetrics finds every prometheus.{Counter,Gauge,Histogram}Opts literal with a Name in
// the repository's non-test Go files (e2e/ excepted: test harnesses).
func sourceMetrics(t *testing.T, root string) []metricDef {
	t.Helper()
	var defs []metricDef
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (d.Name() == "e2e" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || sel.X.(*ast.Ident).Name != "prometheus" || !strings.HasSuffix(sel.Sel.Name, "Opts") {
				return true
			}
			for _, e := range lit.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok || kv.Key.(*ast.Ident).Name != "Name" {
					continue
				}
				bl, ok := kv.Value.(*ast.BasicLit)
				if !ok {
					t.Errorf("%s: a metric name that is not a literal", fset.Position(kv.Pos()))
					continue
				}
				name, _ := strconv.Unquote(bl.Value)
				defs = append(defs, metricDef{name: name, kind: strings.ToLower(strings.TrimSuffix(sel.Sel.Name, "Opts")),
					at: fset.Position(kv.Pos()).String()})
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return defs
}

// TestMetricNames holds every metric to Prometheus' naming conventions and to the README's
// table: edgeflow_ prefix, snake case, _total on counters and only on them, base units (seconds,
// bytes, ratios), and a README row naming the metric with its type.
func TestMetricNames(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	defs := sourceMetrics(t, root)
	if len(defs) < 40 {
		t.Fatalf("found %d metric definitions; the source scan is broken", len(defs))
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^edgeflow_[a-z][a-z0-9_]*[a-z0-9]$`)
	nonBase := regexp.MustCompile(`_(ms|milliseconds|microseconds|us|ns|nanoseconds|minutes|hours|kb|kilobytes|mb|megabytes|percent)(_|$)`)
	seen := map[string]string{}
	for _, d := range defs {
		if prev, ok := seen[d.name]; ok {
			t.Errorf("%s: %s is also defined at %s", d.at, d.name, prev)
		}
		seen[d.name] = d.at
		if !snake.MatchString(d.name) {
			t.Errorf("%s: %s: want edgeflow_ and snake case", d.at, d.name)
		}
		if total := strings.HasSuffix(d.name, "_total"); total != (d.kind == "counter") {
			t.Errorf("%s: %s is a %s: _total is for counters, and every counter has it", d.at, d.name, d.kind)
		}
		if nonBase.MatchString(d.name) {
			t.Errorf("%s: %s: use base units (seconds, bytes, ratio)", d.at, d.name)
		}
		if d.kind == "histogram" && !strings.HasSuffix(d.name, "_seconds") && !strings.HasSuffix(d.name, "_bytes") {
			t.Errorf("%s: %s: a histogram's name ends in its unit", d.at, d.name)
		}
		row := regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(d.name) + "` \\| " + d.kind + " \\|")
		if !row.Match(readme) {
			t.Errorf("%s: %s (%s) has no row in the README's metrics table", d.at, d.name, d.kind)
		}
	}
	// Every row of the table is a metric the code defines.
	for _, m := range regexp.MustCompile("(?m)^\\| `(edgeflow_[a-z0-9_]+)` \\| (counter|gauge|histogram) \\|").FindAllSubmatch(readme, -1) {
		if _, ok := seen[string(m[1])]; !ok {
			t.Errorf("README's metrics table lists %s, which no code defines", m[1])
		}
	}
}
