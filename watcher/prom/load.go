package prom

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// PodLoad is what one pod did over one window, read from the pod-load queries: plain window
// totals, not rates. A consumer takes means and rates from them (inbound time per request:
// InboundMSSum / Requests; CPU use in cores: CPUSeconds / Window).
type PodLoad struct {
	// Namespace and Pod name the pod as the scrape's labels do (LabelNamespace, LabelPod).
	Namespace, Pod string
	// Window is the window the values were measured over.
	Window time.Duration
	// Requests is the number of requests the pod completed (Config.PodRequestsQuery).
	Requests float64
	// InboundMSSum is those requests' summed duration in ms, from arrival at the pod's sidecar
	// to the response: own work, queueing and downstream calls (Config.PodInboundQuery).
	InboundMSSum float64
	// DownstreamMSSum is the summed duration in ms of the calls the pod made, as its sidecar
	// timed them: the time it spent waiting on its callees (Config.PodDownstreamQuery).
	DownstreamMSSum float64
	// CPUSeconds is the CPU time the pod's application containers used (Config.PodCPUQuery).
	CPUSeconds float64
	// Stale says that at least one of the values is a last good one, kept because its series
	// vanished from the latest answer, a pod-load query failed, or the pod is contested: the
	// values are not all of the latest window.
	Stale bool
	// Contested says that a pod-load query answered series of this pod from more than one
	// scrape (see Source): its values are the last trusted ones.
	Contested bool
}

// Name is the pod as "namespace/pod".
func (l PodLoad) Name() string { return l.Namespace + "/" + l.Pod }

// PodRef names a pod by its namespace and name.
type PodRef struct{ Namespace, Name string }

func (p PodRef) String() string { return p.Namespace + "/" + p.Name }

// loadSignal is one of the pod-load queries.
type loadSignal int

const (
	loadRequests loadSignal = iota
	loadInbound
	loadDownstream
	loadCPU
	loadSignals // their number
)

// loadQueryNames are the pod-load queries' names, as in the metrics' query label.
var loadQueryNames = [loadSignals]string{queryPodRequests, queryPodInbound, queryPodDownstream, queryPodCPU}

// loadQueries are cfg's pod-load queries, by signal; DisableLoad for one that is off (all of
// them when PodRequestsQuery is).
func loadQueries(cfg *Config) [loadSignals]string {
	q := [loadSignals]string{cfg.PodRequestsQuery, cfg.PodInboundQuery, cfg.PodDownstreamQuery, cfg.PodCPUQuery}
	if q[loadRequests] == DisableLoad {
		for i := range q {
			q[i] = DisableLoad
		}
	}
	return q
}

// queryLoad runs the pod-load queries that are on; a nil vector is a query that is off or
// failed, and errs holds each failed query's error: one query's failure fails only its signal.
func (s *Source) queryLoad(ctx context.Context, window time.Duration) (vecs [loadSignals]model.Vector, errs [loadSignals]error) {
	for sig, q := range loadQueries(&s.cfg) {
		if q == DisableLoad {
			continue
		}
		vecs[sig], errs[sig] = s.query(ctx, loadQueryNames[sig], s.expand(q, window), time.Time{})
	}
	return vecs, errs
}

// parseLoad sums each pod-load vector per pod, and lists, per signal, the contested pods: those
// whose series came from more than one scrape (job and instance) — a pod's sidecar or its
// node's cAdvisor is one scrape, and under honor_labels another scrape can claim the pod's
// labels, not remove the real series. A series without its pod labels, or with a value that is
// NaN, infinite, negative or a histogram, is ignored and counted (see Source); one of a pod
// outside the managed namespaces is dropped uncounted.
func (s *Source) parseLoad(vecs [loadSignals]model.Vector, window time.Duration, seen map[string]bool) (out [loadSignals]map[PodRef]lastGood, contested [loadSignals]map[PodRef]bool) {
	for sig, vec := range vecs {
		out[sig], contested[sig] = map[PodRef]lastGood{}, map[PodRef]bool{}
		name := loadQueryNames[sig]
		scrapes := map[PodRef]model.Metric{} // the first scrape (job, instance) seen of each pod
		for _, smp := range vec {
			p := PodRef{Namespace: string(smp.Metric[LabelNamespace]), Name: string(smp.Metric[LabelPod])}
			if p.Namespace == "" || p.Name == "" {
				s.ignore(seen, name, reasonMissingLabel, smp.Metric, "prom: ignoring a pod-load series without its pod labels",
					"labels", []string{LabelNamespace, LabelPod})
				continue
			}
			if !s.managed(p.Namespace) {
				continue
			}
			scrape := model.Metric{LabelJob: smp.Metric[LabelJob], LabelInstance: smp.Metric[LabelInstance]}
			if first, ok := scrapes[p]; !ok {
				scrapes[p] = scrape
			} else if !first.Equal(scrape) {
				contested[sig][p] = true
			}
			v := float64(smp.Value)
			if smp.Histogram != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				s.ignore(seen, name, reasonBadValue, smp.Metric, "prom: ignoring a pod-load value that is NaN, infinite, negative or a histogram",
					"value", smp.Value.String())
				continue
			}
			lg := out[sig][p]
			lg.value += v
			lg.window = window
			out[sig][p] = lg
		}
		for p := range contested[sig] {
			delete(out[sig], p)
		}
	}
	return out, contested
}

// mergeLoad folds one round's pod-load values into the last good ones (merge's rules, per
// query): a pod has a load while PodRequestsQuery's answer has it, fresh or stale; the other
// queries' values of pods without one are dropped, unlogged and uncounted (cAdvisor has every
// pod of the cluster, most of them no mesh server). A signal whose query failed (fresh nil) is
// aged instead (ageLoad). A contested pod keeps its last trusted value, not stale. It sets the
// stale-series and contested gauges.
func (s *Source) mergeLoad(fresh [loadSignals]map[PodRef]lastGood, contested [loadSignals]map[PodRef]bool, now time.Time) {
	queries := loadQueries(&s.cfg)
	for sig := range loadSignals {
		if queries[sig] == DisableLoad {
			continue
		}
		name := loadQueryNames[sig]
		if fresh[sig] == nil {
			s.ageLoad(sig, now)
			continue
		}
		for p := range contested[sig] {
			if last, ok := s.load[sig][p]; ok {
				fresh[sig][p] = last
			}
		}
		s.contested.WithLabelValues(name).Set(float64(len(contested[sig])))
		if sig != loadRequests {
			maps.DeleteFunc(fresh[sig], func(p PodRef, _ lastGood) bool { _, ok := s.load[loadRequests][p]; return !ok })
		}
		stale := merge(s.log, s.vanished.WithLabelValues(name), name, s.load[sig], fresh[sig], now, s.cfg.StaleAfter)
		if sig != loadRequests {
			maps.DeleteFunc(s.load[sig], func(p PodRef, last lastGood) bool {
				_, ok := s.load[loadRequests][p]
				if !ok && last.stale {
					stale--
				}
				return !ok
			})
		}
		s.stale.WithLabelValues(name).Set(float64(stale))
	}
}

// ageLoad is mergeLoad for a signal whose query failed: every pod's value is kept, stale, and
// those last seen StaleAfter ago or more are forgotten. Nothing counts as vanished.
func (s *Source) ageLoad(sig loadSignal, now time.Time) {
	var forgotten []string
	for p, last := range s.load[sig] {
		if now.Sub(last.seen) >= s.cfg.StaleAfter {
			delete(s.load[sig], p)
			forgotten = append(forgotten, p.String())
			continue
		}
		last.stale = true
		s.load[sig][p] = last
	}
	logChange(s.log, slog.LevelWarn, "prom: forgetting stale series", loadQueryNames[sig], forgotten)
	s.stale.WithLabelValues(loadQueryNames[sig]).Set(float64(len(s.load[sig])))
}

// loads lists the pods' last good loads, sorted by namespace then pod.
func (s *Source) loads() []PodLoad {
	var out []PodLoad
	for p, req := range s.load[loadRequests] {
		l := PodLoad{Namespace: p.Namespace, Pod: p.Name, Window: req.window, Requests: req.value, Stale: req.stale}
		for sig := range loadSignals {
			l.Contested = l.Contested || s.contestedLoad[sig][p]
		}
		l.Stale = l.Stale || l.Contested
		for sig, v := range map[loadSignal]*float64{loadInbound: &l.InboundMSSum, loadDownstream: &l.DownstreamMSSum, loadCPU: &l.CPUSeconds} {
			if last, ok := s.load[sig][p]; ok {
				*v = last.value
				l.Stale = l.Stale || last.stale
			}
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b PodLoad) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod))
	})
	return out
}

// loadFailed records a round whose pod-load queries failed (err: each failed query's error) or
// succeeded (nil): Status's LoadReason, and a log line once per failure streak and reason.
func (s *Source) loadFailed(err error) {
	s.sideQueriesFailed(&s.status.LoadReason, err, "prom: pod-load queries failed; the pods' last good loads stay in effect",
		"prom: pod-load queries succeed again")
}

// sideQueriesFailed records, in *reason (a field of s.status), why queries that do not fail the
// round failed in it (err), or that they succeeded (nil), and logs failed or recovered once per
// change of the reason.
func (s *Source) sideQueriesFailed(reason *string, err error, failed, recovered string) {
	now := ""
	if err != nil {
		now = strings.ReplaceAll(err.Error(), "\n", "; ")
	}
	s.mu.Lock()
	prev := *reason
	*reason = now
	s.mu.Unlock()
	switch {
	case now == prev:
	case now != "":
		s.log.Error(failed, "error", err)
	default:
		s.log.Info(recovered, "url", s.url)
	}
}

// loadMoved says whether the pod loads moved beyond hysteresis between two snapshots of one
// pod set (sorted alike): a pod's request rate (HysteresisRPS), its CPU use in cores
// (HysteresisCores), or its mean inbound or downstream time per request (HysteresisLatencyMS).
// A pod set that differs is reported as a change by the caller.
func loadMoved(prev, next []PodLoad, beyond func(old, cur, abs float64) bool, cfg *Config) (changed, samePods bool) {
	if len(prev) != len(next) {
		return true, false
	}
	perSecond := func(v float64, w time.Duration) float64 {
		if w <= 0 {
			return 0
		}
		return v / w.Seconds()
	}
	perRequest := func(v, n float64) float64 {
		if n <= 0 {
			return 0
		}
		return v / n
	}
	for i, cur := range next {
		old := prev[i]
		if old.Namespace != cur.Namespace || old.Pod != cur.Pod {
			return true, false
		}
		if old.Contested != cur.Contested { // shown in /readyz: delivered at once
			changed = true
		}
		// Every comparison runs (no short circuit): beyond also notes that something moved.
		r := beyond(perSecond(old.Requests, old.Window), perSecond(cur.Requests, cur.Window), cfg.HysteresisRPS)
		c := beyond(perSecond(old.CPUSeconds, old.Window), perSecond(cur.CPUSeconds, cur.Window), cfg.HysteresisCores)
		in := beyond(perRequest(old.InboundMSSum, old.Requests), perRequest(cur.InboundMSSum, cur.Requests), cfg.HysteresisLatencyMS)
		down := beyond(perRequest(old.DownstreamMSSum, old.Requests), perRequest(cur.DownstreamMSSum, cur.Requests), cfg.HysteresisLatencyMS)
		changed = changed || r || c || in || down
	}
	return changed, true
}
