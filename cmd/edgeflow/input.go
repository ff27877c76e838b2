package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/edgeflow/edgeflow/optimizer"
)

// topologyFlags are the flags of every command that reads a topology: a file (-f) or a live
// cluster (clusterFlags).
type topologyFlags struct {
	file           string
	defaultLatency float64
	utilizationCap float64
	minBandShare   float64
	clusterFlags
}

func (f *topologyFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.file, "filename", "f", "", "topology file (YAML or JSON); - reads standard input")
	latencyVar(cmd, &f.defaultLatency, "default-latency", 0, "latency of node pairs the file does not give, a duration (20ms) or a number of ms (default: a missing pair is an error)")
	cmd.Flags().Lookup("default-latency").DefValue = "0" // not set: the usage text says what happens
	cmd.Flags().Float64Var(&f.utilizationCap, "utilization-cap", optimizer.DefaultUtilizationCap, "lata-q: the most of a pod's service rate (capacity_rps) it is loaded to, in (0, 1)")
	cmd.Flags().Float64Var(&f.minBandShare, "min-band-share", optimizer.DefaultMinBandShare, "lata-q, closed-loop: the least share of a caller pod's calls sent to a node farther than its nearest in use; a thinner share is folded into the caller's other nodes where the pods' caps allow, in [0, 0.5) (0: none)")
	f.clusterFlags.register(cmd)
}

// source checks the topology's source: -f FILE with no flag that reads a cluster, or else a
// cluster that kubectl's loading rules find (restConfig).
func (f *topologyFlags) source(cmd *cobra.Command) error {
	if f.file != "" {
		for _, name := range f.only {
			if cmd.Flags().Changed(name) {
				return badInput("--%s reads the topology from a cluster: give it without -f, or -f FILE without it", name)
			}
		}
		return nil
	}
	if _, err := f.restConfig(); errors.Is(err, errNoCluster) {
		return badInput("no topology: give -f FILE, or a cluster: --kubeconfig, $KUBECONFIG, ~/.kube/config, or in a pod the in-cluster config")
	}
	return nil
}

func (f *topologyFlags) options(cmd *cobra.Command) optimizer.Options {
	opts := optimizer.Options{UtilizationCap: f.utilizationCap, MinBandShare: f.minBandShare}
	if cmd.Flags().Changed("default-latency") {
		d := f.defaultLatency
		opts.DefaultLatencyMS = &d
	}
	return opts
}

// load reads and validates the topology: the file, or one snapshot of the cluster.
func (f *topologyFlags) load(cmd *cobra.Command, opts optimizer.Options) (*optimizer.Topology, *optimizer.Model, error) {
	if err := f.source(cmd); err != nil {
		return nil, nil, err
	}
	var t *optimizer.Topology
	var err error
	if f.file == "" {
		logger := newLogger(cmd, slog.LevelWarn)
		t, err = f.clusterSnapshot(cmd.Context(), opts, logger)
	} else {
		t, err = readTopology(f.file, cmd.InOrStdin())
	}
	if err != nil {
		return nil, nil, err
	}
	m, err := optimizer.Compile(t, opts)
	if err != nil {
		return nil, nil, err
	}
	return t, m, nil
}

func readTopology(path string, stdin io.Reader) (*optimizer.Topology, error) {
	if path == "-" {
		return optimizer.ParseTopology(stdin, "<stdin>")
	}
	file, err := os.Open(path)
	if err != nil {
		return nil, usageError{fmt.Errorf("reading topology: %w", err)}
	}
	defer file.Close()
	return optimizer.ParseTopology(file, path)
}

// writeStructured renders v as JSON or YAML into w. It renders into memory first, so a failure
// leaves nothing half-written.
func writeStructured(w io.Writer, format string, v any) error {
	var buf bytes.Buffer
	switch format {
	case "json":
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return err
		}
	case "yaml":
		enc := yaml.NewEncoder(&buf)
		enc.SetIndent(2)
		if err := enc.Encode(v); err != nil {
			return err
		}
		if err := enc.Close(); err != nil {
			return err
		}
	case "yaml-json-keys": // YAML with the JSON keys, for types without yaml tags
		out, err := sigsyaml.Marshal(v)
		if err != nil {
			return err
		}
		buf.Write(out)
	default:
		return badInput("unknown output format %q", format)
	}
	_, err := w.Write(buf.Bytes())
	return err
}
