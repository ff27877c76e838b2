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
	// StateRemoved lists the state ConfigMap deleted (NAMESPACE/NAME), if any.
	StateRemoved []string
	// StateKept names the ConfigMap where the state would be (NAMESPACE/NAME) when it exists
	// without edgeflow's labels: left alone.
	StateKept string
	// StateMissing names the ConfigMap where the state would be when there is none.
	StateMissing string
}

// UninstallConfig configures Uninstall.
type UninstallConfig struct {
	// DryRun: find what Uninstall would remove and change nothing (the result says what it
	// found: WebhookRemoved for an edgeflow registration present, the gated pods, the state).
	DryRun bool
	// Namespace and LeaseName are the rebalancer's Lease's (rebalance --lease-namespace and
	// --lease-name; the chart's release namespace and rebalancer.leaseName): the state is the
	// ConfigMap LeaseName-state there (LeaseName empty: DefaultLeaseName). Namespace empty:
	// no state is removed.
	Namespace, LeaseName string
}

// Uninstall removes what the rebalancer put in the cluster, in an order that leaves no pod
// waiting: the webhook registration first (when edgeflow's: labelled ManagedByLabel), so that
// no new pod is gated; then edgeflow's gate on every pod of the cluster (one PATCH each, the
// pod's other gates kept); then the state ConfigMap, by its name in the Lease's namespace
// (cfg), and only if it carries the labels the rebalancer writes on it (ManagedByLabel and
// ComponentLabel): never another ConfigMap, labelled or not. It is idempotent: a second run finds nothing and
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

	if cfg.Namespace == "" {
		return res, nil
	}
	name := cfg.LeaseName
	if name == "" {
		name = DefaultLeaseName
	}
	name += stateSuffix
	ref := cfg.Namespace + "/" + name
	cm, err := cs.CoreV1().ConfigMaps(cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		res.StateMissing = ref
	case err != nil:
		return res, fmt.Errorf("rebalancer: uninstall: reading the state %s: %w", ref, err)
	case cm.Labels[ManagedByLabel] != ManagedByValue || cm.Labels[ComponentLabel] != ComponentValue:
		res.StateKept = ref
	case cfg.DryRun:
		res.StateRemoved = append(res.StateRemoved, ref)
	default:
		err := cs.CoreV1().ConfigMaps(cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cm.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return res, fmt.Errorf("rebalancer: uninstall: deleting the state %s: %w", ref, err)
		}
		if err == nil {
			res.StateRemoved = append(res.StateRemoved, ref)
		}
	}
	return res, nil
}
