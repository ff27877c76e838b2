package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeflow/edgeflow/rebalancer"
)

// uninstallRebalancer is uninstall's rebalancer part: it removes the placement webhook's
// registration (when edgeflow's), lifts edgeflow's scheduling gate from every pod, and deletes
// the rebalancer's state ConfigMaps (rebalancer.Uninstall). Safe to run twice.
func uninstallRebalancer(cmd *cobra.Command, cf *clusterFlags, timeout time.Duration) error {
	cs, err := cf.clientset()
	if err != nil {
		return err
	}
	ctx, cancel := contextWithTimeout(cmd, timeout)
	defer cancel()
	res, err := rebalancer.Uninstall(ctx, cs)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	switch {
	case res.WebhookRemoved:
		fmt.Fprintf(out, "the placement webhook's registration %s removed\n", rebalancer.WebhookName)
	case res.WebhookKept:
		fmt.Fprintf(out, "the MutatingWebhookConfiguration %s is not labelled %s=%s: left alone\n", rebalancer.WebhookName, rebalancer.ManagedByLabel, rebalancer.ManagedByValue)
	}
	fmt.Fprintf(out, "%d pods released from the %s scheduling gate\n", res.GatesReleased, rebalancer.GateName)
	if len(res.StateRemoved) > 0 {
		fmt.Fprintf(out, "the rebalancer's state removed: %s\n", strings.Join(res.StateRemoved, ", "))
	}
	return nil
}
