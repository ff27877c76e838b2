package prom

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// windowFor is the window of the queries given the scrape interval in use.
func (s *Source) windowFor() time.Duration {
	if s.cfg.Window > 0 {
		return s.cfg.Window
	}
	return WindowScrapes * s.scrape
}

// expand substitutes the placeholders of a query.
func (s *Source) expand(q string, window time.Duration) string {
	return strings.NewReplacer(WindowVar, model.Duration(window).String(), ScrapeIntervalVar, model.Duration(s.scrape).String(), JobVar, s.cfg.ProbeJob,
		SourceLabelVar, s.cfg.SourceLabel, TargetLabelVar, s.cfg.TargetLabel).Replace(q)
}

// discoverTargets reads the probe job's active targets from Prometheus's targets API, at most
// once per scrape interval: their scrape interval, unless it is configured or already known,
// and, with ProbePins PinTargets, their labels (the pins). A failed read keeps the pins last
// read (none before the first: every probe series is then untrusted) and is logged once per
// streak.
func (s *Source) discoverTargets(ctx context.Context, now time.Time) {
	needPins := s.cfg.ProbePins == PinTargets
	if s.scrapeFrom != "default" && (!needPins || (!s.pinsAt.IsZero() && now.Sub(s.pinsAt) < s.scrape)) {
		return
	}
	d, pins, err := s.readTargets(ctx)
	if err != nil {
		if !s.targetsWarned && ctx.Err() == nil {
			s.targetsWarned = true
			if s.scrapeFrom == "default" {
				s.log.Warn("prom: the probe job's scrape interval is not known yet; assuming the default", "job", s.cfg.ProbeJob,
					"scrape_interval", s.scrape, "window", s.windowFor(), "reason", err)
			}
			if needPins {
				s.log.Warn("prom: cannot read the probe job's targets; keeping the pins last read (none: no probe series is trusted)",
					"job", s.cfg.ProbeJob, "pinned_pairs", len(s.pins), "reason", err)
			}
		}
		return
	}
	s.targetsWarned = false
	if needPins {
		s.pins, s.pinsAt = pins, now
	}
	if s.scrapeFrom == "default" {
		s.scrape, s.scrapeFrom = d, "prometheus"
		s.log.Info("prom: the probe job's scrape interval, from Prometheus's targets", "job", s.cfg.ProbeJob, "scrape_interval", d, "window", s.windowFor())
	}
}

// pinned says whether a probe series of pair p carries every label of one of p's targets.
// With ProbePins PinOff every series is.
func (s *Source) pinned(p Pair, m model.Metric) bool {
	if s.cfg.ProbePins == PinOff {
		return true
	}
next:
	for _, t := range s.pins[p] {
		for k, v := range t {
			if m[k] != v {
				continue next
			}
		}
		return true
	}
	return false
}

// readTargets reads the probe job's active targets: the largest scrape interval, and the
// labels of each target by node pair (its SourceLabel and TargetLabel).
//
// It asks /api/v1/targets and decodes the answer by hand, through the Source's client (the same
// authentication, transport and response-size cap as the queries), because client_golang's
// API lacks the field: v1.API.Targets (client_golang v1.25.0) decodes each active target into a
// v1.ActiveTarget, which has no scrapeInterval, and cannot ask for the active targets only
// (?state=active). The targets' labels are Prometheus's own (its scrape configuration after
// relabelling): no scraped sample can add a target.
func (s *Source) readTargets(ctx context.Context) (time.Duration, map[Pair][]model.LabelSet, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	u := s.client.URL("/api/v1/targets", nil)
	u.RawQuery = url.Values{"state": {"active"}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, nil, err
	}
	resp, body, err := s.client.Do(ctx, req)
	if err != nil {
		return 0, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("GET /api/v1/targets: %s", resp.Status)
	}
	var r struct {
		Data struct {
			ActiveTargets []struct {
				Labels         model.LabelSet `json:"labels"`
				ScrapeInterval string         `json:"scrapeInterval"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, nil, fmt.Errorf("GET /api/v1/targets: %w", err)
	}
	var longest time.Duration
	pins := map[Pair][]model.LabelSet{}
	for _, t := range r.Data.ActiveTargets {
		if string(t.Labels[LabelJob]) != s.cfg.ProbeJob {
			continue
		}
		from, to := t.Labels[model.LabelName(s.cfg.SourceLabel)], t.Labels[model.LabelName(s.cfg.TargetLabel)]
		if from != "" && to != "" {
			p := Pair{From: string(from), To: string(to)}
			pins[p] = append(pins[p], t.Labels)
		}
		if t.ScrapeInterval == "" {
			continue
		}
		d, err := model.ParseDuration(t.ScrapeInterval)
		if err != nil {
			return 0, nil, fmt.Errorf("GET /api/v1/targets: scrapeInterval %q: %w", t.ScrapeInterval, err)
		}
		longest = max(longest, time.Duration(d))
	}
	if longest <= 0 {
		return 0, nil, fmt.Errorf("no active target of job %q with a scrapeInterval", s.cfg.ProbeJob)
	}
	return longest, pins, nil
}
