package main

import (
	"github.com/spf13/cobra"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/xds"
)

// completeFlagValues gives shell completion the values of the flags that take one of a fixed
// set (cobra's completion command, `edgeflow completion bash|zsh|fish|powershell`, completes
// commands and flag names by itself).
func completeFlagValues(root *cobra.Command) {
	fixed := func(values ...string) cobra.CompletionFunc {
		return cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)
	}
	var allocation, placement []string
	for _, p := range optimizer.Policies() {
		allocation = append(allocation, string(p))
	}
	for _, p := range optimizer.PlacementPolicies() {
		placement = append(placement, string(p))
	}
	_ = root.RegisterFlagCompletionFunc("log-format", fixed(logFormatText, logFormatJSON))
	_ = root.RegisterFlagCompletionFunc("log-level", fixed("debug", "info", "warn", "error"))
	for _, c := range root.Commands() {
		switch c.Name() {
		case "plan", "serve":
			_ = c.RegisterFlagCompletionFunc("policy", fixed(allocation...))
		case "place":
			_ = c.RegisterFlagCompletionFunc("policy", fixed(placement...))
		}
		if c.Flags().Lookup("latency-granularity") != nil {
			_ = c.RegisterFlagCompletionFunc("latency-granularity", fixed(watcher.LatencyAuto, optimizer.LatencyPerNode, optimizer.LatencyPerZone))
		}
		if c.Name() == "serve" {
			_ = c.RegisterFlagCompletionFunc("encoding", fixed(string(xds.EncodingLocality), string(xds.EncodingWeightedClusters)))
		}
	}
}

// addBuiltinExamples gives cobra's own commands (help, completion and its shells) an example,
// as every edgeflow command has one.
func addBuiltinExamples(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Example = "  edgeflow help serve"
		case "completion":
			c.Example = "  source <(edgeflow completion bash)\n  edgeflow completion bash > /etc/bash_completion.d/edgeflow"
			for _, sh := range c.Commands() {
				switch sh.Name() {
				case "bash":
					sh.Example = "  source <(edgeflow completion bash)\n  edgeflow completion bash > /etc/bash_completion.d/edgeflow"
				case "zsh":
					sh.Example = "  edgeflow completion zsh > \"${fpath[1]}/_edgeflow\""
				case "fish":
					sh.Example = "  edgeflow completion fish > ~/.config/fish/completions/edgeflow.fish"
				case "powershell":
					sh.Example = "  edgeflow completion powershell | Out-String | Invoke-Expression"
				}
			}
		}
	}
}
