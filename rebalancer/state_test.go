package rebalancer

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// What a leader writes, the next reads: moves in flight, cool-downs, back-offs. A write by a
// leader that read an older version (its predecessor wrote meanwhile) still lands.
func TestStateHandover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := started(t, Config{})
	a.store = stateStore{namespace: "edgeflow", name: DefaultLeaseName + stateSuffix}
	st, err := a.loadState(ctx)
	if err != nil || len(st.Moves) != 0 {
		t.Fatalf("no ConfigMap yet: %+v, %v; want an empty state", st, err)
	}
	a.st = st
	leadingWith(a, "cart")
	a.st.Placed["shop/cart-9"] = t0
	a.st.setLeft("cart.shop", "n1", t0)
	a.st.Backoff["shop/cart-3"] = backoffState{Until: t0.Add(time.Minute), Delay: 20 * time.Second}
	if err := a.saveState(ctx); err != nil {
		t.Fatal(err)
	}

	b := &Controller{cs: a.cs, store: stateStore{namespace: "edgeflow", name: DefaultLeaseName + stateSuffix}}
	got, err := b.loadState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := got.inFlight("shop", ownerOf("cart")); i < 0 || got.Moves[i].To != "n2" || !got.Moves[i].Evicted.Equal(t0) {
		t.Errorf("moves %+v: want cart's move to n2 in flight", got.Moves)
	}
	if at, ok := got.leftAt("cart.shop", "n1"); !ok || !at.Equal(t0) || !got.Placed[types.UID("shop/cart-9")].Equal(t0) ||
		got.Backoff["shop/cart-3"].Delay != 20*time.Second {
		t.Errorf("cool-downs and back-offs lost: %+v", got)
	}
	// a writes again from its older resourceVersion after b wrote: the write lands.
	b.st = got
	b.st.Moves = nil
	if err := b.saveState(ctx); err != nil {
		t.Fatal(err)
	}
	a.st.Moves[0].Outcome = outcomePlaced
	if err := a.saveState(ctx); err != nil {
		t.Fatalf("a write after a newer one: %v", err)
	}
	if got, _ := b.loadState(ctx); len(got.Moves) != 1 || got.Moves[0].Outcome != outcomePlaced {
		t.Errorf("moves %+v after the last write", got.Moves)
	}
}

// The state's keys are those of its first release, whatever the printed keys of a Move: a leader
// reads the records of the one before it across an upgrade (and a downgrade). ownerKind and
// ownerName came later: a first release's record, without them, owns no pod.
func TestStateKeys(t *testing.T) {
	t.Parallel()
	m := Move{Namespace: "shop", Service: "cart.shop", Pod: "cart-0", From: "n1", To: "n2", CostAfter: 12.5,
		Action: ActionEvict, Reason: "r"}
	st := state{Moves: []moveRecord{{recordedMove: recordedMove(m), PodUID: "uid", Owner: "owner", OwnerKind: "ReplicaSet", OwnerName: "cart-7d9f",
		Requests: resources{corev1.ResourceCPU: 100}, Evicted: t0, Outcome: outcomePlaced, Replacement: "uid-2"}}}
	data, err := json.Marshal(&st)
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Moves []map[string]any }
	if err := json.Unmarshal(data, &got); err != nil || len(got.Moves) != 1 {
		t.Fatalf("%s: %v", data, err)
	}
	var keys []string
	for k := range got.Moves[0] {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"action", "costAfter", "evicted", "from", "namespace", "outcome", "owner", "ownerKind", "ownerName",
		"pod", "podUID", "reason", "replacement", "requests", "service", "to"}
	if !slices.Equal(keys, want) {
		t.Errorf("a move record's keys are %q, want %q (the state's since its first release)", keys, want)
	}

	// A record as the first release wrote it.
	const first = `{"moves":[{"namespace":"shop","service":"cart.shop","pod":"cart-0","from":"n1","to":"n2",` +
		`"costAfter":12.5,"action":"evict","podUID":"uid","owner":"owner","requests":{"cpu":100},` +
		`"evicted":"2026-01-01T00:00:00Z"}]}`
	var old state
	if err := json.Unmarshal([]byte(first), &old); err != nil {
		t.Fatal(err)
	}
	if r := old.Moves[0]; Move(r.recordedMove) != (Move{Namespace: "shop", Service: "cart.shop", Pod: "cart-0",
		From: "n1", To: "n2", CostAfter: 12.5, Action: ActionEvict}) || r.PodUID != "uid" || r.Requests[corev1.ResourceCPU] != 100 {
		t.Errorf("the first release's record read as %+v", r)
	}
	if old.Moves[0].owns("shop", &metav1.OwnerReference{Kind: "ReplicaSet", Name: "cart-7d9f", UID: "owner"}) {
		t.Error("a record without the owner's kind and name owns a pod by its UID alone")
	}
}

// TestFutureRecordsExpire: a state whose records are dated in the year 3000 (a leader whose
// clock ran ahead, or a ConfigMap edited by hand) no longer blocks a pod, a service's way back
// or a PDB retry forever: each is taken as made now and expires as any other.
func TestFutureRecordsExpire(t *testing.T) {
	cfg := Config{Cooldown: 10 * time.Minute, Period: 5 * time.Minute, GateTimeout: time.Minute, PlacementTimeout: time.Minute}
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	future := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
	st := newState()
	st.Placed["p1"] = future
	st.Left = []leftRecord{{Service: "shop/api", Node: "n1", At: future}}
	st.Backoff["p2"] = backoffState{Until: future, Delay: 1000 * time.Hour}
	st.Moves = []moveRecord{{PodUID: "p3", Owner: "rs", Evicted: future, Outcome: outcomePlaced}}
	st.expire(now, &cfg)
	if at := st.Placed["p1"]; !at.Equal(now) {
		t.Errorf("a placement dated %v is kept as %v, want now", future, at)
	}
	if b := st.Backoff["p2"]; b.Until.After(now.Add(cfg.Period)) || b.Delay > cfg.Period {
		t.Errorf("a back-off to %v of %v is kept as %+v, want at most a period", future, 1000*time.Hour, b)
	}
	later := now.Add(cfg.Cooldown + 2*cfg.Period)
	st.expire(later, &cfg)
	if len(st.Placed) != 0 || len(st.Left) != 0 || len(st.Backoff) != 0 || len(st.Moves) != 0 {
		t.Errorf("records dated %v still there at %v: %+v", future, later, st)
	}
}

// A placement stays in the state for its placement timeout and a period at least, whatever
// the cool-down (none, here): it is what lets a replica delete the pod past that timeout.
func TestPlacementKeptPastItsTimeout(t *testing.T) {
	t.Parallel()
	cfg := Config{Cooldown: -1, Period: 5 * time.Second, PlacementTimeout: 15 * time.Second, GateTimeout: time.Minute}
	st := newState()
	st.Placed["p1"] = t0
	st.expire(t0.Add(cfg.PlacementTimeout+time.Second), &cfg)
	if _, ok := st.Placed["p1"]; !ok {
		t.Errorf("a placement forgotten %v after it, before its timeout and a period", cfg.PlacementTimeout+time.Second)
	}
	st.expire(t0.Add(cfg.PlacementTimeout+cfg.Period), &cfg)
	if _, ok := st.Placed["p1"]; ok {
		t.Error("a placement kept past its timeout and a period without a cool-down")
	}
}

// A state ConfigMap created beforehand, empty (the Helm chart's: the rebalancer is granted get
// and update on that name only, no create), reads as an empty state; the first write updates
// it, never creates, and keeps the labels and annotations it carried.
func TestStateInAConfigMapCreatedBeforehand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := DefaultLeaseName + stateSuffix
	chart := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "edgeflow", Name: name,
		Labels:      map[string]string{"app.kubernetes.io/instance": "edgeflow", ManagedByLabel: ManagedByValue, ComponentLabel: ComponentValue},
		Annotations: map[string]string{"meta.helm.sh/release-name": "edgeflow"}}}
	a := started(t, Config{}, chart)
	a.store = stateStore{namespace: "edgeflow", name: name}
	st, err := a.loadState(ctx)
	if err != nil || len(st.Moves) != 0 || st.Placed == nil || st.Backoff == nil {
		t.Fatalf("an empty ConfigMap: %+v, %v; want an empty state", st, err)
	}
	a.st = st
	leadingWith(a, "cart")
	if err := a.saveState(ctx); err != nil {
		t.Fatal(err)
	}
	for _, act := range a.cs.(*fake.Clientset).Actions() {
		if act.GetResource().Resource == "configmaps" && act.GetVerb() == "create" {
			t.Errorf("the state was created (%v); want the existing ConfigMap updated", act)
		}
	}
	got, err := a.cs.CoreV1().ConfigMaps("edgeflow").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(chart.Labels, got.Labels); diff != "" {
		t.Errorf("labels (-chart's +after the write):\n%s", diff)
	}
	if diff := cmp.Diff(chart.Annotations, got.Annotations); diff != "" {
		t.Errorf("annotations (-chart's +after the write):\n%s", diff)
	}
	b := &Controller{cs: a.cs, store: stateStore{namespace: "edgeflow", name: name}}
	if st, err := b.loadState(ctx); err != nil || st.inFlight("shop", ownerOf("cart")) < 0 {
		t.Errorf("the next leader reads %+v, %v; want cart's move in flight", st.Moves, err)
	}
}
