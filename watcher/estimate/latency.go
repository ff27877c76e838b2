package estimate

import (
	"cmp"
	"errors"
	"fmt"
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
	// HalfLife is the number of rounds over which a penalty without a measurement (its data
	// thinned) halves, until it falls under HysteresisMS and is dropped. Default 5: the plan
	// that moved traffic off a penalised pair thins its data, and a penalty gone within a few
	// windows would draw the traffic straight back.
	HalfLife int
}

// DefaultMaxPenaltyMS is LatencyConfig.MaxPenaltyMS's default: a path paying 50 ms beyond its
// ICMP RTT is broken, not slow, and that is the health checks' business, not the plan's.
const DefaultMaxPenaltyMS = 50

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
	if c.HalfLife == 0 {
		c.HalfLife = 5
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
	// as independent clusters, as Estimator's bound; the baseline's own error left out); 0
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
//   - Smoothing. A pair's residual per attempt is the sum over its windows of the last
//     Windows rounds, Σ residual / Σ attempts (the sliding sum of Estimator: exact for a ratio
//     whatever the load per window), measured once it has MinWindows windows.
//   - Baseline. The overhead that is no distance (the client library, the sidecars) is what a
//     same-node path pays: a caller node u's baseline is the measured residual of (u, u),
//     else the attempt-weighted mean over all measured same-node pairs. Without any, no pair
//     is measured (overhead cannot be told from distance).
//   - Estimate. For u ≠ v with an ICMP RTT known: residual(u, v) − baseline(u) − ICMP(u, v).
//     The penalty target is the estimate bounded to [0, MaxPenaltyMS]. Same-node pairs are
//     the baseline and never corrected.
//   - Hysteresis. The penalty in force takes the target only when they differ by more than
//     HysteresisMS and by more than twice the estimate's standard error (its windows' spread):
//     a move within the noise is no move, and a target within it never replaces a 0.
//   - Decay. A pair that is not measured (its windows thinned: a plan that moved its traffic
//     away, a quiet hour) keeps its penalty decaying by half every HalfLife rounds, dropped
//     when under HysteresisMS: with no data the plan returns to pure ICMP. (A plan that moved
//     all traffic off a penalised pair will, once the penalty decayed, send some back, and the
//     penalty is found again: the price of not trusting stale data.)
//   - Idle rounds. A round in which no pair has a window over the floor (no load at all, or
//     no telemetry) is no round: nothing ages and nothing decays, since nothing was measured.
//
// Observe costs O(windows + pairs · Windows).
type LatencyCorrector struct {
	cfg   LatencyConfig
	decay float64 // the factor per round of a decaying penalty: 2^(−1/HalfLife)

	mu    sync.Mutex
	round int
	pairs map[NodePair]*pairState
}

type pairState struct {
	windows []pairWindow // oldest first, from rounds within the last cfg.Windows
	penalty float64      // in force
}

type pairWindow struct {
	round                int
	attempts, residualMS float64
}

// NewLatencyCorrector returns a LatencyCorrector with cfg's rules (zero fields take their
// defaults), or an error wrapping ErrInvalidConfig.
func NewLatencyCorrector(cfg LatencyConfig) (*LatencyCorrector, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &LatencyCorrector{cfg: cfg, decay: math.Exp2(-1 / float64(cfg.HalfLife)), pairs: map[NodePair]*pairState{}}, nil
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

	type band struct{ service, node string }
	inbound := map[band][2]float64{} // requests, inbound ms
	for _, b := range bands {
		if b.Service == "" || b.Node == "" || badCount(b.Requests) || badCount(b.InboundMS) {
			errs = append(errs, fmt.Errorf("%w: band of service %q on node %q: requests %v, inbound %v ms", ErrInvalidSample,
				b.Service, b.Node, b.Requests, b.InboundMS))
			continue
		}
		k := band{b.Service, b.Node}
		v := inbound[k]
		inbound[k] = [2]float64{v[0] + b.Requests, v[1] + b.InboundMS}
	}
	fresh := map[NodePair]*pairWindow{}
	for _, p := range paths {
		if p.Pair.From == "" || p.Pair.To == "" || p.Service == "" || badCount(p.Attempts) || badCount(p.AttemptMS) {
			errs = append(errs, fmt.Errorf("%w: path %s to service %q: attempts %v, %v ms", ErrInvalidSample, p.Pair, p.Service,
				p.Attempts, p.AttemptMS))
			continue
		}
		in := inbound[band{p.Service, p.Pair.To}]
		if in[0] < c.cfg.MinRequests || p.Attempts == 0 {
			continue // the band's inbound time is not known this window
		}
		w := fresh[p.Pair]
		if w == nil {
			w = &pairWindow{round: round}
			fresh[p.Pair] = w
		}
		w.attempts += p.Attempts
		w.residualMS += p.AttemptMS - p.Attempts*in[1]/in[0]
	}
	idle := true
	for pair, w := range fresh {
		if w.attempts < c.cfg.MinRequests {
			continue
		}
		idle = false
		st := c.pairs[pair]
		if st == nil {
			st = &pairState{}
			c.pairs[pair] = st
		}
		st.windows = append(st.windows, *w)
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
	}

	// The smoothed residuals, and the baselines.
	residual := map[NodePair][3]float64{} // measured pairs: attempts, residual ms per attempt, its standard error
	var sameAttempts, sameResidual float64
	for pair, st := range c.pairs {
		if len(st.windows) < c.cfg.MinWindows {
			continue
		}
		var n, r float64
		for _, w := range st.windows {
			n += w.attempts
			r += w.residualMS
		}
		x, se := r/n, 0.0
		if k := float64(len(st.windows)); k > 1 {
			var ss float64
			for _, w := range st.windows {
				d := w.residualMS - x*w.attempts
				ss += d * d
			}
			se = math.Sqrt(ss/(k*(k-1))) / (n / k)
		}
		residual[pair] = [3]float64{n, x, se}
		if pair.From == pair.To {
			sameAttempts += n
			sameResidual += r
		}
	}
	baseline := func(node string) (float64, bool) {
		if r, ok := residual[NodePair{node, node}]; ok {
			return r[1], true
		}
		if sameAttempts > 0 {
			return sameResidual / sameAttempts, true
		}
		return 0, false
	}

	var out []LatencyPenalty
	for pair, st := range c.pairs {
		if pair.From == pair.To {
			if len(st.windows) == 0 {
				delete(c.pairs, pair)
			}
			continue
		}
		lp := LatencyPenalty{Pair: pair, Windows: len(st.windows)}
		r, measured := residual[pair]
		base, hasBase := baseline(pair.From)
		rtt, hasRTT := icmp(pair)
		if measured && hasBase && hasRTT {
			lp.Measured, lp.Attempts = true, r[0]
			lp.EstimateMS = r[1] - base - rtt
			lp.StdErrMS = r[2]
			target := min(max(lp.EstimateMS, 0), c.cfg.MaxPenaltyMS)
			if math.Abs(target-st.penalty) > max(c.cfg.HysteresisMS, 2*lp.StdErrMS) {
				st.penalty = target
			}
		} else if !idle {
			st.penalty *= c.decay
			if st.penalty < c.cfg.HysteresisMS {
				st.penalty = 0
			}
		}
		lp.PenaltyMS = st.penalty
		if !lp.Measured && st.penalty == 0 && len(st.windows) == 0 {
			delete(c.pairs, pair)
			continue
		}
		out = append(out, lp)
	}
	slices.SortFunc(out, func(a, b LatencyPenalty) int {
		return cmp.Or(cmp.Compare(a.Pair.From, b.Pair.From), cmp.Compare(a.Pair.To, b.Pair.To))
	})
	return out, errors.Join(errs...)
}

func badCount(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) || v < 0 }
