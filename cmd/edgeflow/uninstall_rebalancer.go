package main

import (
	"context"
	"fmt"
	"io"

	"github.com/edgeflow/edgeflow/rebalancer"
)

// uninstallRebalancer is uninstall's rebalancer part: it removes the placement webhook's
// registration (when edgeflow's), lifts edgeflow's scheduling gate from every pod, and deletes
// the rebalancer's state ConfigMap, by its name in the Lease's namespace and only if labelled
// as the rebalancer labels it (rebalancer.Uninstall); dry (cfg.DryRun), it lists them. Safe to
// run twice.
func uninstallRebalancer(ctx context.Context, out io.Writer, cf *clusterFlags, cfg rebalancer.UninstallConfig) error {
	cs, err := cf.clientset()
	if err != nil {
		return err
	}
	res, err := rebalancer.Uninstall(ctx, cs, cfg)
	if err != nil {
		return err
	}
	verb, lift := "removed", "lifted"
	if cfg.DryRun {
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
	switch {
	case res.StateKept != "":
		fmt.Fprintf(out, "the ConfigMap %s is not labelled %s=%s, %s=%s: left alone (not the rebalancer's state)\n", res.StateKept,
			rebalancer.ManagedByLabel, rebalancer.ManagedByValue, rebalancer.ComponentLabel, rebalancer.ComponentValue)
	case res.StateMissing != "":
		fmt.Fprintf(out, "the rebalancer's state: no ConfigMap %s (--lease-namespace, --lease-name)\n", res.StateMissing)
	}
	return nil
}
