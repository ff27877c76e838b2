package reproduce

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/rebalancer"
)

// Rebalanced is what one `edgeflow rebalance` did: its evictions, and the predicted LATA cost
// (its model: Σ req/s × measured RTT, ms·req/s) of the placement it found and of the one it
// left.
type Rebalanced struct {
	Moves               int
	CostBefore, CostNow float64
	// Settled: it finished its plan (two runs since its last move, every pod placed, its
	// planned gain under the threshold) before the timeout.
	Settled bool
}

// Rebalance runs `edgeflow rebalance --dry-run=false` on the cluster (with its placement
// webhook registered), a run every period on RTTs averaged over window, until it has made its
// moves and the pods settled, or until timeout.
func (h *Harness) Rebalance(a App, rate float64, period, window, timeout time.Duration) Rebalanced {
	r, webhookAddr, metricsAddr, caPEM := h.startRebalance(a, rate, period, window)
	u := "https://" + webhookAddr + rebalancer.WebhookPath
	cfg := rebalancer.MutatingWebhookConfiguration(admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: caPEM})
	if _, err := h.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(h.ctx, cfg, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	defer func() {
		r.stop()
		_ = h.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(h.ctx, cfg.Name, metav1.DeleteOptions{})
		// What it decided: every run that planned moves (its predicted costs, the moves it
		// skipped and why) and every eviction.
		for _, line := range r.lines("rebalancer: run", "rebalancer: evicted", "rebalancer: eviction refused") {
			if !strings.Contains(line, "planned=0") {
				fmt.Fprintf(h.log, "rebalance log: %s\n", line)
			}
		}
	}()
	deadline := time.Now().Add(timeout)
	var moves, lastMoves, runsAtLast, gain float64
	var out Rebalanced
	const current = `edgeflow_rebalance_predicted_latency_cost_seconds{placement="current"}`
	for time.Now().Before(deadline) {
		if r.exited() {
			h.t.Fatalf("edgeflow rebalance exited:\n%s", r.tail())
		}
		select {
		case <-h.ctx.Done():
			h.t.Fatalf("stopped while edgeflow rebalance ran (%g moves): %v", moves, context.Cause(h.ctx))
		case <-time.After(time.Second):
		}
		m, err := metrics(metricsAddr)
		if err != nil {
			continue
		}
		moves = m["edgeflow_rebalance_moves_total"]
		runs := m["edgeflow_rebalance_runs_total"]
		if c, ok := m[current]; ok && runs > 0 {
			if out.CostBefore == 0 {
				out.CostBefore = c * 1000
			}
			out.CostNow = c * 1000
		}
		out.Moves = int(moves)
		if moves != lastMoves {
			lastMoves, runsAtLast = moves, runs
			fmt.Fprintf(h.log, "rebalance: %g moves so far\n", moves)
		}
		// Settled: two runs since the last move, every pod placed, and the last run's target
		// gains less than the threshold over the placement now. A run without an eviction is
		// not enough: moves wait out the per-node limit and their service's replacements, and
		// stopping between them leaves half a plan, whose predicted cost can be above the
		// start's (each move's cost assumes the moves before it; a full run stopped DAG B
		// after 2 of 3 moves that way).
		gain = m["edgeflow_rebalance_planned_gain_ratio"]
		if runs >= runsAtLast+2 && h.unsettled(a) == "" && gain < rebalancer.DefaultThreshold {
			out.Settled = true
			return out
		}
	}
	fmt.Fprintf(h.log, "rebalance: not settled within %v (%g moves; the last run's planned gain %.3f; %s)\n", timeout, moves, gain, h.unsettled(a))
	return out
}

// startRebalance starts `edgeflow rebalance --dry-run=false` with its webhook and metrics on
// picked loopback ports and waits until its metrics answer (it binds the webhook's port
// before them); a bind that fails (the port taken since the pick) starts it again on others.
func (h *Harness) startRebalance(a App, rate float64, period, window time.Duration) (r *proc, webhookAddr, metricsAddr string, caPEM []byte) {
	certFile, keyFile, caPEM := h.selfSigned()
	calls := h.callGraph(a, rate)
	for try := 1; ; try++ {
		addrs := pickLoopbacks(h.t, 2)
		webhookAddr, metricsAddr = addrs[0], addrs[1]
		r = h.start("rebalance", "rebalance", "--dry-run=false", "--kubeconfig", h.cluster.Kubeconfig, "--prometheus-url", h.promURL,
			"--calls", calls, "--namespaces", ns, "--lease-namespace", "default", "--period", period.String(), "--min-age", "1s",
			"--prometheus-window", window.String(),
			"--webhook-address", webhookAddr, "--webhook-tls-cert", certFile, "--webhook-tls-key", keyFile,
			"--metrics-address", metricsAddr, "--prometheus-interval", "2s")
		var exited error
		h.eventually(60*time.Second, "edgeflow rebalance's metrics", func() bool {
			if r.exited() {
				exited = fmt.Errorf("edgeflow rebalance exited:\n%s", r.tail())
				return true
			}
			_, err := metrics(metricsAddr)
			return err == nil
		})
		if exited == nil {
			return r, webhookAddr, metricsAddr, caPEM
		}
		if try == bindTries || !bindFailed(exited) {
			h.t.Fatal(exited)
		}
		fmt.Fprintf(h.log, "rebalance: a picked port was taken before it bound; starting it again on others\n")
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key, for the webhook.
func (h *Harness) selfSigned() (certFile, keyFile string, certPEM []byte) {
	certPEM, keyPEM := testkit.SelfSigned(h.t, "edgeflow-webhook", "127.0.0.1")
	certFile, keyFile = filepath.Join(h.dir, "webhook.crt"), filepath.Join(h.dir, "webhook.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		h.t.Fatal(err)
	}
	return certFile, keyFile, certPEM
}
