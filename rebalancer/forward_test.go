package rebalancer

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

// keyPair writes a fresh self-signed certificate for 127.0.0.1 and returns its files.
func keyPair(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM := testkit.SelfSigned(t, "edgeflow-webhook", "127.0.0.1")
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// serveWebhook runs c.ServeWebhook on 127.0.0.1 until the test ends and returns its address.
func serveWebhook(t *testing.T, c *Controller, certFile, keyFile string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.ServeWebhook(ctx, lis, certFile, keyFile) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeWebhook: %v", err)
		}
	})
	return lis.Addr().String()
}

// call posts a review to the webhook at addr (as the API server would) and returns the answer.
func call(t *testing.T, addr string, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a test client
	defer cl.CloseIdleConnections()
	resp, err := cl.Post("https://"+addr+WebhookPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r admissionv1.AdmissionReview
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("webhook at %s: %s", addr, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Response == nil {
		t.Fatalf("webhook at %s: %v, %+v", addr, err, r)
	}
	return r.Response
}

// A replica that does not lead forwards a review to the leader and relays its answer (the
// replacement is gated); it answers itself, ungated, when there is no leader, when the
// leader's certificate does not carry the webhook's own key, and never forwards a review
// another replica forwarded.
func TestWebhookForwardsToTheLeader(t *testing.T) {
	t.Parallel()
	objs := []runtime.Object{service("shop", "cart", true)}
	certFile, keyFile := keyPair(t)
	otherCert, otherKey := keyPair(t)

	leader := started(t, Config{Identity: "L"}, objs...)
	leadingWith(leader, "cart")
	imposter := started(t, Config{Identity: "I"}, objs...) // leads, but holds another key pair
	leadingWith(imposter, "cart")
	addrs := map[string]string{
		"L": serveWebhook(t, leader, certFile, keyFile),
		"I": serveWebhook(t, imposter, otherCert, otherKey),
	}
	resolve := func(_ context.Context, id string) (string, error) {
		if a, ok := addrs[id]; ok {
			return a, nil
		}
		return "", fmt.Errorf("no replica %q", id)
	}
	follower := func(leaderID string) (*Controller, string) {
		c := started(t, Config{Identity: "F", LeaderWebhook: resolve, Registerer: prometheus.NewRegistry()}, objs...)
		c.leader = leaderID
		return c, serveWebhook(t, c, certFile, keyFile)
	}
	body := review(t, pod("shop", "cart-1", "cart", "", "ReplicaSet", t0, 100))
	gatePatch := `[{"op":"add","path":"/spec/schedulingGates","value":[{"name":"edgeflow.io/placement"}]}]`
	for _, tc := range []struct {
		name, leader, result string
		gated                bool
	}{
		{"the leader answers", "L", ForwardOK, true},
		{"no leader known", "", ForwardNoLeader, false},
		{"the leader cannot be resolved", "gone", ForwardError, false},
		{"a leader without the webhook's key", "I", ForwardError, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, addr := follower(tc.leader)
			r := call(t, addr, body)
			if !r.Allowed || (string(r.Patch) == gatePatch) != tc.gated {
				t.Errorf("answer %+v (patch %s); want allowed, gated %v", r, r.Patch, tc.gated)
			}
			if n := testutil.ToFloat64(f.metrics.forwards.WithLabelValues(tc.result)); n != 1 {
				t.Errorf("edgeflow_rebalance_webhook_forwards_total{result=%q} = %v, want 1", tc.result, n)
			}
		})
	}

	// A forwarded review reaching a replica that does not lead is answered there, not forwarded.
	f, addr := follower("L")
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+WebhookPath, bytes.NewReader(body))
	req.Header.Set(ForwardedHeader, "G")
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a test client
	defer cl.CloseIdleConnections()
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var rv admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&rv); err != nil || rv.Response == nil || len(rv.Response.Patch) != 0 {
		t.Errorf("a forwarded review at a follower: %v, %+v; want answered there, ungated", err, rv.Response)
	}
	resp.Body.Close()
	for _, result := range []string{ForwardOK, ForwardNoLeader, ForwardError} {
		if n := testutil.ToFloat64(f.metrics.forwards.WithLabelValues(result)); n != 0 {
			t.Errorf("a forwarded review was forwarded again (result %s)", result)
		}
	}
}
