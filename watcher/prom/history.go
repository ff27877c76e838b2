package prom

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/common/model"
)

// LoadHistory reads the pod loads of the last windows windows from Prometheus's history: the
// pod-load queries as instant queries evaluated at t0 − (windows−1)·w, …, t0 − w, t0, with w the
// window the Source uses now and t0 now (Config.Clock). It returns one Measurements per window
// that answered, oldest first, each holding only Load (PodLoad.Window w, none stale), Window
// (w) and At (the window's evaluation time, its end), and with the call-attempt queries on
// (Config.AttemptsQuery) the window's Attempts (AttemptsRead; a window whose call-attempt
// query failed has none and says so, and the reading goes on). A capacity estimator and a
// latency corrector that start (a restart, a failover) are fed them before the first live
// window, so that they start warm.
//
// The answers are read by the rules of the live rounds: a series without its pod labels or with
// a bad value is ignored and counted (and logged once for the whole history); a pod contested in
// any pod-load query (series from more than one scrape) is left out of that window; pods outside
// Config.Namespaces are not read; a pod's inbound, downstream or CPU value is 0 without a series.
// Nothing of the live state changes: not the last good values, the snapshot last delivered
// (hysteresis), the contested sets, the series reported, nor Status.
//
// History is best effort. A window in which no pod answered the requests query is left out. A
// query that fails (an error, a timeout, an answer over a cap) ends the reading, logged at warn:
// the windows newer than it are returned and the older ones are not asked (the windows are read
// newest first), so a Prometheus that hangs costs one query's Config.Timeout (and the targets
// read's, below), not 4 × windows of them. With the pod-load queries off (DisableLoad), or
// windows 0, it returns nil and asks nothing.
//
// When the window follows the probe job's scrape interval (Config.Window zero), it first reads
// that interval from Prometheus's targets as the first round would. LoadHistory reads state
// Run's rounds own: call it before Run, on the goroutine that then calls Run. It returns an
// error for a negative windows, or once Run has started.
func (s *Source) LoadHistory(ctx context.Context, windows int) ([]*Measurements, error) {
	switch {
	case windows < 0:
		return nil, fmt.Errorf("prom: history of %d windows: want 0 or more", windows)
	case s.running.Load():
		return nil, errors.New("prom: LoadHistory called after Run")
	case windows == 0 || s.cfg.PodRequestsQuery == DisableLoad:
		return nil, nil
	}
	now := s.cfg.Clock.Now()
	s.discoverTargets(ctx, now)
	w := s.windowFor()
	queries := loadQueries(&s.cfg)
	seen := map[string]bool{} // the series ignored so far: each is logged once for the history
	var out []*Measurements
	for i := range windows {
		at := now.Add(-time.Duration(i) * w)
		var vecs [loadSignals]model.Vector
		for sig, q := range queries {
			if q == DisableLoad {
				continue
			}
			vec, err := s.query(ctx, loadQueryNames[sig], s.expand(q, w), at)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("prom: cannot read the pod loads' history; the windows older than this one are not read",
						"at", at, "window", w, "windows_read", len(out), "error", err)
				}
				slices.Reverse(out)
				return out, nil
			}
			vecs[sig] = vec
		}
		if m := s.historyWindow(vecs, w, at, seen); m != nil {
			count, secs, on, err := s.queryAttemptsAt(ctx, w, at)
			if on && err == nil {
				m.Attempts, m.AttemptsRead = s.parseAttempts(count, secs, seen), true
			}
			out = append(out, m)
		} else {
			s.log.Debug("prom: no pod load in a window of history; left out", "at", at, "window", w)
		}
	}
	slices.Reverse(out)
	return out, nil
}

// historyWindow makes one window of history from its pod-load vectors (parseLoad's rules): the
// pods the requests query answered for, without those contested in any query, sorted by
// namespace then pod; nil when there is none.
func (s *Source) historyWindow(vecs [loadSignals]model.Vector, w time.Duration, at time.Time, seen map[string]bool) *Measurements {
	values, contested := s.parseLoad(vecs, w, seen)
	var load []PodLoad
	for p, req := range values[loadRequests] {
		if slices.ContainsFunc(contested[:], func(c map[PodRef]bool) bool { return c[p] }) {
			continue
		}
		load = append(load, PodLoad{Namespace: p.Namespace, Pod: p.Name, Window: w, Requests: req.value,
			InboundMSSum: values[loadInbound][p].value, DownstreamMSSum: values[loadDownstream][p].value, CPUSeconds: values[loadCPU][p].value})
	}
	if len(load) == 0 {
		return nil
	}
	slices.SortFunc(load, func(a, b PodLoad) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod))
	})
	return &Measurements{Load: load, Window: w, At: at}
}
