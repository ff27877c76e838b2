package estimate

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"
)

// FuzzObserve feeds arbitrary counters (NaN, negative, decreasing, huge) to three pods of one
// service over rounds and checks that Observe only ever rejects samples with ErrInvalidSample
// and that every capacity it gives is finite where it must be, positive, and ordered
// Lower ≤ RPS ≤ Upper.
func FuzzObserve(f *testing.F) {
	seed := func(vs ...float64) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
		return b
	}
	f.Add(seed(1, 100, 0.1, 300, 100, 1, 200, 0.2, 600, 200, 1, 300, 0.3, 900, 300))
	f.Add(seed(4, 1e9, 1e-9, 1e-3, 1e12, 0.5, 5, 1e6, 0, 0, 2, math.NaN(), -1, 3, 3))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := New(Config{MinRequests: 1, Windows: 3, MinWindows: 2})
		if err != nil {
			t.Fatal(err)
		}
		next := func() float64 {
			if len(data) < 8 {
				return 0
			}
			v := math.Float64frombits(binary.LittleEndian.Uint64(data))
			data = data[8:]
			return v
		}
		pods := [...]string{"a-0", "a-1", "a-2"}
		for round := 1; len(data) > 0 && round < 64; round++ {
			var samples []Sample
			for _, pod := range pods {
				samples = append(samples, Sample{Pod: pod, Service: "a", Cores: next(), Requests: next(),
					CPUSeconds: next(), InboundMS: next(), DownstreamMS: next()})
			}
			caps, err := e.Observe(time.Unix(int64(round), 0), samples)
			if err != nil && !errors.Is(err, ErrInvalidSample) {
				t.Fatalf("round %d: %v", round, err)
			}
			for pod, c := range caps {
				if c.Source == SourceNone {
					if c.RPS != 0 || c.Lower != 0 || c.Upper != 0 {
						t.Fatalf("round %d, %s: none with rates %+v", round, pod, c)
					}
					continue
				}
				if !(c.Lower > 0 && c.Lower <= c.RPS && c.RPS <= c.Upper) || math.IsInf(c.RPS, 0) {
					t.Fatalf("round %d, %s: want 0 < Lower ≤ RPS ≤ Upper, RPS finite: %+v", round, pod, c)
				}
			}
		}
	})
}
