package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeflow/edgeflow/xds/istio"
)

func init() { subcommands = append(subcommands, newUninstallCommand) }

func newUninstallCommand() *cobra.Command {
	var (
		cf      clusterFlags
		flags   istioFlags
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "uninstall --kubeconfig PATH [--istio-namespace NS]",
		Short: "Remove every Istio object edgeflow manages from the cluster",
		Long: "uninstall first removes the rebalancer's placement webhook registration (when edgeflow's), lifts the\n" +
			"edgeflow.io/placement scheduling gate from every pod and deletes the rebalancer's state ConfigMaps.\n" +
			"Then it deletes what serve --istio-mode created, the objects labelled " + istio.ManagedByLabel + "=" + istio.ManagedByValue + ":\n" +
			"the EnvoyFilters in --istio-namespace, then the ConfigMaps " + istio.BootstrapConfigMapName + " in every namespace, and the\n" +
			"DestinationRules in every namespace; Istio's sidecars then take every service's endpoints and load balancing\n" +
			"from istiod and the user's own rules again. Objects edgeflow does not own are never touched; running it twice\n" +
			"is harmless. Remove the pods' " + istio.BootstrapAnnotation + " annotation first: a pod that still names a\n" +
			"deleted ConfigMap cannot restart.",
		Example: "  edgeflow uninstall --kubeconfig ~/.kube/config\n  edgeflow uninstall --kubeconfig ~/.kube/config --istio-namespace istio-system",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The rebalancer first: its webhook registration, its gates, its state.
			if err := uninstallRebalancer(cmd, &cf, timeout); err != nil {
				return err
			}
			filters := flags.config()
			filters.XDSAddress = "uninstall.invalid:1" // not used: uninstall only deletes by label
			r, err := cf.envoyFilterReconciler(filters, nil)
			if err != nil {
				return err
			}
			ctx, cancel := contextWithTimeout(cmd, timeout)
			defer cancel()
			if err := r.Uninstall(ctx); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "edgeflow's EnvoyFilters removed from namespace %s, its %s ConfigMaps from every namespace\n", flags.namespace, istio.BootstrapConfigMapName)
			ic, err := cf.istioClient()
			if err != nil {
				return err
			}
			rules, err := istio.NewRulesReconciler(istio.RulesReconcilerConfig{Client: ic})
			if err != nil {
				return usageError{err}
			}
			if err := rules.Uninstall(ctx); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "edgeflow's DestinationRules removed from every namespace")
			return nil
		},
	}
	cmd.Flags().StringVar(&cf.kubeconfig, "kubeconfig", "", "the cluster (else $KUBECONFIG; in a pod, the in-cluster config)")
	flags.register(cmd, false)
	cf.registerKubeLimits(cmd)
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "give up after this long")
	return cmd
}

func contextWithTimeout(cmd *cobra.Command, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), d)
}
