package testkit

import (
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
)

// FakeClock is k8s.io/utils/clock/testing's FakeClock that also tells a test which timers
// the code under test armed: how many (TimersCreated) and when the pending ones are due
// (Deadlines). Time moves only by Step or SetTime, which fire the timers due.
type FakeClock struct {
	*testingclock.FakeClock

	mu      sync.Mutex
	pending []*recordedTimer
	created int
}

var _ clock.WithTickerAndDelayedExecution = (*FakeClock)(nil)

// recordedTimer is a timer of the FakeClock and its deadline, while it is pending.
type recordedTimer struct {
	clock.Timer
	c        *FakeClock
	deadline time.Time
}

// NewFakeClock returns a FakeClock at t.
func NewFakeClock(t time.Time) *FakeClock {
	return &FakeClock{FakeClock: testingclock.NewFakeClock(t)}
}

// NewTimer is FakeClock.NewTimer, recorded.
func (c *FakeClock) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.recordLocked(c.FakeClock.NewTimer(d), d)
}

// AfterFunc is FakeClock.AfterFunc, recorded.
func (c *FakeClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.recordLocked(c.FakeClock.AfterFunc(d, f), d)
}

func (c *FakeClock) recordLocked(t clock.Timer, d time.Duration) *recordedTimer {
	c.created++
	r := &recordedTimer{Timer: t, c: c, deadline: c.FakeClock.Now().Add(d)}
	c.pending = append(c.pending, r)
	return r
}

// Step moves time forward by d and fires the timers due.
func (c *FakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.FakeClock.Step(d)
	c.firedLocked()
}

// SetTime sets the time and fires the timers due.
func (c *FakeClock) SetTime(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.FakeClock.SetTime(t)
	c.firedLocked()
}

// Sleep is Step.
func (c *FakeClock) Sleep(d time.Duration) { c.Step(d) }

// firedLocked forgets the timers the last Step or SetTime fired.
func (c *FakeClock) firedLocked() {
	now := c.FakeClock.Now()
	c.pending = slices.DeleteFunc(c.pending, func(r *recordedTimer) bool { return !r.deadline.After(now) })
}

// TimersCreated returns how many timers NewTimer and AfterFunc made.
func (c *FakeClock) TimersCreated() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.created
}

// Deadlines returns the pending timers' deadlines as offsets from start, earliest first.
func (c *FakeClock) Deadlines(start time.Time) []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]time.Duration, 0, len(c.pending))
	for _, r := range c.pending {
		out = append(out, r.deadline.Sub(start))
	}
	slices.Sort(out)
	return out
}

func (r *recordedTimer) Stop() bool {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	r.c.pending = slices.DeleteFunc(r.c.pending, func(o *recordedTimer) bool { return o == r })
	return r.Timer.Stop()
}

func (r *recordedTimer) Reset(d time.Duration) bool {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	r.c.pending = slices.DeleteFunc(r.c.pending, func(o *recordedTimer) bool { return o == r })
	r.deadline = r.c.FakeClock.Now().Add(d)
	r.c.pending = append(r.c.pending, r)
	return r.Timer.Reset(d)
}
