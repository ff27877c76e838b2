package main

import (
	"slices"
	"testing"
)

func TestMissingSuites(t *testing.T) {
	suites := []*suite{{name: "unit"}, {name: "e2e"}}
	if got := missingSuites(suites, "unit, e2e,ui,,quiet"); !slices.Equal(got, []string{"ui", "quiet"}) {
		t.Errorf("missing %q, want [ui quiet]", got)
	}
	if got := missingSuites(suites, ""); len(got) != 0 {
		t.Errorf("nothing wanted: missing %q", got)
	}
}
