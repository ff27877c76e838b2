package install

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	networkingv1 "istio.io/api/networking/v1"
	typev1beta1 "istio.io/api/type/v1beta1"
	clientnetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"istio.io/client-go/pkg/clientset/versioned"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/xds/istio"
	"github.com/google/go-cmp/cmp"
)

// hookAnnotation marks a Helm hook; helm install and upgrade do not create these objects with
// the release, but when the hook's event comes.
const hookAnnotation = "helm.sh/hook"

// isHook says whether o is a Helm hook object.
func isHook(o *unstructured.Unstructured) bool { return o.GetAnnotations()[hookAnnotation] != "" }

// withoutHooks is objs less the Helm hooks: what helm install creates.
func withoutHooks(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	_, release := hookObjects(objs, "")
	return release
}

// hookObjects returns the rendered objects of the hook event (pre-delete, post-upgrade, …),
// and release the rest: what helm install creates.
func hookObjects(objs []*unstructured.Unstructured, event string) (hook, release []*unstructured.Unstructured) {
	for _, o := range objs {
		switch ann := o.GetAnnotations()[hookAnnotation]; {
		case ann == "":
			release = append(release, o)
		case event != "" && slices.Contains(strings.Split(ann, ","), event):
			hook = append(hook, o)
		}
	}
	return hook, release
}

// Off means off, on a real kube-apiserver (and kube-controller-manager, whose Deployment,
// ReplicaSet and garbage collectors run): the chart is installed object by object, edgeflow's
// objects are written as serve writes them (the placement webhook registration the chart
// renders, a gated pod, the rebalancer's state, EnvoyFilters and edgeflow-bootstrap ConfigMaps
// by the product's own reconciler, a DestinationRule), then the hook's Job runs as the Job's
// pod would — its rendered arguments, a token of the hook's own ServiceAccount — and nothing of
// edgeflow's is left. The hook's account made no request the API server refused, and used
// every rule it was granted (the rules are exactly what uninstall does).
func TestTurnItOff(t *testing.T) {
	t.Parallel()
	c, cl := startAPIServer(t, kubeapi.Options{ControllerManager: true, AuditLog: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	cl.installCRDs(ctx, t, istioCRDs(t))
	createNamespaces(ctx, t, c.Client, namespace, "istio-system", appNS)
	ic, err := versioned.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	w := &offWorld{t: t, ctx: ctx, c: c, cl: cl, ic: ic, bin: testkit.Binary(t)}
	testkit.Eventually(t, 30*time.Second, "the default ServiceAccounts of the new namespaces", func() bool {
		_, err := c.Client.CoreV1().ServiceAccounts(appNS).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	t.Run("helm uninstall runs the pre-delete hook", w.helmUninstall)
	t.Run("helm upgrade to istio.mode=off runs the post-upgrade hook", w.upgradeToOff)
}

type offWorld struct {
	t   *testing.T
	ctx context.Context
	c   *kubeapi.Cluster
	cl  *client
	ic  versioned.Interface
	bin string
}

// the managed services edgeflow writes Istio's objects for
var offServices = []optimizer.Service{
	{Name: "frontend", Namespace: appNS, Ports: []optimizer.Port{{Port: appPort}}},
	{Name: "backend", Namespace: appNS, Ports: []optimizer.Port{{Port: appPort}}},
}

// writeAsServe writes what edgeflow serve writes in the modes given: the rebalancer's state
// and a gated replacement (act), EnvoyFilters and bootstrap ConfigMaps (envoyfilter, by the
// product's reconciler), a DestinationRule (destinationrule). It returns the gated pod's name.
func (w *offWorld) writeAsServe(t *testing.T, act, envoyFilter, destinationRule bool) string {
	ctx, cs := w.ctx, w.c.Client
	var gated string
	if act {
		// into the chart's state ConfigMap (the rebalancer creates one only where it is missing)
		state, err := cs.CoreV1().ConfigMaps(namespace).Get(ctx, "edgeflow-rebalancer-state", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			state = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "edgeflow-rebalancer-state", Namespace: namespace,
				Labels: map[string]string{rebalancer.ManagedByLabel: rebalancer.ManagedByValue, rebalancer.ComponentLabel: rebalancer.ComponentValue}},
				Data: map[string]string{"state.json": "{}"}}
			_, err = cs.CoreV1().ConfigMaps(namespace).Create(ctx, state, metav1.CreateOptions{})
		case err == nil:
			state.Data = map[string]string{"state.json": "{}"}
			_, err = cs.CoreV1().ConfigMaps(namespace).Update(ctx, state, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "backend-", Namespace: appNS, Labels: map[string]string{"app": "backend"}},
			Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: rebalancer.GateName}},
				Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
		p, err := cs.CoreV1().Pods(appNS).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		gated = p.Name
		t.Cleanup(func() { _ = cs.CoreV1().Pods(appNS).Delete(context.Background(), gated, metav1.DeleteOptions{}) })
	}
	if envoyFilter {
		r, err := istio.NewReconciler(istio.ReconcilerConfig{Filters: istio.Config{XDSAddress: "edgeflow.edgeflow.svc.cluster.local:18000"}, Client: w.ic, Kube: cs})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Reconcile(ctx, offServices); err != nil {
			t.Fatal(err)
		}
	}
	if destinationRule {
		dr := &clientnetworkingv1.DestinationRule{ObjectMeta: metav1.ObjectMeta{Name: istio.RuleName(&offServices[0], &offServices[1]), Namespace: appNS,
			Labels: map[string]string{istio.ManagedByLabel: istio.ManagedByValue}},
			Spec: networkingv1.DestinationRule{Host: "backend." + appNS + ".svc.cluster.local",
				WorkloadSelector: &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "frontend"}}}}
		if _, err := w.ic.NetworkingV1().DestinationRules(appNS).Create(ctx, dr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return gated
}

// tenantsConfigMaps are a tenant's ConfigMaps in the application's namespace, labelled as the
// rebalancer labels its state (one under the state's own name): not edgeflow's, whatever
// their labels, and never deleted by uninstall.
var tenantsConfigMaps = []string{"tenant-settings", "edgeflow-rebalancer-state"}

// tenantConfigMaps creates tenantsConfigMaps.
func (w *offWorld) tenantConfigMaps(t *testing.T) {
	for _, name := range tenantsConfigMaps {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appNS,
			Labels: map[string]string{rebalancer.ManagedByLabel: rebalancer.ManagedByValue, rebalancer.ComponentLabel: rebalancer.ComponentValue}},
			Data: map[string]string{"state.json": "{}"}}
		if _, err := w.c.Client.CoreV1().ConfigMaps(appNS).Create(w.ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = w.c.Client.CoreV1().ConfigMaps(appNS).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
}

// edgeflowsObjects lists what of edgeflow's is in the cluster: its labelled objects of every
// kind it writes (the tenant's ConfigMaps aside), the webhook registration, and pods carrying
// its gate.
func (w *offWorld) edgeflowsObjects(t *testing.T) []string {
	ctx, cs := w.ctx, w.c.Client
	sel := metav1.ListOptions{LabelSelector: istio.ManagedByLabel + "=" + istio.ManagedByValue}
	var out []string
	cms, err := cs.CoreV1().ConfigMaps("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range cms.Items {
		if o.Namespace == appNS && slices.Contains(tenantsConfigMaps, o.Name) {
			continue
		}
		out = append(out, "ConfigMap "+o.Namespace+"/"+o.Name)
	}
	efs, err := w.ic.NetworkingV1alpha3().EnvoyFilters("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range efs.Items {
		out = append(out, "EnvoyFilter "+o.Namespace+"/"+o.Name)
	}
	drs, err := w.ic.NetworkingV1().DestinationRules("").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range drs.Items {
		out = append(out, "DestinationRule "+o.Namespace+"/"+o.Name)
	}
	whs, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range whs.Items {
		out = append(out, "MutatingWebhookConfiguration "+o.Name)
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == rebalancer.GateName }) {
			out = append(out, "gated Pod "+p.Namespace+"/"+p.Name)
		}
	}
	slices.Sort(out)
	return out
}

// runHook runs the hook's Job as its pod would (runHookJob).
func (w *offWorld) runHook(t *testing.T, hook []*unstructured.Unstructured, extra ...string) string {
	t.Helper()
	return runHookJob(t, w.ctx, w.c, w.bin, hook, extra...)
}

// runHookJob runs the hook's Job as its pod would — the binary bin with the rendered arguments
// (and extra), a token of the Job's ServiceAccount, no other configuration — and returns its
// output; a failure fails the test.
func runHookJob(t *testing.T, ctx context.Context, c *kubeapi.Cluster, bin string, hook []*unstructured.Unstructured, extra ...string) string {
	t.Helper()
	var job batchv1.Job
	for _, o := range hook {
		if o.GetKind() == "Job" {
			convert(t, o, &job)
		}
	}
	if job.Name == "" {
		t.Fatal("the hook renders no Job")
	}
	spec := job.Spec.Template.Spec
	kubeconfig := saKubeconfig(t, ctx, c.Client, spec.ServiceAccountName, c.Config.Host)
	args := append(slices.Clone(spec.Containers[0].Args), extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cleanEnv(), "KUBECONFIG="+kubeconfig)
	out, err := cmd.CombinedOutput()
	t.Logf("edgeflow %s (as %s):\n%s", strings.Join(args, " "), spec.ServiceAccountName, out)
	if err != nil {
		t.Fatalf("the hook's edgeflow %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// cleanEnv is this process's environment without what would point a client at a cluster.
func cleanEnv() []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBERNETES_SERVICE_") && !strings.HasPrefix(e, "KUBECONFIG=") {
			env = append(env, e)
		}
	}
	return env
}

// checkHookRBAC fails unless the hook account's requests (the audit log) were all allowed and
// used exactly the rules its Roles grant.
func (w *offWorld) checkHookRBAC(t *testing.T, hook []*unstructured.Unstructured) {
	t.Helper()
	set := map[string]bool{}
	var sa string
	for _, o := range hook {
		switch o.GetKind() {
		case "ClusterRole", "Role":
			var r rbacv1.ClusterRole
			convert(t, o, &r)
			for _, g := range flatten(r.Rules) {
				set[g] = true
			}
		case "ServiceAccount":
			sa = o.GetName()
		}
	}
	grants := sortedSet(set)
	var used map[string]bool
	// the audit log is written asynchronously
	testkit.WaitUntil(10*time.Second, func() bool {
		used = auditedRequestsOf(t, w.c.AuditLog, "system:serviceaccount:"+namespace+":"+sa)
		return len(used) >= len(grants)
	})
	for g := range used {
		if !slices.Contains(grants, g) && !strings.HasPrefix(g, "nonResource") {
			t.Errorf("the hook made a request its Roles do not grant: %s", g)
		}
	}
	for _, g := range grants {
		if !used[g] {
			t.Errorf("the hook's Roles grant %s, which uninstall did not use", g)
		}
	}
	t.Logf("the hook's grants, each used: %v", grants)
}

func (w *offWorld) helmUninstall(t *testing.T) {
	ctx, cl, cs := w.ctx, w.cl, w.c.Client
	caPEM, _ := testkit.SelfSigned(t, "webhook-ca")
	values := map[string]any{
		"istio":      map[string]any{"mode": "destinationrule"},
		"rebalancer": map[string]any{"mode": "act"},
		"webhook":    map[string]any{"certificate": "secret", "caBundle": base64.StdEncoding.EncodeToString(caPEM)},
	}
	objs := render(t, values)
	hook, installed := hookObjects(objs, "pre-delete")
	before := cl.snapshot(ctx, t)
	if err := cl.create(ctx, installed); err != nil {
		t.Fatalf("the API server refused the chart: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() { // what helm would have removed, so that the next subtest starts clean
			_ = cl.remove(context.Background(), hook)
			_ = cl.remove(context.Background(), installed)
		}
	})
	testkit.Eventually(t, 60*time.Second, "edgeflow's Deployment has its pods", func() bool {
		pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=edgeflow"})
		return err == nil && len(pods.Items) == 2
	})
	// edgeflow ran in the envoyfilter mode before this one, and in this one.
	gated := w.writeAsServe(t, true, true, true)
	w.tenantConfigMaps(t)
	written := w.edgeflowsObjects(t)
	t.Logf("edgeflow's objects: %v", written)
	if len(written) != 6 {
		t.Fatalf("want 6 of edgeflow's objects (webhook, gated pod, state, the app namespace's EnvoyFilter, bootstrap ConfigMap, DestinationRule), got %v", written)
	}

	// helm uninstall: the pre-delete hook's objects, then its Job.
	if err := cl.create(ctx, hook); err != nil {
		t.Fatalf("the API server refused the pre-delete hook: %v", err)
	}
	// --dry-run first: it lists each object and removes nothing.
	dry := w.runHook(t, hook, "--dry-run")
	for _, o := range written {
		name := o[strings.LastIndex(o, " ")+1:]
		if !strings.Contains(dry, name) {
			t.Errorf("uninstall --dry-run does not list %s", o)
		}
	}
	if got := w.edgeflowsObjects(t); !slices.Equal(got, written) {
		t.Errorf("uninstall --dry-run changed edgeflow's objects: %v, was %v", got, written)
	}
	for _, name := range tenantsConfigMaps {
		if strings.Contains(dry, appNS+"/"+name) {
			t.Errorf("uninstall --dry-run lists the tenant's ConfigMap %s/%s", appNS, name)
		}
	}
	if s, err := cs.AppsV1().Deployments(namespace).GetScale(ctx, release, metav1.GetOptions{}); err != nil || s.Spec.Replicas != 2 {
		t.Errorf("uninstall --dry-run scaled edgeflow: %v %v", s, err)
	}
	out := w.runHook(t, hook)
	if !strings.Contains(out, "scaled to 0, its pods gone") {
		t.Errorf("the hook did not stop edgeflow first")
	}
	if left := w.edgeflowsObjects(t); len(left) > 0 {
		t.Errorf("left of edgeflow's after the pre-delete hook: %v", left)
	}
	for _, name := range tenantsConfigMaps {
		if _, err := cs.CoreV1().ConfigMaps(appNS).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("the tenant's ConfigMap %s/%s, labelled as the rebalancer's state, after edgeflow uninstall: %v", appNS, name, err)
		}
	}
	for _, name := range tenantsConfigMaps { // the tenant's to remove
		if err := cs.CoreV1().ConfigMaps(appNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := cs.CoreV1().Pods(appNS).Get(ctx, gated, metav1.GetOptions{})
	if err != nil || len(p.Spec.SchedulingGates) != 0 {
		t.Errorf("pod %s: %v, gates %v", gated, err, p.Spec.SchedulingGates)
	}
	w.checkHookRBAC(t, hook)

	// hook-delete-policy hook-succeeded, then helm deletes the release's objects.
	for _, o := range hook {
		if o.GetAnnotations()["helm.sh/hook-delete-policy"] != "before-hook-creation,hook-succeeded" {
			t.Errorf("%s %s: hook-delete-policy %q", o.GetKind(), o.GetName(), o.GetAnnotations()["helm.sh/hook-delete-policy"])
		}
	}
	if err := cl.remove(ctx, hook); err != nil {
		t.Fatal(err)
	}
	if err := cl.remove(ctx, installed); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Pods(appNS).Delete(ctx, gated, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cl.waitNoLeftovers(ctx, t, before, 60*time.Second, func(k string) bool {
		return strings.HasPrefix(k, "coordination.k8s.io/leases kube-")
	})
}

func (w *offWorld) upgradeToOff(t *testing.T) {
	ctx, cl, cs := w.ctx, w.cl, w.c.Client
	before := cl.snapshot(ctx, t)
	first := withoutHooks(render(t, map[string]any{"istio": map[string]any{"mode": "destinationrule"}}))
	if err := cl.create(ctx, first); err != nil {
		t.Fatalf("the API server refused the chart: %v", err)
	}
	w.writeAsServe(t, false, false, true)
	written := w.edgeflowsObjects(t)
	if len(written) != 1 {
		t.Fatalf("want edgeflow's DestinationRule, got %v", written)
	}

	// helm upgrade --set istio.mode=off: the release's objects as rendered now (created,
	// updated, those no longer rendered deleted), then the post-upgrade hook.
	hook, second := hookObjects(render(t, map[string]any{"istio": map[string]any{"mode": "off"}}), "post-upgrade")
	if err := cl.upgrade(ctx, first, second); err != nil {
		t.Fatal(err)
	}
	// The fence: with the upgrade's RBAC, edgeflow's own account can no longer write rules,
	// so no replica still running the old mode writes again what the hook removes.
	for _, verb := range []string{"create", "update"} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: saUser,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: appNS, Verb: verb, Group: "networking.istio.io", Resource: "destinationrules"}}}
		res, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status.Allowed {
			t.Errorf("after the upgrade to istio.mode=off, edgeflow's account may still %s destinationrules", verb)
		}
	}
	if err := cl.create(ctx, hook); err != nil {
		t.Fatalf("the API server refused the post-upgrade hook: %v", err)
	}
	w.runHook(t, hook)
	if left := w.edgeflowsObjects(t); len(left) > 0 {
		t.Errorf("left of edgeflow's after upgrading to istio.mode=off: %v", left)
	}
	if _, err := cs.AppsV1().Deployments(namespace).Get(ctx, release, metav1.GetOptions{}); err != nil {
		t.Errorf("the post-upgrade hook touched edgeflow's Deployment: %v", err)
	}
	if err := cl.remove(ctx, hook); err != nil {
		t.Fatal(err)
	}
	if err := cl.remove(ctx, second); err != nil {
		t.Fatal(err)
	}
	cl.waitNoLeftovers(ctx, t, before, 60*time.Second, func(k string) bool {
		return strings.HasPrefix(k, "coordination.k8s.io/leases kube-")
	})
}

// upgrade does what helm upgrade does to the release's objects: each of next created or
// updated (replacing the old content), each of prev no longer in next deleted.
func (c *client) upgrade(ctx context.Context, prev, next []*unstructured.Unstructured) error {
	key := func(o *unstructured.Unstructured) string {
		return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
	}
	keep := map[string]bool{}
	for _, o := range next {
		keep[key(o)] = true
		r, err := c.resource(o)
		if err != nil {
			return err
		}
		old, err := r.Get(ctx, o.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = r.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"})
		case err == nil:
			o = o.DeepCopy()
			o.SetResourceVersion(old.GetResourceVersion())
			_, err = r.Update(ctx, o, metav1.UpdateOptions{FieldValidation: "Strict"})
		}
		if err != nil {
			return fmt.Errorf("upgrading %s: %w", key(o), err)
		}
	}
	var gone []*unstructured.Unstructured
	for _, o := range prev {
		if !keep[key(o)] {
			gone = append(gone, o)
		}
	}
	return c.remove(ctx, gone)
}

// uninstallPartGrants is what each part of edgeflow uninstall calls (cmd/edgeflow/uninstall.go,
// rebalancer.Uninstall, xds/istio's Uninstall and Managed): the rules a hook running the part
// needs, and no other.
var uninstallPartGrants = map[string][]string{
	"rebalancer": {"admissionregistration.k8s.io/mutatingwebhookconfigurations get", "admissionregistration.k8s.io/mutatingwebhookconfigurations delete",
		"/pods list", "/pods patch", "/configmaps get", "/configmaps delete"},
	"envoyfilter":     {"networking.istio.io/envoyfilters list", "networking.istio.io/envoyfilters delete", "/configmaps list", "/configmaps delete"},
	"destinationrule": {"networking.istio.io/destinationrules list", "networking.istio.io/destinationrules delete"},
	"stop":            {"apps/deployments/scale get", "apps/deployments/scale update"},
}

// Each cleanup hook runs the parts its values switch off (the pre-delete hook every part, after
// stopping edgeflow) and is granted exactly those parts' rules.
func TestCleanupHookParts(t *testing.T) {
	t.Parallel()
	all := []string{"rebalancer", "envoyfilter", "destinationrule"}
	for _, tc := range []struct {
		values  map[string]any
		cleanup []string // the post-upgrade hook's parts
	}{
		{nil, []string{"rebalancer", "envoyfilter"}}, // istio.mode destinationrule by default
		{map[string]any{"istio": map[string]any{"mode": "off"}}, all},
		{map[string]any{"istio": map[string]any{"mode": "envoyfilter"}, "rebalancer": map[string]any{"mode": "act"}}, []string{"destinationrule"}},
		{map[string]any{"rebalancer": map[string]any{"mode": "act"}, "istio": map[string]any{"mode": "off"}}, []string{"envoyfilter", "destinationrule"}},
	} {
		objs := render(t, tc.values)
		for _, h := range []struct {
			event string
			parts []string
			stop  bool
		}{{"pre-delete", all, true}, {"post-upgrade", tc.cleanup, false}, {"post-rollback", tc.cleanup, false}} {
			hook, _ := hookObjects(objs, h.event)
			var job batchv1.Job
			set := map[string]bool{}
			for _, o := range hook {
				switch o.GetKind() {
				case "Job":
					convert(t, o, &job)
				case "ClusterRole", "Role":
					var r rbacv1.ClusterRole
					convert(t, o, &r)
					for _, g := range flatten(r.Rules) {
						set[g] = true
					}
				}
			}
			if job.Name == "" {
				t.Errorf("values %v: no %s Job", tc.values, h.event)
				continue
			}
			args := strings.Join(job.Spec.Template.Spec.Containers[0].Args, " ")
			if want := "--only=" + strings.Join(h.parts, ","); !strings.Contains(args, want+" ") {
				t.Errorf("values %v, %s: edgeflow %s, want %s", tc.values, h.event, args, want)
			}
			if strings.Contains(args, "--stop-deployment="+namespace+"/"+release) != h.stop {
				t.Errorf("values %v, %s: edgeflow %s: --stop-deployment %v", tc.values, h.event, args, h.stop)
			}
			want := map[string]bool{}
			parts := h.parts
			if h.stop {
				parts = append(slices.Clone(parts), "stop")
			}
			for _, p := range parts {
				for _, g := range uninstallPartGrants[p] {
					want[g] = true
				}
			}
			if diff := cmp.Diff(sortedSet(want), sortedSet(set)); diff != "" {
				t.Errorf("values %v, %s hook's rules (-want +got):\n%s", tc.values, h.event, diff)
			}
		}
	}
}
