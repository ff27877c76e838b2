package optimizer

import (
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// A Planner handed a topology whose compile was published with its options plans on that
// model (no compile of its own), and gets what Compile and Plan give; with other options it
// compiles for itself.
func TestPlannerUsesPublishedModel(t *testing.T) {
	top := meshTopology(3, 20, 30, 4, 2)
	c := &Compiler{}
	cm, err := c.Compile(top)
	if err != nil {
		t.Fatal(err)
	}
	cm.Publish()
	pl := &Planner{Damping: -1}
	res, err := pl.Plan(top)
	if err != nil {
		t.Fatal(err)
	}
	if &res.Model.Services[0] != &cm.Model.Services[0] {
		t.Error("the Planner compiled the topology again: its model is not the published one")
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
		t.Errorf("allocation on the published model differs from Compile+Plan (-want +got):\n%s", diff)
	}

	def := 5.0
	other := &Planner{Damping: -1, Options: Options{DefaultLatencyMS: &def}}
	res2, err := other.Plan(top)
	if err != nil {
		t.Fatal(err)
	}
	if &res2.Model.Services[0] == &cm.Model.Services[0] {
		t.Error("a Planner with other options used the published model")
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

// A published model lives as long as its topology.
func TestPublishedModelFollowsTopology(t *testing.T) {
	count := func() int {
		published.mu.Lock()
		defer published.mu.Unlock()
		return len(published.m)
	}
	before := count()
	func() {
		top := meshTopology(5, 5, 4, 2, 1)
		cm, err := (&Compiler{}).Compile(top)
		if err != nil {
			t.Fatal(err)
		}
		cm.Publish()
		if PublishedModel(top, Options{}) == nil {
			t.Fatal("not published")
		}
		if got := count(); got != before+1 {
			t.Fatalf("%d published, want %d", got, before+1)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for count() > before && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if got := count(); got > before {
		t.Errorf("%d published after the topology was dropped, want %d", got, before)
	}
}
