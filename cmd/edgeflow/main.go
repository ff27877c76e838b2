// Command edgeflow computes latency-aware traffic weights and replica placements for
// multi-replica microservices and streams the weights to sidecars over xDS.
//
//	edgeflow plan  -f topology.yaml [--policy lata] [-o table|json|yaml]
//	edgeflow place -f topology.yaml [--policy larp] [-o table|json|yaml|topology]
//	edgeflow serve -f topology.yaml --xds-address HOST:PORT [--ui-address HOST:PORT]
//	edgeflow demo
//	edgeflow version [-o json]
//	edgeflow completion bash
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// Exit codes: 0 success, 1 runtime failure, 2 bad input (invalid topology, flags or usage).
const (
	exitFailure  = 1
	exitBadInput = 2
)

// usageError marks an error as the user's input being wrong (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func badInput(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "edgeflow",
		Short:         "Latency-aware traffic allocation and replica placement for edge clusters",
		Long:          "edgeflow computes, for every caller pod, how much traffic to send to every callee pod from measured\nnode-to-node latency under a load-balance constraint (LATA), places replicas so the cheap paths\nexist (LARP), and streams the weights to sidecars and proxyless gRPC clients over xDS.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.Example = "  edgeflow plan -f examples/bookinfo.yaml\n" +
		"  edgeflow serve -f examples/bookinfo.yaml --xds-address 127.0.0.1:18000 --ui-address 127.0.0.1:8080\n  edgeflow demo\n  edgeflow version"
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		var bad *enumError // names the flag itself: not inside pflag's "invalid argument … for … flag"
		if errors.As(err, &bad) {
			return usageError{bad}
		}
		var badValue *valueError
		if errors.As(err, &badValue) {
			return usageError{badValue}
		}
		return usageError{err}
	})
	root.SetUsageTemplate(usageTemplate(root))
	var logs logFlags
	logs.register(root)
	for _, add := range subcommands {
		root.AddCommand(add())
	}
	addBuiltinExamples(root)
	return root
}

// subcommands are registered by the files that define them.
var subcommands []func() *cobra.Command

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes the command line and returns the process exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "error:", userMessage(err))
	if isBadInput(err) {
		return exitBadInput
	}
	return exitFailure
}

// packagePrefix is a package name edgeflow's errors start with (optimizer: invalid topology: …),
// at the start of the message or after a wrapping error's ": ".
var packagePrefix = regexp.MustCompile(`(^|: )(?:optimizer|mcf|xds/istio|xds|watcher|kube|prom|estimate|rebalancer|leader|certfile|ui): `)

// userMessage is err's message for a person: without the Go package names inside it (the
// errors keep them for callers and logs); the item the error names stays.
func userMessage(err error) string {
	msg := err.Error()
	for {
		out := packagePrefix.ReplaceAllString(msg, "$1")
		if out == msg {
			return out
		}
		msg = out
	}
}

// isBadInput says whether err is the user's input being wrong: a usage error, an invalid
// topology, or a topology the xDS server cannot serve (a called pod without an address).
func isBadInput(err error) bool {
	var ue usageError
	return errors.As(err, &ue) || errors.Is(err, optimizer.ErrInvalidTopology) ||
		errors.Is(err, xds.ErrIncompleteTopology) || isCobraUsage(err)
}

// isCobraUsage recognises cobra's own usage errors, which it does not type (the flag groups'
// among them: MarkFlagsMutuallyExclusive, MarkFlagsRequiredTogether, MarkFlagsOneRequired).
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "required flag",
		"if any flags in the group", "at least one of the flags in the group"} {
		if strings.HasPrefix(msg, p) || strings.Contains(msg, "required flag(s)") {
			return true
		}
	}
	return false
}
