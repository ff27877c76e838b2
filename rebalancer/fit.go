package rebalancer

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"
	schedulinghelper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// resources is an amount of each resource a pod requests or a node offers, as kube-scheduler
// counts them: cpu in millicores, every other resource in its unit (memory in bytes).
type resources map[corev1.ResourceName]int64

func resourcesOf(l corev1.ResourceList) resources {
	out := make(resources, len(l))
	for name, q := range l {
		out[name] = quantity(name, q)
	}
	return out
}

func quantity(name corev1.ResourceName, q resource.Quantity) int64 {
	if name == corev1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}

// podRequests is what kube-scheduler counts a pod as requesting: Kubernetes' own
// resource.PodRequests (the containers, the largest init container, restartable init
// containers — native sidecars — for the pod's whole life, pod-level resources, overhead).
func podRequests(p *corev1.Pod) resources {
	return resourcesOf(resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}))
}

// cpuMem is a pod's cpu (millicores) and memory (MiB) request, the units of a Topology.
func (r resources) cpuMem() (cpu, mem int64) {
	return r[corev1.ResourceCPU], r[corev1.ResourceMemory] >> 20
}

// nodeUse is a node and what the pods bound to it (and the moves on their way there)
// request, for the scheduler's resource fit.
type nodeUse struct {
	node  *corev1.Node
	alloc resources
	used  resources
	pods  int64
}

func newNodeUse(n *corev1.Node) *nodeUse {
	return &nodeUse{node: n, alloc: resourcesOf(n.Status.Allocatable), used: resources{}}
}

// reserve counts a pod's requests on the node.
func (n *nodeUse) reserve(r resources) {
	for name, v := range r {
		n.used[name] += v
	}
	n.pods++
}

// fits says whether a pod requesting r fits beside what the node holds, as kube-scheduler's
// NodeResourcesFit filter decides: every requested resource within allocatable (a resource
// the node does not offer has none), and one pod slot.
func (n *nodeUse) fits(r resources) bool {
	if slots, ok := n.alloc[corev1.ResourcePods]; ok && n.pods+1 > slots {
		return false
	}
	for name, v := range r {
		if v == 0 || name == corev1.ResourcePods {
			continue
		}
		if n.used[name]+v > n.alloc[name] {
			return false
		}
	}
	return true
}

func (n *nodeUse) clone() *nodeUse {
	c := &nodeUse{node: n.node, alloc: n.alloc, used: make(resources, len(n.used)), pods: n.pods}
	for k, v := range n.used {
		c.used[k] = v
	}
	return c
}

// unschedulable says why kube-scheduler would not put the pod on the node, leaving resources
// aside (fits checks those), or "" when it would: the node is cordoned, has a NoSchedule or
// NoExecute taint the pod does not tolerate, or does not match the pod's nodeSelector and
// required node affinity. The checks are Kubernetes' own (k8s.io/component-helpers).
func unschedulable(p *corev1.Pod, n *corev1.Node) string {
	if n == nil {
		return "the node is gone"
	}
	if n.Spec.Unschedulable {
		cordon := corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}
		if !schedulinghelper.TolerationsTolerateTaint(klog.Background(), p.Spec.Tolerations, &cordon, false) {
			return "the node is cordoned"
		}
	}
	if t, bad := schedulinghelper.FindMatchingUntoleratedTaint(klog.Background(), n.Spec.Taints, p.Spec.Tolerations, func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}, false); bad {
		return fmt.Sprintf("the pod does not tolerate the node's taint %s", t.ToString())
	}
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(p).Match(n); err != nil || !ok {
		return "the node does not match the pod's node selector or required node affinity"
	}
	return ""
}

// unsupported says which of the pod's scheduling constraints the rebalancer cannot check
// before it chooses a node — required inter-pod (anti-)affinity, volumes bound to a topology
// (PersistentVolumeClaims, ephemeral volumes), hard topology spread, host ports — or "" if it
// has none. A move of such a pod is skipped (ReasonUnsupported): its replacement, required on a
// node the scheduler refuses, would wait for the placement timeout.
func unsupported(p *corev1.Pod) string {
	if a := p.Spec.Affinity; a != nil {
		if a.PodAffinity != nil && len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			return "required pod affinity"
		}
		if a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			return "required pod anti-affinity"
		}
	}
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			return "volume " + v.Name + " (volume topology)"
		}
	}
	for _, c := range p.Spec.TopologySpreadConstraints {
		if c.WhenUnsatisfiable == corev1.DoNotSchedule {
			return "a DoNotSchedule topology spread constraint"
		}
	}
	for _, c := range append(p.Spec.InitContainers[:len(p.Spec.InitContainers):len(p.Spec.InitContainers)], p.Spec.Containers...) {
		for _, port := range c.Ports {
			if port.HostPort != 0 {
				return "host port " + fmt.Sprint(port.HostPort)
			}
		}
	}
	return ""
}
