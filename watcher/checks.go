package watcher

import (
	"fmt"
	"strings"
	"time"

	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/kube"
)

// Check is the state of one input, for /readyz.
type Check struct {
	Name string
	OK   bool
	// Message says what is wrong (or, when OK, a short state).
	Message string
}

// Checks reports each input's state: kubernetes (synced, watches failing), prometheus (the
// last query round), latency (names that match no node, the degraded plan, contested node pairs
// and pods; unreachable pairs named, not failed)
// and, with a model-error breaker, closed-loop (the services it tripped, served as lata: OK
// all the same, for the plan still serves them). It is safe for concurrent use.
func (c *Live) Checks() []Check {
	k := Check{Name: "kubernetes", OK: c.cfg.Kube.Synced(), Message: "informer caches synced"}
	if !k.OK {
		k.Message = "informer caches not synced yet"
	}
	if fails := c.cfg.Kube.WatchFailures(); len(fails) > 0 {
		k.OK = false
		var parts []string
		for _, f := range fails {
			parts = append(parts, fmt.Sprintf("%s: failing since %s: %v", f.Informer, f.Since.Format(time.RFC3339), f.Err))
		}
		k.Message = strings.Join(parts, "; ") + "; serving the last known state"
	}
	if st := c.cfg.Kube.Current(); st != nil && len(st.Refused) > 0 {
		// Not failed: the services within the bound are served in full.
		k.Message += fmt.Sprintf("; %d managed services beyond --max-managed-services refused: %s", len(st.Refused), kube.ListRefused(st.Refused))
	}
	checks := []Check{k}
	if c.cfg.Prom == nil {
		return checks
	}
	st := c.cfg.Prom.Status()
	ck := Check{Name: "prometheus", OK: st.OK, Message: fmt.Sprintf("%s: last query %s; window %v (scrape interval %v, %s)",
		c.cfg.Prom.URL(), st.LastSuccess.Format(time.RFC3339), st.Window, st.ScrapeInterval, st.ScrapeIntervalFrom)}
	if !st.OK {
		ck.Message = st.Reason
		if !st.Since.IsZero() {
			ck.Message += fmt.Sprintf(" (failing since %s", st.Since.Format(time.RFC3339))
			if st.Synced {
				ck.Message += "; serving the last good weights"
			}
			ck.Message += ")"
		}
	}
	if st.OK && st.LoadReason != "" { // the pod loads are an extra: their failure is no failed check
		ck.Message += "; pod-load queries failing, keeping the pods' last good loads: " + st.LoadReason
	}
	if st.OK && st.AttemptsReason != "" { // as the pod loads: the latency correction waits
		ck.Message += "; call-attempt queries failing, the latency correction takes no window: " + st.AttemptsReason
	}
	checks = append(checks, ck)
	if c.capacity != nil && c.capacity.breaker != nil {
		checks = append(checks, breakerCheck(c.capacity.breaker.States()))
	}
	c.mu.Lock()
	ls := c.latency
	c.mu.Unlock()
	if !ls.merged {
		return checks
	}
	lat := Check{Name: "latency", OK: true, Message: "measured"}
	var problems []string
	if len(ls.unmatched) > 0 {
		problems = append(problems, fmt.Sprintf("latency labels naming no node (--node-match=%s): %s", c.cfg.NodeMatch, listed(ls.unmatched, maxListed)))
	}
	if !ls.usable {
		problems = append(problems, "no usable latency measurement: serving the capacity-weighted plan (every node pair equal) until one arrives")
	}
	if len(problems) > 0 {
		lat.OK, lat.Message = false, strings.Join(problems, "; ")
	}
	if ls.unreach != "" {
		lat.Message += "; unreachable pairs (at the unreachable latency): " + ls.unreach
	}
	if ls.contested != "" {
		// Degraded (/readyz stays 200: a pusher that can add a series must not take replicas
		// out of service).
		lat.OK = false
		lat.Message += "; contested (series from more than one scrape; their last trusted values kept): " + ls.contested
	}
	lat.Message += "; " + ls.why
	return append(checks, lat)
}

// breakerCheck is the closed-loop check: the services the model-error breaker tripped, each
// with why. It is OK either way: a tripped service is served as lata, not failed.
func breakerCheck(states []estimate.BreakerState) Check {
	var tripped []string
	for _, st := range states {
		if st.Tripped {
			tripped = append(tripped, fmt.Sprintf("%s (%s)", st.Service, st.Reason))
		}
	}
	ck := Check{Name: "closed-loop", OK: true, Message: fmt.Sprintf("model-error breaker: no service tripped (%d judged)", len(states))}
	if len(tripped) > 0 {
		ck.Message = "model-error breaker tripped, served as lata: " + strings.Join(tripped, "; ")
	}
	return ck
}

// maxListed bounds the names one /readyz line or log line lists: the names come from
// Prometheus labels, which any pod that can push a series may multiply.
const maxListed = 10

// listed joins names with ", ", at most limit of them (0: all), followed by how many more there
// are.
func listed(names []string, limit int) string {
	if limit > 0 && len(names) > limit {
		return strings.Join(names[:limit], ", ") + fmt.Sprintf(" and %d more", len(names)-limit)
	}
	return strings.Join(names, ", ")
}
