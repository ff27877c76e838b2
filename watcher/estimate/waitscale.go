package estimate

import (
	"fmt"
	"math"
	"slices"
	"sync"
)

// WaitWindow is one pod's queueing over one window (Pod set), or one service's summed over its
// pods (Pod empty): the wait measured (own time less the CPU a request takes, times requests, in
// ms) and the wait lata-q's model predicts at the load the pod carried in the window (the same
// sum), and the requests they rest on.
type WaitWindow struct {
	Service, Pod            string
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
// service's pods really pay. The model is an upper bound by design (optimizer's podQueue:
// 2.5–4.4× the simulated quota's wait at 60–90 % of a pod's capacity under Poisson arrivals,
// and more under smoother ones), and a plan on it spreads calls across nodes to spare pods a
// queue they do not have; the scale brings the price down to what is measured, never above the
// model (a model that predicts too little is the breaker's). A prediction is made at the load
// each pod really carried, so the scale needs no plan: it is learned as well from history as
// from live windows, and under any plan.
//
// What is measured is not all queueing: a request's own time less its CPU also holds what the
// server spends on it whatever the load (the RPC library, the node's scheduler; about 1 ms a
// request on the netns testbed), and priced as wait that overhead keeps a plan spread: at a
// spread plan's loads the model predicts little, so an overhead of the same size reads as half
// the model's wait, where the local plan's loads show it a twentieth. So the scale is the slope
// of a line, measured = overhead + scale × predicted, fitted by least squares (weighted by
// requests) over the points of the service's last Windows windows that count (each with at
// least MinRequests requests): one point a pod and window, by the mean waits measured and
// predicted. Points where the model predicts under MinPredictedMS are the ones that show the
// overhead; at least one point must predict more for a scale. The fit is used where the
// predictions differ enough to tell a slope (their weighted standard deviation at least
// MinPredictedMS), it finds an overhead of zero or more, and the model is a bound there (Σ
// measured below Σ predicted over the points that predict MinPredictedMS or more); elsewhere
// the scale is that ratio (the overhead counted as wait: the higher, safe price). Where the
// measured wait is the model's or more, the pods queue more than the model says, and no fit of a
// flat line (as when the capacities in force move the predictions under a steady wait) prices
// them below it. Either is clamped to [Floor, 1].
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
	windows [][]WaitWindow // the latest Windows of the service, oldest first (counting or not): each its points
	scale   float64        // in force; 0: none
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

// Observe takes one window, each pod (or service, without pods) in it at most once, and returns
// the scales in force after it, by service (a service without one is absent). A service absent
// from the window has a window without data. It rejects the whole window, changing nothing,
// when an entry is invalid (empty service; a pod or service given twice; negative, NaN or
// infinite sums), naming it.
func (w *WaitScaler) Observe(window []WaitWindow) (map[string]float64, error) {
	type key struct{ service, pod string }
	seen := map[key]bool{}
	points := map[string][]WaitWindow{}
	for _, x := range window {
		k := key{x.Service, x.Pod}
		switch {
		case x.Service == "":
			return nil, fmt.Errorf("%w: wait window without a service", ErrInvalidSample)
		case seen[k] && x.Pod == "":
			return nil, fmt.Errorf("%w: service %q given twice in one window", ErrInvalidSample, x.Service)
		case seen[k]:
			return nil, fmt.Errorf("%w: pod %q of service %q given twice in one window", ErrInvalidSample, x.Pod, x.Service)
		case badCount(x.MeasuredMS) || badCount(x.PredictedMS) || badCount(x.Requests):
			return nil, fmt.Errorf("%w: service %q%s: wait sums %v / %v ms over %v requests: want finite numbers ≥ 0",
				ErrInvalidSample, x.Service, podSuffix(x.Pod), x.MeasuredMS, x.PredictedMS, x.Requests)
		}
		seen[k] = true
		points[x.Service] = append(points[x.Service], x)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for svc := range points {
		if w.services[svc] == nil {
			w.services[svc] = &waitState{}
		}
	}
	out := map[string]float64{}
	for svc, st := range w.services {
		st.windows = append(st.windows, points[svc])
		if len(st.windows) > w.cfg.Windows {
			st.windows = st.windows[len(st.windows)-w.cfg.Windows:]
		}
		st.scale = w.next(st)
		if st.scale == 0 && !slices.ContainsFunc(st.windows, func(ps []WaitWindow) bool { return requests(ps) > 0 }) {
			delete(w.services, svc)
			continue
		}
		if st.scale > 0 {
			out[svc] = st.scale
		}
	}
	return out, nil
}

// podSuffix is ", pod POD" for a pod's window, "" for a service's.
func podSuffix(pod string) string {
	if pod == "" {
		return ""
	}
	return fmt.Sprintf(", pod %q", pod)
}

// requests is the requests of a window's points.
func requests(points []WaitWindow) float64 {
	var n float64
	for _, x := range points {
		n += x.Requests
	}
	return n
}

// next is the scale a service's windows put in force, given the one in force.
func (w *WaitScaler) next(st *waitState) float64 {
	s, ok := w.fit(st.windows)
	if !ok {
		return 0
	}
	s = min(1, max(w.cfg.Floor, s))
	if st.scale > 0 && math.Abs(s-st.scale) <= w.cfg.Hysteresis*st.scale {
		return st.scale
	}
	return s
}

// fit is the scale of a service's windows before the clamp (WaitScaler's rules); false: none.
func (w *WaitScaler) fit(windows [][]WaitWindow) (float64, bool) {
	// Over the points (requests > 0) of the windows that count: the weighted sums of the
	// means x (predicted, ms a request) and y (measured), and the ratio's sums over the points
	// that predict enough.
	var sw, sx, sy, sxx, sxy, measured, predicted float64
	for _, points := range windows {
		if requests(points) < max(w.cfg.MinRequests, 1) {
			continue
		}
		for _, p := range points {
			if !(p.Requests > 0) {
				continue
			}
			x, y := p.PredictedMS/p.Requests, p.MeasuredMS/p.Requests
			sw += p.Requests
			sx += p.Requests * x
			sy += p.Requests * y
			sxx += p.Requests * x * x
			sxy += p.Requests * x * y
			if x >= w.cfg.MinPredictedMS {
				measured += p.MeasuredMS
				predicted += p.PredictedMS
			}
		}
	}
	if predicted == 0 {
		return 0, false
	}
	if measured >= predicted { // the model is no bound here: no fit prices below it
		return measured / predicted, true
	}
	mx, my := sx/sw, sy/sw
	varX := sxx/sw - mx*mx // the weighted variance of the predictions
	if varX >= w.cfg.MinPredictedMS*w.cfg.MinPredictedMS {
		slope := (sxy/sw - mx*my) / varX
		if my-slope*mx >= 0 { // the overhead
			return slope, true // a flat or falling line: no wait seen, the floor
		}
	}
	return measured / predicted, true
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
