package istio

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"istio.io/client-go/pkg/clientset/versioned/fake"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/xds"
)

// A Reconciler plugs into the watchers' seam, next to the xDS server.
var _ watcher.Listener = (*Reconciler)(nil)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newTestReconciler(t *testing.T, client *fake.Clientset, clock xds.Clock) *Reconciler {
	t.Helper()
	r, err := NewReconciler(ReconcilerConfig{
		Filters: testConfig,
		Client:  client,
		Clock:   clock,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// foreign returns an EnvoyFilter edgeflow does not own.
func foreign(name, namespace string, labels map[string]string) *clientnetworking.EnvoyFilter {
	return &clientnetworking.EnvoyFilter{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels}}
}

// writes returns the create, update and delete actions since the last call, as "VERB NAME".
func writes(c *fake.Clientset) []string {
	var out []string
	for _, a := range c.Actions() {
		switch a := a.(type) {
		case k8stesting.DeleteAction:
			out = append(out, "delete "+a.GetName())
		case k8stesting.CreateAction: // also matches an UpdateAction: same methods
			if v := a.GetVerb(); v == "create" || v == "update" {
				out = append(out, v+" "+a.GetObject().(*clientnetworking.EnvoyFilter).Name)
			}
		}
	}
	c.ClearActions()
	return out
}

// inCluster returns the filters in namespace ns by name.
func inCluster(t *testing.T, c *fake.Clientset, ns string) map[string]*clientnetworking.EnvoyFilter {
	t.Helper()
	list, err := c.NetworkingV1alpha3().EnvoyFilters(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.ClearActions()
	out := map[string]*clientnetworking.EnvoyFilter{}
	for _, f := range list.Items {
		out[f.Name] = f
	}
	return out
}

// checkOwned fails unless the owned filters in the cluster are exactly EnvoyFilters(services).
func checkOwned(t *testing.T, c *fake.Clientset, services []optimizer.Service) {
	t.Helper()
	got := inCluster(t, c, DefaultNamespace)
	for _, want := range EnvoyFilters(testConfig, services) {
		f, ok := got[want.Name]
		if !ok {
			t.Errorf("filter %s missing", want.Name)
			continue
		}
		if !proto.Equal(&f.Spec, &want.Spec) {
			t.Errorf("filter %s: spec differs from EnvoyFilters", want.Name)
		}
		delete(got, want.Name)
	}
	for name, f := range got {
		if f.Labels[ManagedByLabel] == ManagedByValue {
			t.Errorf("owned filter %s should not exist", name)
		}
	}
}

func TestReconcile(t *testing.T) {
	ctx := context.Background()
	client := fake.NewSimpleClientset(
		foreign("someone-elses", DefaultNamespace, nil),
		foreign("edgeflow-eds.old.default", "other-namespace", map[string]string{ManagedByLabel: ManagedByValue}),
	)
	r := newTestReconciler(t, client, nil)
	services := bookinfo()

	// Create: everything is missing.
	if err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}
	want := []string{"create edgeflow-xds", "create edgeflow-eds.ratings.shop", "create edgeflow-eds.reviews.default"}
	if diff := cmp.Diff(want, writes(client)); diff != "" {
		t.Errorf("create pass (-want +got):\n%s", diff)
	}
	checkOwned(t, client, services)

	// No-op: nothing changed, nothing is written.
	if err := r.Reconcile(ctx, bookinfo()); err != nil {
		t.Fatal(err)
	}
	if got := writes(client); len(got) != 0 {
		t.Errorf("unchanged pass wrote %v", got)
	}

	// Update: a new port on reviews rewrites its filter only, keeping others' labels.
	f := inCluster(t, client, DefaultNamespace)["edgeflow-eds.reviews.default"]
	f.Labels["team"] = "bookinfo"
	if _, err := client.NetworkingV1alpha3().EnvoyFilters(DefaultNamespace).Update(ctx, f, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	client.ClearActions()
	services[0].Ports = append(services[0].Ports, optimizer.Port{Port: 9081})
	if err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"update edgeflow-eds.reviews.default"}, writes(client)); diff != "" {
		t.Errorf("update pass (-want +got):\n%s", diff)
	}
	checkOwned(t, client, services)
	reviews := inCluster(t, client, DefaultNamespace)["edgeflow-eds.reviews.default"]
	if reviews.Labels["team"] != "bookinfo" || len(reviews.Spec.ConfigPatches) != 2 {
		t.Errorf("updated reviews filter: labels %v, %d patches", reviews.Labels, len(reviews.Spec.ConfigPatches))
	}

	// Repair: a filter deleted by hand comes back.
	if err := client.NetworkingV1alpha3().EnvoyFilters(DefaultNamespace).Delete(ctx, XDSClusterName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	client.ClearActions()
	if err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"create edgeflow-xds"}, writes(client)); diff != "" {
		t.Errorf("repair pass (-want +got):\n%s", diff)
	}

	// Delete: ratings is no longer managed; filters edgeflow does not own stay.
	services = services[:1]
	if err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"delete edgeflow-eds.ratings.shop"}, writes(client)); diff != "" {
		t.Errorf("delete pass (-want +got):\n%s", diff)
	}
	checkOwned(t, client, services)
	if _, ok := inCluster(t, client, DefaultNamespace)["someone-elses"]; !ok {
		t.Error("a filter edgeflow does not own was deleted")
	}

	// No managed services: the service filters go, the edgeflow-xds one last.
	if err := r.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"delete edgeflow-eds.reviews.default"}, writes(client)); diff != "" {
		t.Errorf("empty pass (-want +got):\n%s", diff)
	}
	checkOwned(t, client, nil)

	// Uninstall: every owned filter in the namespace goes, the others stay.
	if err := r.Reconcile(ctx, bookinfo()); err != nil {
		t.Fatal(err)
	}
	client.ClearActions()
	if err := r.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	want = []string{"delete edgeflow-eds.reviews.default", "delete edgeflow-eds.ratings.shop", "delete edgeflow-xds"}
	if diff := cmp.Diff(want, writes(client)); diff != "" {
		t.Errorf("uninstall (-want +got):\n%s", diff)
	}
	left := inCluster(t, client, DefaultNamespace)
	if len(left) != 1 || left["someone-elses"] == nil {
		t.Errorf("after Uninstall: %v, want only someone-elses", slices.Collect(maps.Keys(left)))
	}
	if len(inCluster(t, client, "other-namespace")) != 1 {
		t.Error("Uninstall touched another namespace")
	}
	if err := r.Uninstall(ctx); err != nil {
		t.Errorf("second Uninstall: %v", err)
	}
}

func TestReconcileErrorsNameTheFilter(t *testing.T) {
	ctx := context.Background()
	t.Run("unlabelled filter of the same name", func(t *testing.T) {
		client := fake.NewSimpleClientset(foreign("edgeflow-eds.reviews.default", DefaultNamespace, nil))
		r := newTestReconciler(t, client, nil)
		err := r.Reconcile(ctx, bookinfo())
		if err == nil || !strings.Contains(err.Error(), "EnvoyFilter istio-system/edgeflow-eds.reviews.default") ||
			!strings.Contains(err.Error(), "without label") {
			t.Fatalf("err = %v, want one naming edgeflow-eds.reviews.default", err)
		}
		got := inCluster(t, client, DefaultNamespace)
		if got[XDSClusterName] == nil || got["edgeflow-eds.ratings.shop"] == nil {
			t.Error("one failing filter stopped the others")
		}
		if got["edgeflow-eds.reviews.default"].Spec.ConfigPatches != nil {
			t.Error("the unlabelled filter was overwritten")
		}
	})
	t.Run("api errors", func(t *testing.T) {
		client := fake.NewSimpleClientset()
		r := newTestReconciler(t, client, nil)
		if err := r.Reconcile(ctx, bookinfo()); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		client.PrependReactor("*", "envoyfilters", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetVerb() == "update" || a.GetVerb() == "delete" {
				return true, nil, boom
			}
			return false, nil, nil
		})
		services := bookinfo()[:1]
		services[0].Ports = []optimizer.Port{{Port: 1}}
		err := r.Reconcile(ctx, services)
		for _, want := range []string{"EnvoyFilter istio-system/edgeflow-eds.reviews.default", "delete EnvoyFilter istio-system/edgeflow-eds.ratings.shop"} {
			if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, boom) {
				t.Errorf("err = %v, want one containing %q wrapping boom", err, want)
			}
		}
		client.PrependReactor("list", "envoyfilters", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, boom
		})
		if err := r.Uninstall(ctx); err == nil || !strings.Contains(err.Error(), "list EnvoyFilters in istio-system") {
			t.Errorf("Uninstall with a failing list: %v", err)
		}
	})
}

func TestNewReconcilerRejects(t *testing.T) {
	client := fake.NewSimpleClientset()
	for _, cfg := range []ReconcilerConfig{
		{Client: client},
		{Filters: testConfig},
		{Filters: testConfig, Client: client, Resync: -1},
	} {
		if _, err := NewReconciler(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewReconciler(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	client := fake.NewSimpleClientset()
	clock := newFakeClock()
	r := newTestReconciler(t, client, clock)

	// The first creates fail once: the pass is retried after RetryInterval.
	var mu sync.Mutex
	failed := false
	client.PrependReactor("create", "envoyfilters", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if !failed {
			failed = true
			return true, nil, errors.New("apiserver unavailable")
		}
		return false, nil, nil
	})

	done := make(chan error)
	go func() { done <- r.Run(ctx) }()

	topo := &optimizer.Topology{Services: bookinfo()}
	r.Update(topo)
	waitFor(t, "a retry timer after the failed pass", func() bool { return clock.pending() == DefaultRetryInterval })
	clock.Advance(DefaultRetryInterval)
	waitFor(t, "the filters after the retry", func() bool { return len(listOwned(client)) == 3 })
	waitFor(t, "a resync timer after the good pass", func() bool { return clock.pending() == DefaultResync })

	// A resync repairs a filter deleted by hand.
	if err := client.NetworkingV1alpha3().EnvoyFilters(DefaultNamespace).Delete(ctx, "edgeflow-eds.reviews.default", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(DefaultResync)
	waitFor(t, "the repaired filter", func() bool { return len(listOwned(client)) == 3 })

	// An Update with no services removes theirs; the edgeflow-xds cluster's stays.
	r.Update(&optimizer.Topology{})
	waitFor(t, "only the edgeflow-xds filter", func() bool { return slices.Equal(listOwned(client), []string{XDSClusterName}) })

	if err := r.Run(ctx); err == nil {
		t.Error("a second Run did not fail")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run returned %v", err)
	}
}

func TestRunWaitsForTheFirstUpdate(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	client := fake.NewSimpleClientset(foreign(XDSClusterName, DefaultNamespace, map[string]string{ManagedByLabel: ManagedByValue}))
	clock := newFakeClock()
	r := newTestReconciler(t, client, clock)
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	r.wake <- struct{}{} // a spurious wake-up before any Update (buffered)
	r.wake <- struct{}{} // blocks until Run has taken the first
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := writes(client); len(got) != 0 || clock.pending() != 0 {
		t.Errorf("before any Update Run wrote %v and set a timer of %v", got, clock.pending())
	}
}

func listOwned(c *fake.Clientset) []string {
	list, err := c.NetworkingV1alpha3().EnvoyFilters(DefaultNamespace).List(context.Background(),
		metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedByValue})
	if err != nil {
		return nil
	}
	var names []string
	for _, f := range list.Items {
		names = append(names, f.Name)
	}
	return names
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// fakeClock is an xds.Clock whose time moves only by Advance.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	clock *fakeClock
	at    time.Time
	c     chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1e9, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) xds.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{clock: c, at: c.now.Add(d), c: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	return t
}

// pending is the delay of the one pending timer (0 when there is none).
func (c *fakeClock) pending() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) != 1 {
		return 0
	}
	return c.timers[0].at.Sub(c.now)
}

// Advance moves time by d and fires the timers due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.timers = slices.DeleteFunc(c.timers, func(t *fakeTimer) bool {
		if t.at.After(c.now) {
			return false
		}
		t.c <- c.now
		return true
	})
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	n := len(t.clock.timers)
	t.clock.timers = slices.DeleteFunc(t.clock.timers, func(o *fakeTimer) bool { return o == t })
	return len(t.clock.timers) < n
}
