package estimate

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkObserve measures one round of 1,000 pods (50 services of 20, 1–8 cores, a tenth of
// them idle so that the median path runs), each with its own time measured so that the M/M/c
// inversion runs too, in steady state (every pod with its Windows windows).
func BenchmarkObserve(b *testing.B) {
	const pods = 1000
	rng := rand.New(rand.NewPCG(1, 2))
	deltas := make([]Sample, pods) // each pod's window, made once
	samples := make([]Sample, pods)
	for i := range deltas {
		cores := float64(1 + rng.IntN(8))
		req := 1000 + rng.Float64()*9000
		if i%10 == 9 {
			req = 0
		}
		cpu := (1 + 5*rng.Float64()) / 1000 // 1–6 ms per request
		deltas[i] = Sample{Requests: req, CPUSeconds: req * cpu, InboundMS: req * (2e3*cpu + 3), DownstreamMS: req * 3}
		samples[i] = Sample{Pod: fmt.Sprintf("pod-%d", i), Service: fmt.Sprintf("svc-%d", i%50), Cores: cores}
	}
	e, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	at := time.Unix(0, 0)
	round := func() {
		at = at.Add(30 * time.Second)
		for i := range samples {
			samples[i].Requests += deltas[i].Requests
			samples[i].CPUSeconds += deltas[i].CPUSeconds
			samples[i].InboundMS += deltas[i].InboundMS
			samples[i].DownstreamMS += deltas[i].DownstreamMS
		}
		if _, err := e.Observe(at, samples); err != nil {
			b.Fatal(err)
		}
	}
	for range 6 {
		round()
	}
	b.ReportAllocs()
	for b.Loop() {
		round()
	}
}
