package rebalancer

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/edgeflow/edgeflow/optimizer"
)

// world is what one run reads from the informer caches: every pod, and each node's allocatable
// and requested resources as kube-scheduler counts them.
type world struct {
	pods  map[podKey]*corev1.Pod
	nodes map[string]*nodeUse
	// selected maps a managed service key to the pods its selector picks (not terminating).
	selected map[string][]*corev1.Pod
}

type podKey struct{ namespace, name string }

// nodeUse is a node's allocatable cpu (millicores), memory (MiB) and pod slots, and what the
// pods bound to it request. A zero allocatable means not given, i.e. not limited.
type nodeUse struct {
	cpu, mem, slots          int64
	usedCPU, usedMem, usedSl int64
}

// fits says whether a pod requesting cpu and mem fits beside what the node already holds.
func (n *nodeUse) fits(cpu, mem int64) bool {
	return (n.cpu == 0 || n.usedCPU+cpu <= n.cpu) &&
		(n.mem == 0 || n.usedMem+mem <= n.mem) &&
		(n.slots == 0 || n.usedSl+1 <= n.slots)
}

func (n *nodeUse) reserve(cpu, mem int64) {
	n.usedCPU += cpu
	n.usedMem += mem
	n.usedSl++
}

// world reads the caches.
func (c *Controller) world() (*world, error) {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("rebalancer: listing pods: %w", err)
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("rebalancer: listing nodes: %w", err)
	}
	w := &world{pods: make(map[podKey]*corev1.Pod, len(pods)), nodes: make(map[string]*nodeUse, len(nodes)),
		selected: map[string][]*corev1.Pod{}}
	for _, n := range nodes {
		a := n.Status.Allocatable
		w.nodes[n.Name] = &nodeUse{cpu: a.Cpu().MilliValue(), mem: a.Memory().Value() >> 20, slots: a.Pods().Value()}
	}
	byNS := map[string][]*corev1.Pod{} // live pods (not terminating, not finished) by namespace
	for _, p := range pods {
		w.pods[podKey{p.Namespace, p.Name}] = p
		if n := w.nodes[p.Spec.NodeName]; n != nil && !terminal(p) {
			cpu, mem := podRequests(p)
			n.reserve(cpu, mem)
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

// forPlanning returns a copy of t whose nodes offer the managed pods what the other pods leave
// free: allocatable minus the requests of every pod bound to the node that is not one of t's
// pods (DaemonSets, unmanaged workloads, managed pods not ready). A node with nothing left
// offers 1 (0 would mean unlimited).
func (w *world) forPlanning(t *optimizer.Topology) *optimizer.Topology {
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
		cpu, mem := podRequests(p)
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

// podRequests is the pod's cpu (millicores) and memory (MiB) request as kube-scheduler counts
// it: the larger of the containers' sum and the largest init container, plus the overhead.
func podRequests(p *corev1.Pod) (cpu, mem int64) {
	var initCPU, initMem int64
	for _, c := range p.Spec.Containers {
		cpu += c.Resources.Requests.Cpu().MilliValue()
		mem += c.Resources.Requests.Memory().Value()
	}
	for _, c := range p.Spec.InitContainers {
		initCPU = max(initCPU, c.Resources.Requests.Cpu().MilliValue())
		initMem = max(initMem, c.Resources.Requests.Memory().Value())
	}
	cpu, mem = max(cpu, initCPU), max(mem, initMem)
	if o := p.Spec.Overhead; o != nil {
		cpu += o.Cpu().MilliValue()
		mem += o.Memory().Value()
	}
	return cpu, mem >> 20
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
