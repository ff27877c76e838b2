package prom

import (
	"math"

	"github.com/prometheus/common/model"
)

// ignore counts an ignored sample and logs it the first time in a row that the series is bad:
// unless the last round (s.reported) or this reading (seen) already did.
func (s *Source) ignore(seen map[string]bool, query, reason string, metric model.Metric, msg string, args ...any) {
	s.ignored.WithLabelValues(query, reason).Inc()
	key := query + " " + metric.String()
	if !s.reported[key] && !seen[key] {
		s.log.Warn(msg, append([]any{"query", query, "series", metric.String()}, args...)...)
	}
	seen[key] = true
}

// pairOf reads a series' node labels; ok is false (the sample counted and logged) without them.
func (s *Source) pairOf(seen map[string]bool, query string, smp *model.Sample) (Pair, bool) {
	from := string(smp.Metric[model.LabelName(s.cfg.SourceLabel)])
	to := string(smp.Metric[model.LabelName(s.cfg.TargetLabel)])
	if from == "" || to == "" {
		s.ignore(seen, query, reasonMissingLabel, smp.Metric, "prom: ignoring a latency series without its node labels",
			"source_label", s.cfg.SourceLabel, "target_label", s.cfg.TargetLabel)
		return Pair{}, false
	}
	return Pair{From: from, To: to}, true
}

// parseLatency combines the RTT and success vectors into one last good value per measured pair
// (see Source's rules), and lists the contested pairs: more than one trusted series in either
// vector. A series that is not pinned (see pinned) is ignored, counted and logged; a contested
// pair gets no value here.
func (s *Source) parseLatency(latVec, sucVec model.Vector, seen map[string]bool) (map[Pair]lastGood, map[Pair]bool) {
	rtt, n := map[Pair]float64{}, map[Pair]int{}
	latSeries, sucSeries := map[Pair]int{}, map[Pair]int{}
	noAnswer := map[Pair]bool{} // an RTT series that is NaN: no answered probe in the window
	for _, smp := range latVec {
		p, ok := s.pairOf(seen, queryLatency, smp)
		if !ok || !s.trusted(seen, queryLatency, p, smp) {
			continue
		}
		latSeries[p]++
		v := float64(smp.Value) * s.cfg.LatencyUnit
		switch {
		case smp.Histogram == nil && math.IsNaN(v):
			noAnswer[p] = true
			continue
		case smp.Histogram != nil || math.IsInf(v, 0) || v < 0:
			s.ignore(seen, queryLatency, reasonBadValue, smp.Metric, "prom: ignoring an RTT that is infinite, negative or a histogram", "value", smp.Value.String())
			continue
		}
		rtt[p] += v
		n[p]++
	}
	ok, cnt := map[Pair]float64{}, map[Pair]int{}
	if s.cfg.SuccessQuery != DisableSuccess {
		for _, smp := range sucVec {
			p, good := s.pairOf(seen, querySuccess, smp)
			if !good || !s.trusted(seen, querySuccess, p, smp) {
				continue
			}
			sucSeries[p]++
			v := float64(smp.Value)
			if smp.Histogram != nil || math.IsNaN(v) || v < 0 || v > 1 {
				s.ignore(seen, querySuccess, reasonBadValue, smp.Metric, "prom: ignoring a probe success ratio outside [0, 1]", "value", smp.Value.String())
				continue
			}
			ok[p] += v
			cnt[p]++
		}
	}
	contested := map[Pair]bool{}
	for _, counts := range []map[Pair]int{latSeries, sucSeries} {
		for p, c := range counts {
			if c > 1 {
				contested[p] = true
			}
		}
	}
	out := map[Pair]lastGood{}
	if s.cfg.SuccessQuery == DisableSuccess {
		for p := range rtt {
			if !contested[p] {
				out[p] = lastGood{value: rtt[p] / float64(n[p]), loss: math.NaN()}
			}
		}
		for p := range noAnswer {
			if n[p] == 0 && !contested[p] {
				s.ignore(seen, queryLatency, reasonIncomplete, model.Metric{model.LabelName(s.cfg.SourceLabel): model.LabelValue(p.From), model.LabelName(s.cfg.TargetLabel): model.LabelValue(p.To)},
					"prom: a pair has no RTT (NaN) and no success query is configured to say why; not measured")
			}
		}
		return out, contested
	}
	pairMetric := func(p Pair) model.Metric {
		return model.Metric{model.LabelName(s.cfg.SourceLabel): model.LabelValue(p.From), model.LabelName(s.cfg.TargetLabel): model.LabelValue(p.To)}
	}
	for p, sum := range ok {
		if contested[p] {
			continue
		}
		loss := 1 - sum/float64(cnt[p])
		switch {
		case loss > s.cfg.MaxProbeLoss:
			out[p] = lastGood{value: s.cfg.UnreachableMS, loss: loss, unreachable: true}
		case n[p] > 0:
			out[p] = lastGood{value: rtt[p] / float64(n[p]), loss: loss}
		default:
			s.ignore(seen, querySuccess, reasonIncomplete, pairMetric(p),
				"prom: a pair answered its probes but has no RTT; not measured this round", "loss", loss)
		}
	}
	for p := range rtt {
		if _, measured := ok[p]; !measured && !contested[p] {
			s.ignore(seen, queryLatency, reasonIncomplete, pairMetric(p),
				"prom: a pair has an RTT but no probe success ratio; not measured this round")
		}
	}
	return out, contested
}

// trusted says whether a probe series of pair p comes from the scrape that should produce it
// (pinned); one that does not is ignored, counted (reason untrusted) and logged once per streak.
func (s *Source) trusted(seen map[string]bool, query string, p Pair, smp *model.Sample) bool {
	if s.pinned(p, smp.Metric) {
		return true
	}
	s.ignore(seen, query, reasonUntrusted, smp.Metric,
		"prom: ignoring a probe series that no target of the probe job produces (its labels are not those of the pair's target in Prometheus's /api/v1/targets)",
		"job", s.cfg.ProbeJob)
	return false
}

// parseCalls turns the calls vector into requests/s per edge, summing several series of an
// edge and reporter, and keeping, of the two reporters, the source's when it reports the edge.
// An edge with an end outside the managed namespaces is dropped uncounted.
func (s *Source) parseCalls(vec model.Vector, seen map[string]bool) map[CallEdge]lastGood {
	bySource, byDest, other := map[CallEdge]float64{}, map[CallEdge]float64{}, map[CallEdge]float64{}
	for _, smp := range vec {
		e := CallEdge{
			From: Workload{Name: string(smp.Metric[LabelSourceWorkload]), Namespace: string(smp.Metric[LabelSourceWorkloadNamespace])},
			To:   Workload{Name: string(smp.Metric[LabelDestinationWorkload]), Namespace: string(smp.Metric[LabelDestinationWorkloadNamespace])},
		}
		if e.From.Name == "" || e.From.Namespace == "" || e.To.Name == "" || e.To.Namespace == "" {
			s.ignore(seen, queryCalls, reasonMissingLabel, smp.Metric, "prom: ignoring a call series without its workload labels",
				"labels", []string{LabelSourceWorkload, LabelSourceWorkloadNamespace, LabelDestinationWorkload, LabelDestinationWorkloadNamespace})
			continue
		}
		if !s.managed(e.From.Namespace) || !s.managed(e.To.Namespace) {
			continue // not read: outside the managed namespaces (Config.Namespaces)
		}
		v := float64(smp.Value)
		if smp.Histogram != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			s.ignore(seen, queryCalls, reasonBadValue, smp.Metric, "prom: ignoring a call rate that is NaN, infinite, negative or a histogram", "value", smp.Value.String())
			continue
		}
		switch r, has := smp.Metric[LabelReporter]; {
		case !has:
			other[e] += v
		case r == "source":
			bySource[e] += v
		case r == "destination":
			byDest[e] += v
		default:
			s.ignore(seen, queryCalls, reasonBadValue, smp.Metric, "prom: ignoring a call series of an unknown reporter (want source or destination)")
		}
	}
	rates := map[CallEdge]lastGood{}
	add := func(e CallEdge, v float64) {
		rate := rates[e]
		rate.value += v
		rates[e] = rate
	}
	for e, v := range bySource {
		add(e, v)
	}
	for e, v := range byDest {
		if _, dup := bySource[e]; !dup {
			add(e, v)
		}
	}
	for e, v := range other {
		add(e, v)
	}
	return rates
}

// managed says whether namespace ns is one of Config.Namespaces (all are when it is empty).
func (s *Source) managed(ns string) bool {
	return len(s.namespaces) == 0 || s.namespaces[ns]
}
