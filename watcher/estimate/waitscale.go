package estimate

import (
	"fmt"
	"math"
	"slices"
	"sync"
)

// WaitWindow is one service's queueing over one window, summed over its pods: the wait measured
// (own time less the CPU a request takes, times requests, in ms) and the wait lata-q's model
// predicts for each pod at the load the pod carried in the window (the same sum), and the
// requests they rest on.
type WaitWindow struct {
	Service                 string
	MeasuredMS, PredictedMS float64
	Requests                float64
}

// WaitScaleConfig sets a WaitScaler's rules. The zero value of a field means its default.
type WaitScaleConfig struct {
	// Windows is how many windows a scale sums, the latest ones a service had. Default 3.
	Windows int
	// MinRequests is the sample floor: a window of a service with fewer requests changes
	// nothing for it. Default DefaultMinRequests.
	MinRequests float64
	// MinPredictedMS is the least mean wait (ms a request) the model must predict in a window
	// for the window to count: where the model predicts almost no wait, a measured overhead of
	// a fraction of a millisecond says nothing of its queueing. Default 0.5 ms.
	MinPredictedMS float64
	// Floor is the least scale: the model's wait is never priced below this share of itself,
	// so a plan made where nothing queues still sees the wall at a pod's capacity. Default 0.05.
	Floor float64
	// Hysteresis is the relative move of a service's scale, from the one in force, below which
	// the one in force stays (each change re-plans). Default 0.1.
	Hysteresis float64
}

func (c WaitScaleConfig) withDefaults() (WaitScaleConfig, error) {
	if c.Windows == 0 {
		c.Windows = 3
	}
	if c.MinRequests == 0 {
		c.MinRequests = DefaultMinRequests
	}
	if c.MinPredictedMS == 0 {
		c.MinPredictedMS = 0.5
	}
	if c.Floor == 0 {
		c.Floor = 0.05
	}
	if c.Hysteresis == 0 {
		c.Hysteresis = 0.1
	}
	switch {
	case c.Windows < 1:
		return c, fmt.Errorf("%w: wait scale Windows %d: want at least 1", ErrInvalidConfig, c.Windows)
	case !(c.MinRequests >= 0) || math.IsInf(c.MinRequests, 0):
		return c, fmt.Errorf("%w: wait scale MinRequests %v: want a finite number ≥ 0", ErrInvalidConfig, c.MinRequests)
	case !(c.MinPredictedMS > 0) || math.IsInf(c.MinPredictedMS, 0):
		return c, fmt.Errorf("%w: wait scale MinPredictedMS %v: want a positive number", ErrInvalidConfig, c.MinPredictedMS)
	case !(c.Floor > 0 && c.Floor <= 1):
		return c, fmt.Errorf("%w: wait scale Floor %v: want a number in (0, 1]", ErrInvalidConfig, c.Floor)
	case !(c.Hysteresis >= 0 && c.Hysteresis < 1):
		return c, fmt.Errorf("%w: wait scale Hysteresis %v: want a number in [0, 1)", ErrInvalidConfig, c.Hysteresis)
	}
	return c, nil
}

// WaitScaler learns, per service, how much of the wait lata-q's quota model predicts the
// service's pods really pay: the scale is Σ measured wait / Σ predicted wait over the service's
// last Windows windows that count (each with at least MinRequests requests and a predicted mean
// wait of at least MinPredictedMS), clamped to [Floor, 1]. The model is an upper bound by design
// (optimizer's podQueue: 2.5–4.4× the simulated quota's wait at 60–90 % of a pod's capacity
// under Poisson arrivals, and more under smoother ones), and a plan on it spreads calls across
// nodes to spare pods a queue they do not have; the scale brings the price down to what is
// measured, never above the model (a model that predicts too little is the breaker's). A
// prediction is made at the load each pod really carried, so the scale needs no plan: it is
// learned as well from history as from live windows, and under any plan.
//
// A service with no window that counts among its last Windows has no scale (the model's whole
// wait): stale data decays to the model. The scale in force moves only when the new one differs
// from it by more than Hysteresis of it. Create it with NewWaitScaler; its methods are safe for
// concurrent use.
type WaitScaler struct {
	cfg WaitScaleConfig

	mu       sync.Mutex
	services map[string]*waitState
}

type waitState struct {
	windows []WaitWindow // the latest Windows of the service, oldest first (counting or not)
	scale   float64      // in force; 0: none
}

// NewWaitScaler returns a WaitScaler with cfg's rules (zero fields take their defaults), or an
// error wrapping ErrInvalidConfig.
func NewWaitScaler(cfg WaitScaleConfig) (*WaitScaler, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &WaitScaler{cfg: cfg, services: map[string]*waitState{}}, nil
}

// Observe takes one window, the services in it each at most once, and returns the scales in
// force after it, by service (a service without one is absent). A service absent from the
// window has a window without data. It rejects the whole window, changing nothing, when an
// entry is invalid (empty or repeated service; negative, NaN or infinite sums), naming it.
func (w *WaitScaler) Observe(window []WaitWindow) (map[string]float64, error) {
	seen := map[string]WaitWindow{}
	for _, x := range window {
		_, dup := seen[x.Service]
		switch {
		case x.Service == "":
			return nil, fmt.Errorf("%w: wait window without a service", ErrInvalidSample)
		case dup:
			return nil, fmt.Errorf("%w: service %q given twice in one window", ErrInvalidSample, x.Service)
		case badCount(x.MeasuredMS) || badCount(x.PredictedMS) || badCount(x.Requests):
			return nil, fmt.Errorf("%w: service %q: wait sums %v / %v ms over %v requests: want finite numbers ≥ 0",
				ErrInvalidSample, x.Service, x.MeasuredMS, x.PredictedMS, x.Requests)
		}
		seen[x.Service] = x
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for svc := range seen {
		if w.services[svc] == nil {
			w.services[svc] = &waitState{}
		}
	}
	out := map[string]float64{}
	for svc, st := range w.services {
		x, ok := seen[svc]
		if !ok {
			x = WaitWindow{Service: svc}
		}
		st.windows = append(st.windows, x)
		if len(st.windows) > w.cfg.Windows {
			st.windows = st.windows[len(st.windows)-w.cfg.Windows:]
		}
		st.scale = w.next(st)
		if st.scale == 0 && !slices.ContainsFunc(st.windows, func(x WaitWindow) bool { return x.Requests > 0 }) {
			delete(w.services, svc)
			continue
		}
		if st.scale > 0 {
			out[svc] = st.scale
		}
	}
	return out, nil
}

// next is the scale a service's windows put in force, given the one in force.
func (w *WaitScaler) next(st *waitState) float64 {
	var measured, predicted float64
	for _, x := range st.windows {
		if x.Requests >= max(w.cfg.MinRequests, 1) && x.PredictedMS >= w.cfg.MinPredictedMS*x.Requests {
			measured += x.MeasuredMS
			predicted += x.PredictedMS
		}
	}
	if predicted == 0 {
		return 0
	}
	s := min(1, max(w.cfg.Floor, measured/predicted))
	if st.scale > 0 && math.Abs(s-st.scale) <= w.cfg.Hysteresis*st.scale {
		return st.scale
	}
	return s
}

// Scales returns the scales in force, by service.
func (w *WaitScaler) Scales() map[string]float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]float64{}
	for svc, st := range w.services {
		if st.scale > 0 {
			out[svc] = st.scale
		}
	}
	return out
}
