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

// discoverScrape reads the probe job's scrape interval from Prometheus's targets API, unless it
// is configured or already known.
func (s *Source) discoverScrape(ctx context.Context) {
	if s.scrapeFrom != "default" {
		return
	}
	d, err := s.targetsInterval(ctx)
	if err != nil {
		if !s.scrapeWarned && ctx.Err() == nil {
			s.scrapeWarned = true
			s.log.Warn("prom: the probe job's scrape interval is not known yet; assuming the default", "job", s.cfg.ProbeJob,
				"scrape_interval", s.scrape, "window", s.windowFor(), "reason", err)
		}
		return
	}
	s.scrape, s.scrapeFrom = d, "prometheus"
	s.log.Info("prom: the probe job's scrape interval, from Prometheus's targets", "job", s.cfg.ProbeJob, "scrape_interval", d, "window", s.windowFor())
}

// targetsInterval is the largest scrape interval of the probe job's active targets.
//
// It asks /api/v1/targets and decodes the answer by hand, through the Source's client (the same
// authentication, transport and response-size cap as the queries), because client_golang's
// API lacks the field: v1.API.Targets (client_golang v1.25.0) decodes each active target into a
// v1.ActiveTarget, which has no scrapeInterval, and cannot ask for the active targets only
// (?state=active).
func (s *Source) targetsInterval(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	u := s.client.URL("/api/v1/targets", nil)
	u.RawQuery = url.Values{"state": {"active"}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, err
	}
	resp, body, err := s.client.Do(ctx, req)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /api/v1/targets: %s", resp.Status)
	}
	var r struct {
		Data struct {
			ActiveTargets []struct {
				Labels         map[string]string `json:"labels"`
				ScrapeInterval string            `json:"scrapeInterval"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, fmt.Errorf("GET /api/v1/targets: %w", err)
	}
	var longest time.Duration
	for _, t := range r.Data.ActiveTargets {
		if t.Labels["job"] != s.cfg.ProbeJob || t.ScrapeInterval == "" {
			continue
		}
		d, err := model.ParseDuration(t.ScrapeInterval)
		if err != nil {
			return 0, fmt.Errorf("GET /api/v1/targets: scrapeInterval %q: %w", t.ScrapeInterval, err)
		}
		longest = max(longest, time.Duration(d))
	}
	if longest <= 0 {
		return 0, fmt.Errorf("no active target of job %q with a scrapeInterval", s.cfg.ProbeJob)
	}
	return longest, nil
}
