package main

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"
)

// Log formats of --log-format.
const (
	logFormatText = "text"
	logFormatJSON = "json"
)

// logFlags are the root command's persistent --log-format and --log-level (every command has
// them; cobra merges them into each command's flags).
type logFlags struct {
	format string
	level  string // "": the command's own default (newLogger's def)
}

func (f *logFlags) register(root *cobra.Command) {
	pf := root.PersistentFlags()
	pf.StringVar(&f.format, "log-format", logFormatText, "log format: text (key=value) or json (one object per line)")
	pf.StringVar(&f.level, "log-level", "", "log level: debug, info, warn, error (default: info for serve and the rebalancer controller, warn otherwise)")
}

// check validates the flags, naming the bad one.
func (f *logFlags) check() error {
	if f.format != logFormatText && f.format != logFormatJSON {
		return badInput("--log-format %q: want text or json", f.format)
	}
	if f.level != "" {
		var l slog.Level
		if err := l.UnmarshalText([]byte(f.level)); err != nil {
			return badInput("--log-level %q: want debug, info, warn or error", f.level)
		}
	}
	return nil
}

// logger returns a logger writing to w in the chosen format, at the chosen level or def.
// (The cluster source routes client-go's klog lines through it: clusterFlags.cluster.)
func (f *logFlags) logger(w io.Writer, def slog.Level) *slog.Logger {
	level := def
	if f.level != "" {
		_ = level.UnmarshalText([]byte(f.level)) // checked in check
	}
	opts := &slog.HandlerOptions{Level: level}
	if f.format == logFormatJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// commandLogFlags reads the root's persistent log flags as cmd parsed them.
func commandLogFlags(cmd *cobra.Command) *logFlags {
	f := &logFlags{format: logFormatText}
	if v, err := cmd.Flags().GetString("log-format"); err == nil {
		f.format = v
	}
	if v, err := cmd.Flags().GetString("log-level"); err == nil {
		f.level = v
	}
	return f
}

// newLogger is the logger of a command, to its standard error, at --log-level or def.
func newLogger(cmd *cobra.Command, def slog.Level) *slog.Logger {
	return commandLogFlags(cmd).logger(cmd.ErrOrStderr(), def)
}

// announce writes a line a person or script waits for (the addresses serve listens on), at
// any --log-level: as it is under text logs, as an INFO object under json logs so that every
// line parses.
func announce(cmd *cobra.Command, format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if commandLogFlags(cmd).format == logFormatJSON {
		slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil)).Info(line)
		return
	}
	fmt.Fprintln(cmd.ErrOrStderr(), line)
}
