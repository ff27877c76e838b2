package rebalancer

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// UninstallResult says what Uninstall removed.
type UninstallResult struct {
	// WebhookRemoved: the placement webhook's registration was edgeflow's and is deleted.
	WebhookRemoved bool
	// WebhookKept: a registration named WebhookName exists that edgeflow did not create (no
	// ManagedByLabel); it is left alone.
	WebhookKept bool
	// GatesReleased counts the pods whose edgeflow.io/placement gate was lifted.
	GatesReleased int
	// Gated lists those pods (NAMESPACE/NAME).
	Gated []string
	// StateRemoved lists the state ConfigMaps deleted (NAMESPACE/NAME).
	StateRemoved []string
}

// UninstallConfig configures Uninstall.
type UninstallConfig struct {
	// DryRun: find what Uninstall would remove and change nothing (the result says what it
	// found: WebhookRemoved for an edgeflow registration present, the gated pods, the state).
	DryRun bool
}

// Uninstall removes what the rebalancer put in the cluster, in an order that leaves no pod
// waiting: the webhook registration first (when edgeflow's: labelled ManagedByLabel), so that
// no new pod is gated; then edgeflow's gate on every pod of the cluster (one PATCH each, the
// pod's other gates kept); then the state ConfigMaps (labelled ManagedByLabel and
// ComponentLabel, in every namespace). It is idempotent: a second run finds nothing and
// succeeds. Stop the rebalancer first, or its leader may gate a replacement meanwhile (a gate
// it set is lifted within its gate timeout in any case). With cfg.DryRun it only reads.
func Uninstall(ctx context.Context, cs kubernetes.Interface, cfg UninstallConfig) (UninstallResult, error) {
	var res UninstallResult
	wh, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, WebhookName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return res, fmt.Errorf("rebalancer: uninstall: the webhook registration %s: %w", WebhookName, err)
	case wh.Labels[ManagedByLabel] != ManagedByValue:
		res.WebhookKept = true
	case cfg.DryRun:
		res.WebhookRemoved = true
	default:
		err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, WebhookName,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &wh.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return res, fmt.Errorf("rebalancer: uninstall: deleting the webhook registration %s: %w", WebhookName, err)
		}
		res.WebhookRemoved = err == nil
	}

	opts := metav1.ListOptions{Limit: 500}
	for {
		pods, err := cs.CoreV1().Pods("").List(ctx, opts)
		if err != nil {
			return res, fmt.Errorf("rebalancer: uninstall: listing pods: %w", err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if !hasGate(p) {
				continue
			}
			if cfg.DryRun {
				res.GatesReleased++
				res.Gated = append(res.Gated, p.Namespace+"/"+p.Name)
				continue
			}
			patch, err := releasePatch(p, "", metav1.Now().Time)
			if err != nil {
				return res, err
			}
			_, err = cs.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return res, fmt.Errorf("rebalancer: uninstall: releasing pod %s/%s: %w", p.Namespace, p.Name, err)
			}
			res.GatesReleased++
			res.Gated = append(res.Gated, p.Namespace+"/"+p.Name)
		}
		if pods.Continue == "" {
			break
		}
		opts.Continue = pods.Continue
	}

	sel := ManagedByLabel + "=" + ManagedByValue + "," + ComponentLabel + "=" + ComponentValue
	cms, err := cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return res, fmt.Errorf("rebalancer: uninstall: listing the state ConfigMaps: %w", err)
	}
	for _, cm := range cms.Items {
		if cfg.DryRun {
			res.StateRemoved = append(res.StateRemoved, cm.Namespace+"/"+cm.Name)
			continue
		}
		err := cs.CoreV1().ConfigMaps(cm.Namespace).Delete(ctx, cm.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return res, fmt.Errorf("rebalancer: uninstall: deleting the state %s/%s: %w", cm.Namespace, cm.Name, err)
		}
		if err == nil {
			res.StateRemoved = append(res.StateRemoved, cm.Namespace+"/"+cm.Name)
		}
	}
	return res, nil
}
