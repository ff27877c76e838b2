package app

import (
	"math"
	"testing"
	"time"
)

// TestExponentialMoments: the mean and the standard deviation of the draws are the configured
// mean, within 2 % (with n = 200,000 draws the standard error of the mean is 0.22 %).
func TestExponentialMoments(t *testing.T) {
	t.Parallel()
	for _, mean := range []time.Duration{time.Millisecond, 6 * time.Millisecond, 250 * time.Millisecond} {
		e := NewExponential(mean, 42)
		const n = 200_000
		var sum, sumSq float64
		for range n {
			d := e.Draw()
			if d < 0 {
				t.Fatalf("negative draw %v", d)
			}
			x := float64(d)
			sum += x
			sumSq += x * x
		}
		m := sum / n
		sd := math.Sqrt(sumSq/n - m*m)
		if rel := m/float64(mean) - 1; math.Abs(rel) > 0.02 {
			t.Errorf("mean %v: sample mean %v (%+.2f%%)", mean, time.Duration(m), 100*rel)
		}
		if rel := sd/float64(mean) - 1; math.Abs(rel) > 0.02 {
			t.Errorf("mean %v: sample standard deviation %v (%+.2f%%), want the mean", mean, time.Duration(sd), 100*rel)
		}
	}
}

// TestExponentialTail: P(X > 3·mean) = e⁻³ ≈ 4.98 %.
func TestExponentialTail(t *testing.T) {
	t.Parallel()
	e := NewExponential(time.Millisecond, 7)
	const n = 100_000
	over := 0
	for range n {
		if e.Draw() > 3*time.Millisecond {
			over++
		}
	}
	if got, want := float64(over)/n, math.Exp(-3); math.Abs(got-want) > 0.004 {
		t.Errorf("P(X > 3·mean) = %.4f, want %.4f", got, want)
	}
}

func TestExponentialReproducible(t *testing.T) {
	t.Parallel()
	a, b := NewExponential(time.Millisecond, 1), NewExponential(time.Millisecond, 1)
	for i := range 100 {
		if x, y := a.Draw(), b.Draw(); x != y {
			t.Fatalf("draw %d: %v != %v with the same seed", i, x, y)
		}
	}
	if NewExponential(0, 1).Draw() != 0 {
		t.Error("mean 0 must draw 0")
	}
}
