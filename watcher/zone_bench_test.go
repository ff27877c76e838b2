package watcher

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeflow/edgeflow/internal/kubetest"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// scaleInput is a cluster of nodes in zones (node i in zone i mod zones) with nodes/5 services
// of 20 pods on random nodes, each service but every fifth calling the next, and what the
// prober measures: every ordered node pair per node; per zone, the first node of each zone
// (its representative) probing the other representatives.
func scaleInput(nodes, zones int, perZone bool) (*kube.State, *prom.Measurements) {
	r := rand.New(rand.NewPCG(uint64(nodes), 20))
	st := &kube.State{Workloads: map[kube.Workload][]string{}, Skipped: map[string]int{}}
	for i := 0; i < nodes; i++ {
		st.Nodes = append(st.Nodes, optimizer.Node{Name: fmt.Sprintf("node-%05d", i), CPU: 16000, Memory: 65536,
			Locality: fmt.Sprintf("region-%d/zone-%02d", i%zones%5, i%zones)})
	}
	for s := 0; s < nodes/5; s++ {
		svc := optimizer.Service{Name: fmt.Sprintf("svc-%04d", s), Namespace: "shop", Ports: []optimizer.Port{{Name: "http", Port: 80, TargetPort: 8080}}}
		for p := 0; p < 20; p++ {
			svc.Pods = append(svc.Pods, optimizer.Pod{Name: fmt.Sprintf("svc-%04d-%02d", s, p), Node: st.Nodes[r.IntN(nodes)].Name,
				IP: fmt.Sprintf("10.%d.%d.%d", s/250, s%250, p+1)})
		}
		st.Services = append(st.Services, svc)
	}
	zoneLatency := func(g, h int) float64 { return float64(1 + (g*7+h*13)%40) }
	meas := &prom.Measurements{Latency: map[prom.Pair]float64{}}
	if perZone {
		for g := 0; g < zones; g++ {
			for h := 0; h < zones; h++ {
				if g != h {
					meas.Latency[prom.Pair{From: st.Nodes[g].Name, To: st.Nodes[h].Name}] = zoneLatency(g, h) + r.Float64()
				}
			}
		}
	} else {
		for u := 0; u < nodes; u++ {
			for v := 0; v < nodes; v++ {
				if u != v {
					meas.Latency[prom.Pair{From: st.Nodes[u].Name, To: st.Nodes[v].Name}] = zoneLatency(u%zones, v%zones) + r.Float64()
				}
			}
		}
	}
	return st, meas
}

func scaleCalls(st *kube.State) *CallGraph {
	g := &CallGraph{}
	for s := 0; s+1 < len(st.Services); s++ {
		if (s+1)%5 != 0 {
			g.Calls = append(g.Calls, optimizer.Call{From: st.Services[s].Key(), To: st.Services[s+1].Key()})
		}
		if s%5 == 0 {
			g.Ingress = append(g.Ingress, optimizer.Ingress{Service: st.Services[s].Key(), RPS: 100})
		}
	}
	return g
}

// BenchmarkZoneScale is one merge of the watcher (Kubernetes state + measurements → topology),
// its compile and a full LATA plan, per node and per zone; live_MiB is the heap the result
// holds (topology, model, allocation) after a GC, B/op what one round allocates.
//
//	go test ./watcher -run '^$' -bench ZoneScale -benchtime 3x -count 5
func BenchmarkZoneScale(b *testing.B) {
	for _, c := range []struct {
		nodes, zones int
		granularity  string
	}{
		{500, 50, optimizer.LatencyPerNode},
		{1000, 50, optimizer.LatencyPerNode},
		{2000, 50, optimizer.LatencyPerNode},
		{500, 50, optimizer.LatencyPerZone},
		{5000, 50, optimizer.LatencyPerZone},
	} {
		b.Run(fmt.Sprintf("%s/nodes=%d/zones=%d", c.granularity, c.nodes, c.zones), func(b *testing.B) {
			perZone := c.granularity == optimizer.LatencyPerZone
			st, meas := scaleInput(c.nodes, c.zones, perZone)
			ks, err := kube.NewSource(kube.Config{Client: kubetest.NewClientset()})
			if err != nil {
				b.Fatal(err)
			}
			live, err := NewLive(LiveConfig{Kube: ks, CallGraph: scaleCalls(st), LatencyGranularity: c.granularity,
				Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			var keep []any
			for i := 0; i < b.N; i++ {
				keep = nil
				top := live.Merge(st, meas)
				m, err := optimizer.Compile(top, optimizer.Options{})
				if err != nil {
					b.Fatal(err)
				}
				a, err := optimizer.Plan(m, optimizer.LATA)
				if err != nil {
					b.Fatal(err)
				}
				keep = []any{top, m, a}
			}
			b.StopTimer()
			// What the last result holds: the heap with it, less the heap without it.
			var with, without runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&with)
			entries := len(keep[0].(*optimizer.Topology).Latency)
			keep = nil
			runtime.GC()
			runtime.ReadMemStats(&without)
			b.ReportMetric(float64(int64(with.HeapAlloc)-int64(without.HeapAlloc))/(1<<20), "live_MiB")
			b.ReportMetric(float64(entries), "latency_entries")
		})
	}
}
