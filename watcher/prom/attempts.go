package prom

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// The call-attempt queries: proxyless gRPC callers' own timing of each call attempt, by the
// callee band the attempt went to. grpc-go's OpenTelemetry plugin records
// grpc.client.attempt.duration with the optional label grpc.lb.locality (gRFC A78/A94: the
// picked endpoint's locality; grpc-go stats/opentelemetry, client_metrics.go), and
// OpenTelemetry's Prometheus exporter names it grpc_client_attempt_duration_seconds with the
// labels grpc_target and grpc_lb_locality. Under edgeflow's bands policy a locality's zone is
// the callee pods' node (xds.BandSubZone), so a caller pod's attempts by locality are its
// requests' time to each node: what the latency correction (estimate.LatencyCorrector) reads.

// Attempt is what one caller pod's attempts to one target at one locality took over one window:
// window totals, as PodLoad's.
type Attempt struct {
	// Namespace and Pod name the caller pod as the scrape's labels do (LabelNamespace,
	// LabelPod).
	Namespace, Pod string
	// Target is the gRPC target the caller dialled (LabelGRPCTarget), e.g. "xds:///reviews".
	Target string
	// Locality is the picked endpoints' xDS locality as grpc-go writes it (LabelGRPCLocality;
	// ParseGRPCLocality reads it).
	Locality string
	// Attempts is the number of attempts completed in the window (Config.AttemptsQuery);
	// Seconds their summed duration (Config.AttemptSecondsQuery). Attempts without a Seconds
	// series have Seconds 0 and are dropped by the Source.
	Attempts, Seconds float64
}

// Labels of the call-attempt series (OpenTelemetry's Prometheus exporter turns grpc-go's dots
// into underscores).
const (
	LabelGRPCTarget   = "grpc_target"
	LabelGRPCLocality = "grpc_lb_locality"
)

// The default call-attempt queries: per caller pod, target and locality, the attempts completed
// in the window and their summed duration in seconds. An attempt without a locality (grpc-go
// leaves the label empty when the picker has none) says nothing of a band and is left out.
const (
	DefaultAttemptsQuery = `sum by (namespace, pod, grpc_target, grpc_lb_locality)` +
		` (increase(grpc_client_attempt_duration_seconds_count{grpc_lb_locality!=""}[$window]))`
	DefaultAttemptSecondsQuery = `sum by (namespace, pod, grpc_target, grpc_lb_locality)` +
		` (increase(grpc_client_attempt_duration_seconds_sum{grpc_lb_locality!=""}[$window]))`
)

// DisableAttempts as Config.AttemptsQuery turns the call-attempt queries off.
const DisableAttempts = "-"

// The call-attempt queries' names, as in the metrics' query label.
const (
	queryAttempts       = "attempts"
	queryAttemptSeconds = "attempt_seconds"
)

// attemptKey is one caller pod's series to one target at one locality.
type attemptKey struct{ namespace, pod, target, locality string }

// queryAttempts runs the call-attempt queries unless they are off (on false); err joins their
// failures: then the round says nothing about attempts, which is not the same as none.
func (s *Source) queryAttempts(ctx context.Context, window time.Duration) (count, secs model.Vector, on bool, err error) {
	return s.queryAttemptsAt(ctx, window, time.Time{})
}

// queryAttemptsAt is queryAttempts evaluated at at (zero: now), for the history.
func (s *Source) queryAttemptsAt(ctx context.Context, window time.Duration, at time.Time) (count, secs model.Vector, on bool, err error) {
	if s.cfg.AttemptsQuery == DisableAttempts {
		return nil, nil, false, nil
	}
	count, cErr := s.query(ctx, queryAttempts, s.expand(s.cfg.AttemptsQuery, window), at)
	secs, sErr := s.query(ctx, queryAttemptSeconds, s.expand(s.cfg.AttemptSecondsQuery, window), at)
	return count, secs, true, errors.Join(cErr, sErr)
}

// parseAttempts pairs the call-attempt queries' answers into the window's attempts, sorted by
// caller pod, target and locality: a series of one without the other's, or with no attempts,
// is left out. Caller pods outside the managed namespaces are dropped uncounted; a series
// without its labels, or with a value that is NaN, infinite, negative or a histogram, is
// ignored and counted as the other queries' are.
func (s *Source) parseAttempts(count, secs model.Vector, seen map[string]bool) []Attempt {
	n := s.sumAttempts(queryAttempts, count, seen)
	sum := s.sumAttempts(queryAttemptSeconds, secs, seen)
	var out []Attempt
	for k, c := range n {
		if v, has := sum[k]; has && c > 0 {
			out = append(out, Attempt{Namespace: k.namespace, Pod: k.pod, Target: k.target, Locality: k.locality, Attempts: c, Seconds: v})
		}
	}
	slices.SortFunc(out, func(a, b Attempt) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Pod, b.Pod),
			strings.Compare(a.Target, b.Target), strings.Compare(a.Locality, b.Locality))
	})
	return out
}

// sumAttempts sums one call-attempt vector per caller pod, target and locality.
func (s *Source) sumAttempts(name string, vec model.Vector, seen map[string]bool) map[attemptKey]float64 {
	out := map[attemptKey]float64{}
	for _, smp := range vec {
		k := attemptKey{namespace: string(smp.Metric[LabelNamespace]), pod: string(smp.Metric[LabelPod]),
			target: string(smp.Metric[LabelGRPCTarget]), locality: string(smp.Metric[LabelGRPCLocality])}
		if k.namespace == "" || k.pod == "" || k.target == "" || k.locality == "" {
			s.ignore(seen, name, reasonMissingLabel, smp.Metric, "prom: ignoring a call-attempt series without its labels",
				"labels", []string{LabelNamespace, LabelPod, LabelGRPCTarget, LabelGRPCLocality})
			continue
		}
		if !s.managed(k.namespace) {
			continue
		}
		v := float64(smp.Value)
		if smp.Histogram != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			s.ignore(seen, name, reasonBadValue, smp.Metric, "prom: ignoring a call-attempt value that is NaN, infinite, negative or a histogram",
				"value", smp.Value.String())
			continue
		}
		out[k] += v
	}
	return out
}

// attemptsFailed records the call-attempt queries' failure in the last round, or that they
// succeeded (nil): Status's AttemptsReason, and a log line once per failure streak and reason.
func (s *Source) attemptsFailed(err error) {
	s.sideQueriesFailed(&s.status.AttemptsReason, err, "prom: call-attempt queries failed; the latency correction takes no window until they answer",
		"prom: call-attempt queries succeed again")
}
