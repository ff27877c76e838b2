package rebalance

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/watcher"
)

// gatedOne waits until the tracker saw a pod gated and returns its name.
func (w *world) gatedOne(tr *tracker, within time.Duration) string {
	var name string
	testkit.Eventually(w.t, within, "a replacement gated", func() bool {
		for _, l := range tr.lives() {
			if !l.gatedFrom.IsZero() {
				name = l.name
				return true
			}
		}
		return false
	})
	return name
}

// reportWaits logs the longest time a pod stayed gated and Pending (the figures docs/tasks/rebalance.md
// quotes) and returns them.
func reportWaits(t *testing.T, tr *tracker, fault string) (gated, pending time.Duration) {
	gated, pending, gn, pn := tr.waits()
	t.Logf("%s: longest gated %v (%s), longest Pending %v (%s)", fault, gated.Round(10*time.Millisecond), gn,
		pending.Round(10*time.Millisecond), pn)
	return gated, pending
}

// The only replica dies while a replacement it gated waits (its RBAC lacked pods/patch, so it
// could not release it), and another replica starts that may not take the Lease (its RBAC
// lacks leases): no leader from then on. The gated replacement is released by the replica that
// does not lead once --gate-timeout has passed, a scale-up meanwhile is never gated, and every
// pod runs within --gate-timeout + 10 s.
func TestNoLeaderNothingGated(t *testing.T) {
	t.Parallel()
	w := badWorld(t)
	tr := w.track()
	certPEM, certFile, keyFile := w.webhookCert()
	const gateTimeout = 20 * time.Second

	a, _ := w.controllerAs(rebalancer.Config{Identity: "a", GateTimeout: gateTimeout},
		w.serviceAccount("edgeflow-a", without(rebalancerRules(), "pods", "patch")))
	addr, stopHookA := w.serveAt(a, "127.0.0.1:0", certFile, keyFile)
	w.replicaWebhooks(certPEM, addr)
	stopA := w.start(a, "a")
	gated := w.gatedOne(tr, 60*time.Second)
	stopHookA()
	stopA()
	killed := time.Now()
	t.Logf("replica a stopped while %s was gated", gated)

	b, regB := w.controllerAs(rebalancer.Config{Identity: "b", GateTimeout: gateTimeout},
		w.serviceAccount("edgeflow-b", without(without(rebalancerRules(), "leases", "create"), "leases", "update")))
	w.serveAt(b, addr, certFile, keyFile)
	w.start(b, "b")
	testkit.Eventually(t, 30*time.Second, "b synced", b.Synced)
	w.scale("frontend", 5)
	testkit.Eventually(t, gateTimeout+30*time.Second, "every pod running", func() bool {
		return w.allRunning() && len(w.pods("frontend")) == 5 && len(w.pods("backend")) == 3
	})
	if b.Leading() {
		t.Error("b leads although it may not take the Lease")
	}
	lease, err := w.cs.CoordinationV1().Leases("default").Get(w.ctx, rebalancer.DefaultLeaseName, metav1.GetOptions{})
	if err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" {
		t.Errorf("the Lease is held by %q: the test wants no leader", *lease.Spec.HolderIdentity)
	}
	for _, l := range tr.lives() {
		if l.seen.After(killed) && !l.gatedFrom.IsZero() {
			t.Errorf("pod %s was gated while no leader held the Lease", l.name)
		}
		end := orNow(l.bound, time.Now())
		if !l.gone.IsZero() && l.bound.IsZero() {
			continue
		}
		if d := end.Sub(l.seen); d > gateTimeout+10*time.Second {
			t.Errorf("pod %s waited %v to be scheduled: more than --gate-timeout + 10 s", l.name, d.Round(time.Millisecond))
		}
	}
	if n := metric(t, regB, "edgeflow_rebalance_gates_released_total", map[string]string{"placement": rebalancer.ReleaseTimeout}); n < 1 {
		t.Errorf("b released %v gates on timeout, want the replacement a left gated", n)
	}
	reportWaits(t, tr, "no leader")
}

// The planned node is tainted or cordoned. Before the move: it is skipped with the reason
// node_unschedulable. After the replacement was released to it (kube-scheduler stopped
// meanwhile, so that it cannot bind first): it stays Pending, is deleted once at
// --placement-timeout, and its ReplicaSet recreates it ungated elsewhere. No pod stays Pending
// past the timeout (+ 10 s). A tenant's unbound pod carrying edgeflow's placement annotations,
// which edgeflow never placed, is never deleted.
func TestTaintedTargetNeverPending(t *testing.T) {
	t.Parallel()
	w := badWorld(t)
	tr := w.track()
	certPEM, certFile, keyFile := w.webhookCert()

	// Before the move: n2 tainted, n3 cordoned.
	w.taint("n2", &corev1.Taint{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule})
	w.cordon(true, "n3")
	a, regA := w.controller(rebalancer.Config{Identity: "a"})
	addr, stopHookA := w.serveAt(a, "127.0.0.1:0", certFile, keyFile)
	w.replicaWebhooks(certPEM, addr)
	stopA := w.start(a, "a")
	testkit.Eventually(t, 60*time.Second, "runs past the new leader's first period", func() bool {
		return metric(t, regA, "edgeflow_rebalance_runs_total", map[string]string{"result": "ok"}) >= 3
	})
	stopHookA()
	stopA()
	r := a.Last()
	unschedulable := 0
	for _, m := range r.Moves {
		if m.To == "n2" || m.To == "n3" {
			if m.Action == rebalancer.ActionEvict {
				t.Errorf("move %+v into a tainted or cordoned node carried out", m)
			}
			if m.Reason == rebalancer.ReasonUnschedulable {
				unschedulable++
			}
		}
	}
	if unschedulable == 0 {
		t.Fatalf("no move skipped as %s: %+v", rebalancer.ReasonUnschedulable, r.Moves)
	}
	t.Logf("tainted n2, cordoned n3: %d moves skipped (%s)", unschedulable, rebalancer.ReasonUnschedulable)
	testkit.Eventually(t, 30*time.Second, "every pod running", w.allRunning)
	w.taint("n2", nil)
	w.cordon(false, "n3")

	// After the release: the scheduler is stopped, the replacement released to its node, the
	// node cordoned, the scheduler started again.
	const placementTimeout = 15 * time.Second
	if err := w.cluster.Stop("kube-scheduler"); err != nil {
		t.Fatal(err)
	}
	forged := w.forgedPlacement()
	b, regB := w.controller(rebalancer.Config{Identity: "b", MaxMoves: 1, Period: 5 * time.Second, PlacementTimeout: placementTimeout})
	w.serveAt(b, addr, certFile, keyFile)
	w.start(b, "b")
	var placing podLife
	testkit.Eventually(t, 60*time.Second, "a replacement released to its planned node", func() bool {
		for _, l := range tr.lives() {
			if l.placedOn != "" && l.bound.IsZero() {
				placing = l
				return true
			}
		}
		return false
	})
	w.cordon(true, placing.placedOn)
	if err := w.cluster.Restart("kube-scheduler"); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s released to %s; %s cordoned, kube-scheduler started again", placing.name, placing.placedOn, placing.placedOn)
	testkit.Eventually(t, placementTimeout+60*time.Second, "the replacement deleted and recreated, every pod running", func() bool {
		return metric(t, regB, "edgeflow_rebalance_placement_failures_total", nil) >= 1 && w.allRunning() &&
			len(w.pods("frontend")) == 3 && len(w.pods("backend")) == 3
	})
	if ev := w.edgeflowEvents(); ev["PlacementFailed"] < 1 {
		t.Errorf("events %v: want PlacementFailed", ev)
	}
	for _, l := range tr.lives() {
		if l.name == placing.name && l.gone.IsZero() {
			testkit.Eventually(t, 10*time.Second, placing.name+" gone", func() bool {
				_, err := w.cs.CoreV1().Pods(ns).Get(w.ctx, placing.name, metav1.GetOptions{})
				return apierrors.IsNotFound(err)
			})
		}
		if l.seen.After(placing.seen) && l.owner == placing.owner && !l.gatedFrom.IsZero() {
			t.Errorf("the recreated pod %s was gated", l.name)
		}
		end := orNow(l.bound, orNow(l.gone, time.Now()))
		if d := end.Sub(l.seen); d > placementTimeout+10*time.Second {
			t.Errorf("pod %s Pending %v: past --placement-timeout + 10 s", l.name, d.Round(time.Millisecond))
		}
	}
	// Past the timeout of its annotations from b's start, and of the real replacement's.
	p, err := w.cs.CoreV1().Pods(forged.Namespace).Get(w.ctx, forged.Name, metav1.GetOptions{})
	if err != nil || p.UID != forged.UID || p.DeletionTimestamp != nil {
		t.Errorf("the tenant's pod annotated %s, never placed by edgeflow: %v, deleting at %v; want it left alone",
			rebalancer.AnnotationPlacedAt, err, p.DeletionTimestamp)
	}
	reportWaits(t, tr, "planned node cordoned after the release")
}

// forgedPlacement creates, in a tenant's namespace, an unbound pod that carries edgeflow's
// placement annotations (placed an hour ago, so past any placement timeout) and a node
// selector no node matches: a pod edgeflow never placed, and Pending for good.
func (w *world) forgedPlacement() *corev1.Pod {
	const tenant = "tenant"
	_, err := w.cs.CoreV1().Namespaces().Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		w.t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "forged", Namespace: tenant,
		Annotations: map[string]string{rebalancer.AnnotationPlacedOn: "n1",
			rebalancer.AnnotationPlacedAt: time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)}},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{"no-such": "node"},
			Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
	p, err = w.cs.CoreV1().Pods(tenant).Create(w.ctx, p, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return p
}

// taint sets (or, with nil, removes) the node's "dedicated" taint.
func (w *world) taint(node string, taint *corev1.Taint) {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := w.cs.CoreV1().Nodes().Get(w.ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == "dedicated" })
		if taint != nil {
			n.Spec.Taints = append(n.Spec.Taints, *taint)
		}
		_, err = w.cs.CoreV1().Nodes().Update(w.ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		w.t.Fatal(err)
	}
}

// The leader dies between an eviction and the placement of its replacement (its RBAC lacked
// pods/patch, so the replacement waited gated). The other replica takes over, reads the state,
// places the replacement on its planned node, and makes no move before a period has passed
// since the last one: with --max-moves 1, no two evictions less than a period apart. Nothing
// placed by a move is moved again (cool-down), and every pod runs.
func TestLeaderChangeMidMove(t *testing.T) {
	w := badWorld(t)
	tr := w.track()
	certPEM, certFile, keyFile := w.webhookCert()
	const period = 6 * time.Second

	a, _ := w.controllerAs(rebalancer.Config{Identity: "a", MaxMoves: 1, Period: period},
		w.serviceAccount("edgeflow-a", without(rebalancerRules(), "pods", "patch")))
	b, regB := w.controllerAs(rebalancer.Config{Identity: "b", MaxMoves: 1, Period: period},
		w.serviceAccount("edgeflow-b", rebalancerRules()))
	addrA, stopHookA := w.serveAt(a, "127.0.0.1:0", certFile, keyFile)
	addrB, _ := w.serveAt(b, "127.0.0.1:0", certFile, keyFile)
	w.replicaWebhooks(certPEM, addrA, addrB)
	stopA := w.start(a, "a")
	testkit.Eventually(t, 30*time.Second, "a leading", a.Leading)
	w.start(b, "b")
	gated := w.gatedOne(tr, 60*time.Second)
	stopHookA()
	stopA()
	died := time.Now()
	t.Logf("leader a stopped while %s was gated", gated)
	testkit.Eventually(t, 30*time.Second, "b leading", b.Leading)
	t.Logf("b leads %v after a stopped", time.Since(died).Round(time.Millisecond))
	testkit.Eventually(t, 60*time.Second, "the replacement placed by b", func() bool {
		for _, l := range tr.lives() {
			if l.name == gated {
				return l.placedOn != "" && !l.bound.IsZero()
			}
		}
		return false
	})
	// Three more periods of b.
	runs := metric(t, regB, "edgeflow_rebalance_runs_total", nil)
	testkit.Eventually(t, 5*period, "three runs of b", func() bool {
		return metric(t, regB, "edgeflow_rebalance_runs_total", nil) >= runs+3
	})
	testkit.Eventually(t, 60*time.Second, "every pod running", func() bool {
		return w.allRunning() && len(w.pods("frontend")) == 3 && len(w.pods("backend")) == 3
	})
	ev := tr.evictions()
	t.Logf("evictions at %v after the first", gaps(ev))
	for i := 1; i < len(ev); i++ {
		if d := ev[i].Sub(ev[i-1]); d < period-time.Second {
			t.Errorf("evictions %d and %d %v apart: --max-moves 1 per %v period", i-1, i, d.Round(time.Millisecond), period)
		}
	}
	if len(ev) < 2 {
		t.Errorf("%d evictions: b made no move after the period (the state holds it back for good?)", len(ev))
	}
	for _, l := range tr.lives() {
		if l.placedOn != "" && !l.evicted.IsZero() {
			t.Errorf("%s, placed by a move, was moved again within the cool-down", l.name)
		}
	}
	if n := metric(t, regB, "edgeflow_rebalance_gates_released_total", map[string]string{"placement": rebalancer.ReleasePlanned}); n < 1 {
		t.Errorf("b placed %v replacements, want a's", n)
	}
	reportWaits(t, tr, "leader change mid-move")
}

func gaps(ts []time.Time) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Sub(ts[0]).Round(100*time.Millisecond).String())
	}
	return out
}

// Dry-run for three periods, with gated pods present (past the gate timeout) and moves to
// make: the API server's audit log shows no write by edgeflow — no eviction, no release, no
// event, no Lease, no state — while it shows edgeflow's reads.
func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	w := newWorldWith(t, worldOptions{audit: true}, threeNodes()...)
	badLayout(w)
	w.topology()
	w.waitTopology(6)
	w.gatedPod("left-gated-1", "other")
	w.gatedPod("left-gated-2", "other")
	pods := w.uids("frontend", "backend")

	c, reg := w.controller(rebalancer.Config{Identity: "dry", DryRun: true, GateTimeout: time.Second})
	stop := w.start(c, "dry")
	testkit.Eventually(t, 30*time.Second, "three dry runs", func() bool {
		return metric(t, reg, "edgeflow_rebalance_runs_total", map[string]string{"result": "ok"}) >= 3
	})
	stop()
	if r := c.Last(); r == nil || r.Evictions() == 0 {
		t.Fatalf("dry-run report %+v: want moves it would make", r)
	}
	entries := w.audit("edgeflow-rebalancer/dry")
	reads := 0
	for _, e := range entries {
		if isWrite(e.Verb) {
			t.Errorf("dry-run wrote: %s %s/%s %s/%s", e.Verb, e.ObjectRef.Resource, e.ObjectRef.Subresource, e.ObjectRef.Namespace, e.ObjectRef.Name)
		} else {
			reads++
		}
	}
	if reads == 0 {
		t.Fatal("the audit log shows no request by edgeflow-rebalancer/dry: the check sees nothing")
	}
	t.Logf("dry-run: %d reads, no write, in the audit log", reads)
	for _, name := range []string{"left-gated-1", "left-gated-2"} {
		p, err := w.cs.CoreV1().Pods(ns).Get(w.ctx, name, metav1.GetOptions{})
		if err != nil || len(p.Spec.SchedulingGates) != 1 {
			t.Errorf("pod %s: %v, gates %v: dry-run must leave it gated", name, err, p.Spec.SchedulingGates)
		}
	}
	if got := w.uids("frontend", "backend"); !slices.Equal(got, pods) {
		t.Errorf("dry-run changed the pods")
	}
}

// A service with one pod is never evicted (an outage wherever no PodDisruptionBudget forbids
// it), however much a move would gain.
func TestSingleReplicaNeverEvicted(t *testing.T) {
	t.Parallel()
	w := newWorld(t, threeNodes()...)
	w.service("frontend")
	w.service("backend")
	w.cordon(true, "n2", "n3")
	w.deployment("frontend", 1, "500m")
	w.settled("frontend", 1)
	w.cordon(true, "n1")
	w.cordon(false, "n2")
	w.deployment("backend", 1, "500m")
	w.settled("backend", 1)
	w.cordon(false, "n1", "n3")
	w.topology()
	w.waitTopology(2)
	pods := w.uids("frontend", "backend")
	certPEM, certFile, keyFile := w.webhookCert()
	c, reg := w.controller(rebalancer.Config{Identity: "a"})
	addr, _ := w.serveAt(c, "127.0.0.1:0", certFile, keyFile)
	w.replicaWebhooks(certPEM, addr)
	w.start(c, "a")
	testkit.Eventually(t, 60*time.Second, "runs past the new leader's first period", func() bool {
		return metric(t, reg, "edgeflow_rebalance_runs_total", map[string]string{"result": "ok"}) >= 3
	})
	r := c.Last()
	single := 0
	for _, m := range r.Moves {
		if m.Action == rebalancer.ActionEvict {
			t.Errorf("move %+v of a single-replica service carried out", m)
		}
		if m.Reason == rebalancer.ReasonSingleReplica {
			single++
		}
	}
	t.Logf("cost %.1f → target %.1f (gain %.0f%%); moves %+v", r.CostBefore, r.CostTarget, 100*r.Gain, r.Moves)
	if single == 0 {
		t.Errorf("no move skipped as %s: %+v", rebalancer.ReasonSingleReplica, r.Moves)
	}
	if got := w.uids("frontend", "backend"); !slices.Equal(got, pods) {
		t.Errorf("a single-replica pod was evicted")
	}
	if n := metric(t, reg, "edgeflow_rebalance_moves_skipped_total", map[string]string{"reason": rebalancer.ReasonSingleReplica}); n == 0 {
		t.Errorf("edgeflow_rebalance_moves_skipped_total{reason=single_replica} is 0")
	}
}

// uninstall removes the webhook registration, releases every gate edgeflow set (another's
// gate stays) and removes the rebalancer's state — by its name in the Lease's namespace, not a
// tenant's ConfigMaps labelled as the state is, one of them under the state's name; a second
// run finds nothing and succeeds.
func TestUninstallReleasesGates(t *testing.T) {
	t.Parallel()
	w := badWorld(t)
	tr := w.track()
	certPEM, certFile, keyFile := w.webhookCert()
	a, _ := w.controllerAs(rebalancer.Config{Identity: "a"},
		w.serviceAccount("edgeflow-a", without(rebalancerRules(), "pods", "patch")))
	addr, stopHook := w.serveAt(a, "127.0.0.1:0", certFile, keyFile)
	w.replicaWebhooks(certPEM, addr)
	stop := w.start(a, "a")
	w.gatedOne(tr, 60*time.Second)
	stop()
	stopHook()
	// A pod gated by edgeflow and by someone else: only edgeflow's gate goes.
	both := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "two-gates", Namespace: ns},
		Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: "other.io/gate"}, {Name: rebalancer.GateName}},
			Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
	if _, err := w.cs.CoreV1().Pods(ns).Create(w.ctx, both, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.cs.CoreV1().ConfigMaps("default").Get(w.ctx, rebalancer.DefaultLeaseName+"-state", metav1.GetOptions{}); err != nil {
		t.Fatalf("the leader left no state: %v", err)
	}
	tenants := []string{"tenant-settings", rebalancer.DefaultLeaseName + "-state"}
	for _, name := range tenants {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{rebalancer.ManagedByLabel: rebalancer.ManagedByValue, rebalancer.ComponentLabel: rebalancer.ComponentValue}}}
		if _, err := w.cs.CoreV1().ConfigMaps(ns).Create(w.ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	lease := rebalancer.UninstallConfig{Namespace: "default", LeaseName: rebalancer.DefaultLeaseName}
	res, err := rebalancer.Uninstall(w.ctx, w.cs, lease)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("uninstall: %+v", res)
	if !res.WebhookRemoved || res.GatesReleased < 2 || len(res.StateRemoved) != 1 {
		t.Errorf("uninstall %+v: want the webhook removed, the replacements' gates and two-gates' released, one state", res)
	}
	if _, err := w.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(w.ctx, rebalancer.WebhookName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the webhook registration is still there (%v)", err)
	}
	if _, err := w.cs.CoreV1().ConfigMaps("default").Get(w.ctx, rebalancer.DefaultLeaseName+"-state", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the state is still there (%v)", err)
	}
	for _, name := range tenants {
		if _, err := w.cs.CoreV1().ConfigMaps(ns).Get(w.ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("the tenant's ConfigMap %s/%s, labelled as the state: %v after uninstall, want it kept", ns, name, err)
		}
	}
	p, err := w.cs.CoreV1().Pods(ns).Get(w.ctx, "two-gates", metav1.GetOptions{})
	if err != nil || len(p.Spec.SchedulingGates) != 1 || p.Spec.SchedulingGates[0].Name != "other.io/gate" {
		t.Errorf("two-gates: %v, gates %v: want other.io/gate only", err, p.Spec.SchedulingGates)
	}
	if err := w.cs.CoreV1().Pods(ns).Delete(w.ctx, "two-gates", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "every pod running", func() bool {
		return w.allRunning() && len(w.pods("frontend")) == 3 && len(w.pods("backend")) == 3
	})
	again, err := rebalancer.Uninstall(w.ctx, w.cs, lease)
	if err != nil || again.WebhookRemoved || again.GatesReleased != 0 || len(again.StateRemoved) != 0 {
		t.Errorf("a second uninstall: %+v, %v: want nothing to do", again, err)
	}
	reportWaits(t, tr, "uninstall")
}

// 200 replacements at once — 100 pairs of services, every caller pod on n1 and every callee
// pod on n2, the plan moving one of each to the other node — are each released within 30 s of
// their pod existing, with edgeflow's default client limits (50 QPS, burst 100).
func TestRebalanceBurst(t *testing.T) {
	t.Parallel()
	const pairs = 100
	nodes := []kubeapi.NodeSpec{{Name: "n1", CPU: "32", Memory: "128Gi", Pods: 600}, {Name: "n2", CPU: "32", Memory: "128Gi", Pods: 600}}
	w := newWorldWith(t, worldOptions{podCIDR: "198.18.0.0/21"}, nodes...)
	name := func(side string, i int) string { return fmt.Sprintf("%s%03d", side, i) }
	one := 1.0
	var g watcher.CallGraph
	for i := 0; i < pairs; i++ {
		w.service(name("a", i))
		w.service(name("b", i))
		g.Calls = append(g.Calls, optimizer.Call{From: name("a", i) + ".shop", To: name("b", i) + ".shop", Rate: &one})
		g.Ingress = append(g.Ingress, optimizer.Ingress{Service: name("a", i) + ".shop", RPS: 10})
	}
	t0 := time.Now()
	w.cordon(true, "n2")
	for i := 0; i < pairs; i++ {
		w.deployment(name("a", i), 2, "10m")
	}
	testkit.Eventually(t, 5*time.Minute, "every caller pod running", func() bool { return w.runningOn("a", "n1") == 2*pairs })
	w.cordon(true, "n1")
	w.cordon(false, "n2")
	for i := 0; i < pairs; i++ {
		w.deployment(name("b", i), 2, "10m")
	}
	testkit.Eventually(t, 5*time.Minute, "every callee pod running", func() bool { return w.runningOn("b", "n2") == 2*pairs })
	w.cordon(false, "n1")
	t.Logf("%d pods running in %v", 4*pairs, time.Since(t0).Round(time.Second))
	w.topologyWith(&g)
	testkit.Eventually(t, 2*time.Minute, "the topology", func() bool {
		t := w.topo.Current()
		n := 0
		if t != nil {
			for _, s := range t.Services {
				n += len(s.Pods)
			}
		}
		return n == 4*pairs
	})
	tr := w.track()
	certPEM, certFile, keyFile := w.webhookCert()
	c, reg := w.controller(rebalancer.Config{Identity: "a", Period: 10 * time.Second,
		MaxMoves: 4 * pairs, MaxMovesPerNode: 4 * pairs, MaxMovesPerNamespace: 4 * pairs})
	addr, _ := w.serveAt(c, "127.0.0.1:0", certFile, keyFile)
	w.replicaWebhooks(certPEM, addr)
	w.start(c, "a")
	testkit.Eventually(t, 3*time.Minute, "200 replacements released", func() bool {
		n := 0
		for _, l := range tr.lives() {
			if !l.gatedTo.IsZero() {
				n++
			}
		}
		return n >= 2*pairs
	})
	var waits []time.Duration
	var first, last time.Time
	for _, l := range tr.lives() {
		if l.gatedFrom.IsZero() {
			continue
		}
		waits = append(waits, l.gatedTo.Sub(l.seen))
		if first.IsZero() || l.seen.Before(first) {
			first = l.seen
		}
		if l.gatedTo.After(last) {
			last = l.gatedTo
		}
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	r := c.Last()
	t.Logf("%d replacements: released %v (median) / %v (max) after their pod existed; first pod → last release %v; plan: %d moves, cost %.0f → %.0f",
		len(waits), waits[len(waits)/2].Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond),
		last.Sub(first).Round(time.Millisecond), r.Evictions(), r.CostBefore, r.CostTarget)
	if len(waits) != 2*pairs {
		t.Errorf("%d pods gated, want the %d replacements", len(waits), 2*pairs)
	}
	if max := waits[len(waits)-1]; max > 30*time.Second {
		t.Errorf("a replacement waited %v for its release: more than 30 s", max.Round(time.Millisecond))
	}
	if n := metric(t, reg, "edgeflow_rebalance_gates_released_total", map[string]string{"placement": rebalancer.ReleasePlanned}); n != 2*pairs {
		t.Errorf("%v replacements placed on their planned node, want %d", n, 2*pairs)
	}
	testkit.Eventually(t, 2*time.Minute, "every pod running", w.allRunning)
}

// runningOn counts the ready pods of apps named PREFIX… on node.
func (w *world) runningOn(prefix, node string) int {
	l, err := w.cs.CoreV1().Pods(ns).List(w.ctx, metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	n := 0
	for i := range l.Items {
		p := &l.Items[i]
		if len(p.Labels["app"]) > 0 && p.Labels["app"][:1] == prefix && p.Spec.NodeName == node && isReady(p) {
			n++
		}
	}
	return n
}
