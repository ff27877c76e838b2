package estimate

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// traffic is one pod's window: its service and cores, and what its counters grew by.
type traffic struct {
	service string
	cores   float64
	delta   Sample // Requests, InboundMS, DownstreamMS, CPUSeconds: the window's increase
}

// steady is a window of n requests of cpu CPU-seconds each, with no own time measured.
func steady(service string, cores, n, cpu float64) traffic {
	return traffic{service: service, cores: cores, delta: Sample{Requests: n, CPUSeconds: n * cpu}}
}

// rig feeds an Estimator rounds one second apart, cumulating each pod's windows into counters
// as a scrape would read them. A pod's first round only sets its base.
type rig struct {
	t   *testing.T
	e   *Estimator
	cum map[string]Sample
	at  time.Time
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, e: e, cum: make(map[string]Sample), at: time.Unix(1000, 0)}
}

// round adds each pod's window to its counters and observes the round; it fails the test on
// an error.
func (r *rig) round(pods map[string]traffic) map[string]Capacity {
	r.t.Helper()
	out, err := r.e.Observe(r.next(), r.samples(pods))
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

func (r *rig) next() time.Time {
	r.at = r.at.Add(time.Second)
	return r.at
}

func (r *rig) samples(pods map[string]traffic) []Sample {
	var out []Sample
	for pod, tr := range pods {
		c := r.cum[pod]
		c.Pod, c.Service, c.Cores = pod, tr.service, tr.cores
		c.Requests += tr.delta.Requests
		c.InboundMS += tr.delta.InboundMS
		c.DownstreamMS += tr.delta.DownstreamMS
		c.CPUSeconds += tr.delta.CPUSeconds
		r.cum[pod] = c
		out = append(out, c)
	}
	return out
}

// approx compares floats to a relative 1e-9 (Inf equal to Inf).
var approx = cmpopts.EquateApprox(1e-9, 0)

func TestSampleFloor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		requests []float64 // per window after the base; 1 ms of CPU each
		want     Capacity
	}{
		{"under the floor", []float64{199, 199, 199, 199}, Capacity{Service: "a", Source: SourceNone}},
		{"at the floor", []float64{200, 200}, Capacity{Service: "a", Source: SourceMeasured, RPS: 1000, Lower: 1000,
			Upper: 1000, UtilizationRPS: 1000, Requests: 400, Windows: 2, Pods: 1}},
		{"thin window skipped", []float64{250, 100, 250}, Capacity{Service: "a", Source: SourceMeasured, RPS: 1000,
			Lower: 1000, Upper: 1000, UtilizationRPS: 1000, Requests: 500, Windows: 2, Pods: 1}},
		{"one window is not enough", []float64{5000, 10, 10}, Capacity{Service: "a", Source: SourceNone}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{MinRequests: 200, Windows: 3, MinWindows: 2})
			r.round(map[string]traffic{"a-0": steady("a", 1, 1000, 0.001)}) // the base
			var got map[string]Capacity
			for _, n := range tc.requests {
				got = r.round(map[string]traffic{"a-0": steady("a", 1, n, 0.001)})
			}
			if d := cmp.Diff(tc.want, got["a-0"], approx); d != "" {
				t.Errorf("capacity (-want +got):\n%s", d)
			}
		})
	}
}

// TestSmoothing: the estimate is Σ CPU / Σ requests over the last Windows rounds — weighted by
// requests, not a mean of per-window ratios — and a window leaves after exactly Windows rounds.
func TestSmoothing(t *testing.T) {
	r := newRig(t, Config{MinRequests: 1, Windows: 3, MinWindows: 2})
	r.round(map[string]traffic{"a-0": steady("a", 1, 1, 0.001)})
	windows := []traffic{
		steady("a", 1, 1000, 0.001),
		steady("a", 1, 3000, 0.002), // a slow spell, three times the requests
		steady("a", 1, 1000, 0.001),
		steady("a", 1, 1000, 0.001),
		steady("a", 1, 1000, 0.001),
	}
	want := []float64{
		0,                // one window: not measured yet
		1 / (7.0 / 4000), // 571.4: Σ7 s / Σ4000; the mean of the ratios would give 666.7 or 750
		1 / (8.0 / 5000), // 625
		1 / (8.0 / 5000), // the first window left: the slow one and two fast ones
		1000,             // the slow window left after exactly three rounds
	}
	for i, w := range windows {
		got := r.round(map[string]traffic{"a-0": w})["a-0"]
		if math.Abs(got.UtilizationRPS-want[i]) > 1e-9*want[i] {
			t.Errorf("window %d: utilisation-law capacity %.4f rps, want %.4f", i+1, got.UtilizationRPS, want[i])
		}
	}
}

// TestLowerBound checks the confidence bounds against a hand computation: windows (requests,
// CPU-seconds) (1000, 1.0), (1000, 1.2), (2000, 1.8): c = 4/4000 = 1 ms, residuals u − c·r =
// 0, 0.2, −0.2, se = √(0.08 / (3·2)) / (4000/3) = 8.660e-5 s, t(0.95, 2 df) = 2.919986.
func TestLowerBound(t *testing.T) {
	r := newRig(t, Config{MinRequests: 1, Windows: 3, MinWindows: 3})
	r.round(map[string]traffic{"a-0": steady("a", 2, 1, 0.001)})
	var got Capacity
	for _, w := range [][2]float64{{1000, 1.0}, {1000, 1.2}, {2000, 1.8}} {
		got = r.round(map[string]traffic{"a-0": {service: "a", cores: 2, delta: Sample{Requests: w[0], CPUSeconds: w[1]}}})["a-0"]
	}
	const tq = 2.919986
	se := math.Sqrt(0.08/6) / (4000.0 / 3)
	want := Capacity{Service: "a", Source: SourceMeasured, RPS: 2000, UtilizationRPS: 2000,
		Lower: 2 / (0.001 + tq*se), Upper: 2 / (0.001 - tq*se), Requests: 4000, Windows: 3, Pods: 1}
	if d := cmp.Diff(want, got, cmpopts.EquateApprox(1e-6, 0)); d != "" {
		t.Errorf("capacity (-want +got):\n%s", d)
	}
	if want.Lower > 1600 || want.Lower < 1590 {
		t.Fatalf("hand computation off: Lower %.2f, want ≈ 1596 (2 / 1.2529 ms)", want.Lower)
	}
}

// TestQueueingBoundAfterBacklog: a window in which the pod drained a backlog does not set the
// bound. A 100m pod of 1.1 ms a request (the utilisation law: 90.9 req/s) that served 91 req/s
// with 2 s of own time (an overload ending), then 67 req/s with 3 ms: pooled, λ = 75 req/s and
// S = 810 ms would bound it at 76.2 req/s; the steady windows bound it at 400 and the
// utilisation law stands. Every window backlogged, the bound is the rate it served.
func TestQueueingBoundAfterBacklog(t *testing.T) {
	window := func(rps, ownMS float64) traffic {
		return traffic{service: "a", cores: 0.1, delta: Sample{Requests: rps, CPUSeconds: rps * 0.0011, InboundMS: rps * ownMS}}
	}
	for _, tc := range []struct {
		name           string
		windows        []traffic
		wantRPS, wantQ float64
	}{
		{"after a backlog", []traffic{window(91, 2000), window(67, 3), window(67, 3)}, 0.1 / 0.0011, 67 + 1000.0/3},
		{"backlogged throughout", []traffic{window(91, 2000), window(91, 2000), window(91, 2000)}, 0.1 / 0.0011, 91.5},
		{"slow throughout", []traffic{window(67, 50), window(67, 50), window(67, 50)}, 87, 87},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{MinRequests: 1, Windows: 3, MinWindows: 3})
			r.round(map[string]traffic{"a-0": tc.windows[0]}) // the base
			var got Capacity
			for _, w := range tc.windows {
				got = r.round(map[string]traffic{"a-0": w})["a-0"]
			}
			if math.Abs(got.RPS-tc.wantRPS) > 1e-6*tc.wantRPS || math.Abs(got.QueueingRPS-tc.wantQ) > 1e-6*tc.wantQ {
				t.Errorf("RPS %.3f, QueueingRPS %.3f; want %.3f, %.3f", got.RPS, got.QueueingRPS, tc.wantRPS, tc.wantQ)
			}
		})
	}
}

// TestQueueingBound: the M/M/c inversion bounds the estimate from above; it never raises it.
func TestQueueingBound(t *testing.T) {
	// 1 ms of CPU per request on one core: the utilisation law says 1000 rps.
	for _, tc := range []struct {
		name             string
		cores            float64
		inbound, downstr float64 // ms per request
		wantRPS, wantQ   float64
	}{
		// λ = 100/s, S = 2 ms: 100 + 500 = 600 rps < 1000: the bound clips.
		{"clips", 1, 3, 1, 600, 600},
		// S = 0.5 ms: 100 + 2000 = 2100 rps: the bound is above, the utilisation law stands.
		{"above", 1, 1.5, 1, 1000, 2100},
		// Own time not positive (downstream measured longer than inbound): no bound.
		{"no own time", 1, 1, 1.5, 1000, 0},
		// A fractional pod is one server: 0.5 cores / 1 ms = 500 rps; 100 + 1/4 ms = 350.
		{"half a core", 0.5, 5, 1, 350, 350},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{MinRequests: 1, Windows: 3, MinWindows: 2})
			w := traffic{service: "a", cores: tc.cores, delta: Sample{Requests: 100, CPUSeconds: 0.1,
				InboundMS: 100 * tc.inbound, DownstreamMS: 100 * tc.downstr}}
			r.round(map[string]traffic{"a-0": w})
			r.round(map[string]traffic{"a-0": w})
			got := r.round(map[string]traffic{"a-0": w})["a-0"]
			if math.Abs(got.RPS-tc.wantRPS) > 1e-6 || math.Abs(got.QueueingRPS-tc.wantQ) > 1e-6 {
				t.Errorf("RPS %.3f, QueueingRPS %.3f; want %.3f, %.3f", got.RPS, got.QueueingRPS, tc.wantRPS, tc.wantQ)
			}
			if !(got.Lower <= got.RPS && got.RPS <= got.Upper) {
				t.Errorf("want Lower ≤ RPS ≤ Upper, have %.3f, %.3f, %.3f", got.Lower, got.RPS, got.Upper)
			}
		})
	}
}

func TestStudentT(t *testing.T) {
	for _, tc := range []struct{ p, df, want float64 }{ // from the printed tables
		{0.95, 1, 6.313752}, {0.95, 2, 2.919986}, {0.95, 4, 2.131847}, {0.975, 10, 2.228139}, {0.99, 2, 6.964557},
	} {
		if got := studentT(tc.p, tc.df); math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("t(%g, %g df) = %.6f, want %.6f", tc.p, tc.df, got, tc.want)
		}
	}
}

func TestMMc(t *testing.T) {
	// M/M/2 at λ = 1, μ₁ = 1: Erlang C = 2ρ²/(1+ρ) = 1/3, W = 1 + (1/3)/(2 − 1) = 4/3.
	if got := mmcSojourn(1, 1, 2); math.Abs(got-4.0/3) > 1e-12 {
		t.Errorf("M/M/2 sojourn %v, want 4/3", got)
	}
	if got := mmcCapacity(1, 4.0/3, 2); math.Abs(got-2) > 1e-9 {
		t.Errorf("M/M/2 inversion %v, want 2", got)
	}
	// Round trips over servers, loads and rates.
	for _, c := range []int{1, 2, 4, 16, 64} {
		for _, rho := range []float64{0.01, 0.3, 0.85, 0.99} {
			mu1 := 250.0
			lambda := rho * float64(c) * mu1
			if got := mmcCapacity(lambda, mmcSojourn(lambda, mu1, c), c); math.Abs(got/(float64(c)*mu1)-1) > 1e-9 {
				t.Errorf("c=%d ρ=%g: inversion %v, want %v", c, rho, got, float64(c)*mu1)
			}
		}
	}
}

// TestMedianFallback: pods without data take their service's median per core, times their
// cores (of μ where their cores are unknown); a service without a measured pod gives none.
func TestMedianFallback(t *testing.T) {
	r := newRig(t, Config{MinRequests: 1, Windows: 3, MinWindows: 2})
	pods := map[string]traffic{
		"b-0": steady("b", 1, 1000, 0.001),     // 1000 rps, 1000 per core
		"b-1": steady("b", 1, 1000, 0.00125),   // 800, 800 per core
		"b-2": steady("b", 2, 1000, 0.002/2.4), // 2400, 1200 per core
		"b-3": steady("b", 2, 0, 0),            // no traffic
		"b-4": steady("b", 0, 1000, 0.001),     // cores unknown
		"c-0": steady("c", 1, 0, 0),            // no measured pod in c
	}
	var got map[string]Capacity
	for range 3 {
		got = r.round(pods)
	}
	median := Capacity{Source: SourceServiceMedian, Requests: 6000, Windows: 6, Pods: 3}
	perCore := median
	perCore.Service, perCore.RPS, perCore.Lower, perCore.Upper, perCore.UtilizationRPS = "b", 2000, 2000, 2000, 2000
	ofRPS := median
	ofRPS.Service, ofRPS.RPS, ofRPS.Lower, ofRPS.Upper, ofRPS.UtilizationRPS = "b", 1000, 1000, 1000, 1000
	want := map[string]Capacity{
		"b-0": {Service: "b", Source: SourceMeasured, RPS: 1000, Lower: 1000, Upper: 1000, UtilizationRPS: 1000, Requests: 2000, Windows: 2, Pods: 1},
		"b-1": {Service: "b", Source: SourceMeasured, RPS: 800, Lower: 800, Upper: 800, UtilizationRPS: 800, Requests: 2000, Windows: 2, Pods: 1},
		"b-2": {Service: "b", Source: SourceMeasured, RPS: 2400, Lower: 2400, Upper: 2400, UtilizationRPS: 2400, Requests: 2000, Windows: 2, Pods: 1},
		"b-3": perCore,
		"b-4": ofRPS,
		"c-0": {Service: "c", Source: SourceNone},
	}
	if d := cmp.Diff(want, got, approx); d != "" {
		t.Errorf("capacities (-want +got):\n%s", d)
	}
}

// TestThinPodKeepsItsOwnEstimate: a slow pod that the plan then spares (its windows fall under
// the sample floor) keeps its own last estimate, not its fast peers' median.
func TestThinPodKeepsItsOwnEstimate(t *testing.T) {
	r := newRig(t, Config{MinRequests: 100, Windows: 3, MinWindows: 2})
	fast, slow := steady("a", 1, 1000, 0.001), steady("a", 1, 1000, 0.004) // 1,000 and 250 req/s
	for range 4 {
		r.round(map[string]traffic{"a-0": slow, "a-1": fast, "a-2": fast})
	}
	spared := steady("a", 1, 10, 0.004) // under the floor
	var c Capacity
	for range 5 {
		c = r.round(map[string]traffic{"a-0": spared, "a-1": fast, "a-2": fast})["a-0"]
	}
	if c.Source != SourceLastMeasured || math.Abs(c.UtilizationRPS-250) > 1e-6 {
		t.Fatalf("spared slow pod: %v at %v req/s; want its own last estimate, 250 req/s", c.Source, c.UtilizationRPS)
	}
}

// TestCounterReset: a counter going down starts a new base and its window is discarded; the
// windows before it stay.
func TestCounterReset(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reset func(s *Sample)
	}{
		{"process restart", func(s *Sample) { *s = Sample{Requests: 400, CPUSeconds: 0.4} }},
		{"cpu counter only", func(s *Sample) { s.CPUSeconds = 0.01 }},
		{"inbound sum only", func(s *Sample) { s.InboundMS = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{MinRequests: 1, Windows: 3, MinWindows: 2})
			w := map[string]traffic{"a-0": {service: "a", cores: 1, delta: Sample{Requests: 1000, CPUSeconds: 1, InboundMS: 3000, DownstreamMS: 1000}}}
			r.round(w)
			var windows []int
			for i := 1; i <= 7; i++ {
				if i == 4 {
					c := r.cum["a-0"]
					tc.reset(&c)
					r.cum["a-0"] = c
				}
				got := r.round(w)["a-0"]
				windows = append(windows, got.Windows)
				if got.Source == SourceMeasured && math.Abs(got.UtilizationRPS-1000) > 1e-9 {
					t.Errorf("round %d: utilisation-law capacity %v, want 1000", i, got.UtilizationRPS)
				}
			}
			// Rounds 1–3 build up; round 4's window is discarded (rounds 2, 3 remain); then the
			// windows of rounds 3 and 5, 5 and 6, 5 to 7.
			if d := cmp.Diff([]int{0, 2, 3, 2, 2, 2, 3}, windows); d != "" {
				t.Errorf("windows per round (-want +got):\n%s", d)
			}
		})
	}
}

// TestMissingData: an absent pod keeps its base and windows; its next window spans the gap;
// with too few windows it keeps its last estimate of its own; it is forgotten after Windows
// rounds away, and comes back as new (its service's median). Requests without CPU do not count.
func TestMissingData(t *testing.T) {
	r := newRig(t, Config{MinRequests: 1, Windows: 3, MinWindows: 2})
	both := map[string]traffic{"a-0": steady("a", 1, 1000, 0.001), "a-1": steady("a", 1, 1000, 0.0005)}
	onlyA1 := map[string]traffic{"a-1": both["a-1"]}
	type state struct {
		Present bool
		Source  Source
		Windows int
	}
	var got []state
	rounds := []map[string]traffic{both, both, both, onlyA1, both, onlyA1, onlyA1, onlyA1, both}
	for _, pods := range rounds {
		c, ok := r.round(pods)["a-0"]
		got = append(got, state{ok, c.Source, c.Windows})
	}
	want := []state{
		{true, SourceNone, 0},          // the base
		{true, SourceNone, 0},          // one window each: nobody measured
		{true, SourceMeasured, 2},      // windows of rounds 2, 3
		{true, SourceMeasured, 2},      // absent: its windows stay
		{true, SourceMeasured, 2},      // back: its window spans two rounds (rounds 3, 5)
		{true, SourceLastMeasured, 2},  // absent: only round 5's left; its own last estimate
		{true, SourceLastMeasured, 2},  //
		{false, SourceNone, 0},         // absent for 3 rounds: forgotten
		{true, SourceServiceMedian, 3}, // back as new: its sample is a base
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("a-0 per round (-want +got):\n%s", d)
	}

	// A window in which requests completed but the CPU counter did not move is discarded.
	r = newRig(t, Config{MinRequests: 1, Windows: 3, MinWindows: 2})
	var c Capacity
	for range 4 {
		c = r.round(map[string]traffic{"a-0": {service: "a", cores: 1, delta: Sample{Requests: 1000}}})["a-0"]
	}
	if c.Source != SourceNone || c.Windows != 0 {
		t.Errorf("requests without CPU: %v with %d windows, want none with 0", c.Source, c.Windows)
	}
}

func TestInvalidInput(t *testing.T) {
	good := Sample{Pod: "a-0", Service: "a", Cores: 1, Requests: 10, CPUSeconds: 0.01}
	for _, tc := range []struct {
		name   string
		bad    Sample
		naming string // what the error must say
	}{
		{"NaN requests", Sample{Pod: "a-9", Service: "a", Cores: 1, Requests: math.NaN()}, `pod "a-9": requests is NaN`},
		{"negative cpu", Sample{Pod: "a-9", Service: "a", Cores: 1, CPUSeconds: -1}, `pod "a-9": cpu seconds is -1`},
		{"infinite cores", Sample{Pod: "a-9", Service: "a", Cores: math.Inf(1)}, `pod "a-9": cores is +Inf`},
		{"too many cores", Sample{Pod: "a-9", Service: "a", Cores: 1e6}, `pod "a-9": cores is 1e+06, want at most 1024`},
		{"negative inbound", Sample{Pod: "a-9", Service: "a", InboundMS: -2}, `pod "a-9": inbound ms is -2`},
		{"NaN downstream", Sample{Pod: "a-9", Service: "a", DownstreamMS: math.NaN()}, `pod "a-9": downstream ms is NaN`},
		{"empty pod", Sample{Service: "a"}, `empty pod name (service "a")`},
		{"empty service", Sample{Pod: "a-9"}, `pod "a-9": empty service`},
		{"twice", good, `pod "a-0": given twice in one round`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(Config{})
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.Observe(time.Unix(1, 0), []Sample{good, tc.bad})
			if !errors.Is(err, ErrInvalidSample) || !strings.Contains(err.Error(), tc.naming) {
				t.Fatalf("error %v, want ErrInvalidSample saying %q", err, tc.naming)
			}
			if _, ok := got["a-0"]; !ok || len(got) != 1 {
				t.Errorf("estimates %v: want the good pod only", got)
			}
		})
	}

	t.Run("round order", func(t *testing.T) {
		r := newRig(t, Config{MinRequests: 1, Windows: 3, MinWindows: 2})
		w := map[string]traffic{"a-0": steady("a", 1, 1000, 0.001)}
		r.round(w)
		r.round(w)
		got, err := r.e.Observe(r.at, r.samples(w)) // the same time again
		if !errors.Is(err, ErrRoundOrder) || got != nil {
			t.Fatalf("Observe at the previous round's time: %v, %v; want nil, ErrRoundOrder", got, err)
		}
		// Nothing changed: the rejected sample was not taken as the base, so the next window
		// holds two rounds' requests.
		if c := r.round(w)["a-0"]; c.Requests != 3000 || c.Windows != 2 {
			t.Errorf("after a rejected round: %v requests in %d windows, want 3000 in 2", c.Requests, c.Windows)
		}
	})

	t.Run("config", func(t *testing.T) {
		for _, cfg := range []Config{
			{MinRequests: -1}, {MinRequests: math.NaN()}, {Windows: 1}, {MinWindows: 1},
			{Windows: 3, MinWindows: 4}, {Confidence: 0.5}, {Confidence: 1}, {Confidence: math.NaN()},
		} {
			if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("New(%+v): %v, want ErrInvalidConfig", cfg, err)
			}
		}
	})
}

func TestSourceString(t *testing.T) {
	for s, want := range map[Source]string{SourceNone: "none", SourceMeasured: "measured",
		SourceServiceMedian: "service-median", Source(9): "Source(9)"} {
		if got := s.String(); got != want {
			t.Errorf("%d: %q, want %q", int(s), got, want)
		}
	}
}
