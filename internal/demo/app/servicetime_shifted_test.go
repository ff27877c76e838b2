package app

import (
	"math"
	"testing"
	"time"
)

// A shifted service time never draws below its fixed part, has the mean asked, and the
// variance of its exponential rest only; the fixed part is clamped to [0, mean].
func TestShifted(t *testing.T) {
	s := NewShifted(4*time.Millisecond, 3*time.Millisecond, 1)
	const n = 200000
	var sum, sq float64
	for range n {
		d := s.Draw()
		if d < 3*time.Millisecond {
			t.Fatalf("drew %v, below the fixed 3ms", d)
		}
		x := float64(d) / float64(time.Millisecond)
		sum, sq = sum+x, sq+x*x
	}
	mean := sum / n
	sd := math.Sqrt(sq/n - mean*mean)
	if math.Abs(mean-4) > 0.02 || math.Abs(sd-1) > 0.02 {
		t.Errorf("mean %.3f ms, sd %.3f ms; want 4 and 1 (the exponential rest's)", mean, sd)
	}
	if c := NewShifted(2*time.Millisecond, 5*time.Millisecond, 1); c.Draw() != 2*time.Millisecond {
		t.Error("a fixed part above the mean is not clamped to it")
	}
	if c := NewShifted(2*time.Millisecond, -time.Millisecond, 1); c.Fixed != 0 {
		t.Error("a negative fixed part is not clamped to 0")
	}
}
