package reproduce

import (
	"strings"
	"testing"
)

// A healthy slice has no problems; each bound missed is named, and only that one.
func TestHealthBounds(t *testing.T) {
	healthy := Health{CPUIdle: 0.4, ReleaseLagMeanUS: 80, ReleaseLagP99US: 900, SendLagMaxMS: 3,
		PingPair: "n1–n4", PingMedianMS: 24.3, PingMinMS: 24.05, PingWantMS: 24, Pings: 25}
	healthy.check()
	if len(healthy.Problems) != 0 {
		t.Fatalf("healthy slice: problems %v", healthy.Problems)
	}
	for _, c := range []struct {
		name string
		bad  func(*Health)
		want string
	}{
		{"busy machine", func(h *Health) { h.CPUIdle = 0.02 }, "CPU idle 2 %"},
		{"late releases", func(h *Health) { h.ReleaseLagMeanUS = 700 }, "release lag mean 700"},
		{"late tail", func(h *Health) { h.ReleaseLagP99US = 12000 }, "release lag p99 12000"},
		{"generator behind", func(h *Health) { h.SendLagMaxMS = 80 }, "send lag 80.0 ms"},
		{"slow path", func(h *Health) { h.PingMedianMS = 27 }, "ping n1–n4 median 27.00"},        // 3 ms > 10 % of 24
		{"fast path", func(h *Health) { h.PingMinMS, h.PingMedianMS = 23.2, 23.4 }, "min 23.20"}, // below the configured delay
		{"no echo", func(h *Health) { h.Pings = 0 }, "no ping n1–n4"},
	} {
		h := healthy
		c.bad(&h)
		h.check()
		if len(h.Problems) != 1 || !strings.Contains(h.Problems[0], c.want) {
			t.Errorf("%s: problems %q, want one naming %q", c.name, h.Problems, c.want)
		}
	}
	small := healthy // a short path: 1 ms of excess allowed, not 10 %
	small.PingWantMS, small.PingMinMS, small.PingMedianMS = 4, 4.02, 4.9
	if small.check(); len(small.Problems) != 0 {
		t.Errorf("4 ms path, median 4.9 ms: %v, want healthy (1 ms allowed)", small.Problems)
	}
}

func TestParseCPU(t *testing.T) {
	c, err := parseCPU("cpu  100 5 50 800 20 3 2 10 40 0")
	if err != nil {
		t.Fatal(err)
	}
	if c.idle != 820 || c.steal != 10 || c.total != 990 {
		t.Errorf("parsed %+v, want idle 820 (idle+iowait), steal 10, total 990 (guest not added again)", c)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 3", "cpu a b c d e f g h"} {
		if _, err := parseCPU(bad); err == nil {
			t.Errorf("parseCPU(%q): no error", bad)
		}
	}
}
