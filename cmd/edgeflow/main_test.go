package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

func TestMain(m *testing.M) {
	// The commands find a cluster as kubectl does; in-process they must not find the one of
	// whoever runs the tests ($KUBECONFIG, ~/.kube/config). A test that wants the loading
	// rules runs the binary with its own HOME.
	os.Unsetenv("KUBECONFIG")
	clientcmd.RecommendedHomeFile = filepath.Join(os.TempDir(), "edgeflow-test-no-home", ".kube", "config")
	code := m.Run()
	testkit.RemoveBuilt()
	os.Exit(code)
}

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// runCLI runs the edgeflow command line in-process.
func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// golden compares got with testdata/NAME, or rewrites it under -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (run go test -update if the change is intended)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// A person reads the item an error names, not the Go package it came from.
func TestErrorsNameTheItemNotAPackage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	unknownNode := filepath.Join(dir, "node.yaml")
	writeFile(t, unknownNode, "nodes: [{name: n1}]\nservices: [{name: a, pods: [{name: a-0, node: n9}]}]\n")
	noAddress := filepath.Join(dir, "noaddr.yaml")
	writeFile(t, noAddress, "nodes: [{name: n1}]\nservices: [{name: a, pods: [{name: a-0, node: n1}]}, {name: b, pods: [{name: b-0, node: n1}]}]\ncalls: [{from: a, to: b}]\ningress: [{service: a, rps: 1}]\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "-f", unknownNode}, `error: invalid topology: pod "a-0" (service "a"): unknown node "n9"`},
		{[]string{"plan", "-f", "../../examples/bookinfo.yaml", "--policy", "lata-q", "--utilization-cap", "3"}, "error: invalid topology: utilization cap 3"},
		{[]string{"serve", "-f", noAddress, "--xds-address", "127.0.0.1:0"}, `error: incomplete topology: pod "b-0" (service "b") has no address`},
	} {
		code, _, errOut := runCLI(t, "", tc.args...)
		if code != exitBadInput || !strings.Contains(errOut, tc.want) || packagePrefix.MatchString(strings.TrimPrefix(errOut, "error: ")) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q, no package name", tc.args, code, errOut, tc.want)
		}
	}
	if got := userMessage(errors.New("reading f: xds: optimizer: invalid topology: pod \"a\"")); got != `reading f: invalid topology: pod "a"` {
		t.Errorf("userMessage: %q", got)
	}
}
