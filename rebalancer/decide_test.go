package rebalancer

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/edgeflow/edgeflow/optimizer"
)

// testWorld holds pods and nodes as world() would read them.
func testWorld(nodes map[string]*nodeUse, pods ...*corev1.Pod) *world {
	w := &world{pods: map[podKey]*corev1.Pod{}, nodes: nodes, selected: map[string][]*corev1.Pod{}}
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
		out[n] = &nodeUse{cpu: 4000, slots: 110}
	}
	return out
}

func decideOne(t *testing.T, d *decider, gain float64, moves ...optimizer.Move) []Move {
	t.Helper()
	if d.cfg == nil {
		d.cfg = &Config{}
	}
	d.cfg.defaults()
	d.now = t0
	if d.namespaceOf == nil {
		d.namespaceOf = map[string]string{}
		for _, m := range moves {
			d.namespaceOf[m.Service] = "shop"
		}
	}
	for _, m := range []*map[string][]pendingMove{&d.pending} {
		if *m == nil {
			*m = map[string][]pendingMove{}
		}
	}
	if d.podOf == nil {
		d.podOf = map[string]topoPod{}
		for _, m := range moves {
			d.podOf[m.Pod] = topoPod{key: podKey{d.namespaceOf[m.Service], m.Pod}}
		}
	}
	if d.placed == nil {
		d.placed = map[types.UID]time.Time{}
	}
	if d.left == nil {
		d.left = map[serviceNode]time.Time{}
	}
	if d.backoff == nil {
		d.backoff = map[types.UID]backoffState{}
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
	old := t0.Add(-time.Hour)
	notReady := pod("shop", "b-2", "b", "n1", "ReplicaSet", old, 100)
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
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
			decider{world: testWorld(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100))},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{"evict"}},
		{"below the threshold nothing moves",
			decider{world: testWorld(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100))},
			0.04, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{ReasonBelowThreshold}},
		{"bare, DaemonSet, young and gone pods are never moved",
			decider{world: testWorld(freeNodes("n1", "n2", "n3", "n4"),
				pod("shop", "a-1", "a", "n1", "", old, 100),
				pod("shop", "d-1", "d", "n2", "DaemonSet", old, 100),
				pod("shop", "e-1", "e", "n3", "ReplicaSet", t0.Add(-time.Minute), 100),
				terminating)},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n4"), mv("d.shop", "d-1", "n2", "n4"),
				mv("e.shop", "e-1", "n3", "n4"), mv("c.shop", "c-1", "n1", "n4"), mv("f.shop", "f-1", "n1", "n4")},
			[]string{ReasonBarePod, ReasonDaemonSet, ReasonTooYoung, ReasonGone, ReasonGone}},
		{"a service with a pod not ready does not move; one move per service per run",
			decider{world: testWorld(freeNodes("n1", "n2", "n3", "n4"),
				pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100), notReady,
				pod("shop", "a-1", "a", "n2", "ReplicaSet", old, 100), pod("shop", "a-2", "a", "n3", "ReplicaSet", old, 100))},
			0.5, []optimizer.Move{mv("b.shop", "b-1", "n1", "n4"), mv("a.shop", "a-1", "n2", "n4"), mv("a.shop", "a-2", "n3", "n1")},
			[]string{ReasonReplicas, "evict", ReasonReplicas}},
		{"a move in flight holds its service",
			decider{world: testWorld(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100)),
				pending: map[string][]pendingMove{"a.shop": {{move: Move{To: "n2"}, evicted: t0}}}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{ReasonReplicas}},
		{"a full node (cpu, then pod slots, then a pending replacement) takes nothing",
			decider{world: testWorld(map[string]*nodeUse{"n1": {cpu: 4000, slots: 110}, "n2": {cpu: 150, slots: 110},
				"n3": {cpu: 4000, slots: 1}, "n4": {cpu: 200, slots: 110}},
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100),
				pod("shop", "x-1", "x", "n2", "ReplicaSet", old, 100), pod("shop", "y-1", "y", "n3", "ReplicaSet", old, 100),
				pod("shop", "c-1", "c", "n1", "ReplicaSet", old, 100)),
				pending: map[string][]pendingMove{"z.shop": {{move: Move{To: "n4"}, evicted: t0, cpu: 150}}}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n3"), mv("c.shop", "c-1", "n1", "n4")},
			[]string{ReasonNodeFull, ReasonNodeFull, ReasonNodeFull}},
		{"moves chosen earlier in the run fill the node",
			decider{world: testWorld(map[string]*nodeUse{"n1": {cpu: 4000, slots: 110}, "n2": {cpu: 150, slots: 110}},
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100)),
				cfg: &Config{MaxMovesPerNode: 5}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n2")},
			[]string{"evict", ReasonNodeFull}},
		{"limits: per node, per namespace, per run",
			decider{world: testWorld(freeNodes("n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"),
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100),
				pod("shop", "c-1", "c", "n3", "ReplicaSet", old, 100), pod("shop", "d-1", "d", "n5", "ReplicaSet", old, 100),
				pod("web", "e-1", "e", "n6", "ReplicaSet", old, 100), pod("app", "f-1", "f", "n7", "ReplicaSet", old, 100)),
				cfg:         &Config{MaxMoves: 3, MaxMovesPerNode: 1, MaxMovesPerNamespace: 2},
				namespaceOf: map[string]string{"a.shop": "shop", "b.shop": "shop", "c.shop": "shop", "d.shop": "shop", "e.web": "web", "f.app": "app"}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n8"), mv("c.shop", "c-1", "n3", "n4"),
				mv("d.shop", "d-1", "n5", "n8"), mv("e.web", "e-1", "n6", "n8"), mv("f.app", "f-1", "n7", "n8")},
			[]string{"evict", ReasonMaxPerNode, "evict", ReasonMaxPerNamespace, "evict", ReasonMaxMoves}},
		{"cool-down: a pod placed by a move, and a move back to the node a service left",
			decider{world: testWorld(freeNodes("n1", "n2", "n3"),
				pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100), pod("shop", "b-1", "b", "n1", "ReplicaSet", old, 100)),
				placed: map[types.UID]time.Time{"shop/a-1": t0.Add(-time.Minute)},
				left:   map[serviceNode]time.Time{{"b.shop", "n3"}: t0.Add(-time.Minute)}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2"), mv("b.shop", "b-1", "n1", "n3")},
			[]string{ReasonCooldown, ReasonCooldown}},
		{"a refused eviction backs off",
			decider{world: testWorld(freeNodes("n1", "n2"), pod("shop", "a-1", "a", "n1", "ReplicaSet", old, 100)),
				backoff: map[types.UID]backoffState{"shop/a-1": {until: t0.Add(time.Second)}}},
			0.5, []optimizer.Move{mv("a.shop", "a-1", "n1", "n2")}, []string{ReasonBackoff}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := reasons(decideOne(t, &tc.d, tc.gain, tc.moves...))
			if !same(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
