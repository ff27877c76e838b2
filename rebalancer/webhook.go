package rebalancer

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WebhookPath is where Webhook is served.
const WebhookPath = "/mutate-pods"

// WebhookName is the name of the MutatingWebhookConfiguration and of its webhook.
const WebhookName = "placement.edgeflow.io"

// Webhook returns the mutating admission webhook (AdmissionReview v1, pods, CREATE). It gates a
// new pod — adds the scheduling gate GateName — when the controller acts (not dry-run), the pod
// is not bound, is owned by a controller other than a DaemonSet, and backs a managed Service
// of a managed namespace. Every other pod is admitted unchanged. The informers must have
// synced (Start) before it is served.
func (c *Controller) Webhook() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
			http.Error(w, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
			return
		}
		resp := c.admit(review.Request)
		review.Response = resp
		review.Request = nil
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&review)
	})
}

// admit answers one admission request; it always allows.
func (c *Controller) admit(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Kind != "Pod" || req.Operation != admissionv1.Create {
		return resp
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		c.log.Info("rebalancer: webhook: undecodable pod, admitted unchanged", "error", err)
		return resp
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	if !c.gates(&pod) {
		return resp
	}
	op := map[string]any{"op": "add", "path": "/spec/schedulingGates/-", "value": corev1.PodSchedulingGate{Name: GateName}}
	if len(pod.Spec.SchedulingGates) == 0 {
		op = map[string]any{"op": "add", "path": "/spec/schedulingGates", "value": []corev1.PodSchedulingGate{{Name: GateName}}}
	}
	patch, _ := json.Marshal([]any{op})
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	return resp
}

// gates says whether the webhook gates the pod.
func (c *Controller) gates(p *corev1.Pod) bool {
	if !c.Acting() || p.Spec.NodeName != "" || hasGate(p) {
		return false
	}
	owner := metav1.GetControllerOf(p)
	if owner == nil || owner.Kind == "DaemonSet" {
		return false
	}
	// The Service listers hold only the managed namespaces.
	return c.serviceOf(p) != ""
}

// MutatingWebhookConfiguration returns the webhook's registration for the given client
// config (a Service reference in a cluster, or a URL) and CA bundle. Its failurePolicy is
// Ignore: with the webhook down, pods are created ungated and schedule as usual. It sees only
// pod CREATEs, outside kube-system, within 5 s.
func MutatingWebhookConfiguration(cc admissionregistrationv1.WebhookClientConfig) *admissionregistrationv1.MutatingWebhookConfiguration {
	ignore := admissionregistrationv1.Ignore
	none := admissionregistrationv1.SideEffectClassNone
	never := admissionregistrationv1.NeverReinvocationPolicy
	timeout := int32(5)
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: WebhookName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         WebhookName,
			ClientConfig: cc,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"},
					Resources: []string{"pods"}},
			}},
			FailurePolicy:           &ignore,
			SideEffects:             &none,
			ReinvocationPolicy:      &never,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system"}}}},
		}},
	}
}

// ServeWebhook serves Webhook over HTTPS on l until ctx is done. The certificate and key are
// read from files, and read again when either file changes (a renewed Secret mounted in the
// pod, cert-manager), so a renewal needs no restart; a file that cannot be read keeps the last
// good pair. It returns nil when ctx is done, after the server stopped.
func (c *Controller) ServeWebhook(ctx context.Context, l net.Listener, certFile, keyFile string) error {
	kp := &keyPair{certFile: certFile, keyFile: keyFile}
	if _, err := kp.get(nil); err != nil {
		l.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(WebhookPath, c.Webhook())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: kp.get}}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(l, "", "") }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

// keyPair is a certificate and key read from files, read again when a file's modification
// time changes.
type keyPair struct {
	certFile, keyFile string
	mu                sync.Mutex
	mtime             [2]time.Time
	cert              *tls.Certificate
}

func (k *keyPair) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var mt [2]time.Time
	for i, f := range []string{k.certFile, k.keyFile} {
		st, err := os.Stat(f)
		if err != nil {
			if k.cert != nil {
				return k.cert, nil
			}
			return nil, fmt.Errorf("rebalancer: webhook TLS: %w", err)
		}
		mt[i] = st.ModTime()
	}
	if k.cert != nil && mt == k.mtime {
		return k.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		if k.cert != nil {
			return k.cert, nil
		}
		return nil, fmt.Errorf("rebalancer: webhook TLS: %w", err)
	}
	k.cert, k.mtime = &cert, mt
	return k.cert, nil
}
