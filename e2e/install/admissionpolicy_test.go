package install

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/xds/istio"
)

var admissionPolicyGVR = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}

// policyAPI is the kind the chart's admission policy needs the API server to serve (helm
// install sees it in discovery; helm template is told with --api-versions).
const policyAPI = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"

// The chart's ValidatingAdmissionPolicy on a real kube-apiserver, for requests made as
// edgeflow's own ServiceAccount (impersonated, with the chart's RBAC for the rebalancer acting
// in one watched namespace and DestinationRules with node labels): on pods it allows only what
// edgeflow's rebalancer sends — lifting its placement gate, narrowing a gated pod's node
// affinity, its own edgeflow.io/ annotations on a pod it gated, deleting a replacement it
// placed that is not scheduled, and evictions — and refuses an image change (gated pod or
// not), a label, another annotation, a toleration, a node selector, another controller's gate
// and any other delete;
// on nodes only the subzone label with the node's own name; on DestinationRules only objects
// named edgeflow.* with a workload selector. The same image change by another user is not
// the policy's business. kube-controller-manager type-checks every expression against the
// objects' schemas (the API server's OpenAPI) without a warning.
func TestAdmissionPolicy(t *testing.T) {
	t.Parallel()
	// kube-controller-manager type-checks the policies (its validatingadmissionpolicy-status
	// controller writes status.typeChecking)
	c, cl := startAPIServer(t, kubeapi.Options{ControllerManager: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cs := c.Client
	cl.installCRDs(ctx, t, istioCRDs(t))
	createNamespaces(ctx, t, cs, namespace, appNS)
	caPEM, _ := testkit.SelfSigned(t, "webhook-ca")
	objs := withoutHooks(render(t, map[string]any{
		"watch":      map[string]any{"namespaces": []any{appNS}},
		"istio":      map[string]any{"mode": "destinationrule", "labelNodes": true},
		"rebalancer": map[string]any{"mode": "act"},
		"webhook":    map[string]any{"certificate": "secret", "caBundle": base64.StdEncoding.EncodeToString(caPEM)},
	}))
	// The account, its rules and the policy (not the webhook registration: no pod here is
	// the rebalancer's to gate).
	var installed []*unstructured.Unstructured
	policies := 0
	for _, o := range objs {
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy":
			policies++
			fallthrough
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ValidatingAdmissionPolicyBinding":
			installed = append(installed, o)
		}
	}
	if policies == 0 {
		t.Errorf("the chart renders no ValidatingAdmissionPolicy")
	}
	if err := cl.create(ctx, installed); err != nil {
		t.Fatalf("the API server refused the chart: %v", err)
	}

	// The world edgeflow writes to.
	if _, err := kubeapi.CreateNode(ctx, cs, kubeapi.NodeSpec{Name: "n1", Labels: map[string]string{
		"topology.kubernetes.io/region": "edge", "topology.kubernetes.io/zone": "z1"}}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, gates []string, annotations map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appNS, Labels: map[string]string{"app": "backend"}, Annotations: annotations},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}}}
		for _, g := range gates {
			p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: g})
		}
		out, err := cs.CoreV1().Pods(appNS).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	gate := []string{rebalancer.GateName}
	pod("running", nil, nil)
	pod("running-2", nil, nil)
	pod("admins", nil, nil)
	for _, n := range []string{"gated-1", "gated-2", "gated-3", "gated-4"} {
		pod(n, gate, nil)
	}
	pod("gated-other", []string{rebalancer.GateName, "example.com/other"}, nil)
	pod("placed", nil, map[string]string{rebalancer.AnnotationPlacedOn: "n1", rebalancer.AnnotationPlacedAt: "2026-12-01T00:00:00Z"})
	userRule := drObject("user-rule", map[string]any{"app": "frontend"})
	if _, err := cl.dyn.Resource(drGVR).Namespace(appNS).Create(ctx, userRule, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	as, asDyn := asEdgeflow(t, c.Config)
	jsonPatch := func(cs kubernetes.Interface, name string, ops ...map[string]any) error {
		raw, _ := json.Marshal(ops)
		_, err := cs.CoreV1().Pods(appNS).Patch(ctx, name, types.JSONPatchType, raw, metav1.PatchOptions{})
		return err
	}
	op := func(o, path string, v any) map[string]any { return map[string]any{"op": o, "path": path, "value": v} }
	imageChange := op("replace", "/spec/containers/0/image", "evil:1")

	// The policy in force: its expressions type-checked, and a dry run of an image change
	// refused (the API server loads a new policy within a second or so).
	if policies > 0 {
		policyTypeChecked(ctx, t, cl)
		testkit.Eventually(t, 30*time.Second, "the policy refusing edgeflow an image change (dry run)", func() bool {
			raw, _ := json.Marshal([]map[string]any{imageChange})
			_, err := as.CoreV1().Pods(appNS).Patch(ctx, "running", types.JSONPatchType, raw, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return refusedByPolicy(err)
		})
	}

	affinity := map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{map[string]any{"matchFields": []any{map[string]any{"key": "metadata.name", "operator": "In", "values": []any{"n1"}}}}}}}}
	nodePatch := func(labels map[string]any, spec map[string]any) func() error {
		return func() error {
			m := map[string]any{"metadata": map[string]any{"labels": labels}}
			if spec != nil {
				m = map[string]any{"spec": spec}
			}
			raw, _ := json.Marshal(m)
			_, err := as.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, raw, metav1.PatchOptions{})
			return err
		}
	}
	edgeflowsRule := "edgeflow.frontend.backend." + appNS
	for _, tc := range []struct {
		name    string
		do      func() error
		refused bool
	}{
		// pods
		{"pod: a container's image", func() error { return jsonPatch(as, "running", imageChange) }, true},
		{"pod: a container's image, of a gated pod", func() error { return jsonPatch(as, "gated-4", imageChange) }, true},
		{"pod: a container's image, by another user", func() error { return jsonPatch(cs, "admins", imageChange) }, false},
		{"pod: lift the placement gate", func() error {
			return jsonPatch(as, "gated-1", op("replace", "/spec/schedulingGates", []any{}))
		}, false},
		{"pod: a gated pod's node affinity", func() error { return jsonPatch(as, "gated-2", op("add", "/spec/affinity", affinity)) }, false},
		{"pod: the release (gate, affinity, edgeflow's annotations in one patch, as rebalancer/gates.go)", func() error {
			return jsonPatch(as, "gated-3", op("replace", "/spec/schedulingGates", []any{}), op("add", "/spec/affinity", affinity),
				op("add", "/metadata/annotations", map[string]any{rebalancer.AnnotationPlacedOn: "n1", rebalancer.AnnotationPlacedAt: "2026-12-01T00:00:00Z"}))
		}, false},
		{"pod: a label of a gated pod", func() error { return jsonPatch(as, "gated-4", op("add", "/metadata/labels/evil", "yes")) }, true},
		{"pod: an annotation not edgeflow's", func() error {
			return jsonPatch(as, "gated-4", op("add", "/metadata/annotations", map[string]any{"example.com/x": "y"}))
		}, true},
		{"pod: edgeflow's annotation on a pod it did not gate", func() error {
			return jsonPatch(as, "running", op("add", "/metadata/annotations", map[string]any{rebalancer.AnnotationPlacedAt: "2026-12-01T00:00:00Z"}))
		}, true},
		{"pod: a toleration on a gated pod", func() error {
			return jsonPatch(as, "gated-4", op("add", "/spec/tolerations/-", map[string]any{"key": "evil", "operator": "Exists"}))
		}, true},
		{"pod: a node selector on a gated pod", func() error {
			return jsonPatch(as, "gated-4", op("add", "/spec/nodeSelector", map[string]any{"evil": "yes"}))
		}, true},
		{"pod: another controller's gate", func() error {
			return jsonPatch(as, "gated-other", op("replace", "/spec/schedulingGates", []any{map[string]any{"name": rebalancer.GateName}}))
		}, true},
		{"pod: delete one edgeflow did not place", func() error { return as.CoreV1().Pods(appNS).Delete(ctx, "running", metav1.DeleteOptions{}) }, true},
		{"pod: delete a replacement edgeflow placed, not scheduled", func() error {
			return as.CoreV1().Pods(appNS).Delete(ctx, "placed", metav1.DeleteOptions{})
		}, false},
		{"pod: evict", func() error {
			return as.PolicyV1().Evictions(appNS).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "running-2", Namespace: appNS}})
		}, false},
		// nodes
		{"node: its own subzone", nodePatch(map[string]any{istio.SubzoneLabel: "n1"}, nil), false},
		{"node: another label", nodePatch(map[string]any{"evil": "yes"}, nil), true},
		{"node: a subzone not its name", nodePatch(map[string]any{istio.SubzoneLabel: "elsewhere"}, nil), true},
		{"node: cordon", nodePatch(nil, map[string]any{"unschedulable": true}), true},
		// DestinationRules
		{"destinationrule: create edgeflow's", func() error {
			_, err := asDyn.Resource(drGVR).Namespace(appNS).Create(ctx, drObject(edgeflowsRule, map[string]any{"app": "frontend"}), metav1.CreateOptions{})
			return err
		}, false},
		{"destinationrule: update edgeflow's", func() error {
			// edgeflow reads rules by listing them (no get); here the admin reads
			o, err := cl.dyn.Resource(drGVR).Namespace(appNS).Get(ctx, edgeflowsRule, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if err := unstructured.SetNestedField(o.Object, "frontend-v2", "spec", "workloadSelector", "matchLabels", "app"); err != nil {
				return err
			}
			_, err = asDyn.Resource(drGVR).Namespace(appNS).Update(ctx, o, metav1.UpdateOptions{})
			return err
		}, false},
		{"destinationrule: create one not named edgeflow.*", func() error {
			_, err := asDyn.Resource(drGVR).Namespace(appNS).Create(ctx, drObject("mine", map[string]any{"app": "frontend"}), metav1.CreateOptions{})
			return err
		}, true},
		{"destinationrule: create edgeflow.* without a workload selector", func() error {
			_, err := asDyn.Resource(drGVR).Namespace(appNS).Create(ctx, drObject("edgeflow.everyone", nil), metav1.CreateOptions{})
			return err
		}, true},
		{"destinationrule: update the user's", func() error {
			o, err := cl.dyn.Resource(drGVR).Namespace(appNS).Get(ctx, "user-rule", metav1.GetOptions{})
			if err != nil {
				return err
			}
			o.SetLabels(map[string]string{"evil": "yes"})
			_, err = asDyn.Resource(drGVR).Namespace(appNS).Update(ctx, o, metav1.UpdateOptions{})
			return err
		}, true},
		{"destinationrule: delete the user's", func() error {
			return asDyn.Resource(drGVR).Namespace(appNS).Delete(ctx, "user-rule", metav1.DeleteOptions{})
		}, true},
		{"destinationrule: delete edgeflow's", func() error {
			return asDyn.Resource(drGVR).Namespace(appNS).Delete(ctx, edgeflowsRule, metav1.DeleteOptions{})
		}, false},
	} {
		err := tc.do()
		switch {
		case tc.refused && !refusedByPolicy(err):
			t.Errorf("%s: %v; want refused by the admission policy", tc.name, err)
		case !tc.refused && err != nil:
			t.Errorf("%s: %v; want accepted", tc.name, err)
		case tc.refused:
			t.Logf("%s: refused: %s", tc.name, policyMessage(err))
		default:
			t.Logf("%s: accepted", tc.name)
		}
	}

	// What the accepted ones did.
	for name, want := range map[string]string{"gated-1": "[]", "gated-2": "[" + rebalancer.GateName + "]", "gated-3": "[]"} {
		p, err := cs.CoreV1().Pods(appNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var gates []string
		for _, g := range p.Spec.SchedulingGates {
			gates = append(gates, g.Name)
		}
		if got := fmt.Sprint(gates); got != want {
			t.Errorf("pod %s: gates %s, want %s", name, got, want)
		}
	}
	for _, name := range []string{"placed", "running-2"} {
		testkit.Eventually(t, 30*time.Second, "pod "+name+" gone", func() bool {
			_, err := cs.CoreV1().Pods(appNS).Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	}
}

// asEdgeflow returns clients that make their requests as edgeflow's ServiceAccount (the
// admin's cfg impersonating it, with the groups its token would carry).
func asEdgeflow(t *testing.T, cfg *rest.Config) (kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	ecfg := rest.CopyConfig(cfg)
	ecfg.Impersonate = rest.ImpersonationConfig{UserName: saUser, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
	cs, err := kubernetes.NewForConfig(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(ecfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs, dyn
}

// drObject is a DestinationRule NAME in appNS for backend, with a workload selector (nil:
// none).
func drObject(name string, selector map[string]any) *unstructured.Unstructured {
	spec := map[string]any{"host": "backend." + appNS + ".svc.cluster.local"}
	if selector != nil {
		spec["workloadSelector"] = map[string]any{"matchLabels": selector}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
		"metadata": map[string]any{"name": name, "namespace": appNS}, "spec": spec}}
}

// refusedByPolicy says whether err is a ValidatingAdmissionPolicy's refusal (Forbidden, as
// the policy's reason says), not RBAC's.
func refusedByPolicy(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy")
}

// policyMessage is the message of the policy's refusal err.
func policyMessage(err error) string {
	s := err.Error()
	if i := strings.Index(s, "denied request: "); i >= 0 {
		return s[i+len("denied request: "):]
	}
	return s
}

// policyTypeChecked waits until kube-controller-manager has type-checked every ValidatingAdmissionPolicy
// (status.observedGeneration) and fails on any warning it found.
func policyTypeChecked(ctx context.Context, t *testing.T, cl *client) {
	t.Helper()
	gvr := admissionPolicyGVR
	testkit.EventuallyNoError(t, 30*time.Second, "the admission policy type-checked", func() error {
		list, err := cl.dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			observed, _, _ := unstructured.NestedInt64(p.Object, "status", "observedGeneration")
			if observed < p.GetGeneration() {
				return fmt.Errorf("%s: observedGeneration %d < generation %d", p.GetName(), observed, p.GetGeneration())
			}
		}
		return nil
	})
	list, err := cl.dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		warnings, _, _ := unstructured.NestedSlice(p.Object, "status", "typeChecking", "expressionWarnings")
		for _, w := range warnings {
			t.Errorf("policy %s: kube-controller-manager's type check warns: %v", p.GetName(), w)
		}
		conds, _, _ := unstructured.NestedSlice(p.Object, "status", "conditions")
		t.Logf("policy %s type-checked: %d warnings, conditions %v", p.GetName(), len(warnings), conds)
	}
}

// Where the chart ships its admission policies, and what they name. With
// admissionPolicy.enabled auto (the default) wherever the API server serves policyAPI: helm
// install and upgrade read that from discovery, helm template only when told (--api-versions;
// alone it knows API group versions, not kinds, and renders none); true renders them
// regardless, false never. There is one policy, with its binding, per kind edgeflow is granted
// to write (pods when the rebalancer acts, nodes with istio.labelNodes, DestinationRules or the
// bootstrap ConfigMap by the Istio mode), each for the chart's ServiceAccount only; the pods'
// compares every field of k8s.io/api's PodSpec but schedulingGates and the node affinity, so a
// field a Kubernetes upgrade adds is not left open.
func TestAdmissionPolicyWhereServed(t *testing.T) {
	t.Parallel()
	acting := map[string]any{"rebalancer": map[string]any{"mode": "act"}, "istio": map[string]any{"mode": "destinationrule", "labelNodes": true}}
	with := func(m map[string]any, k string, v any) map[string]any {
		out := map[string]any{k: v}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name         string
		values       map[string]any
		capabilities bool // helm template told the API server serves policyAPI
		want         []string
	}{
		{"defaults", nil, true, []string{"destinationrules"}},
		{"defaults, helm template without --api-versions", nil, false, nil},
		{"rebalancer acting, node labels", acting, true, []string{"pods", "nodes", "destinationrules"}},
		{"envoyfilter, rebalancer off", map[string]any{"istio": map[string]any{"mode": "envoyfilter"}, "rebalancer": map[string]any{"mode": "off"}}, true, []string{"configmaps"}},
		{"istio off, rebalancer dry-run", map[string]any{"istio": map[string]any{"mode": "off"}}, true, nil},
		{"enabled false", with(acting, "admissionPolicy", map[string]any{"enabled": false}), true, nil},
		{"enabled true, helm template without --api-versions", with(acting, "admissionPolicy", map[string]any{"enabled": true}), false, []string{"pods", "nodes", "destinationrules"}},
		{"another ServiceAccount", with(acting, "serviceAccount", map[string]any{"name": "router"}), true, []string{"pods", "nodes", "destinationrules"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var raw []byte
			var err error
			if tc.capabilities {
				raw, err = renderRaw(t, tc.values)
			} else {
				raw, err = renderFor(t, tc.values)
			}
			if err != nil {
				t.Fatal(err)
			}
			objs := decodeAll(t, raw)
			account := "system:serviceaccount:" + namespace + ":edgeflow"
			if sa, ok := tc.values["serviceAccount"].(map[string]any); ok {
				account = "system:serviceaccount:" + namespace + ":" + sa["name"].(string)
			}
			var got []string
			for _, o := range objs {
				switch o.GetKind() {
				case "ValidatingAdmissionPolicy":
					kind := strings.TrimPrefix(o.GetName(), release+"-")
					got = append(got, kind)
					var p admissionregistrationv1.ValidatingAdmissionPolicy
					convert(t, o, &p)
					if len(p.Spec.MatchConditions) != 1 || p.Spec.MatchConditions[0].Expression != "request.userInfo.username == '"+account+"'" {
						t.Errorf("policy %s matches %v; want requests of %s only", p.Name, p.Spec.MatchConditions, account)
					}
					if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
						t.Errorf("policy %s: failurePolicy %v, want Fail", p.Name, p.Spec.FailurePolicy)
					}
					for _, v := range p.Spec.Validations {
						if v.Reason == nil || *v.Reason != metav1.StatusReasonForbidden {
							t.Errorf("policy %s: a validation's reason %v, want Forbidden (a 403, as RBAC's refusals)", p.Name, v.Reason)
						}
					}
					if kind == "pods" {
						podSpecCompared(t, &p)
					}
					b := find(t, objs, "ValidatingAdmissionPolicyBinding", p.Name)
					var pb admissionregistrationv1.ValidatingAdmissionPolicyBinding
					convert(t, b, &pb)
					if pb.Spec.PolicyName != p.Name || len(pb.Spec.ValidationActions) != 1 || pb.Spec.ValidationActions[0] != admissionregistrationv1.Deny {
						t.Errorf("binding %s: policy %s, actions %v; want %s, Deny", pb.Name, pb.Spec.PolicyName, pb.Spec.ValidationActions, p.Name)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("policies for %v, want %v", got, tc.want)
			}
		})
	}
}

// podSpecCompared fails unless the pods' policy compares every field of core/v1 PodSpec (the
// k8s.io/api this module builds with) but schedulingGates and affinity, and of Affinity but
// nodeAffinity, between the pod as it was and as it would be.
func podSpecCompared(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy) {
	t.Helper()
	var exprs strings.Builder
	for _, v := range p.Spec.Validations {
		exprs.WriteString(v.Expression + "\n")
	}
	compared := func(path string) bool {
		typed := "object." + path + " == oldObject." + path + " "
		field := strings.TrimPrefix(path, "spec.") // untyped: dyn(object.spec).?FIELD
		untyped := "dyn(object.spec)." + field + " == dyn(oldObject.spec)." + field + " "
		return strings.Contains(exprs.String(), typed) || strings.Contains(exprs.String(), untyped)
	}
	fields := func(typ reflect.Type) []string {
		var out []string
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			out = append(out, name)
		}
		return out
	}
	n := 0
	for _, f := range fields(reflect.TypeFor[corev1.PodSpec]()) {
		open := f == "schedulingGates" || f == "affinity"
		if compared("spec.?"+f) == open {
			t.Errorf("pod policy: PodSpec field %s compared %v, want %v", f, !open, open)
		}
		n++
	}
	for _, f := range fields(reflect.TypeFor[corev1.Affinity]()) {
		open := f == "nodeAffinity"
		if compared("spec.?affinity.?"+f) == open {
			t.Errorf("pod policy: Affinity field %s compared %v, want %v", f, !open, open)
		}
	}
	t.Logf("pod policy: %d PodSpec fields, all compared but schedulingGates (edgeflow's gate may go) and affinity.nodeAffinity", n)
}
