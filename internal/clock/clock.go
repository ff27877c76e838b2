// Package clock is the time source of the timers edgeflow debounces with (the xDS server's
// pushes, the Istio writers' passes), so that tests drive them with a fake clock instead of
// sleeping.
package clock

import (
	"time"
)

// Clock is a time source with timers.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once, d from now.
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the debouncer uses.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; after Stop, C delivers nothing.
	Stop() bool
}

// System returns the wall clock.
func System() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.t.C }
func (t systemTimer) Stop() bool          { return t.t.Stop() }
