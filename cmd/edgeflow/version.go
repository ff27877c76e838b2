package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newVersionCommand) }

// buildVersion is what the binary knows of its build (runtime/debug.ReadBuildInfo): the main
// module's version ("(devel)" or a pseudo-version for a build from a checkout) and the VCS
// stamp the go command writes when it builds inside a repository.
type buildVersion struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`             // "" when the build has no VCS stamp (go run, go test)
	Modified  bool   `json:"modified,omitempty"` // the working tree had uncommitted changes
	Time      string `json:"commit_time,omitempty"`
	GoVersion string `json:"go_version"`
}

func readBuildVersion() buildVersion {
	v := buildVersion{Version: "unknown", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		case "vcs.time":
			v.Time = s.Value
		}
	}
	return v
}

// String is the one-line form: edgeflow VERSION (commit X[, modified], goX).
func (v buildVersion) String() string {
	commit := v.Commit
	if commit == "" {
		commit = "unknown"
	}
	if v.Modified {
		commit += ", modified"
	}
	return fmt.Sprintf("edgeflow %s (commit %s, %s)", v.Version, commit, v.GoVersion)
}

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "version [-o text|json|yaml]",
		Short:   "Print edgeflow's version, the commit it was built from and its Go version",
		Long:    "version prints the module version and the VCS commit stamped into the binary by the go command (a build\nfrom a git checkout has them; go run and test binaries have no commit), and the Go version it was built with.",
		Example: "  edgeflow version\n  edgeflow version -o json",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := readBuildVersion()
			switch output {
			case "json":
				return writeStructured(cmd.OutOrStdout(), "json", v)
			case "yaml":
				return writeStructured(cmd.OutOrStdout(), "yaml-json-keys", v)
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), v)
			return err
		},
	}
	outputVar(cmd, &output, "output format: text, json, yaml", "text", "json", "yaml")
	return cmd
}
