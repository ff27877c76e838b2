package prom

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Pair is an ordered pair of node names: From is the probing node, To the probed one.
type Pair struct{ From, To string }

func (p Pair) String() string { return p.From + "→" + p.To }

// Workload is an Istio workload (a Deployment, StatefulSet… by name) in its namespace.
type Workload struct{ Name, Namespace string }

func (w Workload) String() string { return w.Namespace + "/" + w.Name }

// CallEdge is a caller workload and a callee workload.
type CallEdge struct{ From, To Workload }

func (e CallEdge) String() string { return e.From.String() + "→" + e.To.String() }

// CallRate is the rate of requests (per second) on one call edge.
type CallRate struct {
	From, To Workload
	RPS      float64
}

// Measurements is one immutable snapshot of what Prometheus says. The Source never touches a
// snapshot again once delivered; receivers must not modify it either.
type Measurements struct {
	// Latency is in ms, for measured pairs only, including stale pairs kept at their last good
	// value; an unreachable pair holds Config.UnreachableMS. It never holds a value made up for
	// a pair without an answered probe. Pass it to FillLatency for the full matrix.
	Latency map[Pair]float64
	// Loss is the share of the window's probes lost, per pair of Latency whose success was
	// measured (absent with DisableSuccess).
	Loss map[Pair]float64
	// Unreachable holds the pairs that lost more than Config.MaxProbeLoss of their probes.
	Unreachable map[Pair]bool
	// Stale holds the pairs whose series vanished from the query result (or carried a bad
	// value); their value is the last good answer, kept for Config.StaleAfter.
	Stale map[Pair]bool
	// Contested holds the node pairs with more than one trusted probe series in the latest
	// round (an honor_labels scrape claiming the probe job's labels, or a misconfiguration):
	// a contested pair that was measured before keeps its last trusted value in Latency, one
	// that was not is absent from it.
	Contested map[Pair]bool
	// Calls are the call rates, sorted by caller then callee (namespace, then name),
	// including stale edges kept at their last good rate.
	Calls []CallRate
	// StaleCalls holds the call edges kept at their last good rate.
	StaleCalls map[CallEdge]bool
	// Load is each pod's load over the window, sorted by namespace then pod, including pods
	// kept at their last good values (PodLoad.Stale) and contested ones (PodLoad.Contested);
	// empty with the pod-load queries off.
	Load []PodLoad
	// Attempts are the proxyless gRPC callers' call attempts of the window by target and
	// locality (Config.AttemptsQuery), sorted by caller pod, target and locality; AttemptsRead
	// says the call-attempt queries answered this round (false: off or failed, and Attempts
	// says nothing, which is not the same as none). Not kept over from earlier rounds.
	Attempts     []Attempt
	AttemptsRead bool
	// Window is the window the queries used.
	Window time.Duration
	// At is when the query round answered (Config.Clock).
	At time.Time
}

// reportUnreachable sets the unreachable-pairs gauge and logs the set when it changed.
func (s *Source) reportUnreachable(m *Measurements) {
	s.unreachable.Set(float64(len(m.Unreachable)))
	pairs := make([]string, 0, len(m.Unreachable))
	for p := range m.Unreachable {
		pairs = append(pairs, p.String())
	}
	slices.Sort(pairs)
	set := strings.Join(pairs, ",")
	if set == s.unreachLog { // logged once per change of the set, not of the loss
		return
	}
	s.unreachLog = set
	desc := DescribeUnreachable(m, 0)
	if desc == "" {
		s.log.Info("prom: no node pair is unreachable any more")
		return
	}
	s.log.Warn("prom: node pairs unreachable (probe loss above the limit); they get the unreachable latency",
		"pairs", desc, "max_probe_loss", s.cfg.MaxProbeLoss, "latency_ms", s.cfg.UnreachableMS)
}

// DescribeUnreachable lists m's unreachable pairs with their loss, sorted ("a→b (loss 60%), …"),
// at most limit of them (0: all) followed by how many more there are; "" when there are none.
func DescribeUnreachable(m *Measurements, limit int) string {
	if m == nil || len(m.Unreachable) == 0 {
		return ""
	}
	pairs := make([]Pair, 0, len(m.Unreachable))
	for p := range m.Unreachable {
		pairs = append(pairs, p)
	}
	slices.SortFunc(pairs, func(a, b Pair) int { return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To)) })
	var b strings.Builder
	for i, p := range pairs {
		if limit > 0 && i == limit {
			fmt.Fprintf(&b, " and %d more", len(pairs)-limit)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (loss %.0f%%)", p, 100*m.Loss[p])
	}
	return b.String()
}

// DescribeContested lists m's contested node pairs and pods, sorted ("a→b, shop/p-1"), at most
// limit of them (0: all) followed by how many more there are; "" when there are none.
func DescribeContested(m *Measurements, limit int) string {
	if m == nil {
		return ""
	}
	var names []string
	for p := range m.Contested {
		names = append(names, p.String())
	}
	for _, l := range m.Load {
		if l.Contested {
			names = append(names, l.Name())
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	if limit > 0 && len(names) > limit {
		return strings.Join(names[:limit], ", ") + fmt.Sprintf(" and %d more", len(names)-limit)
	}
	return strings.Join(names, ", ")
}
