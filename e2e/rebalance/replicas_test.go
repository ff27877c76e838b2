package rebalance

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/rebalancer"
)

// Every replica serves the webhook and the webhook Service may send a review to any of them;
// only the leader knows its moves in flight. With two replicas and the API server reaching only
// the follower (the worst case of a Service's spread), every replacement of the leader's moves
// is still gated and placed: the follower forwards each review to the leader
// (Config.LeaderWebhook) and relays its answer.
func TestEveryReplicaGates(t *testing.T) {
	t.Parallel()
	w := newWorld(t, threeNodes()...)
	badLayout(w)
	w.pdb("frontend", 2)
	w.pdb("backend", 2)
	w.topology()
	w.waitTopology(6)

	// The replicas' webhook addresses by identity, as the Lease names them.
	var mu sync.Mutex
	addrs := map[string]string{}
	resolve := func(_ context.Context, identity string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if a, ok := addrs[identity]; ok {
			return a, nil
		}
		return "", fmt.Errorf("no replica %q", identity)
	}
	a, regA := w.controller(rebalancer.Config{Identity: "a", LeaderWebhook: resolve})
	b, regB := w.controller(rebalancer.Config{Identity: "b", LeaderWebhook: resolve})
	certPEM, certFile, keyFile := w.webhookCert() // one Secret, as the replicas of a Deployment share it
	addrA, _ := w.serveAt(a, "127.0.0.1:0", certFile, keyFile)
	addrB, _ := w.serveAt(b, "127.0.0.1:0", certFile, keyFile)
	mu.Lock()
	addrs["a"], addrs["b"] = addrA, addrB
	mu.Unlock()

	w.start(a, "a")
	testkit.Eventually(t, 30*time.Second, "a leading", a.Leading)
	w.start(b, "b")
	testkit.Eventually(t, 30*time.Second, "b following a", func() bool { return b.Leader() == "a" && !b.Leading() })
	url := fmt.Sprintf("https://%s%s", addrB, rebalancer.WebhookPath)
	cfg := rebalancer.MutatingWebhookConfiguration(admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: certPEM})
	if _, err := w.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(w.ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var moves float64
	testkit.Eventually(t, 150*time.Second, "at least 3 moves, each replacement placed and every pod ready", func() bool {
		moves = metric(t, regA, "edgeflow_rebalance_moves_total", nil)
		if moves < 3 || len(w.unplaced()) > 0 {
			return false
		}
		placed := metric(t, regA, "edgeflow_rebalance_gates_released_total", nil)
		if placed < moves {
			return false
		}
		for _, app := range []string{"frontend", "backend"} {
			ps := w.pods(app)
			if len(ps) != 3 {
				return false
			}
			for i := range ps {
				if !isReady(&ps[i]) {
					return false
				}
			}
		}
		return true
	})
	moves = metric(t, regA, "edgeflow_rebalance_moves_total", nil)
	planned := metric(t, regA, "edgeflow_rebalance_gates_released_total", map[string]string{"placement": rebalancer.ReleasePlanned})
	released := metric(t, regA, "edgeflow_rebalance_gates_released_total", nil) + metric(t, regB, "edgeflow_rebalance_gates_released_total", nil)
	forwarded := metric(t, regB, "edgeflow_rebalance_webhook_forwards_total", map[string]string{"result": rebalancer.ForwardOK})
	notForwarded := metric(t, regB, "edgeflow_rebalance_webhook_forwards_total", nil) - forwarded
	t.Logf("%v moves by a; %v replacements placed through the gate (%v gates released in all); b forwarded %v reviews to a, answered %v itself",
		moves, planned, released, forwarded, notForwarded)
	if planned != moves {
		t.Errorf("%v of %v replacements placed through the gate: every replacement must be gated, whichever replica the API server calls", planned, moves)
	}
	if forwarded < moves {
		t.Errorf("b forwarded %v reviews to the leader, fewer than the %v replacements", forwarded, moves)
	}
	if a.Leader() != "a" || b.Leading() {
		t.Errorf("the leadership moved during the test (a sees %q, b leading %v)", a.Leader(), b.Leading())
	}
	// A Placed event on every replacement.
	evs, err := w.cs.EventsV1().Events(ns).List(w.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	placedEvents := 0
	for _, e := range evs.Items {
		if e.ReportingController == "edgeflow-rebalancer" && e.Reason == "Placed" {
			placedEvents++
		}
	}
	if float64(placedEvents) != moves {
		t.Errorf("%d Placed events, want one per move (%v)", placedEvents, moves)
	}
}
