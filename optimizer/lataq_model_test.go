package optimizer

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// modelled is an allocation's end-to-end latency per request in the network of M/M/1 pods
// lata-q models, requests following the fractions (the demo's pods: one worker, exponential
// service; each call made in turn, its round trip added once).
type modelled struct {
	mean, p99 float64 // ms
}

// modelLatency returns a's modelled latency: the mean exactly, by Little's law (lata-q's
// objective, every route's rps × latency plus every pod's ℓ·1000/(μ−ℓ), over the ingress; every
// pod of Bookinfo has a service rate and none is saturated), and the P99 from n requests
// drawn with independent exponential sojourns of rate μ−ℓ per pod (Jackson's approximation).
func modelLatency(t *testing.T, m *Model, a *Allocation, n int) modelled {
	t.Helper()
	load := flowLoads(m, a)
	type pod struct{ s, p int }
	at := map[string]pod{}
	for s, svc := range m.Services {
		for p, q := range svc.Pods {
			at[q.Name] = pod{s, p}
			if l := load[q.Name]; l >= q.CapacityRPS {
				t.Fatalf("pod %s loaded with %v rps, at or past its service rate %v", q.Name, l, q.CapacityRPS)
			}
		}
	}
	var ingress float64
	for _, svc := range m.Services {
		ingress += svc.Ingress
	}
	total := objective(m, a)
	routes := map[[2]int][]Route{} // by edge and caller pod index in its service
	for k, c := range a.Calls {
		for _, r := range c.Routes {
			key := [2]int{k, at[r.Caller].p}
			routes[key] = append(routes[key], r)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var visit func(q pod) float64
	visit = func(q pod) float64 {
		ref := m.Services[q.s].Pods[q.p]
		d := rng.ExpFloat64() / (ref.CapacityRPS - load[ref.Name]) * 1000
		for k, e := range m.Calls {
			if e.From != q.s {
				continue
			}
			rs := routes[[2]int{k, q.p}]
			u, pick := rng.Float64(), rs[len(rs)-1]
			for _, r := range rs {
				if u < r.Fraction {
					pick = r
					break
				}
				u -= r.Fraction
			}
			d += pick.LatencyMS + visit(at[pick.Callee])
		}
		return d
	}
	src := m.Order[0]
	svc := &m.Services[src]
	lat := make([]float64, n)
	for i := range lat {
		u, p := rng.Float64()*svc.TotalWeight(), 0
		for ; p+1 < len(svc.Pods) && u >= svc.Pods[p].Weight; p++ {
			u -= svc.Pods[p].Weight
		}
		lat[i] = visit(pod{src, p})
	}
	slices.Sort(lat)
	return modelled{mean: total / ingress, p99: lat[n*99/100]}
}

// TestLATAQModelledLatency: on the demo's Bookinfo (every pod μ = 1000/6 rps), the mean
// end-to-end latency of lata-q's plan in the model it optimises is below lata's at low load
// and not above it at any load (where its own plan is not better, lata's is served). It logs
// both and their modelled P99.
func TestLATAQModelledLatency(t *testing.T) {
	top := demoBookinfo(t)
	n := 400_000
	if testing.Short() {
		n = 20_000
	}
	for _, rps := range []float64{150, 300, 450} {
		top.Ingress[0].RPS = rps
		m, err := Compile(top, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var got [2]modelled
		for i, p := range []Policy{LATA, LATAQ} {
			a, err := Plan(m, p)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = modelLatency(t, m, a, n)
		}
		l, q := got[0], got[1]
		t.Logf("%v rps: mean lata %.2f ms, lata-q %.2f ms (%+.1f %%); P99 lata %.1f ms, lata-q %.1f ms (%+.1f %%)",
			rps, l.mean, q.mean, 100*(q.mean/l.mean-1), l.p99, q.p99, 100*(q.p99/l.p99-1))
		if q.mean > l.mean*(1+1e-9) {
			t.Errorf("%v rps: lata-q's modelled mean %.3f ms is above lata's %.3f ms", rps, q.mean, l.mean)
		}
		if rps == 150 && !(q.mean < l.mean*0.99) {
			t.Errorf("%v rps: lata-q's modelled mean %.3f ms is not 1 %% below lata's %.3f ms", rps, q.mean, l.mean)
		}
	}
}
