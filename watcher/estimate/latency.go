package estimate

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
)

// The latency correction: per directed node pair, what a request path really pays beyond the
// ICMP round-trip time the plan knows — an "L7 penalty" (a sidecar's or a middlebox's cost, a
// congested link that ICMP does not see) — measured from the callers' attempt times and the
// callees' inbound times, bounded, applied only where the data supports it, and decaying back
// to 0 (pure ICMP) when the data thins.

// NodePair is a directed pair of nodes: requests from pods on From to pods on To.
type NodePair struct{ From, To string }

func (p NodePair) String() string { return p.From + "→" + p.To }

// PathWindow is one window of call attempts from a caller pod on node Pair.From to the pods of
// the callee service Service on node Pair.To (one latency band): grpc-go's
// grpc.client.attempt.duration by grpc.lb.locality, whose zone is the band's node under
// edgeflow's bands policy. Several PathWindows of one pair and service in a round (one per
// caller pod, say) are summed.
type PathWindow struct {
	Pair    NodePair
	Service string
	// Attempts is the number of attempts completed in the window; AttemptMS their summed time
	// in milliseconds (the histogram's _count and _sum).
	Attempts, AttemptMS float64
}

// BandWindow is one window of inbound requests of one callee pod (of Service, on Node): Istio's
// istio_request_duration_milliseconds, reporter="destination", from arrival to response, the
// pod's own work, queueing and downstream calls. Several BandWindows of one service and node in
// a round (one per pod) are summed.
type BandWindow struct {
	Service, Node string
	// Requests is the number of requests completed in the window; InboundMS their summed
	// inbound time in milliseconds.
	Requests, InboundMS float64
}

// LatencyConfig sets a LatencyCorrector's rules. The zero value of a field means its default.
type LatencyConfig struct {
	// MinRequests is the sample floor: a pair's window counts only if its attempts (into bands
	// whose inbound time is known) reach it, and a band's inbound time is known only if its
	// requests in the window reach it. Default DefaultMinRequests.
	MinRequests float64
	// Windows is N, the number of most recent rounds whose windows are summed. Default 5.
	Windows int
	// MinWindows is the number of windows over the floor, among the last Windows rounds, that
	// a pair needs for a measured penalty. Default 3.
	MinWindows int
	// MaxPenaltyMS bounds the penalty: a measurement beyond it is taken as MaxPenaltyMS.
	// Default DefaultMaxPenaltyMS.
	MaxPenaltyMS float64
	// HysteresisMS is the least band within which a new estimate leaves the penalty in force
	// unchanged (the band is wider when the estimate is noisier; see LatencyCorrector); a
	// penalty below it is not applied. Default 0.5 ms.
	HysteresisMS float64
	// MinPenaltyMS is the detection floor: a penalty below it is not applied, however well
	// measured. The baseline (a same-node call's overhead) is not exactly a remote call's: on
	// the netns testbed, remote pairs without any penalty measured 1.1 ± 0.1 and 1.5 ± 0.3 ms
	// over ICMP and the baseline (steady, so no confidence rule removes them), and a real
	// network's pod-to-pod path (an overlay, kube-proxy's rules) pays its own beyond a node
	// probe's ICMP. Default DefaultMinPenaltyMS.
	MinPenaltyMS float64
	// Confidence is the two-sided confidence level of the hysteresis band (see
	// LatencyCorrector), in (0, 1). Default 0.95.
	Confidence float64
	// MaxInboundStep is the largest move of a callee band's mean inbound time per request from
	// its previous window, as a fraction of the previous, with which the band's window is still
	// used (a move under MinPenaltyMS always is). Default DefaultMaxInboundStep. See
	// LatencyCorrector's "Steps".
	MaxInboundStep float64
	// HalfLife is the number of rounds over which a penalty without a measurement (its data
	// thinned) halves, until it falls under HysteresisMS or MinPenaltyMS and is dropped.
	// Default 5: the plan
	// that moved traffic off a penalised pair thins its data, and a penalty gone within a few
	// windows would draw the traffic straight back.
	HalfLife int
}

// DefaultMaxPenaltyMS is LatencyConfig.MaxPenaltyMS's default: a path paying 50 ms beyond its
// ICMP RTT is broken, not slow, and that is the health checks' business, not the plan's.
const DefaultMaxPenaltyMS = 50

// DefaultMinPenaltyMS is LatencyConfig.MinPenaltyMS's default: above what the testbed's remote
// calls paid beyond ICMP without a penalty (≤ 1.5 ms), below the penalties worth routing
// around that the issue sets (3 ms).
const DefaultMinPenaltyMS = 2

// DefaultMaxInboundStep is LatencyConfig.MaxInboundStep's default. On the netns testbed a pod
// slowed 1.5× moved its band's inbound time +180–260 % (9.8 → 34.9 ms), and that window read
// up to about ±40 ms of excess on the paths into it; without a step, bands moved up to 46 %
// from one 10 s window to the next (16 of 198 windows over 25 %).
const DefaultMaxInboundStep = 0.5

func (c LatencyConfig) withDefaults() (LatencyConfig, error) {
	if c.MinRequests == 0 {
		c.MinRequests = DefaultMinRequests
	}
	if c.Windows == 0 {
		c.Windows = 5
	}
	if c.MinWindows == 0 {
		c.MinWindows = min(3, c.Windows)
	}
	if c.MaxPenaltyMS == 0 {
		c.MaxPenaltyMS = DefaultMaxPenaltyMS
	}
	if c.HysteresisMS == 0 {
		c.HysteresisMS = 0.5
	}
	if c.MinPenaltyMS == 0 {
		c.MinPenaltyMS = DefaultMinPenaltyMS
	}
	if c.HalfLife == 0 {
		c.HalfLife = 5
	}
	if c.Confidence == 0 {
		c.Confidence = 0.95
	}
	if c.MaxInboundStep == 0 {
		c.MaxInboundStep = DefaultMaxInboundStep
	}
	switch {
	case !(c.MinRequests > 0) || math.IsInf(c.MinRequests, 0):
		return c, fmt.Errorf("%w: latency MinRequests %v: want a positive number", ErrInvalidConfig, c.MinRequests)
	case c.Windows < 1:
		return c, fmt.Errorf("%w: latency Windows %d: want at least 1", ErrInvalidConfig, c.Windows)
	case c.MinWindows < 1 || c.MinWindows > c.Windows:
		return c, fmt.Errorf("%w: latency MinWindows %d: want 1 to Windows (%d)", ErrInvalidConfig, c.MinWindows, c.Windows)
	case !(c.MaxPenaltyMS > 0) || math.IsInf(c.MaxPenaltyMS, 0):
		return c, fmt.Errorf("%w: latency MaxPenaltyMS %v: want a positive number", ErrInvalidConfig, c.MaxPenaltyMS)
	case !(c.HysteresisMS > 0) || c.HysteresisMS >= c.MaxPenaltyMS:
		return c, fmt.Errorf("%w: latency HysteresisMS %v: want a positive number below MaxPenaltyMS (%v)", ErrInvalidConfig, c.HysteresisMS, c.MaxPenaltyMS)
	case !(c.MinPenaltyMS > 0) || c.MinPenaltyMS >= c.MaxPenaltyMS:
		return c, fmt.Errorf("%w: latency MinPenaltyMS %v: want a positive number below MaxPenaltyMS (%v)", ErrInvalidConfig, c.MinPenaltyMS, c.MaxPenaltyMS)
	case !(c.Confidence > 0 && c.Confidence < 1):
		return c, fmt.Errorf("%w: latency Confidence %v: want more than 0 and less than 1", ErrInvalidConfig, c.Confidence)
	case !(c.MaxInboundStep > 0) || math.IsInf(c.MaxInboundStep, 0):
		return c, fmt.Errorf("%w: latency MaxInboundStep %v: want a positive number", ErrInvalidConfig, c.MaxInboundStep)
	case c.HalfLife < 1:
		return c, fmt.Errorf("%w: latency HalfLife %d: want at least 1 round", ErrInvalidConfig, c.HalfLife)
	}
	return c, nil
}

// LatencyPenalty is one node pair's correction after a round.
type LatencyPenalty struct {
	Pair NodePair
	// PenaltyMS is the penalty in force: what the plan should add to the pair's ICMP RTT, in
	// [0, MaxPenaltyMS]; 0 is pure ICMP.
	PenaltyMS float64
	// Measured says the pair has MinWindows windows over the floor: EstimateMS is this round's
	// estimate (unbounded, before hysteresis). Otherwise the penalty in force is decaying.
	Measured   bool
	EstimateMS float64
	// StdErrMS is the estimate's standard error from the spread of its windows (the windows
	// as independent clusters, as Estimator's bound; each window's baseline with it); 0
	// with one window.
	StdErrMS float64
	// Attempts is the number of attempts the estimate rests on; Windows the number of windows.
	Attempts float64
	Windows  int
}

// LatencyCorrector estimates each directed node pair's L7 penalty, one round (window) at a
// time. Create it with NewLatencyCorrector; its methods are safe for concurrent use.
//
// Rules, per round (one call of Observe):
//   - Residual. For a pair (u, v) and each callee service s with a band on v: the attempts'
//     time less, per attempt, the band's mean inbound time this window (Σ InboundMS / Σ
//     Requests over s's pods on v; a band under the sample floor has none, and its attempts
//     are left out). What is left is the network, the client's and the sidecars' overhead,
//     and any penalty. A pair's window is its services' residuals and attempts summed; a
//     window under the sample floor (MinRequests attempts) contributes nothing.
//   - Steps. A band whose mean inbound time per request moved from its previous window (the
//     last one over the sample floor, within the last Windows rounds) by more than
//     MaxInboundStep of it, and by more than MinPenaltyMS, is left out of the round: its
//     paths, and its same-node paths as baselines. Prometheus scrapes every pod at its own
//     offset in the scrape interval, so a caller's attempts and its callee's inbound time of
//     one window cover times up to an interval apart, and a step in the inbound time (a pod
//     slowed, a plan that moved load) shows as excess, of either sign, on every path into the
//     band: up to about ±40 ms in the window of a 1.5× slowdown on the netns testbed, and
//     through the pooled baselines below on pairs into other bands (the likely cause of a
//     false 4.1 ms penalty there). The window after the step is compared with the step's own,
//     and is left out too while the move goes on.
//   - Baseline. The overhead that is no distance (the client library, the sidecars, the
//     response's way back, and whatever slows the whole machine in that window) is what a
//     same-node call pays, and it is not the same for every callee service (the demo measured
//     0.5–1.8 ms by service). A caller node u's baseline for service s in a window is, from
//     the most specific on: the residual per attempt of u's same-node calls to s; of every
//     node's same-node calls to s; of u's same-node calls to every service; of every
//     same-node call of the window (each counted only over the sample floor). A pair's window
//     is its services' residuals less their attempts times their baselines. A pair's window
//     without a baseline (no same-node path over the floor) contributes nothing: overhead
//     cannot be told from distance. Taking the baseline of the same window cancels what the
//     window's stalls add to both.
//   - Smoothing. A pair's excess per attempt is the sum over its windows of the last Windows
//     rounds, Σ (residual − attempts · baseline) / Σ attempts (the sliding sum of Estimator:
//     exact for a ratio whatever the load per window), measured once it has MinWindows
//     windows.
//   - Estimate. For u ≠ v with an ICMP RTT known: excess(u, v) − ICMP(u, v). The penalty
//     target is the estimate bounded to [0, MaxPenaltyMS]. Same-node pairs are the baseline
//     and never corrected.
//   - Entry. A pair without a penalty takes its target only when the target is at least
//     MinPenaltyMS (the detection floor: what a remote call may pay beyond ICMP and the
//     baseline without any penalty), and exceeds HysteresisMS and the estimate's family-wise
//     confidence half-width, t_m · se (se from
//     its windows' spread; t_m Student's on windows − 1 degrees of freedom at the two-sided
//     level 1 − (1 − Confidence)/m, m the pairs measured this round: Bonferroni, so that noise
//     alone enters a penalty on any of them in at most 1 − Confidence of the rounds; at 95 %
//     with 5 windows, 2.8 for one pair, 3.5 for 2, 4.9 for 6, 5.9 for 12). Every round tests
//     every measured pair again, and a single-pair level let noise in: the netns testbed held
//     a 4.3 ms penalty where none was hidden, from an estimate of 4.3 ± 1.5 ms over 2 pairs.
//   - Exit. A round in which a penalty in force has an estimate below it, with a confidence
//     interval at Confidence (t · se, t on windows − 1 degrees of freedom: 4.3 for 3 windows,
//     2.8 for 5) that reaches 0 or below, does not support it; a penalty not supported in
//     MinWindows consecutive measured rounds is dropped. (One round is not enough: every round
//     tests it again, and a real 3 ms with windows 1.4 ms apart failed one round in 40, and
//     then rarely came back, see the entry's level. An estimate above the penalty in force is
//     a penalty growing, whose windows' spread is the step's, not a sign of none: the
//     testbed's 3 → 12 ms read 5.3 ± 2.2 ms on the way.) Entry and exit at two levels are a
//     hysteresis of their own: a penalty that left does not come back until the data supports
//     it at the family-wise level.
//   - Floor. A penalty in force whose estimate's whole interval is under MinPenaltyMS
//     (estimate + t · se below it) is dropped: the data says it is under the floor.
//   - Hysteresis. Otherwise the penalty in force takes the target, raised to MinPenaltyMS,
//     only when they differ by more than HysteresisMS and by more than t · se: a move within
//     the noise is no move. A noisy round whose estimate dips under the floor holds the
//     penalty at the floor rather than dropping it (the floor and the exit rules drop it).
//     (A window's stall that its baseline does not cancel shows as spread, and widens the
//     band.)
//   - Decay. A pair that is not measured (its windows thinned: a plan that moved its traffic
//     away, a quiet hour) keeps its penalty decaying by half every HalfLife rounds, dropped
//     when under HysteresisMS or MinPenaltyMS: with no data the plan returns to pure ICMP. (A plan that moved
//     all traffic off a penalised pair will, once the penalty decayed, send some back, and the
//     penalty is found again: the price of not trusting stale data.)
//   - Idle rounds. A round in which no pair has a window over the floor (no load at all, or
//     no telemetry) is no round: nothing ages and nothing decays, since nothing was measured.
//
// Observe costs O(windows + pairs · Windows).
type LatencyCorrector struct {
	cfg   LatencyConfig
	decay float64   // the factor per round of a decaying penalty: 2^(−1/HalfLife)
	t     []float64 // t[df]: Student's t quantile at (1 + Confidence)/2, df = 1 … Windows−1

	tFamily map[[2]int]float64 // familyT's cache

	mu      sync.Mutex
	round   int
	pairs   map[NodePair]*pairState
	inbound map[serviceNode]bandMean // each band's last window over the floor, within the last Windows rounds
	steps   []BandStep               // the bands the last round left out (Steps)
}

// BandStep is a band a round left out by the Steps rule: its mean inbound time per request in
// the window before and in the round's, ms.
type BandStep struct {
	Service, Node string
	FromMS, ToMS  float64
}

func (b BandStep) String() string {
	return fmt.Sprintf("%s@%s %.1f→%.1fms", b.Service, b.Node, b.FromMS, b.ToMS)
}

// Steps returns the bands the last Observe left out by the Steps rule, sorted by service and
// node.
func (c *LatencyCorrector) Steps() []BandStep {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.steps)
}

// serviceNode names a callee band: a service's pods on one node.
type serviceNode struct{ service, node string }

// bandMean is a band's mean inbound time per request in a window, ms, and the window's round.
type bandMean struct {
	ms    float64
	round int
}

type pairState struct {
	windows []pairWindow // oldest first, from rounds within the last cfg.Windows
	penalty float64      // in force
	// unsupported counts the consecutive measured rounds in which the data did not support
	// the penalty in force (the exit rule).
	unsupported int
}

// pairWindow is one window of a pair: its attempts, and their residual less the window's
// baseline (summed, ms).
type pairWindow struct {
	round              int
	attempts, excessMS float64
}

// NewLatencyCorrector returns a LatencyCorrector with cfg's rules (zero fields take their
// defaults), or an error wrapping ErrInvalidConfig.
func NewLatencyCorrector(cfg LatencyConfig) (*LatencyCorrector, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	t := studentTTable((1+cfg.Confidence)/2, cfg.Windows)
	return &LatencyCorrector{cfg: cfg, decay: math.Exp2(-1 / float64(cfg.HalfLife)), t: t, tFamily: map[[2]int]float64{},
		pairs: map[NodePair]*pairState{}, inbound: map[serviceNode]bandMean{}}, nil
}

// Observe takes one round's windows and the ICMP RTT the plan knows per pair (ok false: none,
// and the pair is not corrected), and returns the correction of every pair it has data or a
// penalty in force for, sorted by pair. A window with an empty name or a count or sum that is
// negative, NaN or infinite is left out, and the error returned beside the corrections joins
// one error per such window, each wrapping ErrInvalidSample and naming it: the round still
// counts.
func (c *LatencyCorrector) Observe(paths []PathWindow, bands []BandWindow, icmp func(NodePair) (ms float64, ok bool)) ([]LatencyPenalty, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	round := c.round + 1
	var errs []error

	inbound := map[serviceNode][2]float64{} // requests, inbound ms
	for _, b := range bands {
		if b.Service == "" || b.Node == "" || badCount(b.Requests) || badCount(b.InboundMS) {
			errs = append(errs, fmt.Errorf("%w: band of service %q on node %q: requests %v, inbound %v ms", ErrInvalidSample,
				b.Service, b.Node, b.Requests, b.InboundMS))
			continue
		}
		k := serviceNode{b.Service, b.Node}
		v := inbound[k]
		inbound[k] = [2]float64{v[0] + b.Requests, v[1] + b.InboundMS}
	}
	// Steps: a band over the floor whose mean moved too far from its last window's is left out
	// (as a band under the floor is); every band over the floor is the next window's previous.
	c.steps = c.steps[:0]
	for k, v := range inbound {
		if v[0] < c.cfg.MinRequests {
			continue
		}
		mean := v[1] / v[0]
		prev, ok := c.inbound[k]
		c.inbound[k] = bandMean{ms: mean, round: round}
		if ok && math.Abs(mean-prev.ms) > max(c.cfg.MinPenaltyMS, c.cfg.MaxInboundStep*prev.ms) {
			delete(inbound, k)
			c.steps = append(c.steps, BandStep{Service: k.service, Node: k.node, FromMS: prev.ms, ToMS: mean})
		}
	}
	slices.SortFunc(c.steps, func(a, b BandStep) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.Node, b.Node))
	})
	type window struct{ attempts, residualMS float64 }
	type path struct {
		pair    NodePair
		service string
	}
	fresh := map[path]*window{}     // by pair and callee service
	pairs := map[NodePair]*window{} // the same, summed over the services
	for _, p := range paths {
		if p.Pair.From == "" || p.Pair.To == "" || p.Service == "" || badCount(p.Attempts) || badCount(p.AttemptMS) {
			errs = append(errs, fmt.Errorf("%w: path %s to service %q: attempts %v, %v ms", ErrInvalidSample, p.Pair, p.Service,
				p.Attempts, p.AttemptMS))
			continue
		}
		in := inbound[serviceNode{p.Service, p.Pair.To}]
		if in[0] < c.cfg.MinRequests || p.Attempts == 0 {
			continue // the band's inbound time is not known this window
		}
		residual := p.AttemptMS - p.Attempts*in[1]/in[0]
		k := path{p.Pair, p.Service}
		if fresh[k] == nil {
			fresh[k] = &window{}
		}
		if pairs[p.Pair] == nil {
			pairs[p.Pair] = &window{}
		}
		for _, w := range []*window{fresh[k], pairs[p.Pair]} {
			w.attempts += p.Attempts
			w.residualMS += residual
		}
	}
	// This window's baselines, per caller node and callee service: what a same-node call to
	// the service pays beyond the callee's inbound time (the client, the sidecars, the
	// response's way back: not the same for every service). From the most to the least
	// specific: the node's own same-node path to the service, the same-node paths to the
	// service from every node, the node's same-node paths to every service, every same-node
	// path of the window; each only from windows over the sample floor. One sum per scope,
	// keyed by (caller node, callee service) with "" for any (no node or service is named "":
	// such windows are rejected above).
	type scope struct{ node, service string }
	idle := true
	same := map[scope]*window{}
	add := func(k scope, w *window) {
		if same[k] == nil {
			same[k] = &window{}
		}
		same[k].attempts += w.attempts
		same[k].residualMS += w.residualMS
	}
	for pair, w := range pairs {
		if w.attempts < c.cfg.MinRequests {
			continue
		}
		idle = false
		if pair.From == pair.To {
			add(scope{pair.From, ""}, w)
			add(scope{}, w)
		}
	}
	for p, w := range fresh {
		if p.pair.From == p.pair.To && w.attempts >= c.cfg.MinRequests {
			add(scope{p.pair.From, p.service}, w)
			add(scope{"", p.service}, w)
		}
	}
	baseline := func(node, service string) (float64, bool) {
		for _, k := range []scope{{node, service}, {"", service}, {node, ""}, {}} {
			if w := same[k]; w != nil {
				return w.residualMS / w.attempts, true
			}
		}
		return 0, false
	}
	excess := map[NodePair]float64{}
	for p, w := range fresh {
		if p.pair.From == p.pair.To || pairs[p.pair].attempts < c.cfg.MinRequests {
			continue
		}
		b, ok := baseline(p.pair.From, p.service)
		if !ok {
			continue // overhead cannot be told from distance in this window
		}
		excess[p.pair] += w.residualMS - w.attempts*b
	}
	for pair, e := range excess {
		st := c.pairs[pair]
		if st == nil {
			st = &pairState{}
			c.pairs[pair] = st
		}
		st.windows = append(st.windows, pairWindow{round: round, attempts: pairs[pair].attempts, excessMS: e})
	}
	if !idle {
		c.round = round
		oldest := c.round - c.cfg.Windows
		for _, st := range c.pairs {
			i := 0
			for i < len(st.windows) && st.windows[i].round <= oldest {
				i++
			}
			st.windows = slices.Delete(st.windows, 0, i)
		}
		maps.DeleteFunc(c.inbound, func(_ serviceNode, b bandMean) bool { return b.round <= oldest })
	}

	// Every pair's estimate first: how many are measured this round sets the family-wise
	// confidence of a penalty's entry.
	out := make([]LatencyPenalty, 0, len(c.pairs))
	measured := 0
	for pair, st := range c.pairs {
		lp := LatencyPenalty{Pair: pair, Windows: len(st.windows)}
		rtt, hasRTT := icmp(pair)
		if len(st.windows) >= c.cfg.MinWindows && hasRTT {
			var n, e float64
			for _, w := range st.windows {
				n += w.attempts
				e += w.excessMS
			}
			x, se := e/n, 0.0
			if k := float64(len(st.windows)); k > 1 {
				var ss float64
				for _, w := range st.windows {
					d := w.excessMS - x*w.attempts
					ss += d * d
				}
				se = math.Sqrt(ss/(k*(k-1))) / (n / k)
			}
			lp.Measured, lp.Attempts, lp.EstimateMS, lp.StdErrMS = true, n, x-rtt, se
			measured++
		}
		out = append(out, lp)
	}
	kept := out[:0]
	for _, lp := range out {
		st := c.pairs[lp.Pair]
		switch {
		case lp.Measured:
			df := lp.Windows - 1
			half := c.t[df] * lp.StdErrMS
			target := min(max(lp.EstimateMS, 0), c.cfg.MaxPenaltyMS)
			unsupported := st.penalty > 0 && lp.EstimateMS < st.penalty && lp.EstimateMS-half <= 0
			if !unsupported {
				st.unsupported = 0
			}
			switch {
			case st.penalty == 0:
				// Entry: beyond the hysteresis and the family-wise confidence half-width.
				if target >= c.cfg.MinPenaltyMS && target > max(c.cfg.HysteresisMS, c.familyT(df, measured)*lp.StdErrMS) {
					st.penalty = target
				}
			case unsupported:
				st.unsupported++
				if st.unsupported >= c.cfg.MinWindows {
					st.penalty, st.unsupported = 0, 0 // the data no longer supports any penalty
				}
			case lp.EstimateMS+half < c.cfg.MinPenaltyMS:
				st.penalty = 0 // the data puts the penalty under the floor
			case math.Abs(max(target, c.cfg.MinPenaltyMS)-st.penalty) > max(c.cfg.HysteresisMS, half):
				st.penalty = max(target, c.cfg.MinPenaltyMS)
			}
		case !idle:
			c.decayPenalty(st)
		}
		lp.PenaltyMS = st.penalty
		if !lp.Measured && st.penalty == 0 && len(st.windows) == 0 {
			delete(c.pairs, lp.Pair)
			continue
		}
		kept = append(kept, lp)
	}
	out = kept
	slices.SortFunc(out, func(a, b LatencyPenalty) int {
		return cmp.Or(cmp.Compare(a.Pair.From, b.Pair.From), cmp.Compare(a.Pair.To, b.Pair.To))
	})
	return out, errors.Join(errs...)
}

// decayPenalty halves st's penalty every HalfLife rounds, dropping it under HysteresisMS or
// MinPenaltyMS.
func (c *LatencyCorrector) decayPenalty(st *pairState) {
	st.penalty *= c.decay
	if st.penalty < max(c.cfg.HysteresisMS, c.cfg.MinPenaltyMS) {
		st.penalty = 0
	}
}

// familyT is Student's t quantile on df degrees of freedom at the Bonferroni-corrected level
// for m pairs measured in one round: each pair's two-sided level is 1 − (1 − Confidence)/m, so
// that the chance of any of them entering a penalty from noise alone is at most 1 − Confidence
// per round. Cached by (df, m).
func (c *LatencyCorrector) familyT(df, m int) float64 {
	if m <= 1 || df == 0 {
		return c.t[df]
	}
	k := [2]int{df, m}
	if t, ok := c.tFamily[k]; ok {
		return t
	}
	t := studentT(1-(1-c.cfg.Confidence)/(2*float64(m)), float64(df))
	c.tFamily[k] = t
	return t
}

func badCount(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) || v < 0 }
