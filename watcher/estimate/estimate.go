// Package estimate turns per-pod telemetry counters into the service rate μ (capacity, requests
// per second) that lata-q plans with, and guards lata-q with a model-error breaker. It is pure:
// it takes plain per-pod window samples (a Prometheus source or a demo scraper feeds them) and
// knows nothing of Kubernetes, gRPC or Prometheus.
//
// Capacity comes from the utilisation law, μ = cores / (CPU-seconds per request), which holds
// whatever the arrival process. The queueing inversion (M/M/1: μ = λ + 1/S, with S the own
// time per request; M/M/c for a pod of several cores) over-estimates under smooth arrivals and
// serves only as an upper bound. Estimator gives the capacities, Breaker the fallback.
package estimate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"gonum.org/v1/gonum/mathext"
)

// Errors returned by this package, wrapped with the offending item.
var (
	// ErrInvalidSample marks a sample that was rejected: an empty pod or service, a counter or
	// cores that is negative, NaN or infinite, cores over MaxCores, or a pod given twice in one
	// round.
	ErrInvalidSample = errors.New("estimate: invalid sample")
	// ErrRoundOrder marks a round whose time is not after the previous round's.
	ErrRoundOrder = errors.New("estimate: round out of order")
	// ErrInvalidConfig marks a Config or BreakerConfig with a value out of range.
	ErrInvalidConfig = errors.New("estimate: invalid config")
)

// Sample is one pod's counters at the end of a window, as a scrape reads them.
//
// The counters are cumulative (monotonic since the process started, as Prometheus counters and
// cAdvisor's are): the estimator keeps the previous round's values as a base and works on the
// differences, so a feeder passes what it reads and a missed round loses nothing. A counter
// lower than its base means the process restarted: see Estimator.
type Sample struct {
	// Pod identifies the pod, unique across everything fed to one Estimator (namespace/name).
	Pod string
	// Service is the service the pod belongs to; pods without data take its median.
	Service string
	// Cores is the CPU the pod may use, in cores (its CPU request or limit); 0 means unknown,
	// and a pod with unknown cores gets no measured capacity.
	Cores float64
	// Requests is the number of requests the pod completed (istio_requests_total,
	// reporter="destination", or the count of the duration histogram).
	Requests float64
	// InboundMS is the sum of the completed requests' inbound time in milliseconds: from
	// arrival to response, own work, queueing and downstream calls together
	// (istio_request_duration_milliseconds_sum, reporter="destination").
	InboundMS float64
	// DownstreamMS is the sum of the time those requests spent waiting on downstream calls, in
	// milliseconds (the same metric, reporter="source", from this pod).
	DownstreamMS float64
	// CPUSeconds is the CPU time the pod's application containers used, in seconds
	// (container_cpu_usage_seconds_total without the sidecar).
	CPUSeconds float64
}

// MaxCores is the most cores a Sample may give: more than any node has. (The queueing bound
// costs O(cores) per step.)
const MaxCores = 1024

// Source says where a Capacity came from.
type Source int

const (
	// SourceNone: no estimate; the caller keeps the configured or requested capacity.
	SourceNone Source = iota
	// SourceMeasured: from the pod's own windows.
	SourceMeasured
	// SourceServiceMedian: the pod has no estimate of its own and takes the median of its
	// service's measured pods.
	SourceServiceMedian
	// SourceLastMeasured: the pod has too few windows now (a plan that sends it little leaves
	// its windows under the sample floor) but had an estimate of its own before: that one, its
	// own data, rather than its service's median, which would make a slow pod that the plan
	// spared look as fast as its peers and draw the traffic back.
	SourceLastMeasured
)

// String returns "none", "measured", "service-median" or "last-measured".
func (s Source) String() string {
	switch s {
	case SourceNone:
		return "none"
	case SourceMeasured:
		return "measured"
	case SourceServiceMedian:
		return "service-median"
	case SourceLastMeasured:
		return "last-measured"
	}
	return fmt.Sprintf("Source(%d)", int(s))
}

// Capacity is one pod's estimated service rate. All rates are in requests per second.
// For SourceNone every rate is 0 (Upper too).
type Capacity struct {
	// Service is the pod's service (from its latest sample).
	Service string
	// Source says where the numbers come from.
	Source Source
	// RPS is the estimate μ: min(UtilizationRPS, QueueingRPS) where both exist, else
	// UtilizationRPS.
	RPS float64
	// Lower is the lower confidence bound on μ (see Config.Confidence), at most RPS. lata-q's
	// utilisation cap should be applied to this, not to RPS.
	Lower float64
	// Upper is an upper bound on μ: the smaller of the utilisation law's upper confidence bound
	// and QueueingRPS; +Inf where neither bounds it. At least RPS.
	Upper float64
	// UtilizationRPS is cores / (CPU-seconds per request) over the windows used (for
	// SourceServiceMedian: the median of the service's, scaled to this pod's cores).
	UtilizationRPS float64
	// QueueingRPS is the M/M/c inversion of the arrival rate and the own time per request, with
	// c = ⌈cores⌉ servers (M/M/1, λ + 1/S, for a pod of one core or less); 0 where the own time
	// is not positive. An upper bound, not an estimate (see the package doc).
	QueueingRPS float64
	// Requests is the number of requests the estimate rests on (for SourceServiceMedian: the
	// sum over the service's measured pods).
	Requests float64
	// Windows is the number of windows the estimate rests on (for SourceServiceMedian: the
	// sum over the service's measured pods).
	Windows int
	// Pods is 1 for SourceMeasured, the number of measured pods the median was taken over for
	// SourceServiceMedian, 0 for SourceNone.
	Pods int
}

// DefaultMinRequests is Config.MinRequests's default: the mean of 200 exponential service times
// is within ±14 % of the truth at 95 %.
const DefaultMinRequests = 200

// DefaultWindows is Config.Windows's default: the estimate sums the windows of the last 5
// rounds.
const DefaultWindows = 5

// Config sets an Estimator's rules. The zero value of a field means its default.
type Config struct {
	// MinRequests is the sample floor: a window in which a pod completed fewer requests
	// contributes nothing. Default DefaultMinRequests (the confidence bound covers the rest).
	MinRequests float64
	// Windows is N, the number of most recent rounds whose windows are summed. Default
	// DefaultWindows.
	Windows int
	// MinWindows is the number of windows above the floor, among the last Windows rounds, that
	// a pod needs for a measured estimate; at least 2 (the confidence bound needs a variance).
	// Default 3.
	MinWindows int
	// Confidence is the one-sided confidence level of Lower, in (0.5, 1). Default 0.95.
	Confidence float64
}

func (c Config) withDefaults() (Config, error) {
	if c.MinRequests == 0 {
		c.MinRequests = DefaultMinRequests
	}
	if c.Windows == 0 {
		c.Windows = DefaultWindows
	}
	if c.MinWindows == 0 {
		c.MinWindows = min(3, c.Windows)
	}
	if c.Confidence == 0 {
		c.Confidence = 0.95
	}
	switch {
	case !(c.MinRequests > 0) || math.IsInf(c.MinRequests, 0):
		return c, fmt.Errorf("%w: MinRequests %v: want a positive number", ErrInvalidConfig, c.MinRequests)
	case c.Windows < 2:
		return c, fmt.Errorf("%w: Windows %d: want at least 2", ErrInvalidConfig, c.Windows)
	case c.MinWindows < 2 || c.MinWindows > c.Windows:
		return c, fmt.Errorf("%w: MinWindows %d: want 2 to Windows (%d)", ErrInvalidConfig, c.MinWindows, c.Windows)
	case !(c.Confidence > 0.5 && c.Confidence < 1):
		return c, fmt.Errorf("%w: Confidence %v: want more than 0.5 and less than 1", ErrInvalidConfig, c.Confidence)
	}
	return c, nil
}

// Estimator estimates each pod's capacity from its counters, one round (window) at a time.
// Create it with New; its methods are safe for concurrent use.
//
// Rules, per round (one call of Observe, all samples read at one time):
//   - Differences. A pod's first sample only sets its base. Each later sample, less its base,
//     is the pod's window since its previous sample, and becomes the new base. If any of a
//     pod's counters is lower than its base, the process restarted: the sample becomes the new
//     base and the window is discarded (the windows before it are kept: same pod, same speed).
//   - Sample floor. A window with fewer than Config.MinRequests requests contributes nothing,
//     and so does one in which requests completed but CPUSeconds did not advance (the CPU
//     series is missing or stale; a CPU time of 0 would read as infinite capacity).
//   - Smoothing. The estimate sums the windows of the last Config.Windows rounds: CPU per
//     request is Σ CPU-seconds / Σ requests, the request-weighted mean. A sliding sum rather
//     than an EWMA because it is exact for a ratio whatever the load per window (an EWMA of
//     per-window ratios weighs a thin window like a full one), it forgets a window after
//     exactly N rounds (an EWMA never does, so it mixes plans and a pod's old speed in for
//     ever), and it keeps the per-window values that the confidence bound needs.
//   - Lower bound. With n windows of r_i requests and u_i CPU-seconds, the CPU per request
//     x = Σu/Σr has the ratio-estimator variance se² = Σ(u_i − x·r_i)² / (n(n−1) r̄²) (windows as
//     independent clusters; normal errors assumed, so Student's t); Lower = cores / (x + t·se),
//     t the quantile of Student's t at Config.Confidence on n−1 degrees of freedom, and the
//     utilisation law's upper bound is cores / (x − t·se) (+Inf when x ≤ t·se).
//   - Queueing bound. For each of the same windows, λ = r / (window length) and S = (inbound −
//     downstream) / r; the window's bound is the capacity c·μ₁ of the M/M/c queue, c = ⌈cores⌉,
//     whose mean sojourn time at λ is S (for c = 1, λ + 1/S), and QueueingRPS is the largest
//     of the windows' (none if a window has no own time): the inversion holds in steady state,
//     and a window that drains a backlog, pooled with the others, would put the bound near
//     the mean arrival rate (queueingBound). Smoother arrivals than Poisson
//     wait less, so the inversion over-estimates (TestBias: up to +29 % for one server under
//     constant-rate arrivals); the estimate is min(utilisation law, this). M/M/c rather than
//     M/M/1 for a pod of several cores because λ + 1/S is no bound there: it under-estimates a
//     4-core pod by 45 % at 30 % load. Own time that is neither CPU nor queueing (disk, locks)
//     lowers the bound, and CPU not spent on requests (GC, probes) lowers the utilisation law:
//     both err on the safe side.
//   - Missing and stale data. A pod absent from a round keeps its base (its next sample's window
//     spans the gap) and its windows, which age out as rounds pass; once it has been absent
//     for Config.Windows rounds it is forgotten (base and windows). A pod with fewer than
//     Config.MinWindows windows in the last Config.Windows rounds (one that gets no traffic,
//     say), or with unknown cores, has no measured estimate: it keeps its last estimate of its
//     own if it had one (SourceLastMeasured, until it is forgotten), else takes its service's
//     median: the median over the
//     service's measured pods of μ per core, times the pod's cores (of μ itself where the
//     pod's cores are unknown), and likewise Lower and Upper. A service without a measured pod
//     gives SourceNone.
//
// Observe costs O(P·N) for P pods and N windows, O(c) for each of ≈ 45 bisection steps of a
// pod's M/M/c bound (c > 1), and a sort of each service's pods for its median: 2–4 ms for
// 1,000 pods on a shared 2-core machine (BenchmarkObserve).
type Estimator struct {
	cfg Config
	t   []float64 // t[df]: Student's t quantile at cfg.Confidence, df = 1 … Windows−1

	mu    sync.Mutex
	round int
	last  time.Time
	pods  map[string]*podState
}

// podState is what the estimator keeps of one pod between rounds.
type podState struct {
	service  string
	cores    float64
	base     Sample
	baseAt   time.Time
	lastSeen int
	windows  []window  // oldest first, at most cfg.Windows, each from a round within the last cfg.Windows
	measured *Capacity // the pod's last estimate of its own (SourceMeasured), nil if none yet
}

// window is one pod's counters between two of its samples.
type window struct {
	round                   int
	seconds                 float64 // the window's length
	requests, cpu           float64
	inboundMS, downstreamMS float64
}

// studentTTable returns t[df], Student's t quantile at p on df = 1 … windows−1 degrees of
// freedom (t[0] unused): the quantiles a rule over at most windows windows reads.
func studentTTable(p float64, windows int) []float64 {
	t := make([]float64, windows)
	for df := 1; df < windows; df++ {
		t[df] = studentT(p, float64(df))
	}
	return t
}

// New returns an Estimator with cfg's rules (zero fields take their defaults), or an error
// wrapping ErrInvalidConfig.
func New(cfg Config) (*Estimator, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Estimator{cfg: cfg, t: studentTTable(cfg.Confidence, cfg.Windows), pods: make(map[string]*podState)}, nil
}

// studentT is the quantile of Student's t distribution with df degrees of freedom at p > 0.5:
// P(T > t) = ½·I_x(df/2, ½) with x = df/(df + t²), I the regularised incomplete beta function.
func studentT(p, df float64) float64 {
	x := mathext.InvRegIncBeta(df/2, 0.5, 2*(1-p))
	return math.Sqrt(df * (1 - x) / x)
}

// Observe takes one round: every pod's sample read at time at (what a feeder does not have, it
// leaves out). It returns the capacity of every pod the estimator knows, keyed by pod; the map
// is the caller's.
//
// A sample that is invalid is treated as absent from the round, and the error returned beside
// the estimates joins one error per such sample, each wrapping ErrInvalidSample and naming the
// pod: the round still counts. If at is not after the previous round's time, nothing changes
// and the error wraps ErrRoundOrder.
func (e *Estimator) Observe(at time.Time, samples []Sample) (map[string]Capacity, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.last.IsZero() && !at.After(e.last) {
		return nil, fmt.Errorf("%w: round at %s is not after the previous round at %s", ErrRoundOrder,
			at.Format(time.RFC3339Nano), e.last.Format(time.RFC3339Nano))
	}
	e.round++
	e.last = at

	var errs []error
	for i := range samples {
		s := &samples[i]
		if err := validate(s); err != nil {
			errs = append(errs, err)
			continue
		}
		st := e.pods[s.Pod]
		if st != nil && st.lastSeen == e.round {
			errs = append(errs, fmt.Errorf("%w: pod %q: given twice in one round", ErrInvalidSample, s.Pod))
			continue
		}
		if st == nil {
			e.pods[s.Pod] = &podState{service: s.Service, cores: s.Cores, base: *s, baseAt: at, lastSeen: e.round}
			continue
		}
		e.advance(st, s, at)
	}
	for pod, st := range e.pods {
		if e.round-st.lastSeen >= e.cfg.Windows {
			delete(e.pods, pod)
			continue
		}
		st.prune(e.round - e.cfg.Windows)
	}
	return e.capacities(), errors.Join(errs...)
}

// validate checks one sample's fields.
func validate(s *Sample) error {
	if s.Pod == "" {
		return fmt.Errorf("%w: empty pod name (service %q)", ErrInvalidSample, s.Service)
	}
	if s.Service == "" {
		return fmt.Errorf("%w: pod %q: empty service", ErrInvalidSample, s.Pod)
	}
	for _, f := range [...]struct {
		name string
		v    float64
	}{
		{"cores", s.Cores}, {"requests", s.Requests}, {"inbound ms", s.InboundMS},
		{"downstream ms", s.DownstreamMS}, {"cpu seconds", s.CPUSeconds},
	} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return fmt.Errorf("%w: pod %q: %s is %v, want a finite number ≥ 0", ErrInvalidSample, s.Pod, f.name, f.v)
		}
	}
	if s.Cores > MaxCores {
		return fmt.Errorf("%w: pod %q: cores is %v, want at most %d", ErrInvalidSample, s.Pod, s.Cores, MaxCores)
	}
	return nil
}

// advance takes a known pod's sample: a window if the counters moved forward, a new base if
// any went down.
func (e *Estimator) advance(st *podState, s *Sample, at time.Time) {
	b := st.base
	seconds := at.Sub(st.baseAt).Seconds()
	st.service, st.cores, st.base, st.baseAt, st.lastSeen = s.Service, s.Cores, *s, at, e.round
	w := window{
		round:        e.round,
		seconds:      seconds,
		requests:     s.Requests - b.Requests,
		cpu:          s.CPUSeconds - b.CPUSeconds,
		inboundMS:    s.InboundMS - b.InboundMS,
		downstreamMS: s.DownstreamMS - b.DownstreamMS,
	}
	if w.requests < 0 || w.cpu < 0 || w.inboundMS < 0 || w.downstreamMS < 0 {
		return // a reset: the sample is the new base, the window is discarded
	}
	if w.requests < e.cfg.MinRequests || w.cpu <= 0 {
		return
	}
	st.windows = append(st.windows, w)
}

// prune drops the windows of rounds up to oldest.
func (st *podState) prune(oldest int) {
	i := 0
	for i < len(st.windows) && st.windows[i].round <= oldest {
		i++
	}
	if i > 0 {
		st.windows = slices.Delete(st.windows, 0, i)
	}
}

// capacities computes every known pod's Capacity: the measured ones, then the medians.
func (e *Estimator) capacities() map[string]Capacity {
	out := make(map[string]Capacity, len(e.pods))
	measured := make(map[string][]Capacity) // service → its measured pods' capacities
	perCore := make(map[string][]Capacity)  // the same, divided by each pod's cores
	for pod, st := range e.pods {
		c, ok := e.measure(st)
		if !ok {
			if st.measured != nil {
				last := *st.measured
				last.Source = SourceLastMeasured
				out[pod] = last
			}
			continue
		}
		st.measured = &c
		out[pod] = c
		measured[st.service] = append(measured[st.service], c)
		perCore[st.service] = append(perCore[st.service], c.scaled(1/st.cores))
	}
	for pod, st := range e.pods {
		if _, ok := out[pod]; ok {
			continue
		}
		var c Capacity
		switch {
		case len(measured[st.service]) == 0:
			c = Capacity{Source: SourceNone}
		case st.cores > 0:
			c = median(perCore[st.service]).scaled(st.cores)
		default:
			c = median(measured[st.service])
		}
		c.Service = st.service
		out[pod] = c
	}
	return out
}

// measure returns a pod's own estimate, if it has MinWindows windows.
func (e *Estimator) measure(st *podState) (Capacity, bool) {
	n := len(st.windows)
	if n < e.cfg.MinWindows || st.cores <= 0 {
		return Capacity{}, false
	}
	var req, cpu, seconds, inbound, downstream float64
	for _, w := range st.windows {
		req += w.requests
		cpu += w.cpu
		seconds += w.seconds
		inbound += w.inboundMS
		downstream += w.downstreamMS
	}
	if math.IsInf(req+cpu+seconds+inbound+downstream, 0) {
		return Capacity{}, false // counters beyond float64's range: no arithmetic to trust
	}
	perReq := cpu / req // CPU-seconds per request
	var ss float64
	for _, w := range st.windows {
		d := w.cpu - perReq*w.requests
		ss += d * d
	}
	meanReq := req / float64(n)
	se := math.Sqrt(ss/float64(n*(n-1))) / meanReq
	margin := e.t[n-1] * se

	c := Capacity{
		Service:        st.service,
		Source:         SourceMeasured,
		UtilizationRPS: st.cores / perReq,
		Requests:       req,
		Windows:        n,
		Pods:           1,
		Upper:          math.Inf(1),
	}
	if perReq > margin {
		c.Upper = st.cores / (perReq - margin)
	}
	c.RPS = c.UtilizationRPS
	if q := queueingBound(st.windows, servers(st.cores)); q > 0 {
		c.QueueingRPS = q
		c.RPS = min(c.RPS, q)
		c.Upper = min(c.Upper, q)
	}
	c.Lower = min(st.cores/(perReq+margin), c.RPS)
	if math.IsInf(c.UtilizationRPS, 0) || !(c.Lower > 0) {
		return Capacity{}, false // beyond float64's range (CPU per request ≈ 0, a variance overflowing)
	}
	return c, true
}

// queueingBound is the largest of the windows' own M/M/c inversions (c servers), each of its
// window's arrival rate and own time per request; 0 (no bound) when a window has none (its own
// time not positive, or a rate beyond float64's range). Each window apart, because the
// inversion holds for a queue in steady state: a window in which the pod drains a backlog (an
// overload that ended, the plan of another policy) has an own time of seconds, and pooled
// with the others it sets the bound near the windows' mean arrival rate whatever the pod can
// serve. (The grid of record's lata-q, planned two slices after Localization's collapse at
// 300 req/s, had the collapsed pods at 48–65 req/s where the others had the utilisation
// law's 91, the entry pods at 64–79 where the others had 272, and spread its plan over the
// network: docs/reproduction-paper, bookinfo/B, run 6.) The largest, because a bound from
// above is what the inversion is for: one window in steady state bounds the pod.
func queueingBound(windows []window, c int) float64 {
	bound := 0.0
	for _, w := range windows {
		lambda := w.requests / w.seconds
		own := (w.inboundMS - w.downstreamMS) / w.requests / 1000
		if !(own > 0) || math.IsInf(lambda, 0) || math.IsNaN(lambda) {
			return 0
		}
		q := mmcCapacity(lambda, own, c)
		if !(q > 0) || math.IsInf(q, 0) {
			return 0
		}
		bound = max(bound, q)
	}
	return bound
}

// servers is the number of servers of the queueing bound for a pod of the given cores: ⌈cores⌉,
// at least 1. Rounding up makes the bound weaker (higher), never a false clip of the estimate.
func servers(cores float64) int {
	return max(1, int(math.Ceil(cores-1e-9)))
}

// scaled returns c with every rate multiplied by f.
func (c Capacity) scaled(f float64) Capacity {
	c.RPS *= f
	c.Lower *= f
	c.Upper *= f
	c.UtilizationRPS *= f
	c.QueueingRPS *= f
	return c
}

// median returns the median of each rate over cs (QueueingRPS over those that have one), the
// sums of Requests and Windows, and Pods = len(cs), as a SourceServiceMedian Capacity. The
// median of each bound keeps Lower ≤ RPS ≤ Upper, since each pod's do.
func median(cs []Capacity) Capacity {
	of := func(f func(Capacity) float64) float64 {
		var v []float64
		for _, c := range cs {
			if x := f(c); x > 0 {
				v = append(v, x)
			}
		}
		if len(v) == 0 {
			return 0
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2 // +Inf if either is
	}
	m := Capacity{
		Source:         SourceServiceMedian,
		RPS:            of(func(c Capacity) float64 { return c.RPS }),
		Lower:          of(func(c Capacity) float64 { return c.Lower }),
		Upper:          of(func(c Capacity) float64 { return c.Upper }),
		UtilizationRPS: of(func(c Capacity) float64 { return c.UtilizationRPS }),
		QueueingRPS:    of(func(c Capacity) float64 { return c.QueueingRPS }),
		Pods:           len(cs),
	}
	for _, c := range cs {
		m.Requests += c.Requests
		m.Windows += c.Windows
	}
	return m
}
