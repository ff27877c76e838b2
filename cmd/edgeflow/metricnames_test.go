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

	"github.com/prometheus/client_golang/prometheus"
)

// metricDef is a metric defined in the source: its name and kind (counter, gauge, histogram).
type metricDef struct {
	name, kind, at string
}

// sourceMetrics finds every prometheus.{Counter,Gauge,Histogram}Opts literal with a Name in
// the repository's non-test Go files (e2e/ excepted: test harnesses). Its name is built from
// the literal's Namespace, Subsystem and Name, each a string literal or a constant of its
// package.
func sourceMetrics(t *testing.T, root string) []metricDef {
	t.Helper()
	type file struct {
		dir string
		f   *ast.File
	}
	var files []file
	consts := map[string]map[string]string{} // dir → constant → value
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
		dir := filepath.Dir(path)
		files = append(files, file{dir, f})
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					if bl, ok := vs.Values[i].(*ast.BasicLit); ok && bl.Kind == token.STRING {
						if consts[dir] == nil {
							consts[dir] = map[string]string{}
						}
						consts[dir][n.Name], _ = strconv.Unquote(bl.Value)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var defs []metricDef
	for _, fl := range files {
		str := func(e ast.Expr) (string, bool) {
			switch e := e.(type) {
			case *ast.BasicLit:
				s, err := strconv.Unquote(e.Value)
				return s, err == nil
			case *ast.Ident:
				s, ok := consts[fl.dir][e.Name]
				return s, ok
			}
			return "", false
		}
		ast.Inspect(fl.f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || sel.X.(*ast.Ident).Name != "prometheus" || !strings.HasSuffix(sel.Sel.Name, "Opts") {
				return true
			}
			parts := map[string]string{}
			var at token.Pos
			for _, e := range lit.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				switch key := kv.Key.(*ast.Ident).Name; key {
				case "Namespace", "Subsystem", "Name":
					v, ok := str(kv.Value)
					if !ok {
						t.Errorf("%s: a metric %s that is neither a literal nor a constant", fset.Position(kv.Pos()), key)
						continue
					}
					parts[key] = v
					if key == "Name" {
						at = kv.Pos()
					}
				}
			}
			if at.IsValid() {
				defs = append(defs, metricDef{name: prometheus.BuildFQName(parts["Namespace"], parts["Subsystem"], parts["Name"]),
					kind: strings.ToLower(strings.TrimSuffix(sel.Sel.Name, "Opts")), at: fset.Position(at).String()})
			}
			return true
		})
	}
	return defs
}

// stockMetrics are the metrics internal/demo/app's simulated pods export under the names a
// stock mesh (and grpc-go's OpenTelemetry) has them, with their kinds.
var stockMetrics = map[string]string{
	"istio_requests_total":                 "counter",
	"istio_request_duration_milliseconds":  "histogram",
	"container_cpu_usage_seconds_total":    "counter",
	"kube_pod_container_resource_requests": "gauge",
	// grpc-go's OpenTelemetry grpc.client.attempt.duration, as the Prometheus exporter names it.
	"grpc_client_attempt_duration_seconds": "histogram",
}

// TestMetricNames holds every metric to Prometheus' naming conventions and to the metrics reference's
// table: edgeflow_ prefix, snake case, _total on counters and only on them, base units (seconds,
// bytes, ratios), and a row of docs/reference/metrics.md naming the metric with its type.
func TestMetricNames(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	defs := sourceMetrics(t, root)
	if len(defs) < 40 {
		t.Fatalf("found %d metric definitions; the source scan is broken", len(defs))
	}
	readme, err := os.ReadFile(filepath.Join(root, "docs", "reference", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^edgeflow_[a-z][a-z0-9_]*[a-z0-9]$`)
	nonBase := regexp.MustCompile(`_(ms|milliseconds|microseconds|us|ns|nanoseconds|minutes|hours|kb|kilobytes|mb|megabytes|percent)(_|$)`)
	seen := map[string]string{}
	simulated := filepath.Join("internal", "demo", "app") + string(filepath.Separator)
	for _, d := range defs {
		if prev, ok := seen[d.name]; ok {
			t.Errorf("%s: %s is also defined at %s", d.at, d.name, prev)
		}
		seen[d.name] = d.at
		if strings.Contains(d.at, simulated) {
			// The simulated pods export a stock mesh's telemetry under its own names (Istio,
			// cAdvisor, kube-state-metrics, grpc-go), not edgeflow's: those names exactly, and no
			// others.
			if kind, ok := stockMetrics[d.name]; !ok || kind != d.kind {
				t.Errorf("%s: %s (%s) is not one of the stock metrics the simulated pods export %v", d.at, d.name, d.kind, stockMetrics)
			}
			continue
		}
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
			t.Errorf("%s: %s (%s) has no row in docs/reference/metrics.md's table", d.at, d.name, d.kind)
		}
	}
	// Every row of the table is a metric the code defines.
	for _, m := range regexp.MustCompile("(?m)^\\| `(edgeflow_[a-z0-9_]+)` \\| (counter|gauge|histogram) \\|").FindAllSubmatch(readme, -1) {
		if _, ok := seen[string(m[1])]; !ok {
			t.Errorf("docs/reference/metrics.md's table lists %s, which no code defines", m[1])
		}
	}
}
