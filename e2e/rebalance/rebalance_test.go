// Package rebalance tests the LARP rebalancer against a real control plane: etcd,
// kube-apiserver, kube-scheduler and kube-controller-manager (ReplicaSets, the disruption
// controller behind PodDisruptionBudgets), with a fake kubelet running the bound pods.
//
// Every test has a world of its own (control plane, namespace, ports, files), so they run in
// parallel, all but TestLeaderChangeMidMove: it holds evictions observed through an informer to
// at least a period apart less 1 s, and is run alone (make runs it by name, without other tests'
// load). The other bounds on time leave ~10 s or more beside what they measure (a release at
// --gate-timeout, a deletion at --placement-timeout, 200 releases within 30 s) and held with 22
// worlds at once on 2 cores.
package rebalance

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/e2e/testbed"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/rebalancer"
)

// Every goroutine a test starts ends with it, and every process is stopped and reaped.
func TestMain(m *testing.M) { testbed.VerifyMain(m, "rebalance") }

// badLayout creates frontend (3 pods) and backend (3 pods), frontend calling backend, with
// every frontend pod on n1 and the backend pods on n2 and n3: all 300 req/s cross nodes. The
// LARP plan puts one of each on every node (the spread cap is 1), so no call crosses a node.
func badLayout(w *world) {
	w.service("frontend")
	w.service("backend")
	w.cordon(true, "n2", "n3")
	w.deployment("frontend", 3, "500m")
	if got := perNode(w.settled("frontend", 3)); got["n1"] != 3 {
		w.t.Fatalf("frontend landed %v, want all on n1", got)
	}
	w.cordon(true, "n1")
	w.cordon(false, "n2", "n3")
	w.deployment("backend", 3, "500m")
	if got := perNode(w.settled("backend", 3)); got["n1"] != 0 {
		w.t.Fatalf("backend landed %v, want none on n1", got)
	}
	w.cordon(false, "n1")
}

// badWorld is a world on three nodes laid out by badLayout, with the cluster source following
// its six pods.
func badWorld(t *testing.T) *world {
	w := newWorld(t, threeNodes()...)
	badLayout(w)
	w.topology()
	w.waitTopology(6)
	return w
}

func threeNodes() []kubeapi.NodeSpec {
	return []kubeapi.NodeSpec{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}}
}

// uids is the set of the pods of app (a pod moved is a pod replaced: a new UID).
func (w *world) uids(apps ...string) []string {
	var out []string
	for _, a := range apps {
		for _, p := range w.pods(a) {
			out = append(out, string(p.UID))
		}
	}
	slices.Sort(out)
	return out
}

func (w *world) waitTopology(pods int) {
	testkit.Eventually(w.t, 30*time.Second, fmt.Sprintf("a topology with %d pods", pods), func() bool {
		t := w.topo.Current()
		if t == nil {
			return false
		}
		n := 0
		for _, s := range t.Services {
			n += len(s.Pods)
		}
		return n == pods
	})
}

// A Deployment whose pods landed badly is moved to the LARP plan, one safe step per period:
// every replacement lands on its planned node through the scheduling gate, and no service
// ever has fewer ready pods than its PodDisruptionBudget's minAvailable.
func TestMovesDeploymentToPlan(t *testing.T) {
	t.Parallel()
	w := newWorld(t, threeNodes()...)
	badLayout(w)
	w.pdb("frontend", 2)
	w.pdb("backend", 2)
	w.topology()
	w.waitTopology(6)
	before := w.lataCost()
	rw := w.watchReady("frontend", "backend")

	c, reg := w.controller(rebalancer.Config{Identity: "a"})
	_, up := w.webhook(c)
	start := time.Now()
	w.start(c, "a")
	up()

	var target float64
	testkit.Eventually(t, 30*time.Second, "the first run", func() bool {
		if r := c.Last(); r != nil {
			target = r.CostTarget
			t.Logf("first run: cost %.1f → target %.1f (gain %.1f%%), %d moves planned, %d evicted now",
				r.CostBefore, r.CostTarget, 100*r.Gain, len(r.Moves), r.Evictions())
			return true
		}
		return false
	})
	if target >= before*(1-rebalancer.DefaultThreshold) {
		t.Fatalf("target %.1f is not below the current cost %.1f by the threshold", target, before)
	}
	var firstEviction time.Time
	testkit.Eventually(t, 150*time.Second, "the plan reached with every pod ready", func() bool {
		if firstEviction.IsZero() && metric(t, reg, "edgeflow_rebalance_moves_total", nil) > 0 {
			firstEviction = time.Now()
		}
		if len(w.unplaced()) > 0 {
			return false
		}
		fe, be := w.pods("frontend"), w.pods("backend")
		for _, ps := range [][]corev1.Pod{fe, be} {
			if len(ps) != 3 {
				return false
			}
			for i := range ps {
				if !isReady(&ps[i]) {
					return false
				}
			}
		}
		return w.lataCost() <= target+1e-9
	})
	reached := time.Now()
	after := w.lataCost()
	moves := metric(t, reg, "edgeflow_rebalance_moves_total", nil)
	planned := metric(t, reg, "edgeflow_rebalance_gates_released_total", map[string]string{"placement": rebalancer.ReleasePlanned})
	runs := metric(t, reg, "edgeflow_rebalance_runs_total", map[string]string{"result": "ok"})
	feNodes, beNodes := perNode(w.settled("frontend", 3)), perNode(w.settled("backend", 3))
	t.Logf("LATA cost %.1f → %.1f (target %.1f); %v moves in %v runs, %v replacements placed by the gate; "+
		"first eviction → plan reached %v (start → reached %v); lowest ready: frontend %d, backend %d; frontend %v, backend %v",
		before, after, target, moves, runs, planned, reached.Sub(firstEviction).Round(time.Millisecond),
		reached.Sub(start).Round(time.Millisecond), rw.min("frontend"), rw.min("backend"), feNodes, beNodes)
	if moves < 3 {
		t.Errorf("%v moves: reaching one pod of each service per node takes at least 3", moves)
	}
	if planned != moves {
		t.Errorf("%v replacements placed through the gate, want one per move (%v)", planned, moves)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if feNodes[n] != 1 || beNodes[n] != 1 {
			t.Errorf("node %s holds %d frontend and %d backend pods, want 1 and 1", n, feNodes[n], beNodes[n])
		}
	}
	for _, app := range []string{"frontend", "backend"} {
		if low := rw.min(app); low < 2 {
			t.Errorf("%s dropped to %d ready pods; its PodDisruptionBudget says at least 2", app, low)
		}
	}
	// The plan reached, later runs move nothing.
	time.Sleep(2500 * time.Millisecond)
	if m := metric(t, reg, "edgeflow_rebalance_moves_total", nil); m != moves {
		t.Errorf("%v moves after the plan was reached (ping-pong)", m-moves)
	}
	// Events on the pods it moved and placed.
	evs, err := w.cs.EventsV1().Events(ns).List(w.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]int{}
	for _, e := range evs.Items {
		if e.ReportingController == "edgeflow-rebalancer" {
			reasons[e.Reason]++
		}
	}
	if reasons["Rebalance"] != int(moves) || reasons["Placed"] != int(moves) {
		t.Errorf("events %v, want %v Rebalance and Placed", reasons, moves)
	}
}

// Dry-run changes nothing; a PodDisruptionBudget that allows no disruption stops every
// eviction; of two replicas only the Lease holder runs, and when it stops the other takes over.
func TestDryRunPDBAndLeaderElection(t *testing.T) {
	t.Parallel()
	w := newWorld(t, threeNodes()...)
	badLayout(w)
	w.pdb("frontend", 3)
	w.pdb("backend", 3)
	w.topology()
	w.waitTopology(6)
	pods := w.uids("frontend", "backend")

	t.Run("dry-run", func(t *testing.T) {
		c, reg := w.controller(rebalancer.Config{Identity: "dry", DryRun: true})
		stop := w.start(c, "dry")
		testkit.Eventually(t, 30*time.Second, "three dry runs", func() bool {
			return metric(t, reg, "edgeflow_rebalance_runs_total", map[string]string{"result": "ok"}) >= 3
		})
		stop()
		r := c.Last()
		if r.Evictions() == 0 || !r.DryRun {
			t.Fatalf("dry-run report %+v: want moves it would make", r)
		}
		if got := w.uids("frontend", "backend"); !slices.Equal(got, pods) {
			t.Errorf("dry-run changed the pods")
		}
		if m := metric(t, reg, "edgeflow_rebalance_moves_total", nil); m != 0 {
			t.Errorf("dry-run counted %v moves", m)
		}
		t.Logf("dry-run: cost %.1f → %.1f, would evict %d", r.CostBefore, r.CostTarget, r.Evictions())
	})

	a, regA := w.controller(rebalancer.Config{Identity: "a"})
	b, regB := w.controller(rebalancer.Config{Identity: "b"})
	stopA := w.start(a, "a")
	testkit.Eventually(t, 30*time.Second, "a leading", a.Leading)
	w.start(b, "b")
	testkit.Eventually(t, 30*time.Second, "two runs of a", func() bool {
		return metric(t, regA, "edgeflow_rebalance_runs_total", nil) >= 2
	})
	r := a.Last()
	pdb := 0
	for _, m := range r.Moves {
		if m.Reason == rebalancer.ReasonPDB {
			pdb++
		}
	}
	if pdb == 0 {
		t.Errorf("no eviction refused by the PodDisruptionBudget: %+v", r.Moves)
	}
	if got := w.uids("frontend", "backend"); !slices.Equal(got, pods) {
		t.Errorf("a pod was evicted although every PodDisruptionBudget allows no disruption")
	}
	if b.Leading() || b.Last() != nil || metric(t, regB, "edgeflow_rebalance_runs_total", nil) != 0 {
		t.Errorf("b ran while a leads")
	}
	lease, err := w.cs.CoordinationV1().Leases("default").Get(w.ctx, rebalancer.DefaultLeaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "a" {
		t.Fatalf("lease %+v, %v: want held by a", lease, err)
	}

	stopped := time.Now()
	stopA()
	testkit.Eventually(t, 30*time.Second, "b taking over", func() bool { return b.Leading() && b.Last() != nil })
	t.Logf("b took over and ran %v after a stopped", time.Since(stopped).Round(time.Millisecond))
	if a.Leading() {
		t.Errorf("a still leads after it stopped")
	}
	if got := w.uids("frontend", "backend"); !slices.Equal(got, pods) {
		t.Errorf("a pod was evicted although every PodDisruptionBudget allows no disruption")
	}
}

// With the webhook up, a new pod of a managed Deployment is not gated (no move awaits it);
// with the webhook down, pods are created ungated (failurePolicy Ignore) and still schedule.
func TestWebhookDown(t *testing.T) {
	t.Parallel()
	w := newWorld(t, threeNodes()...)
	w.service("frontend")
	w.deployment("frontend", 1, "100m")
	w.settled("frontend", 1)
	w.topology()
	w.waitTopology(1)
	c, reg := w.controller(rebalancer.Config{Identity: "a", Threshold: 0.99})
	stopWebhook, up := w.webhook(c)
	w.start(c, "a")
	up()
	testkit.Eventually(t, 30*time.Second, "a leading", c.Leading)

	tr := w.track()
	w.scale("frontend", 2)
	w.settled("frontend", 2)
	for _, l := range tr.lives() {
		if !l.gatedFrom.IsZero() {
			t.Errorf("webhook up: %s was gated although no move awaits it", l.name)
		}
	}

	stopWebhook()
	t0 := time.Now()
	w.scale("frontend", 4)
	pods := w.settled("frontend", 4)
	t.Logf("webhook down: 2 new pods ready in %v (%v)", time.Since(t0).Round(time.Millisecond), pods)
	if n := metric(t, reg, "edgeflow_rebalance_gates_released_total", nil); n != 0 {
		t.Errorf("%v gates released, want none (no pod was ever gated)", n)
	}
	for _, p := range w.pods("frontend") {
		if len(p.Spec.SchedulingGates) > 0 {
			t.Errorf("pod %s still gated", p.Name)
		}
	}
}

// A move whose destination is full (no pod slot left) is skipped with the reason node_full;
// nothing is evicted and nothing is left pending.
func TestNodeFull(t *testing.T) {
	t.Parallel()
	w := newWorld(t, kubeapi.NodeSpec{Name: "n1", Pods: 2}, kubeapi.NodeSpec{Name: "n2", Pods: 2})
	w.service("frontend")
	w.service("backend")
	w.cordon(true, "n2")
	w.deployment("frontend", 2, "500m")
	w.settled("frontend", 2)
	w.cordon(true, "n1")
	w.cordon(false, "n2")
	w.deployment("backend", 2, "500m")
	w.settled("backend", 2)
	w.cordon(false, "n1")
	w.topology()
	w.waitTopology(4)
	pods := w.uids("frontend", "backend")

	c, reg := w.controller(rebalancer.Config{Identity: "a"})
	_, up := w.webhook(c)
	w.start(c, "a")
	up()
	testkit.Eventually(t, 30*time.Second, "two runs", func() bool {
		return metric(t, reg, "edgeflow_rebalance_runs_total", map[string]string{"result": "ok"}) >= 2
	})
	r := c.Last()
	full := 0
	for _, m := range r.Moves {
		if m.Reason == rebalancer.ReasonNodeFull {
			full++
		}
		if m.Action == rebalancer.ActionEvict {
			t.Errorf("move %+v carried out into a full node", m)
		}
	}
	t.Logf("cost %.1f → target %.1f; moves %+v", r.CostBefore, r.CostTarget, r.Moves)
	if full == 0 {
		t.Errorf("no move skipped as node_full: %+v", r.Moves)
	}
	if got := w.uids("frontend", "backend"); !slices.Equal(got, pods) {
		t.Errorf("pods were evicted")
	}
	if u := w.unplaced(); len(u) > 0 {
		t.Errorf("pods left unplaced: %v", u)
	}
	if n := metric(t, reg, "edgeflow_rebalance_moves_skipped_total", map[string]string{"reason": rebalancer.ReasonNodeFull}); n == 0 {
		t.Errorf("edgeflow_rebalance_moves_skipped_total{reason=node_full} is 0")
	}
}
