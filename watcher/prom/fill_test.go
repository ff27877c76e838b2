package prom

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/edgeflow/edgeflow/optimizer"
)

func ptr(v float64) *float64 { return &v }

func l(from, to string, ms float64) optimizer.Latency {
	return optimizer.Latency{From: from, To: to, MS: ms}
}

func TestFillLatency(t *testing.T) {
	t.Parallel()
	abc := []string{"a", "b", "c"}
	tests := []struct {
		name           string
		nodes          []string
		m              map[Pair]float64
		defaultMS      *float64
		want           []optimizer.Latency
		wantUnmeasured int
	}{
		{
			name:  "all measured",
			nodes: []string{"a", "b"},
			m:     map[Pair]float64{{"a", "b"}: 3, {"b", "a"}: 4},
			want:  []optimizer.Latency{l("a", "b", 3), l("b", "a", 4)},
		},
		{
			name:  "one direction stands for both",
			nodes: []string{"a", "b"},
			m:     map[Pair]float64{{"b", "a"}: 4},
			want:  []optimizer.Latency{l("a", "b", 4), l("b", "a", 4)},
		},
		{
			name:           "default latency for a pair never measured",
			nodes:          abc,
			m:              map[Pair]float64{{"a", "b"}: 3, {"b", "c"}: 7},
			defaultMS:      ptr(50),
			want:           []optimizer.Latency{l("a", "b", 3), l("a", "c", 50), l("b", "a", 3), l("b", "c", 7), l("c", "a", 50), l("c", "b", 7)},
			wantUnmeasured: 1,
		},
		{
			name:           "largest measured latency without a default",
			nodes:          abc,
			m:              map[Pair]float64{{"a", "b"}: 3, {"b", "c"}: 7, {"c", "b"}: 9},
			want:           []optimizer.Latency{l("a", "b", 3), l("a", "c", 9), l("b", "a", 3), l("b", "c", 7), l("c", "a", 9), l("c", "b", 9)},
			wantUnmeasured: 1,
		},
		{
			name:           "pairs of other nodes do not set the fallback",
			nodes:          abc,
			m:              map[Pair]float64{{"a", "b"}: 3, {"b", "c"}: 7, {"a", "gone"}: 900},
			want:           []optimizer.Latency{l("a", "b", 3), l("a", "c", 7), l("b", "a", 3), l("b", "c", 7), l("c", "a", 7), l("c", "b", 7)},
			wantUnmeasured: 1,
		},
		{
			// Never 0 ms: every path, a node to itself included, costs the same.
			name:  "nothing measured",
			nodes: abc,
			m:     nil,
			want: []optimizer.Latency{l("a", "a", 1), l("a", "b", 1), l("a", "c", 1), l("b", "a", 1), l("b", "b", 1), l("b", "c", 1),
				l("c", "a", 1), l("c", "b", 1), l("c", "c", 1)},
			wantUnmeasured: 3,
		},
		{
			name:           "only pairs naming no node: nothing measured",
			nodes:          []string{"a", "b"},
			m:              map[Pair]float64{{"x", "y"}: 30, {"a", "y"}: 40},
			want:           []optimizer.Latency{l("a", "a", 1), l("a", "b", 1), l("b", "a", 1), l("b", "b", 1)},
			wantUnmeasured: 1,
		},
		{
			name:           "nothing measured, with a default",
			nodes:          []string{"a", "b"},
			defaultMS:      ptr(20),
			want:           []optimizer.Latency{l("a", "b", 20), l("b", "a", 20)},
			wantUnmeasured: 1,
		},
		{
			name:  "a node to itself only when measured",
			nodes: []string{"a", "b"},
			m:     map[Pair]float64{{"a", "a"}: 0.1, {"a", "b"}: 2},
			want:  []optimizer.Latency{l("a", "a", 0.1), l("a", "b", 2), l("b", "a", 2)},
		},
		{
			name:           "a node to itself does not count as measuring a pair",
			nodes:          []string{"a", "b"},
			m:              map[Pair]float64{{"a", "a"}: 0.1},
			want:           []optimizer.Latency{l("a", "a", 0.1), l("a", "b", 0.1), l("b", "a", 0.1)},
			wantUnmeasured: 1,
		},
		{
			name:           "clamped to [0, 10000] ms, NaN is unmeasured",
			nodes:          abc,
			m:              map[Pair]float64{{"a", "b"}: -1, {"b", "c"}: 1e6, {"a", "c"}: math.NaN()},
			defaultMS:      ptr(math.Inf(1)),
			want:           []optimizer.Latency{l("a", "b", 0), l("a", "c", 1e4), l("b", "a", 0), l("b", "c", 1e4), l("c", "a", 1e4), l("c", "b", 1e4)},
			wantUnmeasured: 1,
		},
		{
			name:  "order follows nodes, duplicates listed once",
			nodes: []string{"b", "a", "b"},
			m:     map[Pair]float64{{"a", "b"}: 1, {"b", "a"}: 2},
			want:  []optimizer.Latency{l("b", "a", 2), l("a", "b", 1)},
		},
		{name: "one node", nodes: []string{"a"}, want: []optimizer.Latency{l("a", "a", 1)}},
		{name: "no nodes", want: []optimizer.Latency{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, unmeasured := FillLatency(tt.nodes, tt.m, tt.defaultMS)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("latency (-want +got):\n%s", diff)
			}
			if unmeasured != tt.wantUnmeasured {
				t.Errorf("unmeasured = %d, want %d", unmeasured, tt.wantUnmeasured)
			}
		})
	}
}

// FuzzFillLatency checks FillLatency's contract on arbitrary inputs: every ordered pair of
// distinct nodes exactly once, values within [0, MaxLatencyMS], measured values used as is,
// and a result the optimizer accepts without a default latency.
func FuzzFillLatency(f *testing.F) {
	f.Add(uint8(3), []byte{0, 1, 10, 1, 2, 200}, 5.0, true)
	f.Add(uint8(1), []byte{0, 0, 1}, math.NaN(), false)
	f.Add(uint8(6), []byte{}, -3.0, true)
	f.Fuzz(func(t *testing.T, n uint8, raw []byte, def float64, useDefault bool) {
		n %= 12
		nodes := make([]string, n)
		for i := range nodes {
			nodes[i] = fmt.Sprintf("n%d", i)
		}
		m := map[Pair]float64{}
		for i := 0; i+2 < len(raw); i += 3 {
			m[Pair{fmt.Sprintf("n%d", raw[i]%16), fmt.Sprintf("n%d", raw[i+1]%16)}] = float64(int8(raw[i+2])) * 97.5
		}
		var defaultMS *float64
		if useDefault {
			defaultMS = &def
		}
		lat, unmeasured := FillLatency(nodes, m, defaultMS)
		seen := map[Pair]bool{}
		distinct := 0
		for _, l := range lat {
			p := Pair{l.From, l.To}
			if seen[p] {
				t.Fatalf("pair %v twice", p)
			}
			seen[p] = true
			if !(l.MS >= 0 && l.MS <= optimizer.MaxLatencyMS) {
				t.Fatalf("pair %v: %v ms out of range", p, l.MS)
			}
			if v, ok := m[p]; ok && l.MS != clampMS(v) {
				t.Fatalf("pair %v: %v ms, measured %v", p, l.MS, v)
			}
			if l.From != l.To {
				distinct++
			} else if _, ok := m[p]; !ok {
				t.Fatalf("self pair %v listed without a measurement", p)
			}
		}
		if want := int(n) * (int(n) - 1); distinct != want {
			t.Fatalf("%d pairs of distinct nodes, want %d", distinct, want)
		}
		if unmeasured < 0 || unmeasured > int(n)*(int(n)-1)/2 {
			t.Fatalf("unmeasured = %d for %d nodes", unmeasured, n)
		}
		if n == 0 {
			return
		}
		top := &optimizer.Topology{Latency: lat, Services: []optimizer.Service{{Name: "s", Pods: []optimizer.Pod{{Name: "s-0", Node: nodes[0]}}}}}
		for _, name := range nodes {
			top.Nodes = append(top.Nodes, optimizer.Node{Name: name})
		}
		if _, err := optimizer.Compile(top, optimizer.Options{}); err != nil {
			t.Fatalf("the optimizer rejects FillLatency's output: %v", err)
		}
	})
}

// BenchmarkFillLatency fills a 200-node matrix with about half the pairs measured.
func BenchmarkFillLatency(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	nodes := make([]string, 200)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%03d", i)
	}
	m := map[Pair]float64{}
	for _, from := range nodes {
		for _, to := range nodes {
			if r.IntN(2) == 0 {
				m[Pair{from, to}] = r.Float64() * 50
			}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		FillLatency(nodes, m, nil)
	}
}

func TestAggregateLatency(t *testing.T) {
	t.Parallel()
	zone := map[string]string{"a1": "A", "a2": "A", "a3": "A", "b1": "B", "b2": "B", "c1": "C"}
	groupOf := func(n string) (string, bool) { z, ok := zone[n]; return z, ok }
	tests := []struct {
		name string
		m    map[Pair]float64
		want map[Pair]float64
	}{
		{
			name: "median of the measured node pairs, each direction apart",
			m: map[Pair]float64{{"a1", "b1"}: 10, {"a2", "b1"}: 12, {"a3", "b2"}: 1000, // one lost probe does not move it
				{"b1", "a1"}: 20, {"b2", "a2"}: 30},
			want: map[Pair]float64{{"A", "B"}: 12, {"B", "A"}: 25},
		},
		{
			name: "inside a zone: pairs of distinct nodes, not a node to itself",
			m:    map[Pair]float64{{"a1", "a2"}: 2, {"a2", "a3"}: 4, {"a1", "a1"}: 0.01},
			want: map[Pair]float64{{"A", "A"}: 3},
		},
		{
			name: "inside a zone of one node: its latency to itself",
			m:    map[Pair]float64{{"c1", "c1"}: 0.2, {"c1", "a1"}: 5},
			want: map[Pair]float64{{"C", "C"}: 0.2, {"C", "A"}: 5},
		},
		{
			name: "unknown nodes and NaN are not used",
			m:    map[Pair]float64{{"x", "a1"}: 1, {"a1", "x"}: 1, {"a1", "b1"}: math.NaN(), {"b1", "c1"}: 7},
			want: map[Pair]float64{{"B", "C"}: 7},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := AggregateLatency(tc.m, groupOf)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
	// Then the missing-pair rule runs over the zones: C ↔ B is never measured.
	lat, unmeasured := FillLatency([]string{"A", "B", "C"}, AggregateLatency(map[Pair]float64{{"a1", "b1"}: 4, {"c1", "a2"}: 9}, groupOf), nil)
	want := []optimizer.Latency{l("A", "B", 4), l("A", "C", 9), l("B", "A", 4), l("B", "C", 9), l("C", "A", 9), l("C", "B", 9)}
	if diff := cmp.Diff(want, lat); diff != "" || unmeasured != 1 {
		t.Errorf("FillLatency over zones: unmeasured %d, (-want +got)\n%s", unmeasured, diff)
	}
}
