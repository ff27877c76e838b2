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
		Short: "Remove every EnvoyFilter edgeflow manages from the cluster",
		Long: "uninstall deletes the EnvoyFilters that serve --istio-xds-address created (those labelled\n" +
			istio.ManagedByLabel + "=" + istio.ManagedByValue + " in --istio-namespace); Istio's sidecars then take every\n" +
			"service's endpoints from istiod again. Filters edgeflow does not own are never touched.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The rebalancer first: its webhook registration, its gates, its state.
			if err := uninstallRebalancer(cmd, &cf, timeout); err != nil {
				return err
			}
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
