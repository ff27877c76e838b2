package kube

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trim is the informers' transform: it keeps of each object only what the watcher and the
// rebalancer read (see Informers), in place (client-go hands the transform an object of its
// own). A DeletedFinalStateUnknown passes through untouched: its object is the cache's, trimmed
// already, and may be read concurrently.
func trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		trimPod(o)
	case *corev1.Node:
		trimNode(o)
	case *corev1.Service:
		trimMeta(&o.ObjectMeta)
	case *discoveryv1.EndpointSlice:
		trimMeta(&o.ObjectMeta)
	}
	return obj, nil
}

// trimMeta drops managed fields and every annotation but edgeflow's. An object that had
// annotations keeps a map (maybe empty): a JSON patch adding one of edgeflow's must not
// replace the others (the rebalancer's release patch adds the map only when there is none).
func trimMeta(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	if m.Annotations != nil {
		kept := map[string]string{}
		for k, v := range m.Annotations {
			if edgeflowAnnotation(k) {
				kept[k] = v
			}
		}
		m.Annotations = kept
	}
}

// trimPod keeps the pod's metadata (annotations but edgeflow's), its scheduling (node, gates,
// node selector, affinity, tolerations, topology spread, priority, volumes that bind a
// topology), its containers' names, requests, limits, restart policy and host ports, its
// pod-level resources and overhead, and of its status the phase, conditions (type and status)
// and IPs.
func trimPod(p *corev1.Pod) {
	trimMeta(&p.ObjectMeta)
	p.Spec.Containers = trimContainers(p.Spec.Containers)
	p.Spec.InitContainers = trimContainers(p.Spec.InitContainers)
	p.Spec.EphemeralContainers = nil
	var vols []corev1.Volume
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			vols = append(vols, corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: v.PersistentVolumeClaim, Ephemeral: v.Ephemeral}})
		}
	}
	p.Spec.Volumes = vols
	p.Spec.ImagePullSecrets = nil
	p.Spec.SecurityContext = nil
	p.Spec.DNSConfig = nil
	p.Spec.HostAliases = nil
	p.Spec.ReadinessGates = nil
	st := corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs, HostIP: p.Status.HostIP}
	for _, c := range p.Status.Conditions {
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: c.Type, Status: c.Status})
	}
	p.Status = st
}

func trimContainers(cs []corev1.Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				out[i].Ports = append(out[i].Ports, p)
			}
		}
	}
	return out
}

// trimNode keeps the node's metadata (annotations but edgeflow's), its taints and cordon, its
// allocatable resources and addresses: not its conditions (a heartbeat changes nothing cached),
// images or system info.
func trimNode(n *corev1.Node) {
	trimMeta(&n.ObjectMeta)
	n.Status = corev1.NodeStatus{Allocatable: n.Status.Allocatable, Addresses: n.Status.Addresses}
}

// samePodView says whether the watcher reads the same of two versions of a pod: its uid,
// node, service account, labels, owners, primary IP and container requests.
func samePodView(a, b *corev1.Pod) bool {
	if a.UID != b.UID || a.Spec.NodeName != b.Spec.NodeName || a.Spec.ServiceAccountName != b.Spec.ServiceAccountName ||
		a.Status.PodIP != b.Status.PodIP || !maps.Equal(a.Labels, b.Labels) || len(a.OwnerReferences) != len(b.OwnerReferences) ||
		len(a.Spec.Containers) != len(b.Spec.Containers) {
		return false
	}
	for i := range a.OwnerReferences {
		x, y := a.OwnerReferences[i], b.OwnerReferences[i]
		if x.Name != y.Name || x.Kind != y.Kind || (x.Controller == nil) != (y.Controller == nil) || (x.Controller != nil && *x.Controller != *y.Controller) {
			return false
		}
	}
	for i := range a.Spec.Containers {
		x, y := a.Spec.Containers[i].Resources.Requests, b.Spec.Containers[i].Resources.Requests
		if x.Cpu().Cmp(*y.Cpu()) != 0 || x.Memory().Cmp(*y.Memory()) != 0 {
			return false
		}
	}
	return true
}

// sameNodeView says whether the watcher reads the same of two versions of a node: its
// allocatable cpu and memory, locality labels and addresses.
func sameNodeView(a, b *corev1.Node) bool {
	if nodeLocality(a.Labels) != nodeLocality(b.Labels) || len(a.Status.Addresses) != len(b.Status.Addresses) {
		return false
	}
	for i := range a.Status.Addresses {
		if a.Status.Addresses[i] != b.Status.Addresses[i] {
			return false
		}
	}
	x, y := a.Status.Allocatable, b.Status.Allocatable
	return x.Cpu().Cmp(*y.Cpu()) == 0 && x.Memory().Cmp(*y.Memory()) == 0
}
