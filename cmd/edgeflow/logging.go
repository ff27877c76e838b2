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
	enumVar(root, pf, &enumFlag[string]{p: &f.format, values: []string{logFormatText, logFormatJSON}, typ: "format"},
		"log-format", "", logFormatText, "log format: text (key=value) or json (one object per line)")
	enumVar(root, pf, &enumFlag[string]{p: &f.level, values: []string{"debug", "info", "warn", "error"}, parse: parseLogLevel, typ: "level"},
		"log-level", "", "", "log level: debug, info, warn, error (default: info for serve and the rebalancer controller, warn otherwise)")
}

// logger returns a logger writing to w in the chosen format, at the chosen level or def.
// (The cluster source routes client-go's klog lines through it: clusterFlags.cluster.)
func (f *logFlags) logger(w io.Writer, def slog.Level) *slog.Logger {
	level := def
	if f.level != "" {
		_ = level.UnmarshalText([]byte(f.level)) // checked by the flag (parseLogLevel)
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
	if fl := cmd.Flags().Lookup("log-format"); fl != nil {
		f.format = fl.Value.String()
	}
	if fl := cmd.Flags().Lookup("log-level"); fl != nil {
		f.level = fl.Value.String()
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
