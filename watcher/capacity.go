package watcher

import (
	"math"
	"sort"
	"time"

	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// CapacityHysteresis is the share by which a pod's estimated capacity must move, from the value
// in force, before the topology takes the new one.
const CapacityHysteresis = 0.05

// capacityFeed feeds the Prometheus source's pod loads to the capacity estimator and keeps the
// capacities in force. It belongs to Live's merge loop (deliver), which alone calls it; merge
// takes what it made as an input.
//
// The loads are window totals (prom.PodLoad) and the estimator takes cumulative counters: the
// feed adds up windows that do not overlap, one estimator round per window of load. A snapshot
// whose window overlaps the one last fed is skipped (the source delivers at least once per
// window while there are loads); the estimator's clock is the sum of the windows fed, so its
// arrival rates are per second of measured window. (A pod left out of a round — its loads
// stale — has that window in its next one's length but not in its counters: its arrival rate,
// which only the queueing bound reads, is low for that window. The utilisation law,
// CPU-seconds per request, is not affected.)
type capacityFeed struct {
	est      *estimate.Estimator
	fedAt    time.Time                  // the At of the measurements last fed
	clock    time.Time                  // the estimator's clock: the windows fed, summed
	counters map[string]estimate.Sample // cumulative, by NAMESPACE/POD
	capacity map[string]float64         // in force, by NAMESPACE/POD: the lower confidence bound, requests/s
}

// capacityRound is what one feed did, for the caller to record.
type capacityRound struct {
	fed       bool     // an estimator round ran
	unmatched []string // pod loads naming no pod of a managed service, NAMESPACE/POD, sorted
	err       error    // the estimator's complaint about samples (the round still counted)
}

func newCapacityFeed(est *estimate.Estimator) *capacityFeed {
	return &capacityFeed{est: est, clock: time.Unix(0, 0), counters: map[string]estimate.Sample{}, capacity: map[string]float64{}}
}

// feed takes one Prometheus snapshot against the Kubernetes state: when it holds a window of
// load after the one last fed, the fresh loads of pods of managed services are added to their
// counters and the estimator runs a round; a pod's capacity in force becomes its estimate's
// lower bound when that moved by more than CapacityHysteresis (a pod without an estimate has
// none). Stale loads (a window mixed of two rounds) are not fed; loads naming no pod of a
// managed service are left out and listed.
func (f *capacityFeed) feed(ks *kube.State, meas *prom.Measurements) capacityRound {
	var r capacityRound
	if meas == nil || len(meas.Load) == 0 || !f.fedAt.IsZero() && meas.At.Sub(f.fedAt) < meas.Window {
		return r
	}
	service := map[string]string{} // NAMESPACE/POD → the key of the first service it backs
	cores := map[string]float64{}  // NAMESPACE/POD → its CPU request in cores (absent: unknown)
	for i, s := range ks.Services {
		for _, p := range s.Pods {
			key := s.Namespace + "/" + p.Name
			if _, dup := service[key]; dup {
				continue
			}
			service[key] = s.Key()
			if i < len(ks.PodCPU) {
				if m, ok := ks.PodCPU[i][key]; ok {
					cores[key] = float64(m) / 1000
				}
			}
		}
	}
	var samples []estimate.Sample
	for _, l := range meas.Load {
		key := l.Name()
		svc, ok := service[key]
		if !ok {
			r.unmatched = append(r.unmatched, key)
			continue
		}
		if l.Stale || l.Window != meas.Window {
			continue
		}
		c := f.counters[key]
		c.Pod, c.Service, c.Cores = key, svc, cores[key]
		c.Requests += l.Requests
		c.InboundMS += l.InboundMSSum
		c.DownstreamMS += l.DownstreamMSSum
		c.CPUSeconds += l.CPUSeconds
		f.counters[key] = c
		samples = append(samples, c)
	}
	sort.Strings(r.unmatched)
	if len(samples) == 0 {
		return r
	}
	f.fedAt = meas.At
	f.clock = f.clock.Add(meas.Window)
	caps, err := f.est.Observe(f.clock, samples)
	r.fed, r.err = true, err
	for key := range f.counters {
		if _, known := caps[key]; !known {
			delete(f.counters, key) // the estimator forgot it: so does the feed
		}
	}
	next := make(map[string]float64, len(caps))
	for key, c := range caps {
		if c.Source == estimate.SourceNone || !(c.Lower > 0) || math.IsInf(c.Lower, 0) {
			continue
		}
		next[key] = c.Lower
		if old, ok := f.capacity[key]; ok && math.Abs(c.Lower-old) <= CapacityHysteresis*old {
			next[key] = old
		}
	}
	f.capacity = next
	return r
}
