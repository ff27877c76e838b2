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
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/internal/certfile"
)

// WebhookPath is where Webhook is served.
const WebhookPath = "/mutate-pods"

// WebhookName is the name of the MutatingWebhookConfiguration and of its webhook.
const WebhookName = "placement.edgeflow.io"

// Webhook bounds.
const (
	// MaxReviewBytes bounds an AdmissionReview's body; a larger one gets 413. The API server
	// sends at most its own request limit (3 MiB by default) plus the review's envelope.
	MaxReviewBytes = 3 << 20
	// maxConcurrentReviews bounds the reviews answered at once; the rest wait (the API server
	// gives up after the registration's 5 s, and failurePolicy Ignore admits the pod ungated).
	maxConcurrentReviews = 64
)

// Webhook returns the mutating admission webhook (AdmissionReview admission.k8s.io/v1 about
// core/v1 pods, CREATE). It gates a new pod — adds the scheduling gate GateName — only when
// this replica leads and a move of the pod's owner is in flight: the pod is that move's
// replacement. Every other pod is admitted unchanged: with no leader, nothing is gated. A body
// over MaxReviewBytes gets 413; a review of another group, version or kind, or about another
// resource, is refused (400), never answered allowed. The informers must have synced (Start)
// before it is served.
func (c *Controller) Webhook() http.Handler {
	slots := make(chan struct{}, maxConcurrentReviews)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
			return
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		case <-r.Context().Done():
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxReviewBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				http.Error(w, fmt.Sprintf("an AdmissionReview is at most %d bytes", MaxReviewBytes), http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &review); err != nil {
			http.Error(w, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
			return
		}
		if err := checkReview(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp := c.admit(review.Request)
		review.Response = resp
		review.Request = nil
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&review)
	})
}

// checkReview refuses a review that is not an admission.k8s.io/v1 AdmissionReview about
// core/v1 pods: the registration asks for nothing else.
func checkReview(r *admissionv1.AdmissionReview) error {
	if gvk := r.GroupVersionKind(); gvk != admissionv1.SchemeGroupVersion.WithKind("AdmissionReview") {
		return fmt.Errorf("refused: a review of apiVersion %q kind %q (want admission.k8s.io/v1 AdmissionReview)", r.APIVersion, r.Kind)
	}
	if r.Request == nil {
		return errors.New("refused: an AdmissionReview without a request")
	}
	k, res := r.Request.Kind, r.Request.Resource
	if k.Group != "" || k.Version != "v1" || k.Kind != "Pod" || res.Group != "" || res.Version != "v1" || res.Resource != "pods" || r.Request.SubResource != "" {
		return fmt.Errorf("refused: a review of %s %s/%s (resource %s): this webhook reviews core/v1 pods only",
			k.Kind, k.Group, k.Version, res.Resource)
	}
	return nil
}

// admit answers one admission request about a pod; it always allows.
func (c *Controller) admit(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation != admissionv1.Create {
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

// gates says whether the webhook gates the pod: not bound, not gated yet, and the replacement
// of a move in flight of this leader (expects).
func (c *Controller) gates(p *corev1.Pod) bool {
	if !c.Acting() || p.Spec.NodeName != "" || hasGate(p) {
		return false
	}
	return c.expects(p)
}

// MutatingWebhookConfiguration returns the webhook's registration for the given client
// config (a Service reference in a cluster, or a URL) and CA bundle, labelled ManagedByLabel
// (uninstall removes only a registration that carries it). Its failurePolicy is
// Ignore: with the webhook down, pods are created ungated and schedule as usual. It sees only
// pod CREATEs, outside kube-system, within 5 s.
func MutatingWebhookConfiguration(cc admissionregistrationv1.WebhookClientConfig) *admissionregistrationv1.MutatingWebhookConfiguration {
	ignore := admissionregistrationv1.Ignore
	none := admissionregistrationv1.SideEffectClassNone
	never := admissionregistrationv1.NeverReinvocationPolicy
	timeout := int32(5)
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: WebhookName, Labels: map[string]string{ManagedByLabel: ManagedByValue, ComponentLabel: ComponentValue}},
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
	kp, err := certfile.New(certfile.Files{CertFile: certFile, KeyFile: keyFile}, "rebalancer: webhook", c.log)
	if err != nil {
		l.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(WebhookPath, c.Webhook())
	// The API server waits 5 s for an answer (the registration's timeout): a client slower
	// than these is not the API server.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: 90 * time.Second, MaxHeaderBytes: 64 << 10,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: kp.GetCertificate}}
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
