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
		Long: "uninstall deletes the EnvoyFilters (in --istio-namespace) and the DestinationRules (in every namespace)\n" +
			"that serve --istio-mode created, those labelled " + istio.ManagedByLabel + "=" + istio.ManagedByValue + "; Istio's sidecars then\n" +
			"take every service's endpoints and load balancing from istiod and the user's own rules again. Objects edgeflow\n" +
			"does not own are never touched. Running it twice is harmless.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ic, err := cf.istioClient()
			if err != nil {
				return err
			}
			filters := flags.config()
			filters.XDSAddress = "uninstall.invalid:1" // not used: uninstall only deletes by label
			r, err := istio.NewReconciler(istio.ReconcilerConfig{Filters: filters, Client: ic})
			if err != nil {
				return usageError{err}
			}
			ctx, cancel := contextWithTimeout(cmd, timeout)
			defer cancel()
			if err := r.Uninstall(ctx); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "edgeflow's EnvoyFilters removed from namespace %s\n", flags.namespace)
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
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "give up after this long")
	return cmd
}

func contextWithTimeout(cmd *cobra.Command, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), d)
}
