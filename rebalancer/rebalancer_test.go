package rebalancer

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/edgeflow/edgeflow/optimizer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

// pod is a running, ready pod of app in ns on node, created at created, owned by kind (""
// for a bare pod), requesting cpu millicores.
func pod(ns, name, app, node, kind string, created time.Time, cpu int64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name),
		Labels: map[string]string{"app": app}, CreationTimestamp: metav1.NewTime(created)},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: *resource.NewMilliQuantity(cpu, resource.DecimalSI)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	if kind != "" {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: app, UID: "owner-" + types.UID(app), Controller: ptr(true)}}
	}
	return p
}

func service(ns, name string, managed bool) *corev1.Service {
	l := map[string]string{}
	if managed {
		l["edgeflow.io/managed"] = "true"
	}
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}}}
}

func node(name string, cpu int64, slots int64) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
		corev1.ResourceCPU: *resource.NewMilliQuantity(cpu, resource.DecimalSI), corev1.ResourcePods: *resource.NewQuantity(slots, resource.DecimalSI)}}}
}

// started is a controller on a fake clientset holding objs, its caches synced.
func started(t *testing.T, cfg Config, objs ...runtime.Object) *Controller {
	t.Helper()
	cfg.Client = fake.NewClientset(objs...)
	if cfg.Topology == nil {
		cfg.Topology = func() *optimizer.Topology { return nil }
	}
	if cfg.Selector == "" {
		cfg.Selector = "edgeflow.io/managed=true"
	}
	cfg.Clock = func() time.Time { return t0 }
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); c.Stop() })
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestWebhookGates(t *testing.T) {
	objs := []runtime.Object{service("shop", "cart", true), service("shop", "plain", false)}
	acting := started(t, Config{}, objs...)
	dry := started(t, Config{DryRun: true}, objs...)
	only := started(t, Config{Namespaces: []string{"other"}}, objs...)
	gated := pod("shop", "cart-2", "cart", "", "ReplicaSet", t0, 100)
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "someone.else/gate"}}
	bound := pod("shop", "cart-3", "cart", "n1", "ReplicaSet", t0, 100)
	for _, tc := range []struct {
		name  string
		c     *Controller
		pod   *corev1.Pod
		patch string
	}{
		{"a new ReplicaSet pod of a managed service is gated", acting, pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100),
			`[{"op":"add","path":"/spec/schedulingGates","value":[{"name":"edgeflow.io/placement"}]}]`},
		{"a pod with gates already gets one more", acting, gated,
			`[{"op":"add","path":"/spec/schedulingGates/-","value":{"name":"edgeflow.io/placement"}}]`},
		{"dry-run gates nothing", dry, pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100), ""},
		{"a namespace not managed", only, pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100), ""},
		{"a bare pod", acting, pod("shop", "cart-1", "cart", "", "", t0, 100), ""},
		{"a DaemonSet pod", acting, pod("shop", "cart-1", "cart", "", "DaemonSet", t0, 100), ""},
		{"a pod of an unmanaged service", acting, pod("shop", "plain-1", "plain", "", "ReplicaSet", t0, 100), ""},
		{"a pod already bound", acting, bound, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, _ := json.Marshal(tc.pod)
			tc.pod.Namespace = "" // the API server sends a new pod without it
			review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
				Request: &admissionv1.AdmissionRequest{UID: "u1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
					Namespace: "shop", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}}
			body, _ := json.Marshal(review)
			rr := httptest.NewRecorder()
			tc.c.Webhook().ServeHTTP(rr, httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(body)))
			if rr.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rr.Code, rr.Body)
			}
			var got admissionv1.AdmissionReview
			if err := json.Unmarshal(rr.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got.Response == nil || !got.Response.Allowed || got.Response.UID != "u1" {
				t.Fatalf("response %+v: want allowed, uid u1", got.Response)
			}
			if string(got.Response.Patch) != tc.patch {
				t.Errorf("patch %s, want %q", got.Response.Patch, tc.patch)
			}
		})
	}
}

func TestWebhookBadRequest(t *testing.T) {
	c := started(t, Config{})
	rr := httptest.NewRecorder()
	c.Webhook().ServeHTTP(rr, httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader([]byte("{"))))
	if rr.Code != http.StatusBadRequest {
		t.Errorf("status %d, want 400", rr.Code)
	}
}

func TestRequireNode(t *testing.T) {
	var spec corev1.PodSpec
	requireNode(&spec, "n2")
	terms := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchFields) != 1 || terms[0].MatchFields[0].Values[0] != "n2" {
		t.Fatalf("terms %+v", terms)
	}
	// Terms already required are ORed: each one must be narrowed, none replaced.
	spec = corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}},
		}}}}}
	requireNode(&spec, "n2")
	for i, term := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		if len(term.MatchExpressions) != 1 || len(term.MatchFields) != 1 || term.MatchFields[0].Values[0] != "n2" {
			t.Errorf("term %d: %+v", i, term)
		}
	}
}

// The gate is always lifted: a pod a move awaits gets a required affinity to the move's node;
// one no move awaits, or whose planned node is full, or gated past the timeout, is released
// without affinity.
func TestReleaseGated(t *testing.T) {
	gatedPod := func(name string, created time.Time) *corev1.Pod {
		p := pod("shop", name, "cart", "", "ReplicaSet", created, 500)
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: GateName}}
		p.Status = corev1.PodStatus{Phase: corev1.PodPending}
		return p
	}
	for _, tc := range []struct {
		name     string
		created  time.Time
		pending  []pendingMove
		nodeCPU  int64
		wantNode string
		wantHow  string
	}{
		{"planned", t0.Add(-time.Second), []pendingMove{{move: Move{Pod: "cart-0", From: "n1", To: "n2"}, evicted: t0}}, 4000, "n2", ReleasePlanned},
		{"no move awaits it", t0.Add(-time.Second), nil, 4000, "", ReleaseUnplanned},
		{"planned node full", t0.Add(-time.Second), []pendingMove{{move: Move{Pod: "cart-0", From: "n1", To: "n2"}, evicted: t0}}, 400, "", ReleaseNodeFull},
		{"gated too long", t0.Add(-DefaultGateTimeout - time.Second), []pendingMove{{move: Move{Pod: "cart-0", From: "n1", To: "n2"}, evicted: t0}}, 4000, "", ReleaseTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := started(t, Config{}, service("shop", "cart", true), node("n1", 4000, 110), node("n2", tc.nodeCPU, 110),
				gatedPod("cart-1", tc.created))
			c.pending["cart.shop"] = tc.pending
			c.releaseGated(context.Background(), discard{})
			got, err := c.cs.CoreV1().Pods("shop").Get(context.Background(), "cart-1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if hasGate(got) {
				t.Fatal("still gated")
			}
			var node string
			if a := got.Spec.Affinity; a != nil && a.NodeAffinity != nil {
				node = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields[0].Values[0]
			}
			if node != tc.wantNode {
				t.Errorf("required node %q, want %q", node, tc.wantNode)
			}
			for _, how := range []string{ReleasePlanned, ReleaseUnplanned, ReleaseNodeFull, ReleaseTimeout} {
				want := 0.0
				if how == tc.wantHow {
					want = 1
				}
				if v := testutil.ToFloat64(c.metrics.released.WithLabelValues(how)); v != want {
					t.Errorf("released{placement=%s} = %v, want %v", how, v, want)
				}
			}
			if tc.wantHow == ReleasePlanned && (c.placed[got.UID] != t0 || c.left[serviceNode{"cart.shop", "n1"}] != t0 || len(c.pending) != 0) {
				t.Errorf("a planned release must start the cool-downs and end the move: placed %v left %v pending %v", c.placed, c.left, c.pending)
			}
		})
	}
}

// discard is an EventRecorder that drops events.
type discard struct{}

func (discard) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {}
