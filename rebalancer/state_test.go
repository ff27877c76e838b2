package rebalancer

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
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
	if i := got.inFlight("owner-cart"); i < 0 || got.Moves[i].To != "n2" || !got.Moves[i].Evicted.Equal(t0) {
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
