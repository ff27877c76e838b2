package watcher

import (
	"maps"
	"strings"
	"time"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// latencyFeed feeds Prometheus's windows of call attempts and pod loads to the latency
// corrector (estimate.LatencyCorrector), one window at a time, and keeps the penalties in force.
//
// Rules, per Prometheus snapshot that holds a window after the one last fed (the capacity
// feed's cadence) and whose call-attempt queries answered:
//   - Paths. An attempt series of a caller pod of a managed service (by namespace and pod, its
//     node from Kubernetes) to a target that names a managed service (grpc-go's target
//     "xds:///KEY", KEY the service's key as the Listener is named, "NAME.default" read as
//     "NAME") at a locality whose zone is a node (edgeflow's bands and per-pod localities; the
//     failover and all-pods localities have none) is one PathWindow from the caller's node to
//     that node into the service. Any other series is left out.
//   - Bands. Each fresh pod load (not stale, of the snapshot's window) of a pod of a managed
//     service is one BandWindow of its service on its node.
//   - ICMP. The RTT the corrector subtracts is the merged topology's latency of the pair (the
//     measured probes', or the missing-pair rule's), before any penalty.
//   - Hold-down. A window in which the plan in force changed (Plan, when given) mixes two
//     plans, and the callers opened the bands the new plan weights in it: the corrector takes
//     it as an idle round (no paths, no bands), which changes nothing.
//   - The topology takes the penalties in force (WithLatencyPenalty) on every merge, only when
//     its latency is per node (the correction is per node pair).
type latencyFeed struct {
	corr      *estimate.LatencyCorrector
	plan      func() (*optimizer.Topology, *optimizer.Allocation) // nil: no hold-down
	fedAt     time.Time                                           // the At of the measurements last fed
	published *optimizer.Allocation                               // the plan in force at the last window fed
	penalty   map[estimate.NodePair]float64                       // in force, ms
}

// latencyRound is what one feed did, for the caller to record.
type latencyRound struct {
	fed       bool
	held      bool
	penalties []estimate.LatencyPenalty
	steps     []estimate.BandStep // the bands the round left out for a step in their inbound time
	err       error               // the corrector's complaint about windows (the round still counted)
}

// feed takes one snapshot against the Kubernetes state and the merged topology t (before
// penalties), by latencyFeed's rules.
func (f *latencyFeed) feed(ks *kube.State, meas *prom.Measurements, t *optimizer.Topology) latencyRound {
	return f.take(ks, meas, t, true)
}

// feedHistory takes one window of Prometheus's history (prom.Source.LoadHistory) as feed does,
// but never held: it was measured before this process planned, under a plan it does not know
// (its own before a restart, another replica's), and the paths it measured are paths whatever
// plan sent traffic on them. Fed oldest first, before the first live snapshot, on the first
// topology's latencies.
func (f *latencyFeed) feedHistory(ks *kube.State, meas *prom.Measurements, t *optimizer.Topology) latencyRound {
	return f.take(ks, meas, t, false)
}

// take is feed, holding a window in which the plan in force changed when hold is set.
func (f *latencyFeed) take(ks *kube.State, meas *prom.Measurements, t *optimizer.Topology, hold bool) latencyRound {
	var r latencyRound
	if meas == nil || !meas.AttemptsRead || !f.fedAt.IsZero() && meas.At.Sub(f.fedAt) < meas.Window ||
		t.LatencyGranularity == optimizer.LatencyPerZone {
		return r
	}
	f.fedAt = meas.At
	type podAt struct{ service, node string }
	pods := map[string]podAt{} // NAMESPACE/POD → the first service it backs, and its node
	services := map[string]bool{}
	for _, s := range ks.Services {
		services[s.Key()] = true
		for _, p := range s.Pods {
			key := s.NamespaceOrDefault() + "/" + p.Name
			if _, dup := pods[key]; !dup {
				pods[key] = podAt{s.Key(), p.Node}
			}
		}
	}
	nodes := make(map[string]bool, len(ks.Nodes))
	for _, n := range ks.Nodes {
		nodes[n.Name] = true
	}
	var paths []estimate.PathWindow
	for _, a := range meas.Attempts {
		caller, ok := pods[a.Namespace+"/"+a.Pod]
		name, isXDS := strings.CutPrefix(a.Target, "xds:///")
		svc := optimizer.CanonicalKey(name)
		if !ok || !isXDS || !services[svc] {
			continue
		}
		loc, err := prom.ParseGRPCLocality(a.Locality)
		if err != nil || !nodes[loc.Zone] {
			continue
		}
		paths = append(paths, estimate.PathWindow{Pair: estimate.NodePair{From: caller.node, To: loc.Zone}, Service: svc,
			Attempts: a.Attempts, AttemptMS: a.Seconds * 1000})
	}
	var bands []estimate.BandWindow
	for _, l := range meas.Load {
		p, ok := pods[l.Name()]
		if !ok || l.Stale || l.Window != meas.Window {
			continue
		}
		bands = append(bands, estimate.BandWindow{Service: p.service, Node: p.node, Requests: l.Requests, InboundMS: l.InboundMSSum})
	}
	if f.plan != nil {
		_, plan := f.plan()
		r.held = hold && plan != f.published
		f.published = plan
	}
	if r.held {
		paths, bands = nil, nil
	}
	rtt := make(map[estimate.NodePair]float64, len(t.Latency))
	for _, l := range t.Latency {
		rtt[estimate.NodePair{From: l.From, To: l.To}] = l.MS
	}
	icmp := func(p estimate.NodePair) (float64, bool) {
		if ms, ok := rtt[p]; ok {
			return ms, true
		}
		ms, ok := rtt[estimate.NodePair{From: p.To, To: p.From}] // one direction given means both
		return ms, ok
	}
	r.fed = true
	r.penalties, r.err = f.corr.Observe(paths, bands, icmp)
	r.steps = f.corr.Steps()
	penalty := map[estimate.NodePair]float64{}
	for _, lp := range r.penalties {
		if lp.PenaltyMS > 0 {
			penalty[lp.Pair] = lp.PenaltyMS
		}
	}
	f.penalty = penalty
	return r
}

// inForce returns the penalties in force (the feed's map: read only).
func (f *latencyFeed) inForce() map[estimate.NodePair]float64 { return f.penalty }

// samePenalties says whether two sets of penalties in force are equal.
func samePenalties(a, b map[estimate.NodePair]float64) bool { return maps.Equal(a, b) }
