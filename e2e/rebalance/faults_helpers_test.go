package rebalance

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/rebalancer"
)

// rebalancerRules is what the rebalancer needs: the rules the chart grants when it acts
// (install/helm/edgeflow, checked against these by e2e/install).
func rebalancerRules() []rbacv1.PolicyRule { return rebalancer.PolicyRules() }

// without returns rules less one verb on one resource.
func without(rules []rbacv1.PolicyRule, resource, verb string) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, r := range rules {
		r = *r.DeepCopy()
		if len(r.Resources) == 1 && r.Resources[0] == resource {
			var verbs []string
			for _, v := range r.Verbs {
				if v != verb {
					verbs = append(verbs, v)
				}
			}
			r.Verbs = verbs
		}
		if len(r.Verbs) > 0 {
			out = append(out, r)
		}
	}
	return out
}

// serviceAccount creates the service account NAME in default, bound to a ClusterRole with
// rules, and returns a rest.Config that authenticates as it (a token from the TokenRequest
// API): the API server's RBAC judges what it may do.
func (w *world) serviceAccount(name string, rules []rbacv1.PolicyRule) *rest.Config {
	ctx := w.ctx
	if _, err := w.cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: "default"}}}, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	secs := int64(3600)
	tok, err := w.cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	rc := rest.AnonymousClientConfig(w.cluster.Config)
	rc.BearerToken = tok.Status.Token
	return rc
}

// webhookCert writes one self-signed certificate for every webhook server of the world.
func (w *world) webhookCert() (certPEM []byte, certFile, keyFile string) {
	dir := w.t.TempDir()
	certPEM, keyPEM := testkit.SelfSigned(w.t, "edgeflow-webhook", "127.0.0.1")
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		w.t.Fatal(err)
	}
	return certPEM, certFile, keyFile
}

// replicaWebhooks registers one placement webhook per replica address (the API server calls
// each; only a leader with a move in flight gates): what a Service in front of every replica
// amounts to for the question "which replica answers". Each address is served by serveAt.
func (w *world) replicaWebhooks(certPEM []byte, addrs ...string) {
	var hooks []admissionregistrationv1.MutatingWebhook
	for i, a := range addrs {
		url := fmt.Sprintf("https://%s%s", a, rebalancer.WebhookPath)
		h := rebalancer.MutatingWebhookConfiguration(admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: certPEM}).Webhooks[0]
		h.Name = fmt.Sprintf("r%d.%s", i, rebalancer.WebhookName)
		hooks = append(hooks, h)
	}
	cfg := rebalancer.MutatingWebhookConfiguration(admissionregistrationv1.WebhookClientConfig{})
	cfg.Webhooks = hooks
	if _, err := w.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(w.ctx, cfg, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// serveAt serves c's webhook on addr (127.0.0.1:0 picks one) once c's caches synced; it
// returns the address and a stop function (also run at the test's end).
func (w *world) serveAt(c *rebalancer.Controller, addr, certFile, keyFile string) (string, func()) {
	var lis net.Listener
	var err error
	// The address of a stopped server can take a moment to be free again.
	if !testkit.WaitUntil(10*time.Second, func() bool { lis, err = net.Listen("tcp", addr); return err == nil }) {
		w.t.Fatal(err)
	}
	stop := w.run("webhook", func(ctx context.Context) error {
		if err := c.WaitSynced(ctx); err != nil {
			lis.Close()
			return nil
		}
		return c.ServeWebhook(ctx, lis, certFile, keyFile)
	})
	return lis.Addr().String(), stop
}

// podLife is what the tracker saw of one pod, in the test's clock.
type podLife struct {
	name, owner        string
	seen               time.Time // first seen (created)
	gatedFrom, gatedTo time.Time // edgeflow's gate on (first seen) and off
	bound, ready, gone time.Time
	evicted            time.Time // a deletion began while bound
	placedOn           string
}

// tracker follows every pod of the namespace with an informer and records when each was
// created, gated, released, bound, ready, evicted and gone.
type tracker struct {
	mu   sync.Mutex
	pods map[string]*podLife // by UID
}

func (w *world) track() *tracker {
	tr := &tracker{pods: map[string]*podLife{}}
	w.watchPods(func(p *corev1.Pod, gone bool) {
		now := time.Now()
		tr.mu.Lock()
		defer tr.mu.Unlock()
		l := tr.pods[string(p.UID)]
		if l == nil {
			l = &podLife{name: p.Name, seen: now}
			if o := metav1.GetControllerOf(p); o != nil {
				l.owner = string(o.UID)
			}
			tr.pods[string(p.UID)] = l
		}
		gated := false
		for _, g := range p.Spec.SchedulingGates {
			gated = gated || g.Name == rebalancer.GateName
		}
		if gated && l.gatedFrom.IsZero() {
			l.gatedFrom = now
		}
		if !gated && !l.gatedFrom.IsZero() && l.gatedTo.IsZero() {
			l.gatedTo = now
		}
		if p.Spec.NodeName != "" && l.bound.IsZero() {
			l.bound = now
		}
		if isReady(p) && l.ready.IsZero() {
			l.ready = now
		}
		if p.DeletionTimestamp != nil && p.Spec.NodeName != "" && l.evicted.IsZero() && !l.ready.IsZero() {
			l.evicted = now
		}
		if v := p.Annotations[rebalancer.AnnotationPlacedOn]; v != "" {
			l.placedOn = v
		}
		if gone && l.gone.IsZero() {
			l.gone = now
		}
	})
	return tr
}

// lives returns a copy of what the tracker saw.
func (tr *tracker) lives() []podLife {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make([]podLife, 0, len(tr.pods))
	for _, l := range tr.pods {
		out = append(out, *l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seen.Before(out[j].seen) })
	return out
}

// waits measures, over the pods the tracker saw, the longest time one stayed gated and the
// longest it stayed Pending (seen → bound; a pod still unbound counts up to now; a pod that
// went away unbound counts until it went).
func (tr *tracker) waits() (gated, pending time.Duration, gatedName, pendingName string) {
	now := time.Now()
	for _, l := range tr.lives() {
		if !l.gatedFrom.IsZero() {
			end := l.gatedTo
			if end.IsZero() {
				end = orNow(l.gone, now)
			}
			if d := end.Sub(l.gatedFrom); d > gated {
				gated, gatedName = d, l.name
			}
		}
		end := l.bound
		if end.IsZero() {
			end = orNow(l.gone, now)
		}
		if d := end.Sub(l.seen); d > pending {
			pending, pendingName = d, l.name
		}
	}
	return gated, pending, gatedName, pendingName
}

func orNow(t, now time.Time) time.Time {
	if t.IsZero() {
		return now
	}
	return t
}

// evictions returns when the tracker saw pods evicted (a deletion of a running pod), sorted.
func (tr *tracker) evictions() []time.Time {
	var out []time.Time
	for _, l := range tr.lives() {
		if !l.evicted.IsZero() {
			out = append(out, l.evicted)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// auditEntry is the part of an audit event the tests read.
type auditEntry struct {
	Stage     string `json:"stage"`
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
}

// audit reads the API server's audit log: the completed requests whose user agent starts
// with prefix.
func (w *world) audit(prefix string) []auditEntry {
	f, err := os.Open(w.cluster.AuditLog)
	if err != nil {
		w.t.Fatal(err)
	}
	defer f.Close()
	var out []auditEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e auditEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			w.t.Fatalf("audit log: %v", err)
		}
		if e.Stage == "ResponseComplete" && strings.HasPrefix(e.UserAgent, prefix) {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil {
		w.t.Fatal(err)
	}
	return out
}

func isWrite(verb string) bool {
	switch verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// gatedPod creates a bare pod of app carrying edgeflow's gate (as if a replica had gated it).
func (w *world) gatedPod(name, app string) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: rebalancer.GateName}},
			Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
	if _, err := w.cs.CoreV1().Pods(ns).Create(w.ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		w.t.Fatal(err)
	}
}

// edgeflowEvents counts the events edgeflow's rebalancer reported, by reason.
func (w *world) edgeflowEvents() map[string]int {
	evs, err := w.cs.EventsV1().Events(ns).List(w.ctx, metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range evs.Items {
		if e.ReportingController == "edgeflow-rebalancer" {
			out[e.Reason]++
		}
	}
	return out
}

// allRunning says whether every pod of the namespace is bound and ready, none gated.
func (w *world) allRunning() bool {
	l, err := w.cs.CoreV1().Pods(ns).List(w.ctx, metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	for i := range l.Items {
		if l.Items[i].DeletionTimestamp == nil && !isReady(&l.Items[i]) {
			return false
		}
	}
	return true
}
