package rebalancer

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/edgeflow/edgeflow/optimizer"
)

// testSnapshot holds pods and nodes as readCaches would read them.
func testSnapshot(nodes map[string]*nodeUse, pods ...*corev1.Pod) *cacheSnapshot {
	w := &cacheSnapshot{pods: map[podKey]*corev1.Pod{}, nodes: nodes, selected: map[string][]*corev1.Pod{}}
	for _, p := range pods {
		w.pods[podKey{p.Namespace, p.Name}] = p
		if n := nodes[p.Spec.NodeName]; n != nil {
			n.reserve(podRequests(p))
		}
		key := optimizer.QualifiedName(p.Labels["app"], p.Namespace)
		w.selected[key] = append(w.selected[key], p)
	}
	return w
}

func freeNodes(names ...string) map[string]*nodeUse {
	out := map[string]*nodeUse{}
	for _, n := range names {
		out[n] = newNodeUse(node(n, 4000, 110))
	}
	return out
}

// nodes builds nodeUses from nodes.
func nodes(ns ...*corev1.Node) map[string]*nodeUse {
	out := map[string]*nodeUse{}
	for _, n := range ns {
		out[n.Name] = newNodeUse(n)
	}
	return out
}

func decideOne(t *testing.T, d *decider, gain float64, moves ...optimizer.Move) []Move {
	t.Helper()
	if d.cfg == nil {
		d.cfg = &Config{AllowSingleReplica: true}
	}
	d.cfg.defaults()
	d.now = t0
	if d.namespaceOf == nil {
		d.namespaceOf = map[string]string{}
		for _, m := range moves {
			d.namespaceOf[m.Service] = "shop"
		}
	}
	if d.st == nil {
		st := newState()
		d.st = &st
	}
	if d.podOf == nil {
		d.podOf = map[string]topoPod{}
		for _, m := range moves {
			d.podOf[m.Pod] = topoPod{key: podKey{d.namespaceOf[m.Service], m.Pod}}
		}
	}
	return d.decide(&optimizer.Rebalance{Moves: moves}, gain)
}

func mv(svc, p, from, to string) optimizer.Move {
	return optimizer.Move{Service: svc, Pod: p, From: from, To: to}
}

func reasons(ms []Move) []string {
	var out []string
	for _, m := range ms {
		if m.Action == ActionEvict {
			out = append(out, "evict")
		} else {
			out = append(out, m.Reason)
		}
	}
	return out
}

func same(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDecideRules(t *testing.T) {
	t.Parallel()
	old := t0.Add(-time.Hour)
	notReady := unready(pod("shop", "b-2", "b", "n1", "ReplicaSet", old, 100))
	terminating := pod("shop", "c-1", "c", "n1", "ReplicaSet", old, 100)
	terminating.DeletionTimestamp = &metav1.Time{Time: t0}
	for _, tc := range []struct {
		name  string
		d     decider
		gain  float64
		moves []optimizer.Move
		want  []string
	}{
		{"a move of a ready ReplicaSet pod is carried out",
			decider{snap: testSnapshot(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100))},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{"evict"}},
		{"below the threshold nothing moves",
			decider{snap: testSnapshot(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100))},
			0.04, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{ReasonBelowThreshold}},
		{"bare, DaemonSet, young and gone pods are never moved",
			decider{snap: testSnapshot(freeNodes("n1", "n2", "n3", "n4"),
				pod("shop", "a-1", "a", "n1", "", old, 100),
				pod("shop", "d-1", "d", "n2", "DaemonSet", old, 100),
				pod("shop", "e-1", "e", "n3", "ReplicaSet", t0.Add(-time.Minute), 100),
				terminating)},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n4"), mv("d.shop", "d-1", "n2", "n4"),
				mv("e.shop", "e-1", "n3", "n4"), mv("c.shop", "c-1", "n1", "n4"), mv("f.shop", "f-1", "n1", "n4")},
			[]string{ReasonBarePod, ReasonDaemonSet, ReasonTooYoung, ReasonGone, ReasonGone}},
		{"a service with a pod not ready does not move; one move per service per run",
			decider{snap: testSnapshot(freeNodes("n1", "n2", "n3", "n4"),
				pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100), notReady,
				pod("shop", "a-1", "a", "n2", "ReplicaSet", old, 100), pod("shop", "a-2", "a", "n3", "ReplicaSet", old, 100))},
			0.5, []optimizer.Move{mv("b.shop", "b-1", "n1", "n4"), mv("a.shop", "a-1", "n2", "n4"), mv("a.shop", "a-2", "n3", "n1")},
			[]string{ReasonReplicas, "evict", ReasonReplicas}},
		{"a move in flight holds its service",
			decider{snap: testSnapshot(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100)),
				st: &state{Moves: []moveRecord{{recordedMove: recordedMove{Service: "a.shop", To: "n2"}, Evicted: t0.Add(-time.Hour)}}}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{ReasonReplicas}},
		{"a full node (cpu, then pod slots, then a pending replacement) takes nothing",
			decider{snap: testSnapshot(nodes(node("n1", 4000, 110), node("n2", 150, 110), node("n3", 4000, 1), node("n4", 200, 110)),
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100),
				pod("shop", "x-1", "x", "n2", "ReplicaSet", old, 100), pod("shop", "y-1", "y", "n3", "ReplicaSet", old, 100),
				pod("shop", "c-1", "c", "n1", "ReplicaSet", old, 100)),
				st: &state{Moves: []moveRecord{{recordedMove: recordedMove{Service: "z.shop", To: "n4"}, Evicted: t0.Add(-time.Hour), Requests: resources{corev1.ResourceCPU: 150}}}}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n3"), mv("c.shop", "c-1", "n1", "n4")},
			[]string{ReasonNodeFull, ReasonNodeFull, ReasonNodeFull}},
		{"moves chosen earlier in the run fill the node",
			decider{snap: testSnapshot(nodes(node("n1", 4000, 110), node("n2", 150, 110)),
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100)),
				cfg: &Config{MaxMovesPerNode: 5, AllowSingleReplica: true}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n2")},
			[]string{"evict", ReasonNodeFull}},
		{"limits: per node, per namespace, per run",
			decider{snap: testSnapshot(freeNodes("n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"),
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100),
				pod("shop", "c-1", "c", "n3", "ReplicaSet", old, 100), pod("shop", "d-1", "d", "n5", "ReplicaSet", old, 100),
				pod("web", "e-1", "e", "n6", "ReplicaSet", old, 100), pod("app", "f-1", "f", "n7", "ReplicaSet", old, 100)),
				cfg:         &Config{MaxMoves: 3, MaxMovesPerNode: 1, MaxMovesPerNamespace: 2, AllowSingleReplica: true},
				namespaceOf: map[string]string{"a.shop": "shop", "b.shop": "shop", "c.shop": "shop", "d.shop": "shop", "e.web": "web", "f.app": "app"}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n8"), mv("c.shop", "c-1", "n3", "n4"),
				mv("d.shop", "d-1", "n5", "n8"), mv("e.web", "e-1", "n6", "n8"), mv("f.app", "f-1", "n7", "n8")},
			[]string{"evict", ReasonMaxPerNode, "evict", ReasonMaxPerNamespace, "evict", ReasonMaxMoves}},
		{"cool-down: a pod placed by a move, and a move back to the node a service left",
			decider{snap: testSnapshot(freeNodes("n1", "n2", "n3"),
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100)),
				st: &state{Placed: map[types.UID]time.Time{"shop/a-1": t0.Add(-time.Minute)},
					Left: []leftRecord{{"b.shop", "n3", t0.Add(-time.Minute)}}}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n3")},
			[]string{ReasonCooldown, ReasonCooldown}},
		{"a refused eviction backs off",
			decider{snap: testSnapshot(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100)),
				st: &state{Backoff: map[types.UID]backoffState{"shop/a-1": {Until: t0.Add(time.Second)}}}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{ReasonBackoff}},
		{"a single-replica service is never evicted (unless allowed)",
			decider{snap: testSnapshot(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100),
				pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100), pod("shop", "b-2", "b", "n2", "ReplicaSet", old, 100)),
				cfg: &Config{MaxMovesPerNode: 5}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n2")},
			[]string{ReasonSingleReplica, "evict"}},
		{"a cordoned node, an untolerated taint, a node the pod's affinity excludes: node_unschedulable",
			decider{snap: testSnapshot(nodes(node("n1", 4000, 110), cordoned(node("n2", 4000, 110)),
				tainted(node("n3", 4000, 110), "dedicated", corev1.TaintEffectNoSchedule),
				tainted(node("n4", 4000, 110), "dedicated", corev1.TaintEffectNoSchedule), node("n5", 4000, 110)),
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100),
				tolerating(pod("shop", "c-1", "c", "n1", "ReplicaSet", old, 100), "dedicated"),
				withNodeSelector(pod("shop", "d-1", "d", "n1", "ReplicaSet", old, 100), "zone", "a")),
				cfg: &Config{MaxMovesPerNode: 5, AllowSingleReplica: true}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n3"), mv("c.shop", "c-1", "n1", "n4"),
				mv("d.shop", "d-1", "n1", "n5")},
			[]string{ReasonUnschedulable, ReasonUnschedulable, "evict", ReasonUnschedulable}},
		{"constraints the rebalancer cannot check: the move is skipped",
			decider{snap: testSnapshot(freeNodes("n1", "n2"), antiAffine(pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100)),
				withPVC(pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100)), pod("shop", "c-1", "c", "n1", "Job", old, 100)),
				cfg: &Config{MaxMovesPerNode: 5, AllowSingleReplica: true}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n2"), mv("c.shop", "c-1", "n1", "n2")},
			[]string{ReasonUnsupported, ReasonUnsupported, ReasonUnsupported}},
		{"a native sidecar counts for the pod's whole life (600m, not 500m)",
			decider{snap: testSnapshot(nodes(node("n1", 4000, 110), node("n2", 550, 110)),
				withSidecar(pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 500), 100))},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{ReasonNodeFull}},
		{"while a pod of any managed service is starting, nothing moves (a broken old pod holds only its own service)",
			decider{snap: testSnapshot(freeNodes("n1", "n2", "n3"),
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "a-2", "a", "n2", "ReplicaSet", old, 100),
				unready(pod("shop", "c-9", "c", "n3", "ReplicaSet", t0.Add(-10*time.Second), 100)))},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n3")}, []string{ReasonSettling}},
		{"a broken pod, not ready for longer than a replacement may take, does not hold other services",
			decider{snap: testSnapshot(freeNodes("n1", "n2", "n3"),
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "a-2", "a", "n2", "ReplicaSet", old, 100),
				unready(pod("shop", "c-9", "c", "n3", "ReplicaSet", old, 100)))},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n3")}, []string{"evict"}},
		{"a move in flight holds every service",
			decider{snap: testSnapshot(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100),
				pod("shop", "a-2", "a", "n2", "ReplicaSet", old, 100)),
				st: &state{Moves: []moveRecord{{recordedMove: recordedMove{Service: "b.shop", Namespace: "shop", Pod: "b-1", From: "n2", To: "n1"}, Evicted: t0.Add(-time.Second)}}}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{ReasonSettling}},
		{"a new leader moves nothing in its first period",
			decider{snap: testSnapshot(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100)), newLeader: true},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{ReasonNewLeader}},
		{"the moves of an earlier leader in this period count against the limits",
			decider{snap: testSnapshot(freeNodes("n1", "n2", "n3", "n4"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100)),
				cfg: &Config{MaxMoves: 2, AllowSingleReplica: true},
				st: &state{Moves: []moveRecord{
					{recordedMove: recordedMove{Service: "x.shop", Namespace: "shop", From: "n3", To: "n4"}, Evicted: t0.Add(-time.Minute), Outcome: outcomePlaced},
					{recordedMove: recordedMove{Service: "y.shop", Namespace: "web", From: "n4", To: "n3"}, Evicted: t0.Add(-2 * time.Minute), Outcome: outcomeFailed}}}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{ReasonMaxMoves}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := reasons(decideOne(t, &tc.d, tc.gain, tc.moves...))
			if !same(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// unready marks the pod not Ready.
func unready(p *corev1.Pod) *corev1.Pod {
	p.Status.Conditions[0].Status = corev1.ConditionFalse
	return p
}

func cordoned(n *corev1.Node) *corev1.Node { n.Spec.Unschedulable = true; return n }

func tainted(n *corev1.Node, key string, effect corev1.TaintEffect) *corev1.Node {
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Effect: effect})
	return n
}

func tolerating(p *corev1.Pod, key string) *corev1.Pod {
	p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists})
	return p
}

func withNodeSelector(p *corev1.Pod, k, v string) *corev1.Pod {
	p.Spec.NodeSelector = map[string]string{k: v}
	return p
}

func antiAffine(p *corev1.Pod) *corev1.Pod {
	p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		LabelSelector: &metav1.LabelSelector{MatchLabels: p.Labels}, TopologyKey: corev1.LabelHostname}}}}
	return p
}

func withPVC(p *corev1.Pod) *corev1.Pod {
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}})
	return p
}

// withSidecar adds a native sidecar (a restartable init container) requesting cpu millicores.
func withSidecar(p *corev1.Pod, cpu int64) *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "proxy", RestartPolicy: &always,
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(cpu, resource.DecimalSI)}}})
	return p
}

// The run's log line names each skipped move with its reason, and only those.
func TestReportSkipped(t *testing.T) {
	t.Parallel()
	r := &Report{Moves: []Move{
		{Namespace: "shop", Pod: "a-1", From: "n1", To: "n2", Action: ActionEvict},
		{Namespace: "shop", Pod: "b-1", From: "n4", To: "n1", Action: ActionSkip, Reason: ReasonMaxPerNode},
	}}
	got, want := r.skipped(), []string{"shop/b-1 n4→n1: " + ReasonMaxPerNode}
	if !same(got, want) {
		t.Errorf("skipped() = %q, want %q", got, want)
	}
}
