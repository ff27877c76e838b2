package install

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite the chart README's values table from values.yaml")

// The markers around the generated table in the chart's README.
const (
	valuesBegin = "<!-- values table: generated from values.yaml by make docs (e2e/install TestValuesTable); do not edit -->\n"
	valuesEnd   = "<!-- end of the values table -->\n"
)

// valueRow is one documented value: its dotted path, default (JSON) and description.
type valueRow struct{ key, def, doc string }

// valuesTable reads values.yaml in helm-docs' convention — a value is documented by a comment
// starting "# --" above its key, continued by the comment lines under it — and returns one row
// per documented value, in the file's order: a leaf (or a list, or a mapping none of whose
// keys is documented, shown whole). It fails naming every leaf without a description.
func valuesTable(raw []byte) ([]valueRow, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("values.yaml: not a mapping")
	}
	var rows []valueRow
	var missing []string
	var walk func(m *yaml.Node, prefix string)
	walk = func(m *yaml.Node, prefix string) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			path := prefix + k.Value
			if v.Kind == yaml.MappingNode && documentedInside(v) {
				walk(v, path+".")
				continue
			}
			text := description(k.HeadComment)
			if text == "" {
				missing = append(missing, fmt.Sprintf("%s (line %d)", path, k.Line))
				continue
			}
			var val any
			if err := v.Decode(&val); err != nil {
				missing = append(missing, fmt.Sprintf("%s (line %d): %v", path, k.Line, err))
				continue
			}
			def, err := json.Marshal(val)
			if err != nil {
				missing = append(missing, fmt.Sprintf("%s: %v", path, err))
				continue
			}
			rows = append(rows, valueRow{path, string(def), text})
		}
	}
	walk(doc.Content[0], "")
	if len(missing) > 0 {
		return rows, fmt.Errorf("values.yaml: no \"# --\" description for %s", strings.Join(missing, ", "))
	}
	return rows, nil
}

// documentedInside says whether a key of the mapping m, at any depth, has a description.
func documentedInside(m *yaml.Node) bool {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if description(m.Content[i].HeadComment) != "" {
			return true
		}
		if v := m.Content[i+1]; v.Kind == yaml.MappingNode && documentedInside(v) {
			return true
		}
	}
	return false
}

// description is the "# --" comment at the end of a key's head comment, with the lines that
// follow it, as one line; "" when there is none.
func description(head string) string {
	lines := strings.Split(head, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "# --") {
			start = i
		}
	}
	if start < 0 {
		return ""
	}
	var words []string
	for i, l := range lines[start:] {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "#"))
		if i == 0 {
			l = strings.TrimSpace(strings.TrimPrefix(l, "--"))
		}
		if l != "" {
			words = append(words, l)
		}
	}
	return strings.Join(words, " ")
}

// markdownTable prints rows as the README's table.
func markdownTable(rows []valueRow) string {
	var b strings.Builder
	b.WriteString("| value | default | meaning |\n|---|---|---|\n")
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", r.key, cell(r.def), cell(r.doc))
	}
	return b.String()
}

// The chart README's values table is generated from values.yaml, every value of which is
// documented ("# --"); -update rewrites it (make docs).
func TestValuesTable(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(testkit.RepoRoot(), "install", "helm", "edgeflow")
	raw, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := valuesTable(raw)
	if err != nil {
		t.Fatal(err)
	}
	readmePath := filepath.Join(dir, "README.md")
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	i, j := bytes.Index(readme, []byte(valuesBegin)), bytes.Index(readme, []byte(valuesEnd))
	if i < 0 || j < i {
		t.Fatalf("%s: no values table between %q and %q", readmePath, valuesBegin, valuesEnd)
	}
	got := string(readme[i+len(valuesBegin) : j])
	want := markdownTable(rows)
	if got == want {
		return
	}
	if *update {
		out := append(append(append([]byte{}, readme[:i+len(valuesBegin)]...), want...), readme[j:]...)
		if err := os.WriteFile(readmePath, out, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: values table rewritten (%d values)", readmePath, len(rows))
		return
	}
	t.Errorf("%s: the values table is stale: run make docs\n%s", readmePath, cmp.Diff(strings.Split(want, "\n"), strings.Split(got, "\n")))
}

// valuesTable: the description convention, nesting, and a leaf without a description named.
func TestValuesTableGenerator(t *testing.T) {
	t.Parallel()
	rows, err := valuesTable([]byte(`# a plain comment, not a description
# -- the image
image: {repository: x, tag: ""}
xds:
  # -- the port,
  # on two lines | with a pipe
  port: 18000
  tls:
    # -- on
    enabled: true
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []valueRow{{"image", `{"repository":"x","tag":""}`, "the image"}, {"xds.port", "18000", "the port, on two lines | with a pipe"}, {"xds.tls.enabled", "true", "on"}}
	if diff := cmp.Diff(want, rows, cmp.AllowUnexported(valueRow{})); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	if !strings.Contains(markdownTable(rows), `with a pipe`) || !strings.Contains(markdownTable(rows), `two lines \| with`) {
		t.Errorf("a pipe in a description is not escaped:\n%s", markdownTable(rows))
	}
	_, err = valuesTable([]byte("xds:\n  # -- the port\n  port: 1\n  host: h\n"))
	if err == nil || !strings.Contains(err.Error(), "xds.host (line 4)") {
		t.Errorf("an undocumented leaf: %v, want it named with its line", err)
	}
}
