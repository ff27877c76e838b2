package xds

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Clock is the time source of the push debouncer and of the latency metrics. Tests inject a
// fake one so debouncing is tested without sleeping.
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

// SystemClock returns the wall clock.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.t.C }
func (t systemTimer) Stop() bool          { return t.t.Stop() }

// gcpLogger adapts slog to go-control-plane's logger. Debug and Info formatting is skipped when
// the level is disabled, since the library logs per request.
type gcpLogger struct{ l *slog.Logger }

func (g gcpLogger) logf(level slog.Level, format string, args ...any) {
	if g.l.Enabled(context.Background(), level) {
		g.l.Log(context.Background(), level, "go-control-plane: "+fmt.Sprintf(format, args...))
	}
}

func (g gcpLogger) Debugf(format string, args ...any) { g.logf(slog.LevelDebug, format, args...) }

// Infof logs at debug level: the library's info messages are per-request chatter.
func (g gcpLogger) Infof(format string, args ...any)  { g.logf(slog.LevelDebug, format, args...) }
func (g gcpLogger) Warnf(format string, args ...any)  { g.logf(slog.LevelWarn, format, args...) }
func (g gcpLogger) Errorf(format string, args ...any) { g.logf(slog.LevelError, format, args...) }
