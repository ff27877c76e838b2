package watcher

import (
	"cmp"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// CapacityHysteresis is the share by which a pod's estimated capacity must move, from the value
// in force, before the topology takes the new one.
const CapacityHysteresis = 0.05

// CapacitiesInForce returns the capacities a loop puts in force after an estimator round: each
// pod's lower confidence bound where it has a usable estimate (any source but none, positive and
// finite), kept at its value in force (inForce, requests/s by pod) while it moved by no more
// than CapacityHysteresis of it. Pods without a usable estimate have none.
//
// Pods the data cannot tell apart share one capacity: a pod whose estimate is within its own
// confidence margin (RPS − Lower) of its service's median estimate is pooled, and every pooled
// pod of a service gets the median of their lower bounds. Pods of one kind measured apart differ
// by their sampling noise alone (±5–10 % over a few windows), and planning on that noise sends
// one pod more than its peers for no reason, which costs tail latency on pods that are in truth
// alike; a pod really slower or faster than its peers (by more than its margin) keeps its own.
// O(pods log pods).
func CapacitiesInForce(caps map[string]estimate.Capacity, inForce map[string]float64) map[string]float64 {
	usable := map[string][]string{} // service → its pods with a usable estimate
	for pod, c := range caps {
		if c.Source == estimate.SourceNone || !(c.Lower > 0) || math.IsInf(c.Lower, 0) {
			continue
		}
		usable[c.Service] = append(usable[c.Service], pod)
	}
	next := make(map[string]float64, len(caps))
	for _, pods := range usable {
		rps := make([]float64, len(pods))
		for i, pod := range pods {
			rps[i] = caps[pod].RPS
		}
		median := prom.Median(rps)
		var pooled []string
		var lowers []float64
		for _, pod := range pods {
			c := caps[pod]
			next[pod] = c.Lower
			if math.Abs(c.RPS-median) <= c.RPS-c.Lower {
				pooled = append(pooled, pod)
				lowers = append(lowers, c.Lower)
			}
		}
		if len(pooled) > 1 {
			shared := prom.Median(lowers)
			for _, pod := range pooled {
				next[pod] = shared
			}
		}
	}
	for pod, v := range next {
		if old, ok := inForce[pod]; ok && math.Abs(v-old) <= CapacityHysteresis*old {
			next[pod] = old
		}
	}
	return next
}

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
//
// With a breaker and the plan in force (LiveConfig.Breaker, Plan), each window fed is also the
// model-error breaker's: per service, the own time lata-q predicts for the plan in force
// (optimizer.PredictedOwnTimeMS on the plan's topology with the capacities in force during the
// window, a tripped service's too) against the one measured in the window (Σ (inbound −
// downstream) / Σ requests over the service's pods' fresh loads). A window in which the plan
// in force changed mixes two plans and is not judged, and is the hold-down: the capacities in
// force stay (the estimator still takes the window; the next window not held puts its
// estimate in force), so a push is followed by at least one window measured under it before
// the next measurement-driven change. A tripped service's pods get no capacity (inForce) until
// the breaker resets it.
type capacityFeed struct {
	est       *estimate.Estimator
	breaker   *estimate.Breaker                                   // nil: none
	plan      func() (*optimizer.Topology, *optimizer.Allocation) // the plan in force; nil without a breaker
	fedAt     time.Time                                           // the At of the measurements last fed
	clock     time.Time                                           // the estimator's clock: the windows fed, summed
	counters  map[string]estimate.Sample                          // cumulative, by NAMESPACE/POD
	estimated map[string]float64                                  // CapacitiesInForce's last, by NAMESPACE/POD: the lower confidence bound, requests/s
	capacity  map[string]float64                                  // in force (merge's), by NAMESPACE/POD: estimated as of the last window not held
	published *optimizer.Allocation                               // the plan in force at the last window fed
	tripped   []string                                            // the services the breaker tripped, sorted
	waits     *estimate.WaitScaler                                // the quota model's wait scales, learned from every window fed
	scale     map[string]float64                                  // in force (merge's), by service key: as of the last window not held
}

// capacityRound is what one feed did, for the caller to record.
type capacityRound struct {
	fed       bool                         // an estimator round ran
	caps      map[string]estimate.Capacity // the round's estimates, by NAMESPACE/POD (fed only)
	unmatched []string                     // pod loads naming no pod of a managed service, NAMESPACE/POD, sorted
	err       error                        // the estimator's complaint about samples (the round still counted)
	// judged says the breaker took the window; changed are the services that tripped or reset
	// in it, and breakerErr its complaint about the window's response times. held says the
	// plan in force changed in the window (the hold-down: the capacities in force stay).
	judged, held bool
	changed      []estimate.BreakerState
	breakerErr   error
}

func newCapacityFeed(est *estimate.Estimator, breaker *estimate.Breaker, plan func() (*optimizer.Topology, *optimizer.Allocation)) *capacityFeed {
	f := &capacityFeed{est: est, clock: time.Unix(0, 0), counters: map[string]estimate.Sample{}, estimated: map[string]float64{}, capacity: map[string]float64{}}
	f.waits, _ = estimate.NewWaitScaler(estimate.WaitScaleConfig{}) // the defaults are valid
	if breaker != nil && plan != nil {
		f.breaker, f.plan = breaker, plan
	}
	return f
}

// feed takes one Prometheus snapshot against the Kubernetes state: when it holds a window of
// load after the one last fed, the fresh loads of pods of managed services are added to their
// counters and the estimator runs a round; a pod's capacity in force becomes its estimate's
// lower bound when that moved by more than CapacityHysteresis (a pod without an estimate has
// none). Stale loads (a window mixed of two rounds) are not fed; loads naming no pod of a
// managed service are left out and listed. With a breaker the window is judged, or held (judge).
func (f *capacityFeed) feed(ks *kube.State, meas *prom.Measurements) capacityRound {
	return f.take(ks, meas, true)
}

// feedHistory takes one window of Prometheus's history (prom.Source.LoadHistory) as feed does,
// but the breaker does not judge it and it is never held: it was measured before this process
// planned, under a plan it does not know (its own before a restart, another replica's), so there
// is no prediction to judge it by and no push of its own to hold down for; its estimate is in
// force at once. Fed oldest first, before the first live snapshot.
func (f *capacityFeed) feedHistory(ks *kube.State, meas *prom.Measurements) capacityRound {
	return f.take(ks, meas, false)
}

// take is feed, judging the window by the plan in force when judge is set.
func (f *capacityFeed) take(ks *kube.State, meas *prom.Measurements, judge bool) capacityRound {
	var r capacityRound
	if meas == nil || len(meas.Load) == 0 || !f.fedAt.IsZero() && meas.At.Sub(f.fedAt) < meas.Window {
		return r
	}
	service := map[string]string{} // NAMESPACE/POD → the key of the first service it backs
	cores := map[string]float64{}  // NAMESPACE/POD → its CPU request in cores (absent: unknown)
	limit := map[string]int64{}    // service key → its pods' CPU limit, millicores (CPU-limited services only)
	for i, s := range ks.Services {
		if s.CPULimit > 0 {
			limit[s.Key()] = s.CPULimit
		}
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
	var fresh []prom.PodLoad
	own := map[string]OwnTime{} // by service key: this window's
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
		fresh = append(fresh, l)
		o := own[svc]
		o.Add(l.Requests, l.InboundMSSum, l.DownstreamMSSum)
		own[svc] = o
	}
	sort.Strings(r.unmatched)
	if len(samples) == 0 {
		return r
	}
	f.fedAt = meas.At
	f.clock = f.clock.Add(meas.Window)
	caps, err := f.est.Observe(f.clock, samples)
	r.fed, r.caps, r.err = true, caps, err
	for key := range f.counters {
		if _, known := caps[key]; !known {
			delete(f.counters, key) // the estimator forgot it: so does the feed
		}
	}
	f.estimated = CapacitiesInForce(caps, f.estimated)
	scale, err := f.waits.Observe(QuotaWaits(fresh, service, limit, f.estimated))
	if err != nil && r.err == nil {
		r.err = err
	}
	if judge {
		r.held = f.judge(own, &r)
	}
	if !r.held {
		f.capacity = f.estimated
		if err == nil {
			f.scale = scale
		}
	}
	return r
}

// QuotaWaits is one window's waits of the pods of CPU-limited services (estimate.WaitWindow, one
// a pod): for each fresh pod load of a service with a limit (limit, millicores by service key;
// service maps NAMESPACE/POD to its service key) and a capacity (requests/s by NAMESPACE/POD),
// the wait measured, requests × max(0, own time − the CPU a request takes at that capacity,
// limit/μ), against the one the quota model predicts at the load the pod carried, requests ×
// optimizer.QuotaWait(requests/window, μ, limit). A pod at or past its capacity (no finite
// prediction) is left out. Sorted by service, then pod.
func QuotaWaits(loads []prom.PodLoad, service map[string]string, limit map[string]int64, capacity map[string]float64) []estimate.WaitWindow {
	var out []estimate.WaitWindow
	for _, l := range loads {
		svc := service[l.Name()]
		lim, mu := limit[svc], capacity[l.Name()]
		if lim <= 0 || !(mu > 0) || !(l.Requests > 0) || !(l.Window > 0) {
			continue
		}
		wait := optimizer.QuotaWait(l.Requests/l.Window.Seconds(), mu, lim)
		if math.IsInf(wait, 0) || math.IsNaN(wait) {
			continue
		}
		cpuMS := float64(lim) / mu // limit/1000 cores over μ, in ms
		out = append(out, estimate.WaitWindow{
			Service:     svc,
			Pod:         l.Name(),
			MeasuredMS:  max(0, l.InboundMSSum-l.DownstreamMSSum-l.Requests*cpuMS),
			PredictedMS: l.Requests * 1000 * wait,
			Requests:    l.Requests,
		})
	}
	slices.SortFunc(out, func(a, b estimate.WaitWindow) int {
		return cmp.Or(strings.Compare(a.Service, b.Service), strings.Compare(a.Pod, b.Pod))
	})
	return out
}

// setQueueScale gives each CPU-limited service of t the wait scale in force (by service key;
// estimate.WaitScaler), in place.
func setQueueScale(t *optimizer.Topology, scale map[string]float64) {
	for i := range t.Services {
		if s := &t.Services[i]; s.CPULimit > 0 {
			s.QueueScale = scale[s.Key()]
		}
	}
}

// OwnTime is one service's own time over one window: Σ (inbound − downstream) in ms over Σ
// requests of its pods.
type OwnTime struct{ MS, Requests float64 }

// Add counts one pod's window: requests completed, their inbound and downstream time in ms (a
// downstream time over the inbound one counts as none).
func (o *OwnTime) Add(requests, inboundMS, downstreamMS float64) {
	o.MS += max(0, inboundMS-downstreamMS)
	o.Requests += requests
}

// ResponseTimes pairs, per service key, the own time lata-q predicts for the plan in force
// (optimizer.PredictedOwnTimeMS of plan on topo with the pods' capacities, by NAMESPACE/POD)
// with the one measured in a window: the model-error breaker's window (estimate.Breaker). A
// service without a prediction or without requests has none. Sorted by service.
func ResponseTimes(topo *optimizer.Topology, plan *optimizer.Allocation, capacity map[string]float64, own map[string]OwnTime) []estimate.ResponseTime {
	var out []estimate.ResponseTime
	for svc, p := range optimizer.PredictedOwnTimeMS(WithCapacity(topo, capacity), plan) {
		if m, ok := own[svc]; ok && m.Requests > 0 {
			out = append(out, estimate.ResponseTime{Service: svc, PredictedMS: p, MeasuredMS: m.MS / m.Requests, Requests: m.Requests})
		}
	}
	slices.SortFunc(out, func(a, b estimate.ResponseTime) int { return strings.Compare(a.Service, b.Service) })
	return out
}

// judge runs the breaker on one window's measured own times (by service key), against lata-q's
// prediction for the plan in force on the capacities in force during the window (f.capacity,
// before the window's update), unless the plan in force changed since the last window fed: then
// it says the window is held. Without a breaker no window is held.
func (f *capacityFeed) judge(own map[string]OwnTime, r *capacityRound) (held bool) {
	if f.breaker == nil {
		return false
	}
	topo, plan := f.plan()
	held = plan != f.published
	f.published = plan
	if held || topo == nil || plan == nil {
		return held
	}
	r.judged = true
	r.changed, r.breakerErr = f.breaker.Observe(ResponseTimes(topo, plan, f.capacity, own))
	f.tripped = f.breaker.Tripped()
	return false
}

// inForce returns the capacities in force, by NAMESPACE/POD, without those of the pods of the
// services the breaker tripped (they fall back to lata: all of a service's pods or none, as
// setCapacity's rule). The map is the caller's when a service is tripped, else f.capacity.
func (f *capacityFeed) inForce(ks *kube.State) map[string]float64 {
	if len(f.tripped) == 0 {
		return f.capacity
	}
	out := make(map[string]float64, len(f.capacity))
	for k, v := range f.capacity {
		out[k] = v
	}
	for _, s := range ks.Services {
		if slices.Contains(f.tripped, s.Key()) {
			for _, p := range s.Pods {
				delete(out, s.NamespaceOrDefault()+"/"+p.Name)
			}
		}
	}
	return out
}
