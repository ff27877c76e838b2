package kube

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The transform keeps every field the watcher and the rebalancer read, and drops the rest.
func TestTrimPod(t *testing.T) {
	t.Parallel()
	p := scalePod("shop", "api", 3, 7, "node-1", true)
	p.Annotations["edgeflow.io/placed-on"] = "node-2"
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "edgeflow.io/placement"}}
	p.Spec.NodeSelector = map[string]string{"disk": "ssd"}
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}}
	p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: corev1.DoNotSchedule}}
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}})
	p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{HostPort: 9090, ContainerPort: 9090})
	p.Spec.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
	now := metav1.NewTime(time.Now())
	p.DeletionTimestamp = &now
	orig := p.DeepCopy()

	obj, err := trim(p)
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*corev1.Pod)
	if got.ManagedFields != nil {
		t.Error("managed fields kept")
	}
	if diff := cmp.Diff(map[string]string{"edgeflow.io/placed-on": "node-2"}, got.Annotations); diff != "" {
		t.Errorf("annotations (-want +got):\n%s", diff)
	}
	for _, c := range got.Spec.Containers {
		if c.Env != nil || c.Image != "" || c.ReadinessProbe != nil || c.VolumeMounts != nil || c.Args != nil {
			t.Errorf("container %s keeps what edgeflow never reads: %+v", c.Name, c)
		}
	}
	if got.Status.ContainerStatuses != nil {
		t.Error("container statuses kept")
	}
	for _, c := range []struct {
		what      string
		want, got any
	}{
		{"labels", orig.Labels, got.Labels},
		{"owners", orig.OwnerReferences, got.OwnerReferences},
		{"uid", orig.UID, got.UID},
		{"deletion", orig.DeletionTimestamp, got.DeletionTimestamp},
		{"node", orig.Spec.NodeName, got.Spec.NodeName},
		{"service account", orig.Spec.ServiceAccountName, got.Spec.ServiceAccountName},
		{"gates", orig.Spec.SchedulingGates, got.Spec.SchedulingGates},
		{"node selector", orig.Spec.NodeSelector, got.Spec.NodeSelector},
		{"affinity", orig.Spec.Affinity, got.Spec.Affinity},
		{"tolerations", orig.Spec.Tolerations, got.Spec.Tolerations},
		{"spread", orig.Spec.TopologySpreadConstraints, got.Spec.TopologySpreadConstraints},
		{"overhead", orig.Spec.Overhead, got.Spec.Overhead},
		{"requests", orig.Spec.Containers[1].Resources, got.Spec.Containers[1].Resources},
		{"host port", []corev1.ContainerPort{orig.Spec.Containers[0].Ports[1]}, got.Spec.Containers[0].Ports},
		{"claim", []corev1.Volume{orig.Spec.Volumes[1]}, got.Spec.Volumes},
		{"phase", orig.Status.Phase, got.Status.Phase},
		{"IP", orig.Status.PodIPs, got.Status.PodIPs},
		{"ready", corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}, got.Status.Conditions[2]},
	} {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.what, diff)
		}
	}

	// A pod with annotations, none of them edgeflow's, keeps an empty map: the rebalancer's
	// release patch adds its annotations one by one then, not a new map over the others.
	q := scalePod("shop", "api", 4, 8, "node-1", true)
	obj, _ = trim(q)
	if a := obj.(*corev1.Pod).Annotations; a == nil || len(a) != 0 {
		t.Errorf("annotations of a pod with only foreign ones: %v, want an empty map", a)
	}
}

func TestTrimNode(t *testing.T) {
	t.Parallel()
	w := newScaleWorld(1, 1, 1, 1, 1)
	n := w.nodeObj[0]
	n.Spec.Taints = []corev1.Taint{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	n.Spec.Unschedulable = true
	orig := n.DeepCopy()
	obj, _ := trim(n)
	got := obj.(*corev1.Node)
	if got.Status.Conditions != nil || got.Status.Images != nil || got.ManagedFields != nil || got.Status.NodeInfo.KubeletVersion != "" {
		t.Errorf("node keeps what edgeflow never reads: %+v", got.Status)
	}
	if diff := cmp.Diff(orig.Spec, got.Spec); diff != "" {
		t.Errorf("spec (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(orig.Status.Allocatable, got.Status.Allocatable); diff != "" {
		t.Errorf("allocatable (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(orig.Labels, got.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if !sameNodeView(orig, got) {
		t.Error("the trimmed node reads differently")
	}
	hb := orig.DeepCopy()
	hb.Status.Conditions = nodeConditions(time.Now().Add(time.Minute))
	if !sameNodeView(orig, hb) {
		t.Error("a heartbeat changes the node's view")
	}
}
