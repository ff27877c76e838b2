package rebalancer

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/edgeflow/edgeflow/optimizer"
)

// Pod informer indexes.
const (
	// indexNode indexes pods by spec.nodeName (bound pods only): a node's use without a list
	// of every pod.
	indexNode = "node"
	// indexGate indexes the pods the gate worker looks after: "gated" (edgeflow's scheduling
	// gate is on) and "placing" (released to a planned node, not bound yet).
	indexGate = "gate"
)

const (
	gateGated   = "gated"
	gatePlacing = "placing"
)

// Annotations the rebalancer puts on a replacement it releases to a planned node: the node
// and when (RFC 3339). A pod that carries them and is still not bound PlacementTimeout after is
// deleted once, by any replica.
const (
	AnnotationPlacedOn = "edgeflow.io/placed-on"
	AnnotationPlacedAt = "edgeflow.io/placed-at"
)

func indexPodNode(obj any) ([]string, error) {
	if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" && !terminal(p) {
		return []string{p.Spec.NodeName}, nil
	}
	return nil, nil
}

func indexPodGate(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.DeletionTimestamp != nil {
		return nil, nil
	}
	switch {
	case hasGate(p):
		return []string{gateGated}, nil
	case placing(p):
		return []string{gatePlacing}, nil
	}
	return nil, nil
}

// placing says whether the pod was released to a planned node and is not bound yet.
func placing(p *corev1.Pod) bool {
	return p.Spec.NodeName == "" && p.Annotations[AnnotationPlacedAt] != "" && !terminal(p)
}

// placedAt is when the pod was released to its planned node (zero if not, or unreadable).
func placedAt(p *corev1.Pod) time.Time {
	t, _ := time.Parse(time.RFC3339, p.Annotations[AnnotationPlacedAt])
	return t
}

// cacheSnapshot is what one planning run reads from the informer caches: every pod, and each node
// with what its pods request. It is built only for a planning run.
type cacheSnapshot struct {
	pods  map[podKey]*corev1.Pod
	nodes map[string]*nodeUse
	// selected maps a managed service key to the pods its selector picks (not terminating).
	selected map[string][]*corev1.Pod
}

type podKey struct{ namespace, name string }

// readCaches reads the caches into a cacheSnapshot.
func (c *Controller) readCaches() (*cacheSnapshot, error) {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("rebalancer: listing pods: %w", err)
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("rebalancer: listing nodes: %w", err)
	}
	w := &cacheSnapshot{pods: make(map[podKey]*corev1.Pod, len(pods)), nodes: make(map[string]*nodeUse, len(nodes)),
		selected: map[string][]*corev1.Pod{}}
	for _, n := range nodes {
		w.nodes[n.Name] = newNodeUse(n)
	}
	byNS := map[string][]*corev1.Pod{} // live pods (not terminating, not finished) by namespace
	for _, p := range pods {
		w.pods[podKey{p.Namespace, p.Name}] = p
		if n := w.nodes[p.Spec.NodeName]; n != nil && !terminal(p) {
			n.reserve(podRequests(p))
		}
		if p.DeletionTimestamp == nil && !terminal(p) {
			byNS[p.Namespace] = append(byNS[p.Namespace], p)
		}
	}
	for _, l := range c.services {
		svcs, err := l.List(c.selector)
		if err != nil {
			return nil, fmt.Errorf("rebalancer: listing services: %w", err)
		}
		for _, s := range svcs {
			if len(s.Spec.Selector) == 0 {
				continue
			}
			sel := labels.SelectorFromSet(s.Spec.Selector)
			key := optimizer.QualifiedName(s.Name, s.Namespace)
			w.selected[key] = nil
			for _, p := range byNS[s.Namespace] {
				if sel.Matches(labels.Set(p.Labels)) {
					w.selected[key] = append(w.selected[key], p)
				}
			}
		}
	}
	return w, nil
}

// nodeUse reads one node and the pods bound to it from the caches (the node index), for a
// release: no list of every pod.
func (c *Controller) nodeUse(name string) (*nodeUse, error) {
	n, err := c.nodes.Get(name)
	if err != nil {
		return nil, err
	}
	u := newNodeUse(n)
	objs, err := c.podIndex.ByIndex(indexNode, name)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		u.reserve(podRequests(o.(*corev1.Pod)))
	}
	return u, nil
}

// forPlanning returns a copy of t whose nodes offer the managed pods what the other pods leave
// free: allocatable minus the requests of every pod bound to the node that is not one of t's
// pods (DaemonSets, unmanaged workloads, managed pods not ready). A node with nothing left
// offers 1 (0 would mean unlimited).
func (w *cacheSnapshot) forPlanning(t *optimizer.Topology) *optimizer.Topology {
	c := t.Clone()
	mine := map[podKey]bool{}
	for i := range c.Services {
		s := &c.Services[i]
		for _, p := range s.Pods {
			name, _ := podName(p.Name)
			mine[podKey{s.NamespaceOrDefault(), name}] = true
		}
	}
	otherCPU, otherMem := map[string]int64{}, map[string]int64{}
	for k, p := range w.pods {
		if mine[k] || terminal(p) || p.Spec.NodeName == "" {
			continue
		}
		cpu, mem := podRequests(p).cpuMem()
		otherCPU[p.Spec.NodeName] += cpu
		otherMem[p.Spec.NodeName] += mem
	}
	for i := range c.Nodes {
		n := &c.Nodes[i]
		if n.CPU > 0 {
			n.CPU = max(1, n.CPU-otherCPU[n.Name])
		}
		if n.Memory > 0 {
			n.Memory = max(1, n.Memory-otherMem[n.Name])
		}
	}
	return c
}

// terminal says whether the pod has finished (its resources are free).
func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// ready says whether the pod is bound, running and Ready.
func ready(p *corev1.Pod) bool {
	if p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hasGate(p *corev1.Pod) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == GateName {
			return true
		}
	}
	return false
}
