package istio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	clientnetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	efistio "github.com/edgeflow/edgeflow/xds/istio"
)

// installIstioCRDs creates Istio's CustomResourceDefinitions (the base chart's crd-all.gen.yaml
// of the istio.io/istio module this test builds against) and waits until DestinationRules can
// be listed.
func installIstioCRDs(t *testing.T, c *kubeapi.Cluster) versioned.Interface {
	t.Helper()
	ctx := kubeapi.Context(t)
	crds := filepath.Join(istioModuleDir(t), "manifests", "charts", "base", "files", "crd-all.gen.yaml")
	raw, err := os.ReadFile(crds)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	n := 0
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if _, err := dyn.Resource(gvr).Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("CRD %s: %v", obj.GetName(), err)
		}
		n++
	}
	ic, err := versioned.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	testkit.EventuallyNoError(t, 30*time.Second, fmt.Sprintf("DestinationRules served after creating %d CRDs", n), func() error {
		_, err := ic.NetworkingV1().DestinationRules(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		return err
	})
	t.Logf("installed %d Istio CRDs from %s", n, crds)
	return ic
}

// istioModuleDir is the istio.io/istio module's folder (in the module cache).
func istioModuleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio").Output()
	if err != nil {
		t.Fatalf("go list -m istio.io/istio: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestReconcilersOnARealAPIServer: edgeflow's Istio reconcilers on one real kube-apiserver with
// Istio's CRDs. The subtests run side by side, each in namespaces of its own, and remove what
// they wrote when they end; the two that own every DestinationRule edgeflow manages (Uninstall
// and the listings see them all) take turns.
func TestReconcilersOnARealAPIServer(t *testing.T) {
	t.Parallel()
	c := kubeapi.Start(t, kubeapi.Options{})
	ic := installIstioCRDs(t, c)
	var rules sync.Mutex
	inTurn := func(t *testing.T) {
		rules.Lock()
		t.Cleanup(rules.Unlock) // after the subtest's own cleanups
	}
	t.Run("RulesReconciler", func(t *testing.T) {
		t.Parallel()
		inTurn(t)
		rulesReconcilerOnARealAPIServer(t, c, ic)
	})
	t.Run("RulesReconcilerLabelsNodes", func(t *testing.T) {
		t.Parallel()
		inTurn(t)
		rulesReconcilerLabelsNodes(t, c, ic)
	})
	t.Run("EnvoyFilterReconciler", func(t *testing.T) {
		t.Parallel()
		envoyFilterReconcilerOnARealAPIServer(t, c, ic)
	})
}

func rulesReconcilerOnARealAPIServer(t *testing.T, c *kubeapi.Cluster, ic versioned.Interface) {
	ctx := kubeapi.Context(t)

	// The user's own rules: one on reviews (carried into edgeflow's), one on something else.
	mustCreateNamespace(t, c, "other")
	userReviews := userReviewsRule()
	userReviews.CreationTimestamp = metav1.Time{}
	userReviews, err := ic.NetworkingV1().DestinationRules("default").Create(ctx, userReviews, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteRule(t, ic, "default", "reviews") })
	userOther := &clientnetworkingv1.DestinationRule{ObjectMeta: metav1.ObjectMeta{Name: "payments", Namespace: "other"}}
	userOther.Spec.Host = "payments.other.svc.cluster.local"
	if userOther, err = ic.NetworkingV1().DestinationRules("other").Create(ctx, userOther, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteRule(t, ic, "other", "payments") })
	userVersions := func() []string {
		var out []string
		for _, ref := range [][2]string{{"default", "reviews"}, {"other", "payments"}} {
			dr, err := ic.NetworkingV1().DestinationRules(ref[0]).Get(ctx, ref[1], metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, dr.ResourceVersion)
		}
		return out
	}
	before := userVersions()

	r, err := efistio.NewRulesReconciler(efistio.RulesReconcilerConfig{Client: ic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uninstall(t, r) })
	ours := func() map[string]*clientnetworkingv1.DestinationRule {
		list, err := ic.NetworkingV1().DestinationRules(metav1.NamespaceAll).List(ctx,
			metav1.ListOptions{LabelSelector: efistio.ManagedByLabel + "=" + efistio.ManagedByValue})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*clientnetworkingv1.DestinationRule{}
		for _, dr := range list.Items {
			out[dr.Namespace+"/"+dr.Name] = dr
		}
		return out
	}
	plan := func(topo *optimizer.Topology) *efistio.LocalityPlan {
		p, err := efistio.PlanLocalities(topo, optimizer.LATA, optimizer.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	managed := managedOnly(bookinfo(t, true))

	// Create.
	p := plan(managed)
	want, _ := efistio.DestinationRules(efistio.RulesConfig{}, p, []*clientnetworkingv1.DestinationRule{userReviews, userOther})
	if err := r.Reconcile(ctx, p); err != nil {
		t.Fatal(err)
	}
	got := ours()
	if len(got) != len(want) || len(want) != 2 {
		t.Fatalf("%d rules in the cluster, want %d", len(got), len(want))
	}
	for _, w := range want {
		g := got[w.Namespace+"/"+w.Name]
		if g == nil || !proto.Equal(&g.Spec, &w.Spec) {
			t.Fatalf("rule %s/%s in the cluster: %v, want %v", w.Namespace, w.Name, g, w.Spec.String())
		}
	}
	if g := got["default/edgeflow.productpage.reviews.default"]; g.Annotations[efistio.BasedOnAnnotation] != "default/reviews" ||
		g.Spec.GetTrafficPolicy().GetTls() == nil || len(g.Spec.GetSubsets()) != 1 {
		t.Errorf("productpage → reviews does not carry the user's rule: %v", g.Spec.String())
	}
	versions := map[string]string{}
	for k, dr := range got {
		versions[k] = dr.ResourceVersion
	}

	// Update only on change.
	if err := r.Reconcile(ctx, p); err != nil {
		t.Fatal(err)
	}
	for k, dr := range ours() {
		if dr.ResourceVersion != versions[k] {
			t.Errorf("%s written again for an unchanged plan (resourceVersion %s → %s)", k, versions[k], dr.ResourceVersion)
		}
	}

	// A latency change rewrites the rules it moves.
	slow := managed.Clone()
	for i, l := range slow.Latency {
		if l.From == "n1" && l.To == "n3" || l.From == "n2" && l.To == "n3" {
			slow.Latency[i].MS = 60
		}
	}
	if err := r.Reconcile(ctx, plan(slow)); err != nil {
		t.Fatal(err)
	}
	if dr := ours()["default/edgeflow.productpage.reviews.default"]; dr.ResourceVersion == versions["default/edgeflow.productpage.reviews.default"] {
		t.Error("productpage → reviews not rewritten after the latency change")
	}

	// The user changes their rule: edgeflow's follows, and the user's is never written.
	userReviews, err = ic.NetworkingV1().DestinationRules("default").Get(ctx, "reviews", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	userReviews.Spec.TrafficPolicy.OutlierDetection.Consecutive_5XxErrors = wrapperspb.UInt32(9)
	if userReviews, err = ic.NetworkingV1().DestinationRules("default").Update(ctx, userReviews, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	before[0] = userReviews.ResourceVersion
	if err := r.Reconcile(ctx, plan(slow)); err != nil {
		t.Fatal(err)
	}
	if od := ours()["default/edgeflow.productpage.reviews.default"].Spec.GetTrafficPolicy().GetOutlierDetection(); od.GetConsecutive_5XxErrors().GetValue() != 9 {
		t.Errorf("edgeflow's rule did not follow the user's outlier detection: %v", od)
	}

	// An edge that goes takes its rule with it.
	noRatings := slow.Clone()
	noRatings.Calls = slices.DeleteFunc(noRatings.Calls, func(c optimizer.Call) bool { return c.To == "ratings" })
	if err := r.Reconcile(ctx, plan(noRatings)); err != nil {
		t.Fatal(err)
	}
	if _, ok := ours()["default/edgeflow.reviews.ratings.default"]; ok {
		t.Error("reviews → ratings' rule stayed after the edge went")
	}

	// Uninstall, twice.
	for i := 0; i < 2; i++ {
		if err := r.Uninstall(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(ours()); n != 0 {
		t.Errorf("%d of edgeflow's rules left after Uninstall", n)
	}
	if after := userVersions(); !slices.Equal(before, after) {
		t.Errorf("the user's rules were written by edgeflow: resourceVersions %v → %v", before, after)
	}
}

func rulesReconcilerLabelsNodes(t *testing.T, c *kubeapi.Cluster, ic versioned.Interface) {
	ctx := kubeapi.Context(t)

	// Nodes with regions and zones but no subzones; one without a zone.
	topo := managedOnly(bookinfo(t, false))
	for _, n := range topo.Nodes {
		r, z, _ := optimizer.SplitLocality(n.Locality)
		labels := map[string]string{corev1.LabelTopologyRegion: r, corev1.LabelTopologyZone: z}
		createNode(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels}})
	}
	createNode(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}})
	topo.Nodes = append(topo.Nodes, optimizer.Node{Name: "bare"})
	zero := 0.0
	r, err := efistio.NewRulesReconciler(efistio.RulesReconcilerConfig{Client: ic, Nodes: c.Client,
		Options: optimizer.Options{DefaultLatencyMS: &zero}, Resync: time.Hour, RetryInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uninstall(t, r) }) // once Run has ended: the rules it wrote
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	r.Update(topo)
	// Until labelled, the plan is per zone; the labels are what a watcher would then report.
	deadline := time.Now().Add(30 * time.Second)
	for {
		labelled := 0
		for _, n := range topo.Nodes[:len(topo.Nodes)-1] {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if node.Labels[efistio.SubzoneLabel] == n.Name {
				labelled++
			}
		}
		if labelled == len(topo.Nodes)-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d nodes labelled with their subzone", labelled, len(topo.Nodes)-1)
		}
		time.Sleep(100 * time.Millisecond)
	}
	bare, err := c.Client.CoreV1().Nodes().Get(ctx, "bare", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := bare.Labels[efistio.SubzoneLabel]; ok {
		t.Error("a node without region and zone was given a subzone (Istio would refuse the locality)")
	}
	// With the labels, a watcher reports per-node localities and the rules plan per node.
	topo = topo.Clone() // an updated topology is a new one: the last stays the reconciler's
	for i := range topo.Nodes[:len(topo.Nodes)-1] {
		topo.Nodes[i].Locality += "/" + topo.Nodes[i].Name
	}
	r.Update(topo)
	deadline = time.Now().Add(30 * time.Second)
	for {
		if rep := r.Report(); rep != nil && rep.Granularity == "node" && strings.Contains(r.Granularity(), "1 unlocated") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rules never planned per node: %s", r.Granularity())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func mustCreateNamespace(t *testing.T, c *kubeapi.Cluster, name string) {
	t.Helper()
	if _, err := c.Client.CoreV1().Namespaces().Create(kubeapi.Context(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createNode creates node and deletes it when t ends.
func createNode(t *testing.T, c *kubeapi.Cluster, node *corev1.Node) {
	t.Helper()
	if _, err := c.Client.CoreV1().Nodes().Create(kubeapi.Context(t), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting node %s: %v", node.Name, err)
		}
	})
}

// deleteRule deletes the DestinationRule ns/name.
func deleteRule(t *testing.T, ic versioned.Interface, ns, name string) {
	if err := ic.NetworkingV1().DestinationRules(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting DestinationRule %s/%s: %v", ns, name, err)
	}
}

// uninstall removes what a reconciler wrote, also when the test failed before its own Uninstall.
func uninstall(t *testing.T, r interface{ Uninstall(context.Context) error }) {
	if err := r.Uninstall(context.Background()); err != nil {
		t.Errorf("Uninstall when the test ends: %v", err)
	}
}

// The per-pod mode's reconciler on the same real apiserver: EnvoyFilters in the root namespace
// and the bootstrap ConfigMap in each managed service's namespace are created, rewritten only
// on change, and removed by Uninstall (twice); a user's ConfigMap of the same name is never
// written.
func envoyFilterReconcilerOnARealAPIServer(t *testing.T, c *kubeapi.Cluster, ic versioned.Interface) {
	ctx := kubeapi.Context(t)
	mustCreateNamespace(t, c, efistio.DefaultNamespace)
	mustCreateNamespace(t, c, "shop")
	// The user's own ConfigMap named like edgeflow's, in shop.
	mine := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: efistio.BootstrapConfigMapName, Namespace: "shop"}, Data: map[string]string{"k": "v"}}
	mine, err := c.Client.CoreV1().ConfigMaps("shop").Create(ctx, mine, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := efistio.NewReconciler(efistio.ReconcilerConfig{
		Filters: efistio.Config{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000"}, Client: ic, Kube: c.Client})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uninstall(t, r) })
	services := []optimizer.Service{
		{Name: "reviews", Ports: []optimizer.Port{{Port: 9080}}},
		{Name: "cart", Namespace: "shop", Ports: []optimizer.Port{{Port: 80}}},
	}
	owned := func() (filters, cms map[string]string) {
		sel := metav1.ListOptions{LabelSelector: efistio.ManagedByLabel + "=" + efistio.ManagedByValue}
		fl, err := ic.NetworkingV1alpha3().EnvoyFilters(efistio.DefaultNamespace).List(ctx, sel)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := c.Client.CoreV1().ConfigMaps(metav1.NamespaceAll).List(ctx, sel)
		if err != nil {
			t.Fatal(err)
		}
		filters, cms = map[string]string{}, map[string]string{}
		for _, f := range fl.Items {
			filters[f.Name] = f.ResourceVersion
		}
		for _, cm := range cl.Items {
			cms[cm.Namespace+"/"+cm.Name] = cm.ResourceVersion
		}
		return filters, cms
	}
	err = r.Reconcile(ctx, services)
	filters, cms := owned()
	if len(filters) != 2 || len(cms) != 1 || cms["default/"+efistio.BootstrapConfigMapName] == "" {
		t.Fatalf("after the first pass: filters %v, ConfigMaps %v", filters, cms)
	}
	if err == nil || !strings.Contains(err.Error(), "shop") {
		t.Errorf("the user's ConfigMap in shop was not reported: %v", err)
	}
	_ = r.Reconcile(ctx, services)
	f2, c2 := owned()
	for k, v := range filters {
		if f2[k] != v {
			t.Errorf("filter %s rewritten for an unchanged set (%s → %s)", k, v, f2[k])
		}
	}
	for k, v := range cms {
		if c2[k] != v {
			t.Errorf("ConfigMap %s rewritten for an unchanged set", k)
		}
	}
	for i := 0; i < 2; i++ {
		if err := r.Uninstall(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if f, cm := owned(); len(f)+len(cm) != 0 {
		t.Errorf("left after Uninstall: filters %v, ConfigMaps %v", f, cm)
	}
	got, err := c.Client.CoreV1().ConfigMaps("shop").Get(ctx, efistio.BootstrapConfigMapName, metav1.GetOptions{})
	if err != nil || got.ResourceVersion != mine.ResourceVersion {
		t.Errorf("the user's ConfigMap was written or removed: %v, %v", got, err)
	}
}

// Uninstall on a cluster without Istio's CRDs has nothing to remove and says no error (its own
// control plane: TestReconcilersOnARealAPIServer's has the CRDs).
func TestUninstallWithoutIstio(t *testing.T) {
	t.Parallel()
	c := kubeapi.Start(t, kubeapi.Options{})
	ctx := kubeapi.Context(t)
	ic, err := versioned.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := efistio.NewRulesReconciler(efistio.RulesReconcilerConfig{Client: ic})
	if err != nil {
		t.Fatal(err)
	}
	filters, err := efistio.NewReconciler(efistio.ReconcilerConfig{Filters: efistio.Config{XDSAddress: "uninstall.invalid:1"}, Client: ic, Kube: c.Client})
	if err != nil {
		t.Fatal(err)
	}
	if err := rules.Uninstall(ctx); err != nil {
		t.Errorf("DestinationRules: %v", err)
	}
	if err := filters.Uninstall(ctx); err != nil {
		t.Errorf("EnvoyFilters and ConfigMaps: %v", err)
	}
}
