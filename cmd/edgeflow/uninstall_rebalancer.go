package main

import (
	"context"
	"fmt"
	"io"

	"github.com/edgeflow/edgeflow/rebalancer"
)

// uninstallRebalancer is uninstall's rebalancer part: it removes the placement webhook's
// registration (when edgeflow's), lifts edgeflow's scheduling gate from every pod, and deletes
// the rebalancer's state ConfigMaps (rebalancer.Uninstall); dry, it lists them. Safe to run
// twice.
func uninstallRebalancer(ctx context.Context, out io.Writer, cf *clusterFlags, dry bool) error {
	cs, err := cf.clientset()
	if err != nil {
		return err
	}
	res, err := rebalancer.Uninstall(ctx, cs, rebalancer.UninstallConfig{DryRun: dry})
	if err != nil {
		return err
	}
	verb, lift := "removed", "lifted"
	if dry {
		verb, lift = "would remove", "would lift"
	}
	switch {
	case res.WebhookRemoved:
		fmt.Fprintf(out, "%s MutatingWebhookConfiguration %s\n", verb, rebalancer.WebhookName)
	case res.WebhookKept:
		fmt.Fprintf(out, "the MutatingWebhookConfiguration %s is not labelled %s=%s: left alone\n", rebalancer.WebhookName, rebalancer.ManagedByLabel, rebalancer.ManagedByValue)
	}
	for _, p := range res.Gated {
		fmt.Fprintf(out, "%s the %s scheduling gate of pod %s\n", lift, rebalancer.GateName, p)
	}
	fmt.Fprintf(out, "%d pods with the %s scheduling gate\n", res.GatesReleased, rebalancer.GateName)
	for _, s := range res.StateRemoved {
		fmt.Fprintf(out, "%s ConfigMap %s (the rebalancer's state)\n", verb, s)
	}
	return nil
}
