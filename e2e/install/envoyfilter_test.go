package install

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
)

var efGVR = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1alpha3", Resource: "envoyfilters"}

// In the per-pod Istio mode, with exactly the chart's permissions (the table's: a Role for
// EnvoyFilters in istio-system, the ConfigMaps named edgeflow-bootstrap cluster-wide, reads and
// the ConfigMap create in the watched namespace), edgeflow writes one EnvoyFilter for the
// namespace of the two managed services (edgeflow-eds.shop) and the bootstrap ConfigMap, with no forbidden request; the admission policy refuses
// it another ConfigMap RBAC would let it create; helm uninstall plus edgeflow uninstall then
// leave nothing.
func TestEnvoyFilterModeWithTheChartsPermissions(t *testing.T) {
	t.Parallel()
	c, cl := startAPIServer(t, kubeapi.Options{AuditLog: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	cs := c.Client
	cl.installCRDs(ctx, t, istioCRDs(t))
	createNamespaces(ctx, t, cs, namespace, "istio-system")
	k := kubeapi.NewKubelet(t, ctx, cs, appNS, appPort)
	k.Namespace()
	k.Node("n1")
	k.Node("n2")
	k.Service("frontend", true)
	k.Service("backend", true)
	k.Pod("frontend", "frontend-0", "n1", "198.18.2.10", true)
	k.Pod("backend", "backend-0", "n1", "198.18.2.20", true)
	k.Pod("backend", "backend-1", "n2", "198.18.2.21", true)
	before := cl.snapshot(ctx, t)

	values := map[string]any{
		"replicaCount":     1,
		"watch":            map[string]any{"namespaces": []any{appNS}},
		"prometheus":       map[string]any{"url": ""},
		"callGraph":        map[string]any{"calls": []any{map[string]any{"from": "frontend.shop", "to": "backend.shop"}}, "ingress": []any{map[string]any{"service": "frontend.shop", "rps": 100}}},
		"defaultLatencyMs": 10,
		"xds":              map[string]any{"tls": map[string]any{"enabled": false}},
		"istio":            map[string]any{"mode": "envoyfilter"},
		"rebalancer":       map[string]any{"mode": "off"},
	}
	objs := withoutHooks(render(t, values)) // helm install creates the hooks only when their event comes
	if diff := cmp.Diff(expected(features{ef: true, namespaced: true}), granted(t, objs)); diff != "" {
		t.Errorf("the chart's grants differ from the table's (-table +chart):\n%s", diff)
	}
	if err := cl.create(ctx, objs); err != nil {
		t.Fatalf("the API server refused the chart: %v", err)
	}
	a := &apps{t: t, ctx: ctx, cs: cs, watched: []string{appNS}}
	r := a.launch(objs, c.Config.Host, nil)

	var filters []string
	testkit.Eventually(t, 60*time.Second, "one EnvoyFilter for the managed services' namespace and the bootstrap ConfigMap", func() bool {
		list, err := cl.dyn.Resource(efGVR).Namespace("istio-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=edgeflow"})
		if err != nil {
			t.Fatal(err)
		}
		filters = filters[:0]
		for _, o := range list.Items {
			filters = append(filters, o.GetName())
		}
		_, err = cs.CoreV1().ConfigMaps(appNS).Get(ctx, "edgeflow-bootstrap", metav1.GetOptions{})
		return slices.Equal(filters, []string{"edgeflow-eds." + appNS}) && err == nil
	})
	t.Logf("EnvoyFilters in istio-system: %v; ConfigMap %s/edgeflow-bootstrap", filters, appNS)
	r.stop()
	grants := a.checkRequests(r, objs, c.AuditLog)
	a.accessReviews(grants)
	// RBAC lets edgeflow create ConfigMaps in the watched namespace (a create has no name to
	// limit it by); the admission policy lets it create edgeflow-bootstrap only.
	as, _ := asEdgeflow(t, c.Config)
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "not-edgeflows", Namespace: appNS}}
	var refused error
	if !testkit.WaitUntil(30*time.Second, func() bool { // dry runs: nothing is created meanwhile
		_, refused = as.CoreV1().ConfigMaps(appNS).Create(ctx, other, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return refusedByPolicy(refused)
	}) {
		t.Errorf("edgeflow creating a ConfigMap not its own: %v; want refused by the admission policy", refused)
	} else {
		t.Logf("edgeflow creating ConfigMap %s/not-edgeflows: refused: %s", appNS, policyMessage(refused))
	}

	if err := cl.remove(ctx, objs); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(r.bin, "uninstall", "--kubeconfig", c.Kubeconfig, "--istio-namespace", "istio-system").CombinedOutput()
	if err != nil {
		t.Fatalf("edgeflow uninstall: %v\n%s", err, out)
	}
	t.Logf("edgeflow uninstall: %s", strings.TrimSpace(string(out)))
	cl.waitNoLeftovers(ctx, t, before, 30*time.Second, nil)
}
