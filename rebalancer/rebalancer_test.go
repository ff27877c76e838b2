package rebalancer

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"

	"github.com/edgeflow/edgeflow/internal/kubetest"
	"github.com/edgeflow/edgeflow/internal/testkit"
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
	cfg.Client = kubetest.NewClientset(objs...)
	if cfg.Topology == nil {
		cfg.Topology = func() *optimizer.Topology { return nil }
	}
	if cfg.Selector == "" {
		cfg.Selector = "edgeflow.io/managed=true"
	}
	cfg.Clock = testingclock.NewFakeClock(t0)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.store = stateStore{namespace: "edgeflow", name: DefaultLeaseName + stateSuffix}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); c.Stop() })
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// ownerOf is the controller reference pod gives a pod of app owned by a ReplicaSet.
func ownerOf(app string) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app, UID: "owner-" + types.UID(app), Controller: ptr(true)}
}

// leadingWith makes c the leader with a move in flight of owner app's pods (owner-APP).
func leadingWith(c *Controller, apps ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leading = true
	for _, app := range apps {
		c.st.Moves = append(c.st.Moves, moveRecord{recordedMove: recordedMove{Namespace: "shop", Service: app + ".shop", Pod: app + "-0", From: "n1", To: "n2"},
			PodUID: types.UID("shop/" + app + "-0"), Owner: types.UID("owner-" + app), OwnerKind: "ReplicaSet", OwnerName: app, Evicted: t0})
	}
}

func review(t *testing.T, p *corev1.Pod) []byte {
	t.Helper()
	raw, _ := json.Marshal(p)
	r := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: "shop", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}}
	body, _ := json.Marshal(r)
	return body
}

// The webhook gates only the replacement of a move in flight of the leader: not a pod of
// another owner, not while no move awaits, not on a replica that does not lead, not in dry-run.
func TestWebhookGates(t *testing.T) {
	t.Parallel()
	objs := []runtime.Object{service("shop", "cart", true)}
	leader := started(t, Config{}, objs...)
	leadingWith(leader, "cart")
	idle := started(t, Config{}, objs...) // leads, no move in flight
	idle.leading = true
	follower := started(t, Config{}, objs...) // a move recorded, but it does not lead
	leadingWith(follower, "cart")
	follower.leading = false
	dry := started(t, Config{DryRun: true}, objs...)
	leadingWith(dry, "cart")
	gated := pod("shop", "cart-2", "cart", "", "ReplicaSet", t0, 100)
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "someone.else/gate"}}
	for _, tc := range []struct {
		name  string
		c     *Controller
		pod   *corev1.Pod
		patch string
	}{
		{"the replacement of a move in flight is gated", leader, pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100),
			`[{"op":"add","path":"/spec/schedulingGates","value":[{"name":"edgeflow.io/placement"}]}]`},
		{"a pod with gates already gets one more", leader, gated,
			`[{"op":"add","path":"/spec/schedulingGates/-","value":{"name":"edgeflow.io/placement"}}]`},
		{"a pod of another owner", leader, pod("shop", "other-1", "other", "", "ReplicaSet", t0, 100), ""},
		{"a leader with no move in flight gates nothing", idle, pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100), ""},
		{"a replica that does not lead gates nothing", follower, pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100), ""},
		{"dry-run gates nothing", dry, pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100), ""},
		{"a bare pod", leader, pod("shop", "cart-1", "cart", "", "", t0, 100), ""},
		{"a pod already bound", leader, pod("shop", "cart-3", "cart", "n1", "ReplicaSet", t0, 100), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.pod.Namespace = "" // the API server sends a new pod without it
			rr := httptest.NewRecorder()
			tc.c.Webhook().ServeHTTP(rr, httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(review(t, tc.pod))))
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
	t.Parallel()
	c := started(t, Config{})
	rr := httptest.NewRecorder()
	c.Webhook().ServeHTTP(rr, httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader([]byte("{"))))
	if rr.Code != http.StatusBadRequest {
		t.Errorf("status %d, want 400", rr.Code)
	}
}

// A review of another apiVersion or kind, or about another resource, is refused (400), never
// answered allowed.
func TestWebhookRefusesWrongKind(t *testing.T) {
	t.Parallel()
	c := started(t, Config{})
	p := pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100)
	for _, tc := range []struct {
		name string
		edit func(r *admissionv1.AdmissionReview)
	}{
		{"review apiVersion v1beta1", func(r *admissionv1.AdmissionReview) { r.APIVersion = "admission.k8s.io/v1beta1" }},
		{"review kind", func(r *admissionv1.AdmissionReview) { r.Kind = "ConversionReview" }},
		{"no apiVersion", func(r *admissionv1.AdmissionReview) { r.APIVersion, r.Kind = "", "" }},
		{"a Service", func(r *admissionv1.AdmissionReview) {
			r.Request.Kind = metav1.GroupVersionKind{Version: "v1", Kind: "Service"}
			r.Request.Resource = metav1.GroupVersionResource{Version: "v1", Resource: "services"}
		}},
		{"a Deployment", func(r *admissionv1.AdmissionReview) {
			r.Request.Kind = metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
			r.Request.Resource = metav1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
		}},
		{"a pod's subresource", func(r *admissionv1.AdmissionReview) { r.Request.SubResource = "binding" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r admissionv1.AdmissionReview
			if err := json.Unmarshal(review(t, p), &r); err != nil {
				t.Fatal(err)
			}
			tc.edit(&r)
			body, _ := json.Marshal(r)
			rr := httptest.NewRecorder()
			c.Webhook().ServeHTTP(rr, httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(body)))
			if rr.Code != http.StatusBadRequest {
				t.Errorf("status %d (%s), want 400", rr.Code, bytes.TrimSpace(rr.Body.Bytes()))
			}
			if bytes.Contains(rr.Body.Bytes(), []byte(`"allowed":true`)) {
				t.Errorf("answered allowed: %s", rr.Body)
			}
		})
	}
}

// A body over MaxReviewBytes gets 413, read no further than the limit.
func TestWebhookBodyLimit(t *testing.T) {
	t.Parallel()
	c := started(t, Config{})
	p := pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100)
	p.Annotations = map[string]string{"pad": strings.Repeat("x", 5<<20)}
	body := review(t, p)
	if len(body) < 5<<20 {
		t.Fatalf("body %d bytes", len(body))
	}
	rr := httptest.NewRecorder()
	c.Webhook().ServeHTTP(rr, httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(body)))
	if rr.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("a %d-byte review: status %d, want 413", len(body), rr.Code)
	}
	// Just under the limit is read and answered.
	p.Annotations["pad"] = strings.Repeat("x", MaxReviewBytes-4096)
	rr = httptest.NewRecorder()
	c.Webhook().ServeHTTP(rr, httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(review(t, p))))
	if rr.Code != http.StatusOK {
		t.Errorf("a review under the limit: status %d, want 200", rr.Code)
	}
}

// A move's replacement is a pod whose controller reference names the moved pod's owner by
// namespace, kind, name and UID. A pod elsewhere, or naming another kind or name, that carries
// the owner's UID (copied: the API server does not check an owner reference's UID) is neither
// gated by the webhook nor placed on the move's node, and the move stays in flight for the
// real replacement.
func TestOwnerMatchedByKindNameAndUID(t *testing.T) {
	t.Parallel()
	forged := func(ns, name string, edit func(o *metav1.OwnerReference)) *corev1.Pod {
		p := pod(ns, name, "cart", "", "ReplicaSet", t0, 100)
		edit(&p.OwnerReferences[0])
		return p
	}
	same := func(*metav1.OwnerReference) {}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"the replacement", forged("shop", "cart-1", same), true},
		{"another namespace, the same reference", forged("tenant", "cart-1", same), false},
		{"the owner's UID under another name", forged("shop", "cart-1", func(o *metav1.OwnerReference) { o.Name = "other" }), false},
		{"the owner's UID under another kind", forged("shop", "cart-1", func(o *metav1.OwnerReference) { o.Kind = "StatefulSet" }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The webhook: gated only if it is the replacement.
			c := started(t, Config{}, service("shop", "cart", true))
			leadingWith(c, "cart")
			body := reviewIn(t, tc.pod.Namespace, tc.pod)
			rr := httptest.NewRecorder()
			c.Webhook().ServeHTTP(rr, httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(body)))
			var got admissionv1.AdmissionReview
			if err := json.Unmarshal(rr.Body.Bytes(), &got); err != nil || got.Response == nil || !got.Response.Allowed {
				t.Fatalf("status %d: %s (%v)", rr.Code, rr.Body, err)
			}
			if gated := len(got.Response.Patch) > 0; gated != tc.want {
				t.Errorf("gated %v, want %v", gated, tc.want)
			}

			// The gate worker: a pod gated by other means is placed only if it is the replacement.
			p := tc.pod.DeepCopy()
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: GateName}}
			p.Status = corev1.PodStatus{Phase: corev1.PodPending}
			c = started(t, Config{}, service("shop", "cart", true), node("n1", 4000, 110), node("n2", 4000, 110), p)
			leadingWith(c, "cart")
			if _, err := c.syncPod(context.Background(), discard{}, p.Namespace+"/"+p.Name); err != nil {
				t.Fatal(err)
			}
			after, err := c.cs.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			placed := after.Annotations[AnnotationPlacedOn] == "n2" && after.Spec.Affinity != nil
			inFlight := c.st.inFlight("shop", ownerOf("cart")) >= 0
			if hasGate(after) || placed != tc.want || inFlight == tc.want {
				t.Errorf("gated %v, placed on n2 %v, the move still in flight %v; want released, placed %v, in flight %v",
					hasGate(after), placed, inFlight, tc.want, !tc.want)
			}
		})
	}
}

// reviewIn is review with the request in namespace ns.
func reviewIn(t *testing.T, ns string, p *corev1.Pod) []byte {
	t.Helper()
	var r admissionv1.AdmissionReview
	if err := json.Unmarshal(review(t, p), &r); err != nil {
		t.Fatal(err)
	}
	r.Request.Namespace = ns
	body, _ := json.Marshal(&r)
	return body
}

// countingBody is a request body of n bytes of a review's padding that counts what is read
// of it and, when hold is set, blocks its first read until hold is closed.
type countingBody struct {
	n, read int64
	started chan<- struct{}
	hold    <-chan struct{}
	payload *bytes.Reader
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.started != nil {
		b.started <- struct{}{}
		b.started = nil
		<-b.hold
	}
	if b.payload != nil {
		n, err := b.payload.Read(p)
		atomic.AddInt64(&b.read, int64(n))
		return n, err
	}
	if b.read >= b.n {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), b.n-b.read))
	for i := range p[:n] {
		p[i] = ' '
	}
	atomic.AddInt64(&b.read, int64(n))
	return n, nil
}

// Bodies declared larger than MaxReviewBytes are refused (413) without a byte of them read,
// however many arrive at once; one of unknown length is read no further than the bound.
func TestWebhookOversizedUnread(t *testing.T) {
	t.Parallel()
	c := started(t, Config{})
	h := c.Webhook()
	const n = 100
	bodies := make([]*countingBody, n)
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		bodies[i] = &countingBody{n: 64 << 20}
		wg.Go(func() {
			req := httptest.NewRequest(http.MethodPost, WebhookPath, bodies[i])
			req.ContentLength = bodies[i].n
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			codes[i] = rr.Code
		})
	}
	wg.Wait()
	var read int64
	for i := range n {
		read += atomic.LoadInt64(&bodies[i].read)
		if codes[i] != http.StatusRequestEntityTooLarge {
			t.Errorf("review %d of %d bytes: status %d, want 413", i, bodies[i].n, codes[i])
		}
	}
	if read != 0 {
		t.Errorf("%d reviews declaring 64 MiB each: %d bytes read of them, want none", n, read)
	}

	// Chunked (no Content-Length): read up to the bound, then 413.
	b := &countingBody{n: 64 << 20}
	req := httptest.NewRequest(http.MethodPost, WebhookPath, b)
	req.ContentLength = -1
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	if rr.Code != http.StatusRequestEntityTooLarge || b.read > MaxReviewBytes+64<<10 {
		t.Errorf("a chunked 64 MiB review: status %d after reading %d bytes, want 413 within %d", rr.Code, b.read, MaxReviewBytes)
	}
}

// At most maxConcurrentReviews reviews are read at once; the others are answered at once 429
// with Retry-After (the API server's client retries them), their bodies unread — none waits
// holding a connection and a goroutine for a slot.
func TestWebhookConcurrencyBounded(t *testing.T) {
	t.Parallel()
	c := started(t, Config{})
	h := c.Webhook()
	const n = 100
	started := make(chan struct{}, n)
	hold := make(chan struct{})
	body := review(t, pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100))
	bodies := make([]*countingBody, n)
	codes := make(chan int, n)
	retryAfter := make(chan string, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()
	for i := range n {
		bodies[i] = &countingBody{started: started, hold: hold, payload: bytes.NewReader(body)}
		wg.Go(func() {
			req := httptest.NewRequest(http.MethodPost, WebhookPath, bodies[i])
			req.ContentLength = int64(len(body))
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			codes <- rr.Code
			if rr.Code == http.StatusTooManyRequests {
				retryAfter <- rr.Header().Get("Retry-After")
			}
		})
	}
	// Every review but those being read is answered while the readers are held.
	answered := map[int]int{}
	deadline := time.After(10 * time.Second)
	for len(started) < n && sum(answered)+len(started) < n {
		select {
		case code := <-codes:
			answered[code]++
		case <-deadline:
			t.Fatalf("10 s: %d reviews being read, %d answered (%v); want all %d either read or answered at once",
				len(started), sum(answered), answered, n)
		}
	}
	reading := len(started)
	if reading > maxConcurrentReviews || answered[http.StatusTooManyRequests] != n-reading {
		t.Errorf("%d reviews at once: %d read together, answered %v; want at most %d read, the rest 429",
			n, reading, answered, maxConcurrentReviews)
	}
	for range answered[http.StatusTooManyRequests] {
		if ra := <-retryAfter; ra != "1" {
			t.Errorf("a 429 with Retry-After %q, want 1", ra)
		}
	}
	var unread int
	for _, b := range bodies {
		if atomic.LoadInt64(&b.read) == 0 {
			unread++
		}
	}
	if unread != n {
		t.Errorf("%d bodies read before the held readers went on, want none", n-unread)
	}
	close(hold)
	released = true
	for range reading {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a review read in its turn: status %d, want 200", code)
		}
	}
}

func sum(m map[int]int) int {
	s := 0
	for _, v := range m {
		s += v
	}
	return s
}

// The reviews read at once, each of the largest body, allocate well under the chart's memory
// limit for edgeflow: maxConcurrentReviews × what one such review allocates ≤ a quarter of it.
func TestWebhookMemoryBound(t *testing.T) {
	c := started(t, Config{})
	leadingWith(c, "cart")
	h := c.Webhook()
	p := pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100)
	p.Annotations = map[string]string{"pad": strings.Repeat("x", MaxReviewBytes-4096)}
	body := review(t, p)
	if len(body) > MaxReviewBytes || len(body) < MaxReviewBytes-8192 {
		t.Fatalf("body %d bytes, want just under %d", len(body), MaxReviewBytes)
	}
	const runs = 5
	var before, after goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&before)
	for range runs {
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(body)))
		if rr.Code != http.StatusOK || !strings.Contains(rr.Body.String(), `"patch"`) {
			t.Fatalf("status %d: %.200s", rr.Code, rr.Body)
		}
	}
	goruntime.ReadMemStats(&after)
	perReview := (after.TotalAlloc - before.TotalAlloc) / runs

	values, err := os.ReadFile("../install/helm/edgeflow/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Resources struct {
			Limits struct {
				Memory resource.Quantity `json:"memory"`
			} `json:"limits"`
		} `json:"resources"`
	}
	if err := yaml.Unmarshal(values, &v); err != nil {
		t.Fatal(err)
	}
	limit := v.Resources.Limits.Memory.Value()
	total := uint64(maxConcurrentReviews) * perReview
	t.Logf("a %d-byte review allocates %.1f MiB; %d at once %.1f MiB; the chart's limit %d MiB",
		len(body), float64(perReview)/(1<<20), maxConcurrentReviews, float64(total)/(1<<20), limit>>20)
	if limit <= 0 || total > uint64(limit)/4 {
		t.Errorf("%d reviews at once allocate %d MiB, over a quarter of the chart's memory limit (%d MiB)", maxConcurrentReviews, total>>20, limit>>20)
	}
}

func TestRequireNode(t *testing.T) {
	t.Parallel()
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

// The gate is always lifted: by the leader, the replacement of a move in flight gets a
// required affinity to the move's node (and the annotations), any other at once without; a
// replacement whose planned node cannot take it any more is released without; a pod gated
// past the timeout is released by any replica; a replica that does not lead waits for it.
func TestReleaseGated(t *testing.T) {
	t.Parallel()
	gatedPod := func(name string, created time.Time) *corev1.Pod {
		p := pod("shop", name, "cart", "", "ReplicaSet", created, 500)
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: GateName}, {Name: "other.io/gate"}}
		p.Status = corev1.PodStatus{Phase: corev1.PodPending}
		return p
	}
	young := t0.Add(-time.Second)
	for _, tc := range []struct {
		name      string
		created   time.Time
		leading   bool
		move      bool
		n2        *corev1.Node
		wantNode  string
		wantHow   string
		wantAfter bool
	}{
		{"planned", young, true, true, node("n2", 4000, 110), "n2", ReleasePlanned, false},
		{"no move awaits it", young, true, false, node("n2", 4000, 110), "", ReleaseUnplanned, false},
		{"planned node full", young, true, true, node("n2", 400, 110), "", ReleaseNodeUnfit, false},
		{"planned node cordoned", young, true, true, cordoned(node("n2", 4000, 110)), "", ReleaseNodeUnfit, false},
		{"planned node tainted", young, true, true, tainted(node("n2", 4000, 110), "x", corev1.TaintEffectNoExecute), "", ReleaseNodeUnfit, false},
		{"gated too long, not the leader", t0.Add(-DefaultGateTimeout - time.Second), false, true, node("n2", 4000, 110), "", ReleaseTimeout, false},
		{"not the leader, not timed out: wait", young, false, true, node("n2", 4000, 110), "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := started(t, Config{}, service("shop", "cart", true), node("n1", 4000, 110), tc.n2, gatedPod("cart-1", tc.created))
			if tc.move {
				leadingWith(c, "cart")
			}
			c.leading = tc.leading
			after, err := c.syncPod(context.Background(), discard{}, "shop/cart-1")
			if err != nil {
				t.Fatal(err)
			}
			if (after > 0) != tc.wantAfter {
				t.Errorf("look again after %v, want %v", after, tc.wantAfter)
			}
			got, err := c.cs.CoreV1().Pods("shop").Get(context.Background(), "cart-1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if hasGate(got) != (tc.wantHow == "") {
				t.Fatalf("gated %v, want %v", hasGate(got), tc.wantHow == "")
			}
			if len(got.Spec.SchedulingGates) == 0 || got.Spec.SchedulingGates[len(got.Spec.SchedulingGates)-1].Name != "other.io/gate" {
				t.Errorf("gates %v: another's gate must stay", got.Spec.SchedulingGates)
			}
			var node string
			if a := got.Spec.Affinity; a != nil && a.NodeAffinity != nil {
				node = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields[0].Values[0]
			}
			if node != tc.wantNode || got.Annotations[AnnotationPlacedOn] != tc.wantNode {
				t.Errorf("required node %q, annotation %q, want %q", node, got.Annotations[AnnotationPlacedOn], tc.wantNode)
			}
			for _, how := range []string{ReleasePlanned, ReleaseUnplanned, ReleaseNodeUnfit, ReleaseTimeout} {
				want := 0.0
				if how == tc.wantHow {
					want = 1
				}
				if v := testutil.ToFloat64(c.metrics.released.WithLabelValues(how)); v != want {
					t.Errorf("released{placement=%s} = %v, want %v", how, v, want)
				}
			}
			if tc.wantHow == ReleasePlanned {
				at, _ := c.st.leftAt("cart.shop", "n1")
				if c.st.Placed[got.UID] != t0 || at != t0 || c.st.inFlight("shop", ownerOf("cart")) >= 0 {
					t.Errorf("a planned release must start the cool-downs and end the move: %+v", c.st)
				}
				// The placement is in the state ConfigMap before the pod carries its annotations.
				written, patched := -1, -1
				for i, a := range c.cs.(*fake.Clientset).Actions() {
					switch {
					case a.GetResource().Resource == "configmaps" && (a.GetVerb() == "create" || a.GetVerb() == "update") && written < 0:
						written = i
					case a.GetResource().Resource == "pods" && a.GetVerb() == "patch":
						patched = i
					}
				}
				if st, err := c.loadState(context.Background()); err != nil || st.Placed[got.UID].IsZero() || written < 0 || written > patched {
					t.Errorf("the state records the placement %v (%v), written at action %d, the pod patched at %d: want written first",
						st.Placed, err, written, patched)
				}
			}
		})
	}
}

// A replacement released to its node and not bound within the placement timeout is deleted
// once (its controller recreates it) — if edgeflow placed it: the leader's state, or on a
// replica that does not lead the state ConfigMap, records it. Before the timeout it is left
// alone; an unbound pod carrying the annotations that the state does not record (a tenant
// wrote them on their own pod, or they outlived edgeflow's record) is never deleted, and is
// logged.
func TestPlacementTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		leading, record  bool
		wantDeleted      bool
		wantLogLeftAlone bool
	}{
		{"placed by the leader", true, true, true, false},
		{"placed, seen by a replica that does not lead", false, true, true, false},
		{"annotated, not placed: the leader", true, false, false, true},
		{"annotated, not placed: a replica that does not lead", false, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pod("shop", "cart-1", "cart", "", "ReplicaSet", t0.Add(-time.Hour), 500)
			p.Status = corev1.PodStatus{Phase: corev1.PodPending}
			p.Annotations = map[string]string{AnnotationPlacedOn: "n2", AnnotationPlacedAt: t0.Add(-DefaultPlacementTimeout + time.Second).Format(time.RFC3339)}
			var logs testkit.LogBuffer
			c := started(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, p)
			// Another pod placed: the state is not empty.
			c.st.Placed["shop/cart-0"] = t0.Add(-time.Hour)
			if tc.record {
				c.st.Placed[p.UID] = t0.Add(-DefaultPlacementTimeout + time.Second)
			}
			if err := c.saveState(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !tc.leading {
				c.st = newState() // the state of a replica that led before, or never
			}
			c.leading = tc.leading
			after, err := c.syncPod(context.Background(), discard{}, "shop/cart-1")
			if err != nil || after <= 0 || after > time.Second {
				t.Fatalf("before the timeout: look again after %v (%v), want within 1 s", after, err)
			}
			c.cfg.Clock.(*testingclock.FakeClock).Step(time.Second)
			if _, err := c.syncPod(context.Background(), discard{}, "shop/cart-1"); err != nil {
				t.Fatal(err)
			}
			_, err = c.cs.CoreV1().Pods("shop").Get(context.Background(), "cart-1", metav1.GetOptions{})
			if deleted := apierrors.IsNotFound(err); deleted != tc.wantDeleted {
				t.Errorf("deleted after the placement timeout: %v (%v), want %v", deleted, err, tc.wantDeleted)
			}
			want := 0.0
			if tc.wantDeleted {
				want = 1
			}
			if v := testutil.ToFloat64(c.metrics.placementFailures); v != want {
				t.Errorf("placement failures %v, want %v", v, want)
			}
			if left := strings.Contains(logs.String(), "left alone") && strings.Contains(logs.String(), "pod=shop/cart-1"); left != tc.wantLogLeftAlone {
				t.Errorf("logged as left alone: %v, want %v; log:\n%s", left, tc.wantLogLeftAlone, logs.String())
			}
		})
	}
}

// discard is an EventRecorder that drops events.
type discard struct{}

func (discard) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {}
