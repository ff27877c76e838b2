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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"istio.io/client-go/pkg/clientset/versioned/fake"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
)

// A Reconciler plugs into the watchers' seam, next to the xDS server.
var _ watcher.Listener = (*Reconciler)(nil)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testEnv is a Reconciler on fake Istio and Kubernetes clientsets that records, in one
// ordered log, every write to either.
type testEnv struct {
	istio *fake.Clientset
	kube  *kubefake.Clientset
	mu    sync.Mutex
	log   []string
}

func newTestEnv(t *testing.T, clock clock.WithTickerAndDelayedExecution, objs ...runtime.Object) (*testEnv, *Reconciler) {
	t.Helper()
	var iobjs, kobjs []runtime.Object
	for _, o := range objs {
		if _, ok := o.(*corev1.ConfigMap); ok {
			kobjs = append(kobjs, o)
		} else {
			iobjs = append(iobjs, o)
		}
	}
	e := &testEnv{istio: fake.NewSimpleClientset(iobjs...), kube: kubefake.NewClientset(kobjs...)}
	record := func(a k8stesting.Action) (bool, runtime.Object, error) {
		var what string
		switch a := a.(type) {
		case k8stesting.DeleteAction:
			what = "delete " + a.GetResource().Resource + " " + a.GetNamespace() + "/" + a.GetName()
		case k8stesting.CreateAction: // also matches an UpdateAction: same methods
			if v := a.GetVerb(); v == "create" || v == "update" {
				m, _ := meta.Accessor(a.GetObject())
				what = v + " " + a.GetResource().Resource + " " + a.GetNamespace() + "/" + m.GetName()
			}
		}
		if what != "" {
			e.mu.Lock()
			e.log = append(e.log, what)
			e.mu.Unlock()
		}
		return false, nil, nil
	}
	e.istio.PrependReactor("*", "*", record)
	e.kube.PrependReactor("*", "*", record)
	r, err := NewReconciler(ReconcilerConfig{
		Filters: testConfig,
		Client:  e.istio,
		Kube:    e.kube,
		Clock:   clock,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return e, r
}

// writes returns the writes since the last call, in order, as "VERB RESOURCE NS/NAME".
func (e *testEnv) writes() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.log
	e.log = nil
	return out
}

// foreign returns an EnvoyFilter edgeflow does not own.
func foreign(name, namespace string, labels map[string]string) *clientnetworking.EnvoyFilter {
	return &clientnetworking.EnvoyFilter{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels}}
}

// configMap returns a ConfigMap with the given labels and data.
func configMap(name, namespace string, labels, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels}, Data: data}
}

// inCluster returns the filters in namespace ns by name.
func inCluster(t *testing.T, c *fake.Clientset, ns string) map[string]*clientnetworking.EnvoyFilter {
	t.Helper()
	list, err := c.NetworkingV1alpha3().EnvoyFilters(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*clientnetworking.EnvoyFilter{}
	for _, f := range list.Items {
		out[f.Name] = f
	}
	return out
}

// configMaps returns every ConfigMap in the cluster as "NS/NAME".
func configMaps(t *testing.T, c *kubefake.Clientset) map[string]*corev1.ConfigMap {
	t.Helper()
	list, err := c.CoreV1().ConfigMaps("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.ConfigMap{}
	for i := range list.Items {
		out[list.Items[i].Namespace+"/"+list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// checkOwned fails unless the owned filters and ConfigMaps in the cluster are exactly
// EnvoyFilters(services) and BootstrapConfigMaps(services).
func checkOwned(t *testing.T, e *testEnv, services []optimizer.Service) {
	t.Helper()
	got := inCluster(t, e.istio, DefaultNamespace)
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
	cms := configMaps(t, e.kube)
	for _, want := range BootstrapConfigMaps(testConfig, services) {
		key := want.Namespace + "/" + want.Name
		cm, ok := cms[key]
		if !ok {
			t.Errorf("ConfigMap %s missing", key)
			continue
		}
		if !maps.Equal(cm.Data, want.Data) || cm.Labels[ManagedByLabel] != ManagedByValue {
			t.Errorf("ConfigMap %s: data or labels differ from BootstrapConfigMaps", key)
		}
		delete(cms, key)
	}
	for key, cm := range cms {
		if cm.Labels[ManagedByLabel] == ManagedByValue && cm.Name == BootstrapConfigMapName {
			t.Errorf("owned ConfigMap %s should not exist", key)
		}
	}
}

func TestReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owned := map[string]string{ManagedByLabel: ManagedByValue}
	e, r := newTestEnv(t, nil,
		foreign("someone-elses", DefaultNamespace, nil),
		foreign("edgeflow-eds.old.default", "other-namespace", owned),
		configMap("app-config", "default", owned, map[string]string{"k": "v"}), // labelled, another name: not ours
		configMap(BootstrapConfigMapName, "stale", owned, map[string]string{"k": "v"}),
	)
	services := bookinfo()

	// Create: everything is missing; ConfigMaps first; the stale namespace's goes last.
	if err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"create configmaps default/edgeflow-bootstrap", "create configmaps shop/edgeflow-bootstrap",
		"create envoyfilters istio-system/edgeflow-eds.default", "create envoyfilters istio-system/edgeflow-eds.shop",
		"delete configmaps stale/edgeflow-bootstrap",
	}
	if diff := cmp.Diff(want, e.writes()); diff != "" {
		t.Errorf("create pass (-want +got):\n%s", diff)
	}
	checkOwned(t, e, services)

	// No-op: nothing changed, nothing is written.
	if err := r.Reconcile(ctx, bookinfo()); err != nil {
		t.Fatal(err)
	}
	if got := e.writes(); len(got) != 0 {
		t.Errorf("unchanged pass wrote %v", got)
	}

	// Update: a new port on reviews rewrites its filter only, keeping others' labels.
	f := inCluster(t, e.istio, DefaultNamespace)["edgeflow-eds.default"]
	f.Labels["team"] = "bookinfo"
	if _, err := e.istio.NetworkingV1alpha3().EnvoyFilters(DefaultNamespace).Update(ctx, f, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.writes()
	services[0].Ports = append(services[0].Ports, optimizer.Port{Port: 9081})
	if err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"update envoyfilters istio-system/edgeflow-eds.default"}, e.writes()); diff != "" {
		t.Errorf("update pass (-want +got):\n%s", diff)
	}
	checkOwned(t, e, services)
	reviews := inCluster(t, e.istio, DefaultNamespace)["edgeflow-eds.default"]
	if reviews.Labels["team"] != "bookinfo" || len(reviews.Spec.ConfigPatches) != 2 {
		t.Errorf("updated reviews filter: labels %v, %d patches", reviews.Labels, len(reviews.Spec.ConfigPatches))
	}

	// Repair: a filter deleted by hand comes back; a ConfigMap edited by hand is set back,
	// keeping the labels and annotations others added.
	if err := e.istio.NetworkingV1alpha3().EnvoyFilters(DefaultNamespace).Delete(ctx, "edgeflow-eds.shop", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cm := configMaps(t, e.kube)["shop/"+BootstrapConfigMapName]
	cm.Data[BootstrapOverrideKey] = "{}"
	cm.Annotations = map[string]string{"note": "kept"}
	if _, err := e.kube.CoreV1().ConfigMaps("shop").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.writes()
	if err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}
	want = []string{"update configmaps shop/edgeflow-bootstrap", "create envoyfilters istio-system/edgeflow-eds.shop"}
	if diff := cmp.Diff(want, e.writes()); diff != "" {
		t.Errorf("repair pass (-want +got):\n%s", diff)
	}
	checkOwned(t, e, services)
	if got := configMaps(t, e.kube)["shop/"+BootstrapConfigMapName].Annotations["note"]; got != "kept" {
		t.Error("the ConfigMap update dropped another writer's annotation")
	}

	// Delete: ratings is no longer managed: its filter, then its namespace's ConfigMap go;
	// objects edgeflow does not own stay.
	services = services[:1]
	if err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}
	want = []string{"delete envoyfilters istio-system/edgeflow-eds.shop", "delete configmaps shop/edgeflow-bootstrap"}
	if diff := cmp.Diff(want, e.writes()); diff != "" {
		t.Errorf("delete pass (-want +got):\n%s", diff)
	}
	checkOwned(t, e, services)
	if _, ok := inCluster(t, e.istio, DefaultNamespace)["someone-elses"]; !ok {
		t.Error("a filter edgeflow does not own was deleted")
	}

	// A ConfigMap of edgeflow's name that edgeflow does not own is reported, never touched.
	if _, err := e.kube.CoreV1().ConfigMaps("shop").Create(ctx, configMap(BootstrapConfigMapName, "shop", nil, map[string]string{"mine": "yes"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.writes()
	err := r.Reconcile(ctx, bookinfo())
	if err == nil || !strings.Contains(err.Error(), "ConfigMap shop/edgeflow-bootstrap") || !strings.Contains(err.Error(), "without label") {
		t.Errorf("err = %v, want one naming ConfigMap shop/edgeflow-bootstrap", err)
	}
	if got := configMaps(t, e.kube)["shop/"+BootstrapConfigMapName].Data; got["mine"] != "yes" {
		t.Errorf("the user's ConfigMap was modified: %v", got)
	}

	// No managed services: everything edgeflow owns goes, the others stay.
	if err := r.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	checkOwned(t, e, nil)

	// Uninstall: every owned object goes, filters first, the others stay.
	if err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}
	e.writes()
	if err := r.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	want = []string{"delete envoyfilters istio-system/edgeflow-eds.default", "delete configmaps default/edgeflow-bootstrap"}
	if diff := cmp.Diff(want, e.writes()); diff != "" {
		t.Errorf("uninstall (-want +got):\n%s", diff)
	}
	left := inCluster(t, e.istio, DefaultNamespace)
	if len(left) != 1 || left["someone-elses"] == nil {
		t.Errorf("after Uninstall: %v, want only someone-elses", slices.Collect(maps.Keys(left)))
	}
	if len(inCluster(t, e.istio, "other-namespace")) != 1 {
		t.Error("Uninstall touched another namespace's filter")
	}
	cms := configMaps(t, e.kube)
	if len(cms) != 2 || cms["default/app-config"] == nil || cms["shop/"+BootstrapConfigMapName] == nil {
		t.Errorf("after Uninstall ConfigMaps %v, want only the user's two", slices.Collect(maps.Keys(cms)))
	}
	if err := r.Uninstall(ctx); err != nil {
		t.Errorf("second Uninstall: %v", err)
	}
}

func TestReconcileErrorsNameTheObject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("unlabelled filter of the same name", func(t *testing.T) {
		e, r := newTestEnv(t, nil, foreign("edgeflow-eds.default", DefaultNamespace, nil))
		err := r.Reconcile(ctx, bookinfo())
		if err == nil || !strings.Contains(err.Error(), "EnvoyFilter istio-system/edgeflow-eds.default") ||
			!strings.Contains(err.Error(), "without label") {
			t.Fatalf("err = %v, want one naming edgeflow-eds.default", err)
		}
		got := inCluster(t, e.istio, DefaultNamespace)
		if got["edgeflow-eds.shop"] == nil {
			t.Error("one failing filter stopped the others")
		}
		if got["edgeflow-eds.default"].Spec.ConfigPatches != nil {
			t.Error("the unlabelled filter was overwritten")
		}
	})
	t.Run("api errors", func(t *testing.T) {
		e, r := newTestEnv(t, nil)
		if err := r.Reconcile(ctx, bookinfo()); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		fail := func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetVerb() == "update" || a.GetVerb() == "delete" {
				return true, nil, boom
			}
			return false, nil, nil
		}
		e.istio.PrependReactor("*", "envoyfilters", fail)
		e.kube.PrependReactor("*", "configmaps", fail)
		services := bookinfo()[:1]
		services[0].Ports = []optimizer.Port{{Port: 1}}
		err := r.Reconcile(ctx, services)
		for _, want := range []string{"EnvoyFilter istio-system/edgeflow-eds.default", "delete EnvoyFilter istio-system/edgeflow-eds.shop",
			"delete ConfigMap shop/edgeflow-bootstrap"} {
			if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, boom) {
				t.Errorf("err = %v, want one containing %q wrapping boom", err, want)
			}
		}
		e.istio.PrependReactor("list", "envoyfilters", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, boom
		})
		if err := r.Uninstall(ctx); err == nil || !strings.Contains(err.Error(), "list EnvoyFilters in istio-system") {
			t.Errorf("Uninstall with a failing list: %v", err)
		}
	})
}

func TestNewReconcilerRejects(t *testing.T) {
	t.Parallel()
	client, kube := fake.NewSimpleClientset(), kubefake.NewClientset()
	for _, cfg := range []ReconcilerConfig{
		{Client: client, Kube: kube},
		{Filters: testConfig},
		{Filters: testConfig, Client: client},
		{Filters: testConfig, Kube: kube},
		{Filters: testConfig, Client: client, Kube: kube, Resync: -1},
	} {
		if _, err := NewReconciler(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewReconciler(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	clock := newFakeClock()
	e, r := newTestEnv(t, clock)
	client := e.istio

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
	testkit.Eventually(t, 10*time.Second, "a retry timer after the failed pass", func() bool { return pending(clock) == DefaultRetryInterval })
	clock.Step(DefaultRetryInterval)
	testkit.Eventually(t, 10*time.Second, "the filters after the retry", func() bool { return len(listOwned(client)) == 2 })
	testkit.Eventually(t, 10*time.Second, "a resync timer after the good pass", func() bool { return pending(clock) == DefaultResync })

	// A resync repairs a filter deleted by hand.
	if err := client.NetworkingV1alpha3().EnvoyFilters(DefaultNamespace).Delete(ctx, "edgeflow-eds.default", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clock.Step(DefaultResync)
	testkit.Eventually(t, 10*time.Second, "the repaired filter", func() bool { return len(listOwned(client)) == 2 })

	// An Update with no services removes every owned object.
	r.Update(&optimizer.Topology{})
	testkit.Eventually(t, 10*time.Second, "no owned filter", func() bool { return len(listOwned(client)) == 0 })
	testkit.Eventually(t, 10*time.Second, "no owned ConfigMap", func() bool {
		l, err := e.kube.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{LabelSelector: managedSelector})
		return err == nil && len(l.Items) == 0
	})

	if err := r.Run(ctx); err == nil {
		t.Error("a second Run did not fail")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run returned %v", err)
	}
}

func TestRunWaitsForTheFirstUpdate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	clock := newFakeClock()
	e, r := newTestEnv(t, clock, foreign("edgeflow-eds.gone.default", DefaultNamespace, map[string]string{ManagedByLabel: ManagedByValue}))
	passed := make(chan bool, 2)
	r.passes.passed = func(ok bool) { passed <- ok }
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	for i, what := range []string{"Run's own pass at its start", "a spurious wake-up's pass"} {
		if i > 0 {
			r.passes.wake()
		}
		if ok := <-passed; ok {
			t.Errorf("%s, before any Update, had something to do", what)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := e.writes(); len(got) != 0 || pending(clock) != 0 {
		t.Errorf("before any Update Run wrote %v and set a timer of %v", got, pending(clock))
	}
}

// TestRunTermsWriteOnlyWhileRunning is how serve runs a reconciler under leader election:
// Updates while no Run runs write nothing; each new Run reconciles the latest topology at once
// (no Update needed), and a Run that returned writes nothing more.
func TestRunTermsWriteOnlyWhileRunning(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	e, r := newTestEnv(t, clock)
	term := func(what string, cond func() bool) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		testkit.Eventually(t, 10*time.Second, what, cond)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	r.Update(&optimizer.Topology{Services: bookinfo()})
	lostTerm(t, r) // a Run that lost its term before the pass
	if got := e.writes(); len(got) != 0 {
		t.Fatalf("wrote %v with no Run", got)
	}
	term("the filters of the first term", func() bool { return len(listOwned(e.istio)) == 2 })
	e.writes()
	r.Update(&optimizer.Topology{}) // recorded between terms
	lostTerm(t, r)                  // and a Run that lost its term before the pass
	if got := e.writes(); len(got) != 0 {
		t.Fatalf("wrote %v between terms", got)
	}
	term("no owned filter in the second term, without a new Update", func() bool { return len(listOwned(e.istio)) == 0 })
	if err := r.Run(canceled()); err != nil {
		t.Errorf("a third Run after the second returned: %v", err)
	}
}

// lostTerm runs r in a term that ends before its first pass.
func lostTerm(t *testing.T, r *Reconciler) {
	t.Helper()
	if err := r.Run(canceled()); err != nil {
		t.Fatalf("Run in a term already over: %v", err)
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
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

// newFakeClock returns the clock of tests that drive the reconcilers' timers by hand.
func newFakeClock() *testkit.FakeClock { return testkit.NewFakeClock(time.Unix(1e9, 0)) }

// pending is the delay of the clock's one pending timer (0 when there is none, or several).
func pending(c *testkit.FakeClock) time.Duration {
	d := c.Deadlines(c.Now())
	if len(d) != 1 {
		return 0
	}
	return d[0]
}

// TestLabelledFilterNotEdgeflowsLeftAlone: an EnvoyFilter carrying edgeflow's label but not its
// name pattern and annotation (nor an earlier edgeflow's exact filter: legacyFilter) (anyone who may write EnvoyFilters in the namespace can set a
// label) survives reconcile passes, Managed lists it not and Uninstall (edgeflow uninstall's
// envoyfilter part) leaves it; it is logged once. Before, the label alone made it edgeflow's:
// the first pass deleted it.
func TestLabelledFilterNotEdgeflowsLeftAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owned := map[string]string{ManagedByLabel: ManagedByValue}
	tenants := []*clientnetworking.EnvoyFilter{
		foreign("tenant-filter", DefaultNamespace, owned),               // another name
		foreign("edgeflow-eds.forged", DefaultNamespace, owned),         // edgeflow's pattern, no annotation
		foreign("edgeflow-eds.other", DefaultNamespace, owned),          // an annotation naming another namespace
		foreign("edgeflow-eds.forged.default", DefaultNamespace, owned), // an earlier edgeflow's pattern, not its spec
	}
	tenants[2].Annotations = map[string]string{FilterNamespaceAnnotation: "default"}
	var objs []runtime.Object
	for _, f := range tenants {
		objs = append(objs, f)
	}
	e, _ := newTestEnv(t, nil, objs...)
	var logs testkit.LogBuffer
	r, err := NewReconciler(ReconcilerConfig{Filters: testConfig, Client: e.istio, Kube: e.kube, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	survive := func(when string) {
		t.Helper()
		have := inCluster(t, e.istio, DefaultNamespace)
		for _, f := range tenants {
			if _, ok := have[f.Name]; !ok {
				t.Errorf("%s: the tenant's labelled filter %s is gone", when, f.Name)
			}
		}
		for _, w := range e.writes() {
			for _, f := range tenants {
				if strings.HasSuffix(w, "/"+f.Name) {
					t.Errorf("%s: edgeflow wrote the tenant's filter: %s", when, w)
				}
			}
		}
	}
	for _, services := range [][]optimizer.Service{bookinfo(), bookinfo(), nil, bookinfo()} {
		if err := r.Reconcile(ctx, services); err != nil {
			t.Fatal(err)
		}
		survive("reconcile")
	}
	got, err := r.Managed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"EnvoyFilter istio-system/edgeflow-eds.default", "EnvoyFilter istio-system/edgeflow-eds.shop",
		"ConfigMap default/edgeflow-bootstrap", "ConfigMap shop/edgeflow-bootstrap"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Managed (-want +got):\n%s", diff)
	}
	if err := r.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	survive("uninstall")
	if len(listOwned(e.istio)) != len(tenants) {
		t.Errorf("after uninstall, labelled filters %v, want only the tenant's", listOwned(e.istio))
	}
	for _, f := range tenants {
		if n := strings.Count(logs.String(), "name="+f.Name+" "); n != 1 {
			t.Errorf("the tenant's filter %s logged %d times, want once:\n%s", f.Name, n, logs.String())
		}
	}
}

// TestFiltersOfAnEarlierEdgeflowReplaced: the filters of one service an earlier edgeflow wrote
// (labelled, "edgeflow-eds.NAME.NAMESPACE", exactly the spec it wrote) are deleted once their
// namespace's filter is written, and by Uninstall; one of that pattern and label with another
// spec is not edgeflow's and stays.
func TestFiltersOfAnEarlierEdgeflowReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	legacy := func(s optimizer.Service) *clientnetworking.EnvoyFilter {
		var patches []*networking.EnvoyFilter_EnvoyConfigObjectPatch
		for _, port := range servicePorts(s) {
			patches = append(patches, clusterPatch(s.IstioClusterName(port, testConfig.ClusterDomain)))
		}
		f := newFilter(testConfig, "edgeflow-eds."+s.Name+"."+s.NamespaceOrDefault(), "", patches)
		f.Annotations = nil
		return f
	}
	services := bookinfo()
	old := []*clientnetworking.EnvoyFilter{legacy(services[0]), legacy(services[1])}
	forged := legacy(optimizer.Service{Name: "forged", Namespace: "shop", Ports: []optimizer.Port{{Port: 80}}})
	forged.Spec.WorkloadSelector = nil // every sidecar of the mesh
	e, r := newTestEnv(t, nil, old[0], old[1], forged)
	if err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"create configmaps default/edgeflow-bootstrap", "create configmaps shop/edgeflow-bootstrap",
		"create envoyfilters istio-system/edgeflow-eds.default", "create envoyfilters istio-system/edgeflow-eds.shop",
		"delete envoyfilters istio-system/" + old[1].Name, "delete envoyfilters istio-system/" + old[0].Name,
	}
	slices.Sort(want[4:])
	if diff := cmp.Diff(want, e.writes()); diff != "" {
		t.Errorf("upgrade pass (-want +got):\n%s", diff)
	}
	if err := r.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	if got := listOwned(e.istio); !slices.Equal(got, []string{forged.Name}) {
		t.Errorf("labelled filters after Uninstall %v, want only %s", got, forged.Name)
	}
}

// TestRefusedFilterAndConfigMapCounted: an EnvoyFilter or bootstrap ConfigMap write the API
// server refuses (an admission policy's 403, a validation's 422) is counted in
// edgeflow_istio_refused_writes_total{kind} and logged naming it, and the pass writes the
// others and succeeds, as for DestinationRules. Before, the refusal failed the whole pass
// (retried every RetryInterval).
func TestRefusedFilterAndConfigMapCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, _ := newTestEnv(t, nil)
	e.istio.PrependReactor("create", "envoyfilters", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if f := a.(k8stesting.CreateAction).GetObject().(*clientnetworking.EnvoyFilter); f.Name == "edgeflow-eds.shop" {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "networking.istio.io", Resource: "envoyfilters"}, f.Name,
				errors.New("ValidatingAdmissionPolicy 'quota' denied request"))
		}
		return false, nil, nil
	})
	e.kube.PrependReactor("create", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() == "default" {
			return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, BootstrapConfigMapName, nil)
		}
		return false, nil, nil
	})
	reg := prometheus.NewRegistry()
	var logs testkit.LogBuffer
	r, err := NewReconciler(ReconcilerConfig{Filters: testConfig, Client: e.istio, Kube: e.kube, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Reconcile(ctx, bookinfo()); err != nil {
		t.Fatalf("a refused write failed the pass: %v", err)
	}
	for kind, want := range map[string]float64{kindEnvoyFilter: 1, kindConfigMap: 1, kindDestinationRule: 0} {
		if got := testutil.ToFloat64(r.refused.WithLabelValues(kind)); got != want {
			t.Errorf("edgeflow_istio_refused_writes_total{kind=%s} = %v, want %v", kind, got, want)
		}
	}
	for _, want := range []string{"msg=\"EnvoyFilter refused by the API server; the other objects are written\" component=istio-envoyfilters namespace=istio-system name=edgeflow-eds.shop",
		"msg=\"ConfigMap refused by the API server; the other objects are written\" component=istio-envoyfilters namespace=default name=edgeflow-bootstrap"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no log line %q:\n%s", want, logs.String())
		}
	}
	if _, ok := inCluster(t, e.istio, DefaultNamespace)["edgeflow-eds.default"]; !ok {
		t.Error("the other namespace's filter was not written")
	}
	if _, ok := configMaps(t, e.kube)["shop/"+BootstrapConfigMapName]; !ok {
		t.Error("the other namespace's ConfigMap was not written")
	}
}
