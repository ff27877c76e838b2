package watcher

import (
	"testing"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/estimate"
)

// TestWithLatencyPenalty: the corrected direction pays the penalty, the reverse keeps its
// latency whichever direction the topology gave (or the default), the input is not modified,
// and what cannot be corrected is left alone. Checked on the compiled matrix.
func TestWithLatencyPenalty(t *testing.T) {
	base := func() *optimizer.Topology {
		return &optimizer.Topology{
			Nodes:    []optimizer.Node{{Name: "a"}, {Name: "b"}, {Name: "c"}},
			Latency:  []optimizer.Latency{{From: "a", To: "b", MS: 4}, {From: "c", To: "a", MS: 6}},
			Services: []optimizer.Service{{Name: "s", Pods: []optimizer.Pod{{Name: "s-0", Node: "a"}}}},
		}
	}
	def := 9.0
	type lat struct {
		from, to string
		ms       float64
	}
	for _, c := range []struct {
		name    string
		penalty map[estimate.NodePair]float64
		want    []lat
	}{
		{"forward entry", map[estimate.NodePair]float64{{From: "a", To: "b"}: 3}, []lat{{"a", "b", 7}, {"b", "a", 4}}},
		{"reverse entry", map[estimate.NodePair]float64{{From: "a", To: "c"}: 3}, []lat{{"a", "c", 9}, {"c", "a", 6}}},
		{"default", map[estimate.NodePair]float64{{From: "b", To: "c"}: 2}, []lat{{"b", "c", 11}, {"c", "b", 9}}},
		{"both directions", map[estimate.NodePair]float64{{From: "a", To: "b"}: 3, {From: "b", To: "a"}: 1}, []lat{{"a", "b", 7}, {"b", "a", 5}}},
		{"capped", map[estimate.NodePair]float64{{From: "a", To: "b"}: 2 * optimizer.MaxLatencyMS}, []lat{{"a", "b", optimizer.MaxLatencyMS}, {"b", "a", 4}}},
		{"left alone", map[estimate.NodePair]float64{{From: "a", To: "a"}: 3, {From: "a", To: "x"}: 3, {From: "b", To: "a"}: -1},
			[]lat{{"a", "a", 0}, {"a", "b", 4}, {"b", "a", 4}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := base()
			got := WithLatencyPenalty(in, &def, c.penalty)
			if len(in.Latency) != 2 || in.Latency[0].MS != 4 || in.Latency[1].MS != 6 {
				t.Fatalf("the input was modified: %+v", in.Latency)
			}
			m, err := optimizer.Compile(got, optimizer.Options{DefaultLatencyMS: &def})
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range c.want {
				u, _ := m.NodeIndex(w.from)
				v, _ := m.NodeIndex(w.to)
				if ms := m.Latency.At(u, v); ms != w.ms {
					t.Errorf("%s → %s: %v ms, want %v (entries %+v)", w.from, w.to, ms, w.ms, got.Latency)
				}
			}
		})
	}
	zoned := base()
	zoned.LatencyGranularity = optimizer.LatencyPerZone
	if got := WithLatencyPenalty(zoned, nil, map[estimate.NodePair]float64{{From: "a", To: "b"}: 3}); got.Latency[0].MS != 4 || len(got.Latency) != 2 {
		t.Errorf("per-zone latencies were corrected: %+v", got.Latency)
	}
}
