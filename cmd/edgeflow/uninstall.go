package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/xds/istio"
)

func init() { subcommands = append(subcommands, newUninstallCommand) }

// The parts uninstall --only selects, in the order uninstall removes them.
const (
	partRebalancer      = "rebalancer"
	partEnvoyFilter     = istioModeEnvoyFilter
	partDestinationRule = istioModeDestinationRule
	partIstio           = "istio" // envoyfilter and destinationrule
)

var uninstallParts = []string{partRebalancer, partEnvoyFilter, partDestinationRule}

// uninstallOptions are uninstall's flags.
type uninstallOptions struct {
	cf      clusterFlags
	flags   istioFlags
	timeout time.Duration
	dryRun  bool
	only    []string
	stop    string // NAMESPACE/NAME of a Deployment to scale to zero first
	// the rebalancer's Lease, whose name-state ConfigMap is its state
	leaseNamespace, leaseName string
}

// parts is the set --only selects (every part without it).
func (o *uninstallOptions) parts() (map[string]bool, error) {
	if len(o.only) == 0 {
		o.only = uninstallParts
	}
	sel := map[string]bool{}
	for _, p := range o.only {
		switch p = strings.TrimSpace(p); {
		case p == partIstio:
			sel[partEnvoyFilter], sel[partDestinationRule] = true, true
		case slices.Contains(uninstallParts, p):
			sel[p] = true
		default:
			return nil, badInput("--only %q: want %s or %s (comma-separated)", p, strings.Join(uninstallParts, ", "), partIstio)
		}
	}
	return sel, nil
}

func newUninstallCommand() *cobra.Command {
	var o uninstallOptions
	cmd := &cobra.Command{
		Use:   "uninstall [--dry-run] [--only PARTS] [--stop-deployment NS/NAME] [--kubeconfig PATH] [--context NAME] [--istio-namespace NS] [--lease-namespace NS]",
		Short: "Remove everything edgeflow wrote into the cluster (--dry-run: list it)",
		Long: "uninstall removes what edgeflow wrote into the cluster, part by part (--only selects parts; default all):\n" +
			"  rebalancer       the placement webhook's registration (when edgeflow's), the edgeflow.io/placement\n" +
			"                   scheduling gate on every pod (other gates stay), the rebalancer's state: the ConfigMap\n" +
			"                   LEASE-NAME-state in --lease-namespace, only if labelled as the rebalancer labels it\n" +
			"  envoyfilter      the EnvoyFilters in --istio-namespace, then the " + istio.BootstrapConfigMapName + " ConfigMaps in every namespace\n" +
			"  destinationrule  the DestinationRules in every namespace\n" +
			"  istio            envoyfilter and destinationrule\n" +
			"Only objects labelled " + istio.ManagedByLabel + "=" + istio.ManagedByValue + " are deleted, EnvoyFilters only when also named\n" +
			"edgeflow-eds.NAMESPACE and annotated " + istio.FilterNamespaceAnnotation + "=NAMESPACE as edgeflow writes them, or exactly as\n" +
			"an earlier edgeflow wrote one per service (a label alone is anyone's to set: such a filter is left and\n" +
			"logged); Istio's sidecars then take every\n" +
			"service's endpoints and load balancing from istiod and the user's own rules again. Running it twice is\n" +
			"harmless. Stop edgeflow first, or a running replica writes again what this removes: --stop-deployment\n" +
			"scales edgeflow's Deployment to zero and waits until its pods are gone (the Helm chart's pre-delete hook\n" +
			"runs exactly this). Remove the pods' " + istio.BootstrapAnnotation + " annotation first: a pod that still\n" +
			"names a deleted ConfigMap cannot restart. --dry-run lists what would be removed and changes nothing.",
		Example: "  edgeflow uninstall --dry-run\n" +
			"  edgeflow uninstall --context edge-prod --stop-deployment edgeflow/edgeflow\n" +
			"  edgeflow uninstall --only istio --istio-namespace istio-system",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	fl := cmd.Flags()
	o.cf.registerKubeconfig(cmd, "the cluster's kubeconfig (default: kubectl's: $KUBECONFIG, else ~/.kube/config, else in a pod the in-cluster config)")
	o.flags.register(cmd, false)
	o.cf.registerKubeLimits(cmd)
	fl.DurationVar(&o.timeout, "timeout", time.Minute, "give up after this long")
	dryRunVar(cmd, &o.dryRun, "dry-run", false, "client (also the bare flag): list what would be removed, change nothing; none (the default): remove it")
	fl.StringSliceVar(&o.only, "only", nil, "remove only these parts: "+strings.Join(uninstallParts, ", ")+", "+partIstio+" (default: all)")
	fl.StringVar(&o.stop, "stop-deployment", "", "NAMESPACE/NAME: first scale this Deployment (edgeflow serve) to zero replicas and wait until its pods are gone")
	fl.StringVar(&o.leaseNamespace, "lease-namespace", "", "the rebalancer's: namespace of its Lease and state ConfigMap, as given to rebalance or serve (default: the kubeconfig context's namespace; in a pod its own)")
	fl.StringVar(&o.leaseName, "lease-name", rebalancer.DefaultLeaseName, "the rebalancer's: name of its Lease; its state is the ConfigMap NAME-state")
	return cmd
}

func (o *uninstallOptions) run(cmd *cobra.Command) error {
	parts, err := o.parts()
	if err != nil {
		return err
	}
	if o.stop != "" {
		if _, _, err := deploymentRef(o.stop); err != nil {
			return err
		}
	}
	out := cmd.OutOrStdout()
	ctx, cancel := contextWithTimeout(cmd, o.timeout)
	defer cancel()
	if o.stop != "" {
		cs, err := o.cf.clientset()
		if err != nil {
			return err
		}
		if err := stopDeployment(ctx, cs, o.stop, o.dryRun, out); err != nil {
			return err
		}
	}
	// The rebalancer first: its webhook registration, its gates, its state.
	if parts[partRebalancer] {
		ns := o.leaseNamespace
		if ns == "" {
			if ns, err = o.cf.namespace(); err != nil {
				return err
			}
		}
		cfg := rebalancer.UninstallConfig{DryRun: o.dryRun, Namespace: ns, LeaseName: o.leaseName}
		if err := uninstallRebalancer(ctx, out, &o.cf, cfg); err != nil {
			return err
		}
	}
	if parts[partEnvoyFilter] {
		filters := o.flags.config()
		filters.XDSAddress = "uninstall.invalid:1" // not used: uninstall only deletes by label
		r, err := o.cf.envoyFilterReconciler(filters, nil, nil)
		if err != nil {
			return err
		}
		found, err := r.Managed(ctx)
		if err != nil {
			return err
		}
		if !o.dryRun {
			if err := r.Uninstall(ctx); err != nil {
				return err
			}
		}
		report(out, o.dryRun, found, fmt.Sprintf("edgeflow's EnvoyFilters in namespace %s and %s ConfigMaps", o.flags.namespace, istio.BootstrapConfigMapName))
	}
	if parts[partDestinationRule] {
		ic, err := o.cf.istioClient()
		if err != nil {
			return err
		}
		rules, err := istio.NewRulesReconciler(istio.RulesReconcilerConfig{Client: ic})
		if err != nil {
			return usageError{err}
		}
		found, err := rules.Managed(ctx)
		if err != nil {
			return err
		}
		if !o.dryRun {
			if err := rules.Uninstall(ctx); err != nil {
				return err
			}
		}
		report(out, o.dryRun, found, "edgeflow's DestinationRules")
	}
	return nil
}

// report prints what a part removed (or, dry, would remove), one object a line.
func report(out io.Writer, dry bool, objs []string, what string) {
	verb := "removed"
	if dry {
		verb = "would remove"
	}
	if len(objs) == 0 {
		fmt.Fprintf(out, "%s: none found\n", what)
		return
	}
	for _, o := range objs {
		fmt.Fprintf(out, "%s %s\n", verb, o)
	}
}

// stopDeployment scales the Deployment ref (NAMESPACE/NAME) to zero replicas and waits until
// none of its pods is left (terminating ones included), polling every second until ctx ends.
// A Deployment not found is nothing to stop.
func stopDeployment(ctx context.Context, cs kubernetes.Interface, ref string, dry bool, out io.Writer) error {
	ns, name, err := deploymentRef(ref)
	if err != nil {
		return err
	}
	scale, err := cs.AppsV1().Deployments(ns).GetScale(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		fmt.Fprintf(out, "Deployment %s not found: nothing to stop\n", ref)
		return nil
	}
	if err != nil {
		return fmt.Errorf("stopping Deployment %s: %w", ref, err)
	}
	if dry {
		fmt.Fprintf(out, "would scale Deployment %s from %d replicas to 0 and wait until its pods are gone\n", ref, scale.Spec.Replicas)
		return nil
	}
	if scale.Spec.Replicas != 0 {
		scale.Spec.Replicas = 0
		if _, err := cs.AppsV1().Deployments(ns).UpdateScale(ctx, name, scale, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("scaling Deployment %s to 0: %w", ref, err)
		}
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: scale.Status.Selector})
		if err != nil {
			return fmt.Errorf("waiting for the pods of Deployment %s to go: %w", ref, err)
		}
		if len(pods.Items) == 0 {
			fmt.Fprintf(out, "Deployment %s scaled to 0, its pods gone\n", ref)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopping Deployment %s: scaled to 0, but %d of its pods still run (first: %s): %w; nothing else removed",
				ref, len(pods.Items), pods.Items[0].Name, ctx.Err())
		case <-tick.C:
		}
	}
}

// deploymentRef splits --stop-deployment's NAMESPACE/NAME.
func deploymentRef(ref string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", badInput("--stop-deployment %q: want NAMESPACE/NAME", ref)
	}
	return ns, name, nil
}

func contextWithTimeout(cmd *cobra.Command, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), d)
}
