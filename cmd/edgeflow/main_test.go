package main

import (
	"bytes"
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
