package estimate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestBias feeds the counters of simulated queues to the estimator, window by window, and
// checks its estimate against the true capacity: never more than 5 % over it, and within
// ±10 % once measured (every window here has ≈ 4,000 requests). It also shows why the
// utilisation law is primary: the M/M/1 inversion λ + 1/S over-estimates a single server under
// smooth (constant-rate, round-robin-split) arrivals, and is no bound at all for a 4-core pod
// (it under-estimates at low load), where the estimator's queueing bound is the M/M/c inversion,
// itself over under smooth arrivals (by little at ρ = 0.3, where no model waits much) and
// right under Poisson arrivals, its own model.
func TestBias(t *testing.T) {
	const (
		windows       = 10     // rounds after the base
		perWindow     = 4000.0 // expected completions per pod and window
		maxOver       = 1.05
		tolerance     = 0.10
		smoothMinOver = 1.05 // the M/M/1 inversion of a single server under smooth arrivals is over by more
		multiMinOver  = 1.03 // and the M/M/c inversion of a 4-core pod at ρ ≥ 0.6
	)
	var table strings.Builder
	fmt.Fprintf(&table, "%-34s %9s %9s %9s %9s %9s %9s\n", "case", "est/true", "max", "min", "lower", "M/M/1", "M/M/c")
	seed := uint64(0)
	for _, servers := range []int{1, 4} {
		for _, serviceMS := range []float64{1, 6} {
			for _, arr := range []arrivalProcess{constantRate, roundRobin3, poisson} {
				for _, rho := range []float64{0.3, 0.6, 0.85} {
					seed++
					c := simCase{servers: servers, serviceMS: serviceMS, downstreamMS: 2, arrivals: arr, rho: rho}
					t.Run(c.String(), func(t *testing.T) {
						r := biasRun(t, c, seed, windows, perWindow)
						truth := c.capacity()
						for pod, est := range r.rounds {
							for k, e := range est {
								if e.Source != SourceMeasured {
									continue
								}
								if e.RPS > maxOver*truth {
									t.Errorf("pod %d round %d: estimate %.1f rps over the truth %.1f by %.1f %%, want ≤ %.0f %%",
										pod, k, e.RPS, truth, 100*(e.RPS/truth-1), 100*(maxOver-1))
								}
								if math.Abs(e.RPS/truth-1) > tolerance {
									t.Errorf("pod %d round %d: estimate %.1f rps, truth %.1f: off by %.1f %%, want within ±%.0f %%",
										pod, k, e.RPS, truth, 100*(e.RPS/truth-1), 100*tolerance)
								}
								if !(e.Lower <= e.RPS && e.RPS <= e.Upper) {
									t.Errorf("pod %d round %d: want Lower ≤ RPS ≤ Upper, have %.1f, %.1f, %.1f", pod, k, e.Lower, e.RPS, e.Upper)
								}
							}
							if got := est[len(est)-1].Source; got != SourceMeasured {
								t.Errorf("pod %d: source %v after %d windows of ≈ %.0f requests, want measured", pod, got, windows, perWindow)
							}
						}
						// The queueing inversions over the whole run.
						smooth := c.arrivals != poisson
						if servers == 1 && smooth && !(r.mm1 > smoothMinOver*truth) {
							t.Errorf("M/M/1 inversion %.1f rps, truth %.1f: want over by more than %.0f %% under smooth arrivals",
								r.mm1, truth, 100*(smoothMinOver-1))
						}
						if servers > 1 && smooth && rho >= 0.6 && !(r.mmc > multiMinOver*truth) {
							t.Errorf("M/M/c inversion %.1f rps, truth %.1f: want over by more than %.0f %% under smooth arrivals",
								r.mmc, truth, 100*(multiMinOver-1))
						}
						if servers > 1 && rho <= 0.6 && !(r.mm1 < (1-tolerance)*truth) {
							t.Errorf("M/M/1 inversion of a %d-core pod %.1f rps, truth %.1f: want under by more than %.0f %% at low load",
								servers, r.mm1, truth, 100*tolerance)
						}
						if !smooth && math.Abs(r.mmc/truth-1) > tolerance {
							t.Errorf("M/M/c inversion %.1f rps, truth %.1f: want within ±%.0f %% under Poisson arrivals (its own model)",
								r.mmc, truth, 100*tolerance)
						}
						fmt.Fprintf(&table, "%-34s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f\n", c, r.final/truth, r.max/truth, r.min/truth,
							r.lower/truth, r.mm1/truth, r.mmc/truth)
					})
				}
			}
		}
	}
	t.Logf("estimate / true capacity (final, max and min over the measured rounds and pods; the final lower bound), "+
		"and the queueing inversions over the whole run:\n%s", table.String())
}

// biasResult is what one simulated case gave.
type biasResult struct {
	rounds          [][]Capacity // per pod, per round after the base
	final, max, min float64      // of RPS, over the measured rounds (final: the last round's mean over pods)
	lower           float64      // the last round's mean Lower over pods
	mm1, mmc        float64      // the plain M/M/1 and the M/M/c inversions over the whole run, mean over pods
}

// biasRun simulates c and feeds its counters to a default Estimator.
func biasRun(t *testing.T, c simCase, seed uint64, windows int, perWindow float64) biasResult {
	t.Helper()
	w := perWindow / c.lambda()
	cum := simulate(rand.New(rand.NewPCG(seed, 37)), c, w, windows)
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := biasResult{rounds: make([][]Capacity, len(cum)), min: math.Inf(1)}
	t0 := time.Unix(0, 0)
	for k := 0; k <= windows; k++ {
		samples := make([]Sample, len(cum))
		for i, p := range cum {
			samples[i] = p[k]
			samples[i].Pod = fmt.Sprintf("pod-%d", i)
			samples[i].Service = "svc"
			samples[i].Cores = float64(c.servers)
		}
		est, err := e.Observe(t0.Add(time.Duration(float64(k)*w*float64(time.Second))), samples)
		if err != nil {
			t.Fatalf("round %d: %v", k, err)
		}
		if k == 0 {
			continue
		}
		for i := range cum {
			e := est[fmt.Sprintf("pod-%d", i)]
			r.rounds[i] = append(r.rounds[i], e)
			if e.Source == SourceMeasured {
				r.max, r.min = max(r.max, e.RPS), min(r.min, e.RPS)
			}
			if k == windows {
				r.final += e.RPS / float64(len(cum))
				r.lower += e.Lower / float64(len(cum))
			}
		}
	}
	for _, p := range cum {
		r.mm1 += mm1Inversion(p, 0, windows, w) / float64(len(cum))
		last := p[windows]
		req := last.Requests
		own := (last.InboundMS - last.DownstreamMS) / req / 1000
		r.mmc += mmcCapacity(req/(float64(windows)*w), own, c.servers) / float64(len(cum))
	}
	return r
}
