package optimizer

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// A Planner handed a topology with its compiled model (PlanCompiled), compiled with its
// options, plans on that model (no compile of its own), and gets what Compile and Plan give;
// with other options it compiles for itself.
func TestPlannerUsesHandedModel(t *testing.T) {
	top := meshTopology(3, 20, 30, 4, 2)
	c := &Compiler{}
	cm, err := c.Compile(top)
	if err != nil {
		t.Fatal(err)
	}
	pl := &Planner{Damping: -1}
	res, err := pl.PlanCompiled(top, cm)
	if err != nil {
		t.Fatal(err)
	}
	if &res.Model.Services[0] != &cm.Model.Services[0] {
		t.Error("the Planner compiled the topology again: its model is not the one handed over")
	}
	m, err := Compile(top, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := Plan(m, LATA)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, res.Allocation, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("allocation on the handed model differs from Compile+Plan (-want +got):\n%s", diff)
	}

	def := 5.0
	other := &Planner{Damping: -1, Options: Options{DefaultLatencyMS: &def}}
	res2, err := other.PlanCompiled(top, cm)
	if err != nil {
		t.Fatal(err)
	}
	if &res2.Model.Services[0] == &cm.Model.Services[0] {
		t.Error("a Planner with other options used the model handed over")
	}
}

// Changed says whether anything differs from the topology compiled before: nothing for a copy;
// a latency, a rate, a pod, a pod's sidecar flag, a service's selector each count.
func TestCompilerChanged(t *testing.T) {
	base := meshTopology(4, 10, 12, 3, 2)
	no := false
	for _, tc := range []struct {
		name   string
		change func(*Topology)
		want   bool
	}{
		{"copy", func(*Topology) {}, false},
		{"latency", func(c *Topology) { c.Latency[0].MS += 1 }, true},
		{"rate", func(c *Topology) { r := 0.123; c.Calls[0].Rate = &r }, true},
		{"pod node", func(c *Topology) { c.Services[1].Pods[0].Node = c.Nodes[len(c.Nodes)-1].Name }, true},
		{"sidecar", func(c *Topology) { c.Services[2].Pods[0].Sidecar = &no }, true},
		{"selector", func(c *Topology) { c.Services[3].Selector = map[string]string{"app": "x"} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Compiler{}
			if _, err := c.Compile(base); err != nil {
				t.Fatal(err)
			}
			next := base.Clone()
			tc.change(next)
			cm, err := c.Compile(next)
			if err != nil {
				t.Fatal(err)
			}
			if cm.Changed != tc.want {
				t.Errorf("Changed = %v, want %v", cm.Changed, tc.want)
			}
			m, err := Compile(next, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(m.Services, cm.Model.Services); diff != "" {
				t.Errorf("incremental model differs from Compile's (-want +got):\n%s", diff)
			}
		})
	}
}
