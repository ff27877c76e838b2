package main

import (
	"bytes"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	clientnetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds/istio"
)

func init() { subcommands = append(subcommands, newPlanCommand) }

func newPlanCommand() *cobra.Command {
	var (
		tf     topologyFlags
		policy optimizer.Policy
		output string
		istioF istioFlags
	)
	cmd := &cobra.Command{
		Use:   "plan -f FILE [--policy P] [-o table|json|yaml|istio]",
		Short: "Compute the traffic allocation of a topology file",
		Long: "plan reads a topology (nodes, latencies, services with placed pods, calls, ingress) and prints,\n" +
			"for every call edge and caller pod, the fraction of its requests to send to each callee pod.\n" +
			"The table shows the total cost (Σ rps × latency) beside what round-robin would cost.\n\n" +
			"-o istio prints the DestinationRules serve --istio-mode=destinationrule would apply (networking.istio.io/v1,\n" +
			"multi-document YAML for kubectl apply or GitOps): the plan made between localities (nodes' locality, or a\n" +
			"topology file's `locality: region/zone/subzone`), one rule per caller service and callee host. From a live\n" +
			"cluster the user's own DestinationRules are read and carried over, as serve does.",
		Example: "  edgeflow plan -f examples/bookinfo.yaml\n  edgeflow plan -f examples/dag.yaml --policy opttraffic -o json\n" +
			"  edgeflow plan -f examples/bookinfo.yaml -o istio | kubectl apply -f -",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, m, err := tf.load(cmd, tf.options(cmd))
			if err != nil {
				return err
			}
			if output == "istio" {
				return writeIstioRules(cmd, &tf, &istioF, t, policy)
			}
			alloc, err := optimizer.Plan(m, policy)
			if err != nil {
				return err
			}
			if output != "table" {
				return writeStructured(cmd.OutOrStdout(), output, alloc)
			}
			rr, err := optimizer.Plan(m, optimizer.RoundRobin)
			if err != nil {
				return err
			}
			return writePlanTable(cmd.OutOrStdout(), alloc, rr)
		},
	}
	tf.register(cmd)
	policyVar(cmd, &policy)
	outputVar(cmd, &output, "output format: table, json, yaml, istio (the DestinationRules serve --istio-mode=destinationrule applies)",
		"table", "json", "yaml", "istio")
	istioF.registerRules(cmd)
	return cmd
}

// writeIstioRules prints the DestinationRules of t's locality plan, with the user's rules read
// from the cluster when the topology came from one.
func writeIstioRules(cmd *cobra.Command, tf *topologyFlags, f *istioFlags, t *optimizer.Topology, p optimizer.Policy) error {
	plan, err := istio.PlanLocalities(t, p, tf.options(cmd))
	if err != nil {
		return err
	}
	var user []*clientnetworkingv1.DestinationRule
	if tf.file == "" {
		ic, err := tf.istioClient()
		if err != nil {
			return err
		}
		list, err := ic.NetworkingV1().DestinationRules(metav1.NamespaceAll).List(cmd.Context(), metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("reading the cluster's DestinationRules: %w", err)
		}
		user = list.Items
	}
	rules, rep := istio.DestinationRules(f.rulesConfig(), plan, user)
	out, err := istio.MarshalRulesYAML(rules, rep)
	if err != nil {
		return err
	}
	_, err = cmd.OutOrStdout().Write(out)
	return err
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return badInput("%s takes no arguments, got %q", cmd.CommandPath(), args)
	}
	return nil
}

// writePlanTable prints the routes of every call edge and the cost beside round-robin's.
func writePlanTable(w io.Writer, alloc, rr *optimizer.Allocation) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CALL\tCALLER\tCALLEE\tFRACTION\tRPS\tLATENCY(ms)")
	for _, c := range alloc.Calls {
		call := c.From + " → " + c.To
		prev := ""
		for _, r := range c.Routes {
			caller := r.Caller
			if caller == prev {
				caller = ""
			}
			prev = r.Caller
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.4f\t%.2f\t%.2f\n", call, caller, r.Callee, r.Fraction, r.RPS, r.LatencyMS)
			call = ""
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	buf.WriteString("\n")
	tw = tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "CALL\tCOST(%s)\tCOST(round-robin)\tCHANGE\n", alloc.Policy)
	for i, c := range alloc.Calls {
		fmt.Fprintf(tw, "%s → %s\t%.1f\t%.1f\t%s\n", c.From, c.To, c.Cost, rr.Calls[i].Cost, change(c.Cost, rr.Calls[i].Cost))
	}
	fmt.Fprintf(tw, "total\t%.1f\t%.1f\t%s\n", alloc.Cost, rr.Cost, change(alloc.Cost, rr.Cost))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(&buf, "\ncost = Σ rps × latency over all routes, in ms·req/s\n")
	if alloc.Policy == optimizer.LATAQ || alloc.Policy == optimizer.ClosedLoop {
		writeQueued(&buf, alloc)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// writeQueued prints what lata-q adds to the cost: the queueing term, the services it served as
// lata because the cap cannot hold their load, and whether lata's plan was served instead.
func writeQueued(buf *bytes.Buffer, alloc *optimizer.Allocation) {
	fmt.Fprintf(buf, "queue cost = Σ 1000·ℓ/(μ−ℓ) over the pods with a service rate: %.1f ms·req/s (cost + queue cost = %.1f)\n",
		alloc.QueueCost, alloc.Cost+alloc.QueueCost)
	for _, why := range alloc.Saturated {
		fmt.Fprintf(buf, "saturated, served as lata: %s\n", why)
	}
	if alloc.ServedAsLATA {
		fmt.Fprintln(buf, "lata's routes are served: lata-q's own plan cost no less in its objective")
	}
}

func change(v, base float64) string {
	if base == 0 {
		if v == 0 {
			return "0.0%"
		}
		return "n/a"
	}
	return fmt.Sprintf("%+.1f%%", 100*(v-base)/base)
}
