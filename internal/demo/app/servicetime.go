package app

import (
	"math/rand/v2"
	"sync"
	"time"
)

// ServiceTime draws the time a pod's worker spends on one request. Implementations must be safe
// for concurrent use.
type ServiceTime interface {
	Draw() time.Duration
}

// Exponential is an exponentially distributed service time (the "M" of M/M/c): memoryless, with
// standard deviation equal to its mean, so a pod with c workers behaves like an M/M/c queue under
// Poisson-like arrivals. It is safe for concurrent use.
type Exponential struct {
	mean time.Duration
	mu   sync.Mutex
	rng  *rand.Rand
}

// NewExponential returns an exponential service time with the given mean, drawn from a PCG
// generator seeded with seed (the sequence of draws is reproducible; which request gets which
// draw depends on scheduling). A mean ≤ 0 always draws 0.
func NewExponential(mean time.Duration, seed uint64) *Exponential {
	return &Exponential{mean: mean, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Mean returns the configured mean.
func (e *Exponential) Mean() time.Duration { return e.mean }

// Draw returns the next service time.
func (e *Exponential) Draw() time.Duration {
	if e.mean <= 0 {
		return 0
	}
	e.mu.Lock()
	x := e.rng.ExpFloat64()
	e.mu.Unlock()
	return time.Duration(x * float64(e.mean))
}

// Shifted is a service time with a fixed part and an exponential rest: Fixed plus an
// exponential draw of mean Rest's — a request's own work (parsing, serialising) that every
// request costs, and a variable part. Its squared coefficient of variation is (rest/mean)², 1 for
// a purely exponential time and 0 for a fixed one. It is safe for concurrent use.
type Shifted struct {
	Fixed time.Duration
	Rest  *Exponential
}

// NewShifted returns a service time of the given mean whose first fixed of it every request
// takes (0 ≤ fixed ≤ mean; clamped), the rest exponential, drawn from seed as NewExponential.
func NewShifted(mean, fixed time.Duration, seed uint64) *Shifted {
	fixed = min(max(fixed, 0), max(mean, 0))
	return &Shifted{Fixed: fixed, Rest: NewExponential(mean-fixed, seed)}
}

// Draw returns the next service time.
func (s *Shifted) Draw() time.Duration { return s.Fixed + s.Rest.Draw() }

// Fixed is a constant service time (a deterministic "D" server), mainly for tests.
type Fixed time.Duration

// Draw returns the constant.
func (f Fixed) Draw() time.Duration { return time.Duration(f) }

var (
	_ ServiceTime = (*Exponential)(nil)
	_ ServiceTime = Fixed(0)
	_ ServiceTime = (*Shifted)(nil)
)
