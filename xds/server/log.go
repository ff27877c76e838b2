package server

import (
	"context"
	"fmt"
	"log/slog"
)

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
