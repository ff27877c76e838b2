// Package xdstest holds the test fixtures that package xds's and package xds/server's tests
// share. It imports only the optimizer, so xds's own tests may use it.
package xdstest

import (
	"os"
	"testing"

	"github.com/edgeflow/edgeflow/optimizer"
)

// LoadTopology reads a topology file, failing the test on error.
func LoadTopology(t testing.TB, path string) *optimizer.Topology {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	top, err := optimizer.ParseTopology(f, path)
	if err != nil {
		t.Fatal(err)
	}
	return top
}

// Plan compiles top with the default options and plans it with policy p, failing the test on
// error.
func Plan(t testing.TB, top *optimizer.Topology, p optimizer.Policy) *optimizer.Allocation {
	t.Helper()
	m, err := optimizer.Compile(top, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := optimizer.Plan(m, p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
