package estimate

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// latencyWorld is a small world for the corrector: a callee service s with one pod on each of
// the nodes a, b and c, called from each node. An attempt pays the band's inbound time (own
// work and queueing, exponential), the ICMP RTT, an overhead every path pays (the client
// library, the sidecars), a stall that every path of its caller's node pays in that window (a
// busy machine; uniform in [0, stallMS)), and the pair's hidden penalty.
type latencyWorld struct {
	rng        *rand.Rand
	icmp       map[NodePair]float64
	penalty    map[NodePair]float64
	overheadMS float64
	stallMS    float64
	inboundMS  float64 // mean inbound time
}

func newLatencyWorld(seed uint64) *latencyWorld {
	icmp := map[NodePair]float64{}
	for _, e := range []struct {
		u, v string
		ms   float64
	}{{"a", "b", 4}, {"a", "c", 6}, {"b", "c", 2}} {
		icmp[NodePair{e.u, e.v}], icmp[NodePair{e.v, e.u}] = e.ms, e.ms
	}
	for _, n := range []string{"a", "b", "c"} {
		icmp[NodePair{n, n}] = 0
	}
	return &latencyWorld{rng: rand.New(rand.NewPCG(seed, 1)), icmp: icmp, penalty: map[NodePair]float64{}, overheadMS: 0.3, stallMS: 2,
		inboundMS: 5}
}

func (w *latencyWorld) rtt(p NodePair) (float64, bool) { ms, ok := w.icmp[p]; return ms, ok }

// round draws one window: bandRequests inbound requests per band and attempts per pair
// (from every node to every node), each attempt's inbound time drawn afresh.
func (w *latencyWorld) round(bandRequests, attempts int) ([]PathWindow, []BandWindow) {
	var paths []PathWindow
	var bands []BandWindow
	draw := func(n int) float64 {
		var sum float64
		for range n {
			sum += w.rng.ExpFloat64() * w.inboundMS
		}
		return sum
	}
	stall := map[string]float64{}
	for _, u := range []string{"a", "b", "c"} {
		stall[u] = w.rng.Float64() * w.stallMS
	}
	for _, v := range []string{"a", "b", "c"} {
		bands = append(bands, BandWindow{Service: "s", Node: v, Requests: float64(bandRequests), InboundMS: draw(bandRequests)})
		for _, u := range []string{"a", "b", "c"} {
			p := NodePair{u, v}
			extra := w.icmp[p] + w.overheadMS + stall[u] + w.penalty[p]
			paths = append(paths, PathWindow{Pair: p, Service: "s", Attempts: float64(attempts), AttemptMS: draw(attempts) + float64(attempts)*extra})
		}
	}
	return paths, bands
}

func byPair(ps []LatencyPenalty) map[NodePair]LatencyPenalty {
	out := map[NodePair]LatencyPenalty{}
	for _, p := range ps {
		out[p.Pair] = p
	}
	return out
}

func newCorrector(t *testing.T, cfg LatencyConfig) *LatencyCorrector {
	t.Helper()
	c, err := NewLatencyCorrector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLatencyFindsPenalty: a hidden 3 ms penalty on a→b under constant load (exponential own
// times, an overhead every path pays, stalls) is found within ±1 ms once it stands out of the
// noise, by Windows windows, not before MinWindows, and no other pair gets one beyond the same ±1 ms: the overhead and the stalls are
// not taken for distance. Over seeds. (200 attempts a window: an estimate over 3 windows has a
// standard error of about 5 ms · √(2/200) / √3 ≈ 0.3 ms, its own and its baseline's; ±1 ms is
// over three of them.)
func TestLatencyFindsPenalty(t *testing.T) {
	for seed := range uint64(20) {
		w := newLatencyWorld(seed)
		w.penalty[NodePair{"a", "b"}] = 3
		c := newCorrector(t, LatencyConfig{MinRequests: 50})
		for r := 1; r <= 8; r++ {
			paths, bands := w.round(600, 200)
			got, err := c.Observe(paths, bands, w.rtt)
			if err != nil {
				t.Fatal(err)
			}
			pen := byPair(got)
			ab := pen[NodePair{"a", "b"}]
			if r < 3 {
				if ab.PenaltyMS != 0 || ab.Measured {
					t.Fatalf("seed %d round %d: a→b %+v before MinWindows (3) windows", seed, r, ab)
				}
				continue
			}
			// Measured from 3 windows; in force once it stands out of its confidence band, at
			// the latest with Windows (5) windows.
			if !ab.Measured || (ab.PenaltyMS != 0 || r >= 5) && math.Abs(ab.PenaltyMS-3) > 1 {
				t.Fatalf("seed %d round %d: a→b %+v; want 3 ± 1 ms, measured", seed, r, ab)
			}
			for pair, p := range pen {
				if pair != (NodePair{"a", "b"}) && p.PenaltyMS > 1 {
					t.Errorf("seed %d round %d: %s has a penalty %+v; it has none (±1 ms)", seed, r, pair, p)
				}
			}
		}
	}
}

// TestLatencyThinData: windows under the sample floor correct nothing, however large their
// residual; and so do windows without the callee band's inbound time (its band under the
// floor), or without any same-node path to take the baseline from.
func TestLatencyThinData(t *testing.T) {
	for _, c := range []struct {
		name               string
		bandReq, attempts  int
		dropSameNode       bool
		wantMeasuredAnyway bool
	}{
		{"attempts under the floor", 300, 40, false, false},
		{"band under the floor", 40, 100, false, false},
		{"no same-node path", 300, 100, true, false},
		{"enough", 300, 100, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newLatencyWorld(1)
			w.penalty[NodePair{"a", "b"}] = 20
			corr := newCorrector(t, LatencyConfig{MinRequests: 50})
			var got []LatencyPenalty
			for range 6 {
				paths, bands := w.round(c.bandReq, c.attempts)
				if c.dropSameNode {
					kept := paths[:0]
					for _, p := range paths {
						if p.Pair.From != p.Pair.To {
							kept = append(kept, p)
						}
					}
					paths = kept
				}
				var err error
				if got, err = corr.Observe(paths, bands, w.rtt); err != nil {
					t.Fatal(err)
				}
			}
			ab := byPair(got)[NodePair{"a", "b"}]
			if c.wantMeasuredAnyway {
				if !ab.Measured || math.Abs(ab.PenaltyMS-20) > 1 {
					t.Fatalf("a→b %+v; want 20 ± 1 ms", ab)
				}
				return
			}
			if ab.Measured || ab.PenaltyMS != 0 {
				t.Fatalf("a→b %+v; want no correction", ab)
			}
		})
	}
}

// TestLatencyDecay: once a found penalty's data thins (its pair's attempts under the floor),
// the penalty in force halves every HalfLife rounds, never rises without a measurement, and
// is 0 (pure ICMP) within the rounds a halving from 3 ms to under MinPenaltyMS takes; the other
// pairs are untouched.
func TestLatencyDecay(t *testing.T) {
	w := newLatencyWorld(2)
	ab := NodePair{"a", "b"}
	w.penalty[ab] = 3
	c := newCorrector(t, LatencyConfig{MinRequests: 50, HalfLife: 2})
	var found float64
	for range 5 {
		paths, bands := w.round(600, 200)
		got, err := c.Observe(paths, bands, w.rtt)
		if err != nil {
			t.Fatal(err)
		}
		found = byPair(got)[ab].PenaltyMS
	}
	if math.Abs(found-3) > 1 {
		t.Fatalf("a→b penalty %v after 5 rounds; want 3 ± 1", found)
	}
	prev := found
	rounds := 0
	for prev > 0 {
		rounds++
		if rounds > 20 {
			t.Fatalf("a→b penalty still %v after 20 thin rounds", prev)
		}
		paths, bands := w.round(600, 200)
		for i := range paths {
			if paths[i].Pair == ab {
				paths[i].Attempts, paths[i].AttemptMS = 10, 10*(w.inboundMS+7) // under the floor
			}
		}
		got, err := c.Observe(paths, bands, w.rtt)
		if err != nil {
			t.Fatal(err)
		}
		p := byPair(got)[ab]
		// The sliding windows age out first (MinWindows of the last Windows rounds stay
		// measured), then the decay.
		if !p.Measured && p.PenaltyMS > prev {
			t.Fatalf("thin round %d: a→b penalty rose from %v to %v without a measurement", rounds, prev, p.PenaltyMS)
		}
		if !p.Measured && p.PenaltyMS > 0 && math.Abs(p.PenaltyMS-prev*math.Exp2(-0.5)) > 1e-9 {
			t.Fatalf("thin round %d: a→b penalty %v after %v; want it halved every 2 rounds", rounds, p.PenaltyMS, prev)
		}
		prev = p.PenaltyMS
	}
	// Measured for Windows − MinWindows + 1 = 3 more rounds, then from ≤ 4 ms to under 2 ms
	// (MinPenaltyMS) takes at most 2 rounds at a half-life of 2: at most 9 is loose.
	if rounds > 3+6 {
		t.Errorf("a→b back to ICMP after %d thin rounds; want at most 9", rounds)
	}
}

// TestLatencyBoundAndHysteresis: a residual beyond MaxPenaltyMS is taken as MaxPenaltyMS; a
// penalty that moves within HysteresisMS leaves the one in force; one that moves further
// replaces it.
func TestLatencyBoundAndHysteresis(t *testing.T) {
	w := newLatencyWorld(3)
	ab := NodePair{"a", "b"}
	w.penalty[ab] = 500
	c := newCorrector(t, LatencyConfig{MinRequests: 50, MaxPenaltyMS: 40, HysteresisMS: 2, Windows: 3})
	observe := func() LatencyPenalty {
		t.Helper()
		paths, bands := w.round(600, 200)
		got, err := c.Observe(paths, bands, w.rtt)
		if err != nil {
			t.Fatal(err)
		}
		return byPair(got)[ab]
	}
	var p LatencyPenalty
	for range 3 {
		p = observe()
	}
	if p.PenaltyMS != 40 || !(p.EstimateMS > 400) {
		t.Fatalf("a→b %+v; want the bound, 40 ms, from an estimate near 500", p)
	}
	w.penalty[ab] = 10
	for range 3 { // the windows of 500 ms age out
		p = observe()
	}
	if math.Abs(p.PenaltyMS-10) > 1 {
		t.Fatalf("a→b %+v; want 10 ± 1 ms", p)
	}
	inForce := p.PenaltyMS
	w.penalty[ab] = inForce + 1 // within the 2 ms band
	for range 3 {
		if p = observe(); p.PenaltyMS != inForce {
			t.Fatalf("a→b %+v: moved from %v within the hysteresis band", p, inForce)
		}
	}
	w.penalty[ab] = inForce + 4
	for range 3 {
		p = observe()
	}
	// It moved beyond the band, to within the band (and ±1 ms of noise) of the truth.
	if !(p.PenaltyMS > inForce+2) || math.Abs(p.PenaltyMS-(inForce+4)) > 2+1 {
		t.Fatalf("a→b %+v; want a move from %v beyond the 2 ms band, to %v ± 3 ms", p, inForce, inForce+4)
	}
}

// TestLatencyInvalid: bad windows are left out, each named in the error; the round counts;
// a bad config is refused.
func TestLatencyInvalid(t *testing.T) {
	c := newCorrector(t, LatencyConfig{})
	_, err := c.Observe([]PathWindow{{Pair: NodePair{"a", "b"}, Service: "s", Attempts: -1}, {Pair: NodePair{"", "b"}, Service: "s"}},
		[]BandWindow{{Service: "s", Node: "b", Requests: math.NaN()}}, func(NodePair) (float64, bool) { return 0, true })
	if !errors.Is(err, ErrInvalidSample) {
		t.Fatalf("error %v; want ErrInvalidSample", err)
	}
	for _, want := range []string{`path a→b to service "s"`, `path →b`, `band of service "s" on node "b"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	for _, cfg := range []LatencyConfig{{MinRequests: -1}, {MinWindows: 6}, {MaxPenaltyMS: math.Inf(1)}, {HysteresisMS: 60}, {MinPenaltyMS: 60}, {MinPenaltyMS: -1}, {HalfLife: -1}, {Confidence: 1}} {
		if _, err := NewLatencyCorrector(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("config %+v: error %v; want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestLatencyIdleRounds: rounds without any window over the floor (the load stopped) neither
// age the windows nor decay the penalty: when the load resumes, the penalty found before is
// still in force and measured.
func TestLatencyIdleRounds(t *testing.T) {
	w := newLatencyWorld(4)
	ab := NodePair{"a", "b"}
	w.penalty[ab] = 3
	c := newCorrector(t, LatencyConfig{MinRequests: 50})
	var before LatencyPenalty
	for range 4 {
		paths, bands := w.round(600, 200)
		got, err := c.Observe(paths, bands, w.rtt)
		if err != nil {
			t.Fatal(err)
		}
		before = byPair(got)[ab]
	}
	for i := range 20 {
		paths, bands := w.round(300, 10) // attempts under the floor everywhere
		got, err := c.Observe(paths, bands, w.rtt)
		if err != nil {
			t.Fatal(err)
		}
		if p := byPair(got)[ab]; p.PenaltyMS != before.PenaltyMS || !p.Measured || p.Windows != before.Windows {
			t.Fatalf("idle round %d: a→b %+v; want it as before the load stopped, %+v", i+1, p, before)
		}
	}
}

// FuzzLatencyObserve: whatever the windows, Observe neither panics nor puts in force a penalty
// outside [0, MaxPenaltyMS] or one that is NaN, and the same-node pairs get none.
func FuzzLatencyObserve(f *testing.F) {
	f.Add(uint64(1), 100.0, 700.0, 50.0, 240.0, 4.0)
	f.Add(uint64(2), 0.0, 0.0, 0.0, 0.0, 0.0)
	f.Add(uint64(3), 1e308, 1e308, 1e308, 1e308, math.Inf(1))
	f.Fuzz(func(t *testing.T, seed uint64, attempts, attemptMS, requests, inboundMS, rtt float64) {
		c, err := NewLatencyCorrector(LatencyConfig{MinRequests: 1, Windows: 3, MinWindows: 2})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, 2))
		nodes := []string{"a", "b"}
		for range 6 {
			var paths []PathWindow
			var bands []BandWindow
			for _, u := range nodes {
				bands = append(bands, BandWindow{Service: "s", Node: u, Requests: requests * rng.Float64(), InboundMS: inboundMS * rng.Float64()})
				for _, v := range nodes {
					paths = append(paths, PathWindow{Pair: NodePair{u, v}, Service: "s", Attempts: attempts * rng.Float64(), AttemptMS: attemptMS * rng.Float64()})
				}
			}
			got, _ := c.Observe(paths, bands, func(NodePair) (float64, bool) { return rtt, !math.IsNaN(rtt) })
			for _, p := range got {
				if math.IsNaN(p.PenaltyMS) || p.PenaltyMS < 0 || p.PenaltyMS > DefaultMaxPenaltyMS || p.Pair.From == p.Pair.To && p.PenaltyMS != 0 {
					t.Fatalf("%+v", p)
				}
			}
		}
	})
}

// TestLatencyBaselinePerService: what a call pays beyond the callee's inbound time is not the
// same for every service (the demo measured 0.5–1.8 ms by service: the response's size, the
// client's path), so a pair whose calls go to other services than its caller node's same-node
// calls would read the difference as distance. The baseline is per callee service: the caller
// node's own same-node path to the service, else the service's same-node paths from every
// node, else the node's same-node paths to every service. No noise: every attempt pays its
// service's overhead exactly, and no pair has a penalty.
func TestLatencyBaselinePerService(t *testing.T) {
	const inbound = 5.0
	overhead := map[string]float64{"s": 0.3, "t": 1.5}
	icmp := func(p NodePair) (float64, bool) {
		if p.From == p.To {
			return 0, true
		}
		return 4, true
	}
	path := func(from, to, service string, extra float64) PathWindow {
		return PathWindow{Pair: NodePair{from, to}, Service: service, Attempts: 100,
			AttemptMS: 100 * (inbound + overhead[service] + extra)}
	}
	band := func(service, node string) BandWindow {
		return BandWindow{Service: service, Node: node, Requests: 100, InboundMS: 100 * inbound}
	}
	bands := []BandWindow{band("s", "a"), band("s", "b"), band("t", "a"), band("t", "b"), band("t", "c")}
	for _, c := range []struct {
		name  string
		paths []PathWindow
		want  float64 // a→b's estimate
	}{
		// a's same-node calls go to s only; a→b's to t, whose overhead b's and c's same-node
		// calls to t show. (A baseline of a's same-node calls would read 1.2 ms of distance.)
		{"the service's same-node paths from other nodes", []PathWindow{
			path("a", "a", "s", 0), path("b", "b", "t", 0), path("c", "c", "t", 0), path("a", "b", "t", 4)}, 0},
		// a's own same-node path to t pays 0.4 ms more than other nodes' (its client is
		// slower): a→b's calls to t pay it too, and a's own baseline takes it.
		{"the node's own same-node path to the service", []PathWindow{
			path("a", "a", "s", 0), path("a", "a", "t", 0.4), path("b", "b", "t", 0), path("a", "b", "t", 4.4)}, 0},
		// No same-node call to t anywhere: a's same-node calls (to s) are the baseline, and
		// t's extra overhead reads as distance: the documented fallback, not a silent zero.
		{"no same-node path to the service", []PathWindow{
			path("a", "a", "s", 0), path("b", "b", "s", 0), path("a", "b", "t", 4)}, 1.2},
	} {
		t.Run(c.name, func(t *testing.T) {
			corr := newCorrector(t, LatencyConfig{MinRequests: 50})
			var got []LatencyPenalty
			for range 3 {
				var err error
				if got, err = corr.Observe(c.paths, bands, icmp); err != nil {
					t.Fatal(err)
				}
			}
			ab := byPair(got)[NodePair{"a", "b"}]
			if !ab.Measured || math.Abs(ab.EstimateMS-c.want) > 1e-9 {
				t.Errorf("a→b %+v; want measured, estimate %v ms", ab, c.want)
			}
		})
	}
}

// The noisy world of TestLatencyNoPenaltyFromNoise and TestLatencyRealPenaltyKeptThroughNoise:
// 4 nodes, one service, callee pods of 30 ms inbound time, 2 ms between nodes, 300 attempts a
// pair a round whose mean scatters by noiseMS (one draw a pair, in node order), plus penaltyMS
// on penalised (a pair; the zero pair: none).
const (
	noisyInbound  = 30.0 // the testbed's callee pods: 11–22 ms
	noisyRTT      = 2.0
	noisyAttempts = 300
)

var noisyNodes = []string{"a", "b", "c", "d"}

func noisyICMP(p NodePair) (float64, bool) {
	if p.From == p.To {
		return 0, true
	}
	return noisyRTT, true
}

func noisyRound(rng *rand.Rand, noiseMS float64, penalised NodePair, penaltyMS float64) ([]PathWindow, []BandWindow) {
	var paths []PathWindow
	var bands []BandWindow
	for _, v := range noisyNodes {
		bands = append(bands, BandWindow{Service: "s", Node: v, Requests: 1000, InboundMS: 1000 * noisyInbound})
		for _, u := range noisyNodes {
			extra := 0.5 + rng.NormFloat64()*noiseMS
			if u != v {
				extra += noisyRTT
			}
			if (NodePair{u, v}) == penalised {
				extra += penaltyMS
			}
			paths = append(paths, PathWindow{Pair: NodePair{u, v}, Service: "s", Attempts: noisyAttempts,
				AttemptMS: noisyAttempts * (noisyInbound + extra)})
		}
	}
	return paths, bands
}

// TestLatencyNoPenaltyFromNoise: four nodes, a callee band on each, every node calling every
// node, no penalty anywhere, and every path's window paying noise its baseline does not cancel
// (normal, 6 ms a window's mean: the netns testbed's estimates of pairs without a penalty
// spread so, ±1–1.5 ms standard error over 5 windows). Over 20 seeds of 200 rounds each, the
// share of rounds in which any of the 12 remote pairs enters a penalty is at most 2 × the
// one-sided 2.5 % that the family-wise level allows (the rounds overlap in their windows, so a
// run's entries are not independent: the bound is on the whole sample), and a penalty that
// entered is gone within a few rounds: the share of rounds with any penalty in force stays
// under 10 %. Measured: 1.6 % and 3.8 %; with the rule before (t at 95 % on each pair, and a
// penalty kept until an estimate differed from it beyond the band) 9.7 % and 94 %.
func TestLatencyNoPenaltyFromNoise(t *testing.T) {
	const (
		noiseMS = 6.0
		rounds  = 200
	)
	var entries, inForce, total int
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		c := newCorrector(t, LatencyConfig{MinRequests: 100})
		held := map[NodePair]bool{}
		for range rounds {
			paths, bands := noisyRound(rng, noiseMS, NodePair{}, 0)
			got, err := c.Observe(paths, bands, noisyICMP)
			if err != nil {
				t.Fatal(err)
			}
			total++
			entered, any := false, false
			for _, p := range got {
				if p.PenaltyMS > 0 {
					any = true
					if !held[p.Pair] {
						entered = true
					}
				}
				held[p.Pair] = p.PenaltyMS > 0
			}
			if entered {
				entries++
			}
			if any {
				inForce++
			}
		}
	}
	t.Logf("rounds with a penalty entering: %d of %d (%.1f %%); with any in force: %d (%.1f %%)", entries, total,
		100*float64(entries)/float64(total), inForce, 100*float64(inForce)/float64(total))
	if share := float64(entries) / float64(total); share > 2*0.025 {
		t.Errorf("a penalty entered from noise alone in %.1f %% of the rounds; want at most 5 %%", 100*share)
	}
	if share := float64(inForce) / float64(total); share > 0.10 {
		t.Errorf("a penalty was in force, from noise alone, in %.1f %% of the rounds; want under 10 %%", 100*share)
	}
}

// TestLatencyPenaltyRisingStaysInForce: a penalty found (3 ms on a→b) that grows (to 12 ms)
// is never dropped while its windows mix the two (their spread is the step's): from the
// round it entered on, a→b always holds a penalty, and it ends at 12 ± 1 ms.
func TestLatencyPenaltyRisingStaysInForce(t *testing.T) {
	for seed := range uint64(10) {
		w := newLatencyWorld(seed)
		ab := NodePair{"a", "b"}
		w.penalty[ab] = 3
		c := newCorrector(t, LatencyConfig{MinRequests: 50})
		entered := false
		var p LatencyPenalty
		for r := 1; r <= 16; r++ {
			if r == 7 {
				w.penalty[ab] = 12
			}
			paths, bands := w.round(600, 200)
			got, err := c.Observe(paths, bands, w.rtt)
			if err != nil {
				t.Fatal(err)
			}
			p = byPair(got)[ab]
			if entered && p.PenaltyMS == 0 {
				t.Fatalf("seed %d round %d: a→b dropped its penalty while it grew: %+v", seed, r, p)
			}
			entered = entered || p.PenaltyMS > 0
		}
		if math.Abs(p.PenaltyMS-12) > 1 {
			t.Errorf("seed %d: a→b %+v at the end; want 12 ± 1 ms", seed, p)
		}
	}
}

// TestLatencyDetectionFloor: a steady, well-measured excess under MinPenaltyMS (1.5 ms, as the
// netns testbed's remote calls paid beyond ICMP and the baseline with no penalty hidden) is
// never applied; one over it (2.5 ms) is, within ±1 ms; MinPenaltyMS set lower (1 ms) applies
// the 1.5 ms.
func TestLatencyDetectionFloor(t *testing.T) {
	for _, c := range []struct {
		truth, floor float64
		applied      bool
	}{{1.5, 0, false}, {2.5, 0, true}, {1.5, 1, true}} {
		w := newLatencyWorld(11)
		ab := NodePair{"a", "b"}
		w.penalty[ab] = c.truth
		corr := newCorrector(t, LatencyConfig{MinRequests: 50, MinPenaltyMS: c.floor})
		var p LatencyPenalty
		for range 10 {
			paths, bands := w.round(2000, 1000)
			got, err := corr.Observe(paths, bands, w.rtt)
			if err != nil {
				t.Fatal(err)
			}
			p = byPair(got)[ab]
			if !c.applied && p.PenaltyMS != 0 {
				t.Fatalf("%v ms with the floor at %v: a→b holds %+v; want none", c.truth, c.floor, p)
			}
		}
		if !p.Measured || math.Abs(p.EstimateMS-c.truth) > 0.5 {
			t.Fatalf("%v ms: a→b %+v; want it measured within ±0.5 ms", c.truth, p)
		}
		if c.applied && math.Abs(p.PenaltyMS-c.truth) > 1 {
			t.Errorf("%v ms with the floor at %v: a→b holds %v; want %v ± 1 ms", c.truth, c.floor, p.PenaltyMS, c.truth)
		}
	}
}

// TestLatencyRealPenaltyKeptThroughNoise: a real 3 ms on a→b, among 12 pairs whose windows
// scatter by 1 ms (the pair's windows, less their baseline, by 1.4 ms: a standard error of
// 0.6 ms over 5 windows, more than the testbed's 0.2–0.4 ms for a pair this busy), stays in
// force once found. Every round tests it again, and the rules before this test dropped it on
// one unsupported round or one estimate under the floor, and rarely let it back (the entry is
// family-wise): no penalty in 21.4 % of the rounds after it entered (20 seeds × 200 rounds).
// Now 9.2 %.
func TestLatencyRealPenaltyKeptThroughNoise(t *testing.T) {
	ab := NodePair{"a", "b"}
	const (
		penalty = 3.0
		noiseMS = 1.0
		rounds  = 200
	)
	var after, missing, exits int
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 11))
		c := newCorrector(t, LatencyConfig{MinRequests: 100})
		entered, held := false, false
		for range rounds {
			paths, bands := noisyRound(rng, noiseMS, ab, penalty)
			got, err := c.Observe(paths, bands, noisyICMP)
			if err != nil {
				t.Fatal(err)
			}
			p := byPair(got)[ab]
			entered = entered || p.PenaltyMS > 0
			if entered {
				after++
				if p.PenaltyMS == 0 {
					missing++
					if held {
						exits++
					}
				}
			}
			held = p.PenaltyMS > 0
		}
	}
	share := float64(missing) / float64(after)
	t.Logf("after it entered, a→b held no penalty in %d of %d rounds (%.1f %%); it left %d times", missing, after, 100*share, exits)
	if share > 0.12 {
		t.Errorf("a real %g ms penalty was out of force in %.1f %% of the rounds after it was found; want at most 12 %%", penalty, 100*share)
	}
}

// TestLatencyStepLeavesBandOut: the Steps rule. Callers on n1 and n4 call back's pod on their
// own node; the caller on n3 has none and calls both, so its baseline is the same-node calls of
// n1 and n4 pooled. Mid-window in round 6, n4's pod steps from 10 to 40 ms of inbound time (a
// pod slowed), and its callers' attempt series lag its own by half a window (Prometheus
// scrapes each pod at its own offset): in rounds 6 and 7 the attempts into n4 saw 15 ms less
// than the band's window says. Without the rule that misalignment reaches n3 → n1, a pair
// into a band that did not move, through the pooled baseline: 7.5 ms of false excess in each
// of the two windows. With it, n4's band is left out of both rounds (named by Steps), and
// n3 → n1's estimate stays exactly what it is without the step: 0.
func TestLatencyStepLeavesBandOut(t *testing.T) {
	const overhead, rtt = 1.0, 2.0
	icmp := func(p NodePair) (float64, bool) {
		if p.From == p.To {
			return 0, true
		}
		return rtt, true
	}
	// n4's band's mean over the window of round r, and as its callers' lagging windows saw it.
	stepped := func(r int) (band, seen float64) {
		switch {
		case r < 6:
			return 10, 10
		case r == 6:
			return 25, 10
		case r == 7:
			return 40, 25
		}
		return 40, 40
	}
	round := func(r int) ([]PathWindow, []BandWindow) {
		z, seen := stepped(r)
		path := func(from, to string, n, inbound float64) PathWindow {
			d := overhead
			if from != to {
				d += rtt
			}
			return PathWindow{Pair: NodePair{from, to}, Service: "back", Attempts: n, AttemptMS: n * (inbound + d)}
		}
		return []PathWindow{path("n1", "n1", 1000, 10), path("n4", "n4", 1000, seen), path("n3", "n1", 300, 10), path("n3", "n4", 300, seen)},
			[]BandWindow{{Service: "back", Node: "n1", Requests: 1300, InboundMS: 1300 * 10}, {Service: "back", Node: "n4", Requests: 1300, InboundMS: 1300 * z}}
	}
	for _, c := range []struct {
		name string
		cfg  LatencyConfig
		want map[int]float64 // n3 → n1's estimate by round, ms
	}{
		{"the rule", LatencyConfig{MinRequests: 50}, map[int]float64{5: 0, 6: 0, 7: 0, 8: 0, 12: 0}},
		{"without it", LatencyConfig{MinRequests: 50, MaxInboundStep: 1e9}, map[int]float64{5: 0, 6: 1.5, 7: 3, 10: 3, 11: 1.5, 12: 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rule := c.cfg.MaxInboundStep == 0 // the default; 1e9: no step is this large
			corr := newCorrector(t, c.cfg)
			for r := 1; r <= 12; r++ {
				paths, bands := round(r)
				got, err := corr.Observe(paths, bands, icmp)
				if err != nil {
					t.Fatal(err)
				}
				steps := corr.Steps()
				wantSteps := 0
				if rule && (r == 6 || r == 7) {
					wantSteps = 1
				}
				if len(steps) != wantSteps || wantSteps == 1 && (steps[0].Node != "n4" || steps[0].Service != "back") {
					t.Errorf("round %d: steps %v; want %d (back on n4)", r, steps, wantSteps)
				}
				want, ok := c.want[r]
				if !ok {
					continue
				}
				p := byPair(got)[NodePair{"n3", "n1"}]
				if !p.Measured || math.Abs(p.EstimateMS-want) > 1e-9 || p.PenaltyMS != 0 {
					t.Errorf("round %d: n3→n1 %+v; want measured, estimate %v ms, no penalty", r, p, want)
				}
			}
		})
	}
}

// TestLatencyStepPreviousWithinWindows: a band's previous window is its last one over the floor
// within the last Windows rounds. n2's band leaves for a while (its pod idle) while n1's calls go
// on; back after 2 rounds at four times its mean it is a step, back after more than Windows
// rounds it is a band measured afresh.
func TestLatencyStepPreviousWithinWindows(t *testing.T) {
	icmp := func(p NodePair) (float64, bool) { return 0, p.From == p.To }
	round := func(n2 bool, n2MS float64) ([]PathWindow, []BandWindow) {
		paths := []PathWindow{{Pair: NodePair{"n1", "n1"}, Service: "s", Attempts: 100, AttemptMS: 100 * 11}}
		bands := []BandWindow{{Service: "s", Node: "n1", Requests: 100, InboundMS: 100 * 10}}
		if n2 {
			paths = append(paths, PathWindow{Pair: NodePair{"n2", "n2"}, Service: "s", Attempts: 100, AttemptMS: 100 * (n2MS + 1)})
			bands = append(bands, BandWindow{Service: "s", Node: "n2", Requests: 100, InboundMS: 100 * n2MS})
		}
		return paths, bands
	}
	for _, c := range []struct {
		away  int
		steps int // Steps' length in the round n2 is back
	}{{2, 1}, {5, 0}, {8, 0}} {
		corr := newCorrector(t, LatencyConfig{MinRequests: 50}) // Windows 5
		for r := range 3 + c.away + 1 {
			n2, ms := r < 3, 10.0
			if r == 3+c.away {
				n2, ms = true, 40
			}
			paths, bands := round(n2, ms)
			if _, err := corr.Observe(paths, bands, icmp); err != nil {
				t.Fatal(err)
			}
		}
		if got := corr.Steps(); len(got) != c.steps {
			t.Errorf("n2 back at 40 ms after %d rounds away (Windows 5): steps %v; want %d", c.away, got, c.steps)
		}
	}
}
