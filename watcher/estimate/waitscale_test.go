package estimate

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// TestWaitScaler runs one service through sequences of windows of 1,000 requests and checks the
// scale in force after each: q (measured 0.2 × predicted, which is 3 ms a request), h (0.5 ×),
// o (measured 2 × predicted: capped at 1), z (nothing measured: the floor), t (thin: 50
// requests), x (0.41 ×), s (the model predicts 0.1 ms a request: under MinPredictedMS), - (no window);
// and for the fit of an overhead: l (1.9 ms predicted, 0.95 measured: 0.5 ×), i (light: 0.1 ms
// predicted, 0.8 measured, the overhead alone), p (two pods of 500 requests: 1 and 3 ms predicted,
// 1.0 and 1.2 measured: 0.9 ms of overhead and a slope of 0.1, where the ratio says 0.55), n (two
// pods: 1 and 3 ms predicted, 0.2 and 2.2 measured: a line below zero at no load, so the ratio, 0.6),
// f (two pods: 1 and 3 ms predicted, 3.5 measured by both: a flat line above the model, so 1).
// Windows 3, Hysteresis 0.1, Floor 0.05.
func TestWaitScaler(t *testing.T) {
	for _, tc := range []struct {
		name, windows string
		want          []float64 // after each window; 0: none in force
	}{
		{"one window is enough", "q", []float64{0.2}},
		{"the scale sums the last 3 windows", "qqh", []float64{0.2, 0.2, 0.3}},
		{"windows age out", "qqhhh", []float64{0.2, 0.2, 0.3, 0.4, 0.5}},
		{"never above the model", "o", []float64{1}},
		{"never under the floor", "z", []float64{0.05}},
		{"thin and unpredicted windows do not count", "tsq", []float64{0, 0, 0.2}},
		{"a scale decays to none without data", "q---", []float64{0.2, 0.2, 0.2, 0}},
		{"hysteresis: a move of 10 % or less stays", "hhhx", []float64{0.5, 0.5, 0.5, 0.5}},
		{"hysteresis: a larger one moves", "hhhxx", []float64{0.5, 0.5, 0.5, 0.5, 0.44}},
		{"an overhead seen at light load is not priced as wait", "li", []float64{0.5, 0.0675 / 0.81}},
		{"the overhead ages out with its window", "ilhhh", []float64{0, 0.0675 / 0.81, 0.22589424572317265, 0.5, 0.5}},
		{"light windows alone give no scale", "ii", []float64{0, 0}},
		{"the pods of one window tell the slope", "p", []float64{0.1}},
		{"a line below zero at no load: the ratio", "n", []float64{0.6}},
		{"measured above the model: no flat line lowers it", "f", []float64{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := NewWaitScaler(WaitScaleConfig{Windows: 3, Hysteresis: 0.1, Floor: 0.05})
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range tc.windows {
				var window []WaitWindow
				pred, req := 3.0*1000, 1000.0
				switch c {
				case 'q':
					window = []WaitWindow{{Service: "a", PredictedMS: pred, MeasuredMS: 0.2 * pred, Requests: req}}
				case 'h':
					window = []WaitWindow{{Service: "a", PredictedMS: pred, MeasuredMS: 0.5 * pred, Requests: req}}
				case 'x':
					window = []WaitWindow{{Service: "a", PredictedMS: pred, MeasuredMS: 0.41 * pred, Requests: req}}
				case 'o':
					window = []WaitWindow{{Service: "a", PredictedMS: pred, MeasuredMS: 2 * pred, Requests: req}}
				case 'z':
					window = []WaitWindow{{Service: "a", PredictedMS: pred, Requests: req}}
				case 't':
					window = []WaitWindow{{Service: "a", PredictedMS: 3 * 50, Requests: 50}}
				case 's':
					window = []WaitWindow{{Service: "a", PredictedMS: 0.1 * req, Requests: req}}
				case 'l':
					window = []WaitWindow{{Service: "a", PredictedMS: 1.9 * req, MeasuredMS: 0.95 * req, Requests: req}}
				case 'i':
					window = []WaitWindow{{Service: "a", PredictedMS: 0.1 * req, MeasuredMS: 0.8 * req, Requests: req}}
				case 'p':
					window = []WaitWindow{
						{Service: "a", Pod: "a-1", PredictedMS: 1 * 500, MeasuredMS: 1.0 * 500, Requests: 500},
						{Service: "a", Pod: "a-2", PredictedMS: 3 * 500, MeasuredMS: 1.2 * 500, Requests: 500},
					}
				case 'f':
					window = []WaitWindow{
						{Service: "a", Pod: "a-1", PredictedMS: 1 * 500, MeasuredMS: 3.5 * 500, Requests: 500},
						{Service: "a", Pod: "a-2", PredictedMS: 3 * 500, MeasuredMS: 3.5 * 500, Requests: 500},
					}
				case 'n':
					window = []WaitWindow{
						{Service: "a", Pod: "a-1", PredictedMS: 1 * 500, MeasuredMS: 0.2 * 500, Requests: 500},
						{Service: "a", Pod: "a-2", PredictedMS: 3 * 500, MeasuredMS: 2.2 * 500, Requests: 500},
					}
				}
				got, err := w.Observe(window)
				if err != nil {
					t.Fatal(err)
				}
				if math.Abs(got["a"]-tc.want[i]) > 1e-9 {
					t.Fatalf("after window %d (%q): scale %v, want %v", i+1, tc.windows[:i+1], got["a"], tc.want[i])
				}
				if s := w.Scales()["a"]; s != got["a"] {
					t.Errorf("after window %d: Scales says %v, Observe %v", i+1, s, got["a"])
				}
			}
		})
	}
}

// TestWaitScalerRejects: an invalid window is rejected whole, naming the offending service, and
// changes nothing; an invalid config names its field.
func TestWaitScalerRejects(t *testing.T) {
	w, err := NewWaitScaler(WaitScaleConfig{})
	if err != nil {
		t.Fatal(err)
	}
	good := WaitWindow{Service: "a", PredictedMS: 3000, MeasuredMS: 600, Requests: 1000}
	if _, err := w.Observe([]WaitWindow{good}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		window []WaitWindow
		want   string
	}{
		{"no service", []WaitWindow{{PredictedMS: 1, Requests: 1}}, "without a service"},
		{"twice", []WaitWindow{good, good}, `service "a" given twice`},
		{"a pod twice", []WaitWindow{{Service: "b", Pod: "b-1", Requests: 1}, {Service: "b", Pod: "b-1", Requests: 1}}, `pod "b-1" of service "b" given twice`},
		{"a pod's NaN", []WaitWindow{{Service: "b", Pod: "b-1", MeasuredMS: math.NaN(), Requests: 1}}, `service "b", pod "b-1"`},
		{"NaN", []WaitWindow{{Service: "b", PredictedMS: math.NaN(), Requests: 1}}, `service "b"`},
		{"negative", []WaitWindow{{Service: "b", MeasuredMS: -1, Requests: 1}}, `service "b"`},
		{"infinite", []WaitWindow{{Service: "b", Requests: math.Inf(1)}}, `service "b"`},
	} {
		// the bad entry comes after a good one that would move the scale
		window := append([]WaitWindow{{Service: "a", PredictedMS: 3000, MeasuredMS: 3000, Requests: 1000}}, tc.window...)
		if tc.name == "twice" {
			window = tc.window
		}
		_, err := w.Observe(window)
		if !errors.Is(err, ErrInvalidSample) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Observe said %v, want ErrInvalidSample naming %s", tc.name, err, tc.want)
		}
		if got := w.Scales()["a"]; math.Abs(got-0.2) > 1e-9 {
			t.Errorf("%s: scale %v after a rejected window, want 0.2 as before", tc.name, got)
		}
	}
	for _, cfg := range []WaitScaleConfig{{Windows: -1}, {MinRequests: -1}, {MinPredictedMS: -1}, {Floor: 2}, {Hysteresis: 1}} {
		if _, err := NewWaitScaler(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewWaitScaler(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
}
