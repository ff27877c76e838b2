package main

import (
	"bytes"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeflow/edgeflow/optimizer"
)

func init() { subcommands = append(subcommands, newPlaceCommand) }

func newPlaceCommand() *cobra.Command {
	var (
		tf      topologyFlags
		policy  optimizer.PlacementPolicy
		output  string
		budget  time.Duration
		maxUtil float64
	)
	cmd := &cobra.Command{
		Use:   "place -f FILE [--policy P] [--budget D] [-o table|json|yaml|topology]",
		Short: "Compute a replica placement for a topology file",
		Long: "place reads a topology (nodes with allocatable cpu and memory, latencies, services with their\n" +
			"requests and replicas, calls, ingress) and decides the node of every pod, within node cpu and\n" +
			"memory and a spread cap of ceil(replicas/nodes) pods of a service per node, so that the optimal\n" +
			"traffic allocation (LATA) is as cheap as possible. Pods are named SERVICE-0 … SERVICE-(n-1) when\n" +
			"the file gives only replicas; nodes a file gives for pods are ignored.\n\n" +
			"Policies: larp (default: the paper's greedy from every start node, then local search on the exact\n" +
			"cost; where pods have capacity_rps, the cost is network + queueing, and larp's placement is never worse\n" +
			"on it than the network-only one), larp-greedy (the paper's greedy), k8s-spread (what the default\n" +
			"scheduler does).\n\n" +
			"--budget bounds larp's search (default 10s, 0: no limit): when it runs out, place prints the best\n" +
			"placement found so far and says so on stderr (and \"truncated\": true in json/yaml). Only a run that\n" +
			"was not cut short is deterministic.\n\n" +
			"--max-node-utilization (default 0.7, 0: no limit) bounds every node's planned utilisation: the cpu its\n" +
			"pods use at the load the call graph gives them (a pod's cpu request × load / capacity_rps; the whole\n" +
			"request for a pod without capacity_rps) over the node's cores. A placement that cannot keep it is an\n" +
			"error naming the service.\n\n" +
			"Output: table (each pod's node, per-node use and planned utilisation, the network and queueing parts\n" +
			"of the cost beside k8s-spread's), json or yaml ({policy, placement: {pod: node}, cost, queueing,\n" +
			"utilization: [{node, cores, cpu, utilization}]}), or topology: the input with the pods placed, which\n" +
			"edgeflow plan reads (edgeflow place -f F -o topology | edgeflow plan -f -).",
		Example: "  edgeflow place -f examples/bookinfo.yaml\n" +
			"  edgeflow place -f examples/bookinfo.yaml --policy larp-greedy -o json\n" +
			"  edgeflow place -f examples/bookinfo.yaml -o topology | edgeflow plan -f -",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if budget < 0 {
				return usageError{fmt.Errorf("--budget %v: must be >= 0 (0: no limit)", budget)}
			}
			if !(maxUtil >= 0 && maxUtil <= 1) {
				return usageError{fmt.Errorf("--max-node-utilization %v: must be in (0, 1], or 0 for no limit", maxUtil)}
			}
			opts := tf.options(cmd)
			opts.Unplaced = true
			opts.MaxNodeUtilization = maxUtil
			t, m, err := tf.load(cmd, opts)
			if err != nil {
				return err
			}
			pl, err := optimizer.PlaceWithOptions(m, policy, optimizer.PlaceOptions{Budget: budget})
			if err != nil {
				return err
			}
			if c := pl.Cut; pl.Truncated && c != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "edgeflow place: the %v budget cut the search short: best placement so far "+
					"(%d of %d starts built, %d of %d local searches finished, %d passes); not deterministic, raise --budget for the full search\n",
					budget, c.StartsBuilt, c.Starts, c.SearchesFinished, c.Searches, c.Passes)
			}
			switch output {
			case "json", "yaml":
				return writeStructured(cmd.OutOrStdout(), output, pl)
			case "topology":
				return writeStructured(cmd.OutOrStdout(), "yaml", placedTopology(t, m, pl, opts))
			}
			base := pl
			if policy != optimizer.K8sSpread {
				// The baseline is only shown: if its packing gives up where policy found a
				// placement, the table says n/a.
				if base, err = optimizer.Place(m, optimizer.K8sSpread); err != nil {
					base = nil
				}
			}
			return writePlaceTable(cmd.OutOrStdout(), m, pl, base)
		},
	}
	tf.register(cmd)
	enumVar(cmd, cmd.Flags(), &enumFlag[optimizer.PlacementPolicy]{p: &policy, values: optimizer.PlacementPolicies(),
		parse: optimizer.ParsePlacementPolicy, typ: "policy", noun: "placement policy"}, "policy", "", optimizer.LARP, "placement policy: larp, larp-greedy, k8s-spread")
	outputVar(cmd, &output, "output format: table, json, yaml, topology", "table", "json", "yaml", "topology")
	cmd.Flags().DurationVar(&budget, "budget", optimizer.DefaultPlaceBudget, "wall-time budget of larp's search; when it runs out the best placement so far is printed (0: no limit)")
	cmd.Flags().Float64Var(&maxUtil, "max-node-utilization", optimizer.DefaultMaxNodeUtilization, "highest planned utilisation of a node's cores, in (0, 1] (0: no limit)")
	return cmd
}

// placedTopology is the input with the pods placed (see Placement.Apply). When a default latency
// filled node pairs the file does not give, those pairs are written out, so the result plans
// without the flag.
func placedTopology(t *optimizer.Topology, m *optimizer.Model, pl *optimizer.Placement, opts optimizer.Options) *optimizer.Topology {
	out := pl.Apply(t)
	if opts.DefaultLatencyMS == nil {
		return out
	}
	given := map[[2]string]bool{}
	for _, l := range t.Latency {
		given[[2]string{l.From, l.To}] = true
		given[[2]string{l.To, l.From}] = true
	}
	if zones := m.Latency.Zones(); zones != nil { // the entries name zones
		for g, a := range zones {
			for h := g + 1; h < len(zones); h++ {
				if !given[[2]string{a, zones[h]}] {
					out.Latency = append(out.Latency, optimizer.Latency{From: a, To: zones[h], MS: m.Latency.ZoneAt(g, h)})
				}
			}
		}
		return out
	}
	for u, a := range m.Nodes {
		for v := u + 1; v < len(m.Nodes); v++ {
			b := m.Nodes[v]
			if !given[[2]string{a.Name, b.Name}] {
				out.Latency = append(out.Latency, optimizer.Latency{From: a.Name, To: b.Name, MS: m.Latency.At(u, v)})
			}
		}
	}
	return out
}

// writePlaceTable prints every pod's node, each node's use, and the cost beside k8s-spread's
// (base; nil if it has none).
func writePlaceTable(w io.Writer, m *optimizer.Model, pl, base *optimizer.Placement) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tPOD\tNODE\t")
	cpu := make(map[string]int64, len(m.Nodes))
	mem := make(map[string]int64, len(m.Nodes))
	pods := make(map[string]int, len(m.Nodes))
	for _, s := range m.Services {
		name := s.Name
		for _, p := range s.Pods {
			node := pl.Placement[p.Name]
			fmt.Fprintf(tw, "%s\t%s\t%s\t\n", name, p.Name, node)
			name = ""
			cpu[node] += s.CPU
			mem[node] += s.Mem
			pods[node]++
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "NODE\tPODS\tCPU(m)\tMEMORY(MiB)\tPLANNED CPU(m)\tUTILIZATION\t")
	for v, n := range m.Nodes {
		use := "n/a"
		if v < len(pl.Utilization) {
			use = utilization(pl.Utilization[v], m.MaxNodeUtilization)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t\n", n.Name, pods[n.Name], usage(cpu[n.Name], n.CPU), usage(mem[n.Name], n.Memory), use)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "\tCOST(%s)\tCOST(%s)\tCHANGE\t\n", pl.Policy, optimizer.K8sSpread)
	rows := []struct {
		name string
		of   func(*optimizer.Placement) float64
	}{
		{"network", func(p *optimizer.Placement) float64 { return p.Cost }},
		{"queueing", func(p *optimizer.Placement) float64 { return p.Queueing }},
		{"total", func(p *optimizer.Placement) float64 { return p.Cost + p.Queueing }},
	}
	for _, r := range rows {
		if base != nil {
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%s\t\n", r.name, r.of(pl), r.of(base), change(r.of(pl), r.of(base)))
		} else {
			fmt.Fprintf(tw, "%s\t%.1f\tn/a\tn/a\t\n", r.name, r.of(pl))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(&buf, "\nnetwork = optimal LATA cost of the placed topology: Σ rps × latency over all routes, in ms·req/s\n"+
		"queueing = Σ over pods with capacity_rps of their M/M/1 queueing, each pod's rate shared with its node's other pods (ms·req/s)\n"+
		"planned cpu = the cpu the pods use at their planned load (the request without capacity_rps); utilization = planned cpu / cores\n")
	_, err := w.Write(buf.Bytes())
	return err
}

// utilization shows a node's planned cpu and utilisation, marking one over limit (0: none).
func utilization(u optimizer.NodeUse, limit float64) string {
	if u.Cores == 0 {
		return fmt.Sprintf("%.0f\tn/a (cores unknown)", u.CPU)
	}
	mark := ""
	if limit > 0 && u.Utilization > limit {
		mark = fmt.Sprintf(" (over %.2f)", limit)
	}
	return fmt.Sprintf("%.0f\t%.2f of %d cores%s", u.CPU, u.Utilization, u.Cores, mark)
}

func usage(used, alloc int64) string {
	if alloc == 0 {
		return fmt.Sprintf("%d/unlimited", used)
	}
	return fmt.Sprintf("%d/%d", used, alloc)
}
