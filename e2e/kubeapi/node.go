package kubeapi

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// NodeSpec describes a node as its kubelet would register it. Zero fields take defaults.
type NodeSpec struct {
	Name string
	// CPU and Memory are the node's capacity and allocatable (defaults "4" and "8Gi").
	CPU, Memory string
	// Pods is the allocatable pod count (default 110). kube-scheduler rejects a node without
	// one ("Too many pods"), so it is always set.
	Pods int64
	// Labels are added to kubernetes.io/hostname=Name (and kubernetes.io/os=linux).
	Labels map[string]string
	// Taints are the node's taints. The not-ready taint that the TaintNodesByCondition
	// admission plugin puts on every new node is removed (the node is Ready); without that
	// kube-scheduler would wait for the node-lifecycle controller to remove it.
	Taints []corev1.Taint
	// Address is the node's InternalIP (none if empty).
	Address string
}

// CreateNode registers a Ready node with spec's allocatable and labels, and returns it. It does
// not renew the node's Lease: run a FakeKubelet for that when kube-controller-manager runs,
// or its node-lifecycle controller marks the node unreachable after its 50 s grace period.
func CreateNode(ctx context.Context, cs kubernetes.Interface, spec NodeSpec) (*corev1.Node, error) {
	if spec.Name == "" {
		return nil, fmt.Errorf("kubeapi: NodeSpec without a name")
	}
	if spec.CPU == "" {
		spec.CPU = "4"
	}
	if spec.Memory == "" {
		spec.Memory = "8Gi"
	}
	if spec.Pods == 0 {
		spec.Pods = 110
	}
	cpu, err := resource.ParseQuantity(spec.CPU)
	if err != nil {
		return nil, fmt.Errorf("kubeapi: node %s cpu: %w", spec.Name, err)
	}
	mem, err := resource.ParseQuantity(spec.Memory)
	if err != nil {
		return nil, fmt.Errorf("kubeapi: node %s memory: %w", spec.Name, err)
	}
	labels := map[string]string{corev1.LabelHostname: spec.Name, corev1.LabelOSStable: "linux"}
	for k, v := range spec.Labels {
		labels[k] = v
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Labels: labels},
		Spec: corev1.NodeSpec{Taints: spec.Taints}}
	n, err = cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	now := metav1.Now()
	res := corev1.ResourceList{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem,
		corev1.ResourcePods: *resource.NewQuantity(spec.Pods, resource.DecimalSI)}
	// kube-controller-manager may touch the new node between Create and this update (taints,
	// node lifecycle): read it again and retry on conflict.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := cs.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status.Capacity, cur.Status.Allocatable = res, res.DeepCopy()
		cur.Status.Phase = corev1.NodeRunning
		cur.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			Reason: "KubeletReady", Message: "kubelet is posting ready status (edgeflow test)",
			LastHeartbeatTime: now, LastTransitionTime: now}}
		if spec.Address != "" {
			cur.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: spec.Address},
				{Type: corev1.NodeHostName, Address: spec.Name}}
		}
		n, err = cs.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, err
	}
	// Remove the not-ready taint as the node-lifecycle controller would once it sees Ready
	// (it may do so concurrently: retry on conflict).
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := cs.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var kept []corev1.Taint
		for _, tt := range cur.Spec.Taints {
			if tt.Key != corev1.TaintNodeNotReady {
				kept = append(kept, tt)
			}
		}
		if len(kept) == len(cur.Spec.Taints) {
			n = cur
			return nil
		}
		cur.Spec.Taints = kept
		n, err = cs.CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}
