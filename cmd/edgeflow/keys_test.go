package main

import (
	"bytes"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/edgeflow/edgeflow/internal/ui"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
)

// snakeCase is the one key style of what edgeflow defines and prints.
var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// TestOutputKeysAreSnakeCase: every key of every object edgeflow prints (-o json and -o yaml of
// each command, the web view's snapshot) and of the topology file it reads and prints is
// snake_case. Each type is filled by reflection (every field set, omitempty ones included, one
// element per slice and map), printed as its command prints it, and every key of the result
// walked. A new output type belongs in the table. Kubernetes and Istio objects, the Prometheus
// API and the rebalancer's state ConfigMap (rebalancer.TestStateKeys) follow their own keys.
func TestOutputKeysAreSnakeCase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		v    any
		yaml string // the format -o yaml hands writeStructured; "" for JSON only
	}{
		{"plan: optimizer.Allocation", &optimizer.Allocation{}, "yaml"},
		{"place: optimizer.Placement", &optimizer.Placement{}, "yaml"}, // its cut included
		{"place -o topology, the topology file: optimizer.Topology", &optimizer.Topology{}, "yaml"},
		{"rebalance: rebalancer.Report", &rebalancer.Report{}, "yaml-json-keys"},
		{"optimizer.Rebalance", &optimizer.Rebalance{}, ""},
		{"demo: []demoRow", &[]demoRow{}, "yaml-json-keys"},
		{"version: buildVersion", &buildVersion{}, "yaml-json-keys"},
		{"the web view: ui.Snapshot", &ui.Snapshot{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fill(reflect.ValueOf(tc.v).Elem(), map[reflect.Type]bool{})
			formats := []string{"json"}
			if tc.yaml != "" {
				formats = append(formats, tc.yaml)
			}
			for _, format := range formats {
				var buf bytes.Buffer
				if err := writeStructured(&buf, format, tc.v); err != nil {
					t.Fatal(err)
				}
				var doc any
				if err := yaml.Unmarshal(buf.Bytes(), &doc); err != nil { // JSON is YAML
					t.Fatalf("%s: %v\n%s", format, err, buf.Bytes())
				}
				keys := 0
				walkKeys(doc, "", func(path, key string) {
					keys++
					if !snakeCase.MatchString(key) {
						t.Errorf("as %s: key %s%s is not snake_case", format, path, key)
					}
				})
				if keys == 0 {
					t.Errorf("as %s: no keys in %s", format, buf.Bytes())
				}
			}
		})
	}
}

// The walk sees camelCase, an untagged Go field and a key with a dash, at any depth.
func TestWalkKeysFindsEveryKey(t *testing.T) {
	var doc any
	if err := yaml.Unmarshal([]byte(`{"a": [{"b_c": {"dE": 1}}], "F": {"g-h": [[{"ok": 1}]]}}`), &doc); err != nil {
		t.Fatal(err)
	}
	var bad []string
	walkKeys(doc, "", func(path, key string) {
		if !snakeCase.MatchString(key) {
			bad = append(bad, path+key)
		}
	})
	if want := []string{"F", "F.g-h", "a[0].b_c.dE"}; fmt.Sprint(bad) != fmt.Sprint(want) {
		t.Errorf("walk found %q, want %q", bad, want)
	}
}

// walkKeys calls visit with every key of every mapping in v (a decoded YAML or JSON document),
// in sorted order, with the path of the mapping that holds it.
func walkKeys(v any, path string, visit func(path, key string)) {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			visit(path, k)
			walkKeys(v[k], path+k+".", visit)
		}
	case map[any]any: // a mapping whose keys are not all strings
		for k, e := range v {
			key := fmt.Sprint(k)
			visit(path, key)
			walkKeys(e, path+key+".", visit)
		}
	case []any:
		prefix := path
		if prefix != "" {
			prefix = prefix[:len(prefix)-1]
		}
		for i, e := range v {
			walkKeys(e, fmt.Sprintf("%s[%d].", prefix, i), visit)
		}
	}
}

// fill sets every exported field of v to a value that is not zero (so omitempty keeps it): one
// element per slice, one entry per map, pointers allocated. A type already being filled on
// the way down is left zero, so a recursive type ends.
func fill(v reflect.Value, filling map[reflect.Type]bool) {
	t := v.Type()
	if filling[t] {
		return
	}
	filling[t] = true
	defer delete(filling, t)
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(t.Elem()))
		fill(v.Elem(), filling)
	case reflect.Struct:
		if t == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
			return
		}
		for i := range t.NumField() {
			if t.Field(i).IsExported() {
				fill(v.Field(i), filling)
			}
		}
	case reflect.Slice:
		s := reflect.MakeSlice(t, 1, 1)
		fill(s.Index(0), filling)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(t)
		k, e := reflect.New(t.Key()).Elem(), reflect.New(t.Elem()).Elem()
		fill(k, filling)
		fill(e, filling)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	}
}
