package main

import (
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/edgeflow/edgeflow/optimizer"
)

// enumFlag is a flag that takes one of a fixed set of values: Set validates while the command
// line is parsed, and its error names the flag, the value and the values allowed; Type names
// the enum in --help (--policy policy); enumVar registers the values as the flag's shell
// completion.
type enumFlag[T ~string] struct {
	p      *T
	values []T                     // allowed, in the order the error and the completion give them
	parse  func(string) (T, error) // the domain's parser, where there is one (it may take an alias: "" for the default); nil: one of values exactly
	typ    string                  // Type
	noun   string                  // what a value names, for the error (FLAG: unknown NOUN "VALUE" (want …); "": FLAG "VALUE": want …)
	flag   string                  // the flag as the error names it (-o, --policy): enumVar sets it
}

var _ pflag.Value = (*enumFlag[string])(nil)

func (e *enumFlag[T]) String() string {
	if e.p == nil {
		return ""
	}
	return string(*e.p)
}

func (e *enumFlag[T]) Type() string { return e.typ }

func (e *enumFlag[T]) Set(s string) error {
	v, ok := T(s), slices.Contains(e.values, T(s))
	if e.parse != nil {
		var err error
		v, err = e.parse(s)
		ok = err == nil
	}
	if !ok {
		return &enumError{flag: e.flag, value: s, noun: e.noun, values: e.strings()}
	}
	*e.p = v
	return nil
}

func (e *enumFlag[T]) strings() []string {
	out := make([]string, len(e.values))
	for i, v := range e.values {
		out[i] = string(v)
	}
	return out
}

// enumVar defines e as the flag name (shorthand short, "" for none) of fs with the default def,
// and registers its values as the flag's completion on cmd, whose flags fs is (its own, or its
// persistent ones).
func enumVar[T ~string](cmd *cobra.Command, fs *pflag.FlagSet, e *enumFlag[T], name, short string, def T, usage string) {
	*e.p = def
	e.flag = "--" + name
	if short != "" {
		e.flag = "-" + short
	}
	fs.VarP(e, name, short, usage)
	_ = cmd.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(e.strings(), cobra.ShellCompDirectiveNoFileComp))
}

// Values of --dry-run, as kubectl takes them.
const (
	dryRunNone   = "none"   // act
	dryRunClient = "client" // change nothing: plan or list only (the bare --dry-run)
	dryRunServer = "server" // kubectl: the API server runs the request without persisting it
)

// dryRunFlag is a --dry-run flag read as kubectl reads it: none acts, client (also the bare
// flag) changes nothing; true and false, the values of the flag when it was a bool, are
// client and none. server is an error saying edgeflow has no server-side dry run.
type dryRunFlag struct {
	p    *bool
	flag string
}

var _ pflag.Value = (*dryRunFlag)(nil)

func (d *dryRunFlag) String() string {
	if d.p != nil && *d.p {
		return dryRunClient
	}
	return dryRunNone
}

func (d *dryRunFlag) Type() string { return "mode" }

func (d *dryRunFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case dryRunClient, "true":
		*d.p = true
	case dryRunNone, "false":
		*d.p = false
	case dryRunServer:
		return &enumError{flag: d.flag, value: s, values: []string{dryRunNone, dryRunClient},
			note: "edgeflow has no server-side dry run: " + dryRunClient + " (the bare " + d.flag + ") changes nothing"}
	default:
		return &enumError{flag: d.flag, value: s, values: []string{dryRunNone, dryRunClient}}
	}
	return nil
}

// dryRunVar defines the --dry-run flag name on cmd, default def (true: client), and its
// completion.
func dryRunVar(cmd *cobra.Command, p *bool, name string, def bool, usage string) {
	*p = def
	d := &dryRunFlag{p: p, flag: "--" + name}
	cmd.Flags().Var(d, name, usage)
	cmd.Flags().Lookup(name).NoOptDefVal = dryRunClient
	_ = cmd.RegisterFlagCompletionFunc(name, cobra.FixedCompletions([]string{dryRunNone, dryRunClient}, cobra.ShellCompDirectiveNoFileComp))
}

// latencyFlag is a flag that takes a latency: a duration (20ms, 1.5ms, 2s), or a bare number
// of milliseconds (20), the form the flags took before; it holds milliseconds. A negative,
// NaN or infinite latency is refused while the command line is parsed.
type latencyFlag struct {
	p    *float64
	flag string
}

var _ pflag.Value = (*latencyFlag)(nil)

func (l *latencyFlag) String() string {
	if l.p == nil {
		return ""
	}
	return time.Duration(*l.p * float64(time.Millisecond)).String()
}

func (l *latencyFlag) Type() string { return "latency" }

func (l *latencyFlag) Set(s string) error {
	ms, err := strconv.ParseFloat(s, 64)
	if err != nil {
		d, derr := time.ParseDuration(s)
		if derr != nil {
			return &valueError{flag: l.flag, value: s, want: "a latency: a duration (20ms) or a number of milliseconds"}
		}
		ms = float64(d) / float64(time.Millisecond)
	}
	if !(ms >= 0) || math.IsInf(ms, 0) {
		return &valueError{flag: l.flag, value: s, want: "a latency of at least 0 (20ms, or 20 for milliseconds)"}
	}
	*l.p = ms
	return nil
}

// latencyVar defines the latency flag name on cmd, holding milliseconds in p, default def ms.
func latencyVar(cmd *cobra.Command, p *float64, name string, def float64, usage string) {
	*p = def
	cmd.Flags().Var(&latencyFlag{p: p, flag: "--" + name}, name, usage)
}

// valueError is a flag's bad value, naming the flag; the root's flag error function shows it
// as it is, as it does an enumError.
type valueError struct{ flag, value, want string }

func (e *valueError) Error() string { return fmt.Sprintf("%s %q: want %s", e.flag, e.value, e.want) }

// enumError is an enum flag's bad value. The root's flag error function shows it as it is,
// not inside pflag's "invalid argument … for … flag", since it names the flag itself.
type enumError struct {
	flag, value, noun string
	values            []string
	note              string // why, when more than the values allowed need saying
}

func (e *enumError) Error() string {
	want := e.values[len(e.values)-1]
	if n := len(e.values); n > 1 {
		want = strings.Join(e.values[:n-1], ", ") + " or " + want
	}
	if e.noun != "" {
		return fmt.Sprintf("%s: unknown %s %q (want %s)", e.flag, e.noun, e.value, want)
	}
	if e.note != "" {
		return fmt.Sprintf("%s %q: %s; want %s", e.flag, e.value, e.note, want)
	}
	return fmt.Sprintf("%s %q: want %s", e.flag, e.value, want)
}

// policyVar defines --policy, the allocation policy (plan, serve).
func policyVar(cmd *cobra.Command, p *optimizer.Policy) {
	enumVar(cmd, cmd.Flags(), &enumFlag[optimizer.Policy]{p: p, values: optimizer.Policies(), parse: optimizer.ParsePolicy,
		typ: "policy", noun: "policy"}, "policy", "", optimizer.LATA, "allocation policy: round-robin, localization, opttraffic, lata, lata-q, closed-loop")
}

// outputVar defines -o/--output, the output format: one of values, the first the default.
func outputVar(cmd *cobra.Command, p *string, usage string, values ...string) {
	enumVar(cmd, cmd.Flags(), &enumFlag[string]{p: p, values: values, typ: "format", noun: "output format"}, "output", "o", values[0], usage)
}

// parseLogLevel takes what slog.Level reads (debug, info, warn, error, any case, with an
// offset such as debug-4), and "" (the command's own default).
func parseLogLevel(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	var l slog.Level
	return s, l.UnmarshalText([]byte(s))
}
