package rebalancer

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"k8s.io/apimachinery/pkg/types"

	"github.com/edgeflow/edgeflow/internal/certfile"
)

// WebhookPath is where Webhook is served.
const WebhookPath = "/mutate-pods"

// WebhookName is the name of the MutatingWebhookConfiguration and of its webhook.
const WebhookName = "placement.edgeflow.io"

// Webhook bounds.
const (
	// MaxReviewBytes bounds an AdmissionReview's body; a larger one gets 413, refused unread
	// when its Content-Length says so. The API server's own limit for a request body is 3 MiB
	// (k8s.io/apiserver server.Config MaxRequestBodyBytes), and a review of a pod CREATE
	// carries the pod once.
	MaxReviewBytes = 3 << 20
	// maxConcurrentReviews bounds the reviews read and answered at once. One more is answered
	// at once 429 with Retry-After: 1, its body unread: the API server's webhook client
	// (client-go's rest.Request) retries it after that second, within the registration's 5 s;
	// past them failurePolicy Ignore admits the pod ungated. A review holds its body, the
	// pod's copy the decoded review keeps and the decoded pod — about 3 × MaxReviewBytes at
	// most — so 8 of them stay under 100 MiB, a fifth of the chart's 512 MiB memory limit
	// (TestWebhookMemoryBound measures it).
	maxConcurrentReviews = 8
)

// Webhook returns the mutating admission webhook (AdmissionReview admission.k8s.io/v1 about
// core/v1 pods, CREATE). It gates a new pod — adds the scheduling gate GateName — only when
// this replica leads and a move of the pod's owner is in flight: the pod is that move's
// replacement. Every other pod is admitted unchanged: with no leader, nothing is gated. A body
// over MaxReviewBytes gets 413; a review of another group, version or kind, or about another
// resource, is refused (400), never answered allowed. At most maxConcurrentReviews are read
// and answered at once; one more gets 429 with Retry-After, unread. The informers must have synced (Start)
// before it is served. It answers every review itself: ServeWebhook forwards a follower's
// reviews to the leader (Config.LeaderWebhook).
func (c *Controller) Webhook() http.Handler { return c.webhook(nil) }

// ForwardedHeader marks a review a follower forwarded to the leader; its value is the
// follower's identity. A review carrying it is answered where it arrives, never forwarded
// again (so two replicas that each think the other leads cannot loop).
const ForwardedHeader = "X-Edgeflow-Forwarded-By"

// forwardTimeout bounds one forwarded review: under the registration's 5 s, so that a follower
// whose leader does not answer still answers the API server itself.
const forwardTimeout = 3 * time.Second

// Results of edgeflow_rebalance_webhook_forwards_total.
const (
	ForwardOK       = "ok"        // the leader answered
	ForwardNoLeader = "no_leader" // no leader known (or this replica is named and not leading yet): answered here
	ForwardError    = "error"     // the leader could not be resolved or did not answer: answered here
)

// forwarder carries a follower's reviews to the leader's webhook.
type forwarder struct {
	client  *http.Client
	resolve func(ctx context.Context, identity string) (string, error)
}

// webhook is Webhook, forwarding a follower's reviews with fwd (nil: never).
func (c *Controller) webhook(fwd *forwarder) http.Handler {
	slots := make(chan struct{}, maxConcurrentReviews)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
			return
		}
		if r.ContentLength > MaxReviewBytes {
			http.Error(w, fmt.Sprintf("an AdmissionReview is at most %d bytes, not %d", MaxReviewBytes, r.ContentLength), http.StatusRequestEntityTooLarge)
			return
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, fmt.Sprintf("busy: %d reviews in flight, retry", maxConcurrentReviews), http.StatusTooManyRequests)
			return
		}
		body, err := readReview(w, r)
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
		if fwd != nil && r.Header.Get(ForwardedHeader) == "" && !c.Leading() {
			answer, result, err := c.forward(r.Context(), fwd, body, review.Request.UID)
			c.metrics.forwards.WithLabelValues(result).Inc()
			c.forwarded(err)
			if err == nil {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(answer)
				return
			}
		}
		resp := c.admit(review.Request)
		review.Response = resp
		review.Request = nil
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&review)
	})
}

// readReview reads a review's body, at most MaxReviewBytes: into one buffer of its
// Content-Length when it has one (already checked against the bound), else growing up to the
// bound.
func readReview(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, MaxReviewBytes)
	if r.ContentLength < 0 {
		return io.ReadAll(body)
	}
	buf := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(body, buf); err != nil {
		return nil, fmt.Errorf("reading the review: %w", err)
	}
	return buf, nil
}

// forward sends a review (body, as received) to the leader's webhook and returns the leader's
// answer, re-encoded, with the forwards metric's result. An error means the review is to be
// answered here.
func (c *Controller) forward(ctx context.Context, fwd *forwarder, body []byte, uid types.UID) ([]byte, string, error) {
	leader := c.Leader()
	if leader == "" || leader == c.identity() {
		return nil, ForwardNoLeader, errors.New("no leader to forward to")
	}
	ctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	defer cancel()
	addr, err := fwd.resolve(ctx, leader)
	if err != nil {
		return nil, ForwardError, fmt.Errorf("the leader %s's webhook: %w", leader, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+WebhookPath, bytes.NewReader(body))
	if err != nil {
		return nil, ForwardError, fmt.Errorf("the leader %s's webhook at %s: %w", leader, addr, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(ForwardedHeader, c.identity())
	resp, err := fwd.client.Do(req)
	if err != nil {
		return nil, ForwardError, fmt.Errorf("the leader %s's webhook at %s: %w", leader, addr, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, MaxReviewBytes))
	if err != nil {
		return nil, ForwardError, fmt.Errorf("the leader %s's webhook at %s: %w", leader, addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, ForwardError, fmt.Errorf("the leader %s's webhook at %s: %s", leader, addr, resp.Status)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(answer, &review); err != nil || review.Response == nil || review.Response.UID != uid {
		return nil, ForwardError, fmt.Errorf("the leader %s's webhook at %s: not an answer to review %s", leader, addr, uid)
	}
	out, err := json.Marshal(&review)
	if err != nil {
		return nil, ForwardError, err
	}
	return out, ForwardOK, nil
}

// forwarded logs a forwarding failure once per streak and reason, and the first success
// after failures.
func (c *Controller) forwarded(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	c.mu.Lock()
	prev := c.forwardErr
	c.forwardErr = msg
	c.mu.Unlock()
	switch {
	case msg == prev:
	case msg != "":
		c.log.Warn("rebalancer: webhook: cannot forward reviews to the leader; answering them here (not gated)", "error", err)
	default:
		c.log.Info("rebalancer: webhook: forwarding reviews to the leader again")
	}
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
//
// With Config.LeaderWebhook, a replica that does not lead forwards each review to the leader's
// webhook (once: ForwardedHeader) and relays its answer, so every review is decided by the one
// replica that knows the moves in flight, whichever replica the webhook Service picked. The
// leader must present a certificate with this replica's own public key (the replicas share the
// webhook's Secret); no other server is trusted with a review. If there is no leader, or it
// cannot be resolved or does not answer within forwardTimeout, the follower answers itself
// (admitted ungated, as with failurePolicy Ignore), logged once per streak and counted in
// edgeflow_rebalance_webhook_forwards_total.
func (c *Controller) ServeWebhook(ctx context.Context, l net.Listener, certFile, keyFile string) error {
	kp, err := certfile.New(certfile.Files{CertFile: certFile, KeyFile: keyFile}, "rebalancer: webhook", c.log)
	if err != nil {
		l.Close()
		return err
	}
	var fwd *forwarder
	if c.cfg.LeaderWebhook != nil {
		fwd = &forwarder{resolve: c.cfg.LeaderWebhook, client: &http.Client{Transport: &http.Transport{
			// Verified by VerifyConnection: the peer holds the webhook's own key pair.
			TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true, //nolint:gosec // pinned by VerifyConnection
				VerifyConnection: func(cs tls.ConnectionState) error { return samePublicKey(kp, cs) }},
			MaxIdleConnsPerHost: maxConcurrentReviews, IdleConnTimeout: 90 * time.Second,
		}}}
		defer fwd.client.CloseIdleConnections()
	}
	mux := http.NewServeMux()
	mux.Handle(WebhookPath, c.webhook(fwd))
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

// samePublicKey accepts a peer whose certificate carries the public key of this replica's own
// webhook certificate (kp's): the leader, which serves the same Secret.
func samePublicKey(kp *certfile.Source, cs tls.ConnectionState) error {
	own, err := kp.GetCertificate(nil)
	if err != nil || own == nil || len(own.Certificate) == 0 {
		return fmt.Errorf("rebalancer: webhook: no own certificate to compare the leader's with: %v", err)
	}
	leaf, err := x509.ParseCertificate(own.Certificate[0])
	if err != nil {
		return fmt.Errorf("rebalancer: webhook: own certificate: %w", err)
	}
	if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].RawSubjectPublicKeyInfo, leaf.RawSubjectPublicKeyInfo) {
		return errors.New("rebalancer: webhook: the leader's certificate does not carry the webhook's public key")
	}
	return nil
}
