package estimate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
)

// ResponseTime is one service's mean response time over one window: what lata-q's model
// predicted for the plan in force, and what was measured, both in milliseconds, and the number
// of requests the measurement rests on.
type ResponseTime struct {
	Service     string
	PredictedMS float64
	MeasuredMS  float64
	// Requests is the number of requests the service completed in the window; a window with
	// fewer than BreakerConfig.MinRequests is no measurement.
	Requests float64
}

// BreakerConfig sets a Breaker's rules. The zero value of a field means its default.
type BreakerConfig struct {
	// Threshold is the relative error (measured − predicted) / predicted above which a window
	// is bad: only a measurement slower than the prediction counts. Default 0.5.
	Threshold float64
	// TripAfter is K: that many consecutive bad windows trip a service. Default 3.
	TripAfter int
	// ResetAfter is M: that many consecutive good windows reset a tripped service. Default 5
	// (more than TripAfter: hysteresis, so that a model near the threshold does not flap).
	ResetAfter int
	// MinRequests is the sample floor: a window in which the service completed fewer requests
	// changes nothing for it, as a missing one (the mean of a few requests' times says little).
	// Default 0: every window counts.
	MinRequests float64
	// MinErrorMS is the least excess, measured over predicted, that makes a window bad,
	// whatever the ratio: a bad window is slower than predicted by more than Threshold of the
	// prediction and by more than MinErrorMS. A pod whose own time is about a millisecond (a
	// CPU-limited pod's work below its quota, which lata-q's quota model predicts: the CPU a
	// request takes) shows its server library's and its node's scheduling overhead as a large
	// ratio, and the breaker is for a queueing model gone wrong, whose errors are queues.
	// Default 1 ms.
	MinErrorMS float64
}

func (c BreakerConfig) withDefaults() (BreakerConfig, error) {
	if c.Threshold == 0 {
		c.Threshold = 0.5
	}
	if c.TripAfter == 0 {
		c.TripAfter = 3
	}
	if c.ResetAfter == 0 {
		c.ResetAfter = 5
	}
	if c.MinErrorMS == 0 {
		c.MinErrorMS = 1
	}
	switch {
	case !(c.Threshold > 0) || math.IsInf(c.Threshold, 0):
		return c, fmt.Errorf("%w: breaker Threshold %v: want a positive number", ErrInvalidConfig, c.Threshold)
	case c.TripAfter < 1:
		return c, fmt.Errorf("%w: breaker TripAfter %d: want at least 1", ErrInvalidConfig, c.TripAfter)
	case c.ResetAfter < 1:
		return c, fmt.Errorf("%w: breaker ResetAfter %d: want at least 1", ErrInvalidConfig, c.ResetAfter)
	case !(c.MinRequests >= 0) || math.IsInf(c.MinRequests, 0):
		return c, fmt.Errorf("%w: breaker MinRequests %v: want a finite number ≥ 0", ErrInvalidConfig, c.MinRequests)
	case !(c.MinErrorMS > 0) || math.IsInf(c.MinErrorMS, 0):
		return c, fmt.Errorf("%w: breaker MinErrorMS %v: want a positive number", ErrInvalidConfig, c.MinErrorMS)
	}
	return c, nil
}

// BreakerState is one service's breaker.
type BreakerState struct {
	Service string
	// Tripped says the service should fall back to lata: lata-q's model does not describe it.
	Tripped bool
	// Reason says why it tripped, for /readyz and the log; empty while not tripped.
	Reason string
	// BadWindows and GoodWindows are the current streaks of consecutive windows over and
	// within the threshold (one of them is 0).
	BadWindows, GoodWindows int
	// RelativeError is the last window's |measured − predicted| / predicted.
	RelativeError float64
}

// Breaker is the model-error breaker: per service, it compares the response time lata-q
// predicted with the one measured, window by window, and trips the service to "fall back to
// lata" after BreakerConfig.TripAfter consecutive windows with a relative error over
// BreakerConfig.Threshold; a tripped service resets after BreakerConfig.ResetAfter consecutive
// good windows. A window without a ResponseTime for a service (no traffic, no prediction), or
// with fewer than BreakerConfig.MinRequests requests, changes nothing for it: stale or thin data
// neither trips nor resets. While a service is tripped the
// caller should go on passing the model's prediction for the plan in force (lata's), so that
// the breaker can see the model become right again.
//
// Create it with NewBreaker; its methods are safe for concurrent use (Observe from the loop,
// States from /readyz and the metrics).
type Breaker struct {
	cfg BreakerConfig

	mu       sync.Mutex
	services map[string]*BreakerState
}

// NewBreaker returns a Breaker with cfg's rules (zero fields take their defaults), or an error
// wrapping ErrInvalidConfig.
func NewBreaker(cfg BreakerConfig) (*Breaker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Breaker{cfg: cfg, services: make(map[string]*BreakerState)}, nil
}

// Observe takes one window's response times, at most one per service, and returns the states
// of the services that tripped or reset in it (for the log), sorted by service. An entry under
// the sample floor is passed over. An invalid entry (empty service, a predicted time not
// positive and finite, a measured time or a request count negative or not finite, a service
// given twice) is skipped, and the error returned joins one error per
// such entry, each wrapping ErrInvalidSample and naming the service.
func (b *Breaker) Observe(window []ResponseTime) ([]BreakerState, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	var changed []BreakerState
	seen := make(map[string]bool, len(window))
	for _, r := range window {
		if err := validateResponse(r, seen); err != nil {
			errs = append(errs, err)
			continue
		}
		seen[r.Service] = true
		if r.Requests < b.cfg.MinRequests {
			continue
		}
		st := b.services[r.Service]
		if st == nil {
			st = &BreakerState{Service: r.Service}
			b.services[r.Service] = st
		}
		if b.step(st, r) {
			changed = append(changed, *st)
		}
	}
	slices.SortFunc(changed, byService)
	return changed, errors.Join(errs...)
}

func validateResponse(r ResponseTime, seen map[string]bool) error {
	switch {
	case r.Service == "":
		return fmt.Errorf("%w: response time with an empty service", ErrInvalidSample)
	case seen[r.Service]:
		return fmt.Errorf("%w: service %q: given twice in one window", ErrInvalidSample, r.Service)
	case !(r.PredictedMS > 0) || math.IsInf(r.PredictedMS, 0):
		return fmt.Errorf("%w: service %q: predicted response time %v ms, want a finite number > 0", ErrInvalidSample, r.Service, r.PredictedMS)
	case !(r.MeasuredMS >= 0) || math.IsInf(r.MeasuredMS, 0):
		return fmt.Errorf("%w: service %q: measured response time %v ms, want a finite number ≥ 0", ErrInvalidSample, r.Service, r.MeasuredMS)
	case !(r.Requests >= 0) || math.IsInf(r.Requests, 0):
		return fmt.Errorf("%w: service %q: %v requests, want a finite number ≥ 0", ErrInvalidSample, r.Service, r.Requests)
	}
	return nil
}

// step applies one window to a service's state and says whether Tripped changed.
func (b *Breaker) step(st *BreakerState, r ResponseTime) bool {
	st.RelativeError = math.Abs(r.MeasuredMS-r.PredictedMS) / r.PredictedMS
	// Only the unsafe direction is bad: measured slower than predicted. A model that predicts
	// more than is measured (M/M/1 at the lower confidence bound of μ, near the cap, over-
	// predicts) plans conservatively; falling back to lata there would undo the capacities that
	// keep slow pods from being overloaded.
	if r.MeasuredMS-r.PredictedMS > b.cfg.MinErrorMS && st.RelativeError > b.cfg.Threshold {
		st.BadWindows++
		st.GoodWindows = 0
		if !st.Tripped && st.BadWindows >= b.cfg.TripAfter {
			st.Tripped = true
			st.Reason = fmt.Sprintf("measured response time %.3g ms against %.3g ms predicted "+
				"(relative error %.2f > %.2f) for %d consecutive windows: falling back to lata",
				r.MeasuredMS, r.PredictedMS, st.RelativeError, b.cfg.Threshold, st.BadWindows)
			return true
		}
		return false
	}
	st.GoodWindows++
	st.BadWindows = 0
	if st.Tripped && st.GoodWindows >= b.cfg.ResetAfter {
		st.Tripped = false
		st.Reason = ""
		return true
	}
	return false
}

// State returns one service's state; a service the breaker has not seen is not tripped.
func (b *Breaker) State(service string) BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st := b.services[service]; st != nil {
		return *st
	}
	return BreakerState{Service: service}
}

// States returns every service's state, sorted by service.
func (b *Breaker) States() []BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]BreakerState, 0, len(b.services))
	for _, st := range b.services {
		out = append(out, *st)
	}
	slices.SortFunc(out, byService)
	return out
}

// byService orders states by service, for slices.SortFunc.
func byService(x, y BreakerState) int { return strings.Compare(x.Service, y.Service) }

// Tripped returns the services tripped now, sorted.
func (b *Breaker) Tripped() []string {
	var out []string
	for _, st := range b.States() {
		if st.Tripped {
			out = append(out, st.Service)
		}
	}
	return out
}
