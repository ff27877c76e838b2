package install

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
)

// Messages edgeflow serve logs (xds/istio's writes, cmd/edgeflow's Istio writer).
const (
	logLeading = `msg="Istio writer: leading; this replica writes"`
	ruleName   = "edgeflow.frontend.backend.shop"
)

// metricsAt finds the metrics address in the line edgeflow serve prints once it serves.
var metricsAt = regexp.MustCompile(`^edgeflow serve: xDS on \S+, metrics http://(\S+)/metrics`)

var logWrites = []string{`msg="DestinationRule created"`, `msg="DestinationRule updated"`, `msg="DestinationRule deleted"`}

// replica is one edgeflow serve process of TestIstioWriterIsLeaderElected.
type replica struct {
	name, metrics, logFile string
	cmd                    *exec.Cmd
	done                   chan struct{}
}

// TestIstioWriterIsLeaderElected: two `edgeflow serve --istio-mode=destinationrule` processes
// follow the same real kube-apiserver (Istio's CRDs installed) with the default Lease timings
// (15/10/2 s). Exactly one holds the Lease edgeflow-istio and only it writes the
// DestinationRule, also for a change both see; the follower logs no write before it leads.
// The leader is killed with SIGKILL (its Lease is not released) and the cluster changes at
// once: the follower takes the Lease and writes the change within LeaseDuration + 5 s.
func TestIstioWriterIsLeaderElected(t *testing.T) {
	c := kubeapi.Start(t, kubeapi.Options{})
	cl := newClient(t, c.Config)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cs := c.Client
	cl.installCRDs(ctx, t, istioCRDs(t))
	createNamespaces(ctx, t, cs, namespace, appNS)
	for _, n := range []string{"n1", "n2", "n3"} { // each its own locality: the plan is per node
		if _, err := kubeapi.CreateNode(ctx, cs, kubeapi.NodeSpec{Name: n, Labels: map[string]string{
			"topology.kubernetes.io/region": "edge", "topology.kubernetes.io/zone": "z1", "topology.istio.io/subzone": n}}); err != nil {
			t.Fatal(err)
		}
	}
	k := kubeapi.NewKubelet(t, ctx, cs, appNS, appPort)
	k.Service("frontend", true)
	k.Service("backend", true)
	k.Pod("frontend", "frontend-1", "n1", "198.18.3.1", true)
	k.Pod("frontend", "frontend-2", "n2", "198.18.3.2", true)
	k.Pod("backend", "backend-2", "n2", "198.18.3.12", true)
	k.Pod("backend", "backend-3", "n3", "198.18.3.13", true)

	dir := t.TempDir()
	calls := filepath.Join(dir, "calls.yaml")
	if err := os.WriteFile(calls, []byte("calls:\n- {from: frontend.shop, to: backend.shop}\ningress:\n- {service: frontend.shop, rps: 300}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := testkit.Binary(t)
	start := func(name string) *replica {
		r := &replica{name: name, logFile: filepath.Join(dir, name+".log"), done: make(chan struct{})}
		f, err := os.Create(r.logFile)
		if err != nil {
			t.Fatal(err)
		}
		// Port 0: the process binds its own ports and prints them.
		r.cmd = exec.Command(bin, "serve", "--kubeconfig", c.Kubeconfig, "--calls", calls, "--default-latency", "10",
			"--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
			"--istio-mode", "destinationrule", "--namespaces", appNS, "--rebalance-lease-namespace", namespace)
		r.cmd.Stdout, r.cmd.Stderr = f, f
		r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		exited, err := testkit.StartChild(r.cmd) // Pdeathsig follows the forking thread: StartChild keeps it
		if err != nil {
			t.Fatal(err)
		}
		go func() { <-exited; f.Close(); close(r.done) }()
		t.Cleanup(func() {
			_ = r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(10 * time.Second):
				_ = r.cmd.Process.Kill()
				<-r.done
			}
			if t.Failed() {
				b, _ := os.ReadFile(r.logFile)
				t.Logf("%s's log:\n%s", name, b)
			}
		})
		testkit.Eventually(t, 60*time.Second, name+"'s metrics address", func() bool {
			for _, l := range logLines(t, r) {
				if m := metricsAt.FindStringSubmatch(l); m != nil {
					r.metrics = m[1]
					return true
				}
			}
			return false
		})
		return r
	}
	a, b := start("a"), start("b")
	waitHTTP(t, "http://"+a.metrics+"/readyz", 60*time.Second)
	waitHTTP(t, "http://"+b.metrics+"/readyz", 60*time.Second)

	// Exactly one leads, and it wrote the rule.
	var lead, follow *replica
	testkit.Eventually(t, 30*time.Second, "one replica leads", func() bool {
		la, lb := gauge(t, a, "edgeflow_istio_leader"), gauge(t, b, "edgeflow_istio_leader")
		if la+lb > 1 {
			t.Fatalf("both replicas lead (edgeflow_istio_leader %v, %v)", la, lb)
		}
		switch {
		case la == 1:
			lead, follow = a, b
		case lb == 1:
			lead, follow = b, a
		}
		return lead != nil
	})
	testkit.Eventually(t, 30*time.Second, "the rule written", func() bool { return ruleHas(ctx, t, cl, "edge/z1/n3") })
	if h := leaseHolder(ctx, t, cs); h == "" {
		t.Fatalf("the Lease %s/edgeflow-istio has no holder while %s leads", namespace, lead.name)
	}
	first := leaseHolder(ctx, t, cs)
	t.Logf("%s leads (Lease held by %s)", lead.name, first)

	// A change both replicas see: only the leader writes it.
	k.Pod("backend", "backend-1", "n1", "198.18.3.11", true)
	testkit.Eventually(t, 30*time.Second, "the rule naming n1's backend", func() bool { return ruleHas(ctx, t, cl, `"edge/z1/n1":`) })
	readyzSays(t, follow, "follower: ")
	readyzSays(t, lead, "leader: ")
	// The leader logs a write once the API server has answered it, so the rule may be read
	// here a moment before the line is written.
	testkit.Eventually(t, 5*time.Second, "the leader logging the create and the update", func() bool { return count(t, lead, logWrites...) >= 2 })
	if n := count(t, follow, logWrites...); n != 0 || gauge(t, follow, "edgeflow_istio_leader") != 0 {
		t.Fatalf("the follower wrote %d times", n)
	}

	// The leader dies without releasing the Lease; the cluster changes at once.
	killed := time.Now()
	if err := lead.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-lead.done
	k.DeletePod("backend", "backend-3")
	// client-go's follower takes the Lease LeaseDuration after it saw the last renewal, which it
	// sees at its next try, and tries every RetryPeriod × [1, 2.2] (jitter factor 1.2): at worst
	// 15 + 4.4 + 4.4 s after the kill; 1.2 s more for the write.
	const leaseDuration, bound = 15 * time.Second, 10 * time.Second
	var tookOver time.Duration
	testkit.Eventually(t, leaseDuration+bound, "the follower leads", func() bool {
		if gauge(t, follow, "edgeflow_istio_leader") == 1 {
			tookOver = time.Since(killed)
			return true
		}
		return false
	})
	testkit.Eventually(t, leaseDuration+bound-time.Since(killed), "the change written by the new leader", func() bool { return !ruleHas(ctx, t, cl, "edge/z1/n3") })
	written := time.Since(killed)
	t.Logf("leader %s killed: %s led after %.1f s, the change was written %.1f s after the kill (LeaseDuration 15 s)",
		lead.name, follow.name, tookOver.Seconds(), written.Seconds())
	if h := leaseHolder(ctx, t, cs); h == "" || h == first {
		t.Errorf("the Lease is held by %q after the takeover (before: %q)", h, first)
	}
	readyzSays(t, follow, "leader: ")

	// The follower wrote nothing before it led.
	lines := logLines(t, follow)
	led := -1
	for i, l := range lines {
		if strings.Contains(l, logLeading) {
			led = i
			break
		}
	}
	if led < 0 {
		t.Fatal("the new leader never logged that it leads")
	}
	for _, l := range lines[:led] {
		for _, w := range logWrites {
			if strings.Contains(l, w) {
				t.Errorf("the follower wrote before it led: %s", l)
			}
		}
	}
	if n := count(t, follow, logWrites...); n == 0 {
		t.Error("the new leader logged no write")
	}
}

// gauge reads a gauge without labels from r's /metrics (0 when absent).
func gauge(t *testing.T, r *replica, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		t.Fatalf("%s: %v", r.name, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var v float64
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			if _, err := fmt.Sscan(f[1], &v); err == nil {
				return v
			}
		}
	}
	return 0
}

func readyzSays(t *testing.T, r *replica, want string) {
	t.Helper()
	resp, err := http.Get("http://" + r.metrics + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if strings.Contains(l, "istio-leader") && strings.Contains(l, want) {
			return
		}
	}
	t.Errorf("%s's /readyz has no istio-leader line saying %q:\n%s", r.name, want, body)
}

// ruleHas says whether edgeflow's DestinationRule exists and its spec's JSON contains s.
func ruleHas(ctx context.Context, t *testing.T, cl *client, s string) bool {
	t.Helper()
	dr, err := cl.dyn.Resource(drGVR).Namespace(appNS).Get(ctx, ruleName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(dr.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), s)
}

// leaseHolder is the holder of the Istio writer's Lease ("" when none).
func leaseHolder(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	l, err := cs.CoordinationV1().Leases(namespace).Get(ctx, "edgeflow-istio", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func logLines(t *testing.T, r *replica) []string {
	t.Helper()
	b, err := os.ReadFile(r.logFile)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(b), "\n")
}

// count counts the log lines of r holding any of subs.
func count(t *testing.T, r *replica, subs ...string) int {
	t.Helper()
	n := 0
	for _, l := range logLines(t, r) {
		for _, s := range subs {
			if strings.Contains(l, s) {
				n++
				break
			}
		}
	}
	return n
}
