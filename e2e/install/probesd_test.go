package install

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/edgeflow/edgeflow/e2e/kubeapi"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/probesd"
)

// The probes follow the cluster (issue 40): a Node created on the real API server is in the
// HTTP service discovery answer as soon as the Node informer has its event (the answer is read
// right after the event, no polling), and a real Prometheus, running the chart's probe job
// against edgeflow serve's /sd/probes, scrapes the pairs it lists through real
// blackbox-exporters (the chart's module) on the nodes' addresses, all on 127.0.0.0/8.
func TestProbesFollowTheCluster(t *testing.T) {
	t.Parallel()
	prometheus, blackbox := needBinary(t, "prometheus"), needBinary(t, "prometheus-blackbox-exporter")
	c, _ := startAPIServer(t, kubeapi.Options{})
	ctx := kubeapi.Context(t)
	ips := map[string]string{"n1": "127.0.0.2", "n2": "127.0.0.3", "n3": "127.0.0.4"}
	for _, n := range []string{"n1", "n2"} {
		if _, err := kubeapi.CreateNode(ctx, c.Client, kubeapi.NodeSpec{Name: n, Address: ips[n]}); err != nil {
			t.Fatal(err)
		}
	}
	port := freePort(t, ips["n1"])
	dir := t.TempDir()

	// In process: the informer's event, then at once the answer.
	inf, err := kube.NewInformers(kube.InformersConfig{Client: c.Client})
	if err != nil {
		t.Fatal(err)
	}
	added := make(chan string, 16)
	if _, err := inf.Nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			added <- n.Name
		}
	}}); err != nil {
		t.Fatal(err)
	}
	inf.Start(ctx)
	t.Cleanup(inf.Stop)
	if err := inf.WaitForCacheSync(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := probesd.Config{Port: port}
	answer := probesd.Handler(probesd.InformerNodes(inf.Nodes), cfg)
	pairsNow := func() []string {
		t.Helper()
		return groupPairs(t, httptestRecorder(answer))
	}
	if diff := cmp.Diff([]string{"n1→n2", "n2→n1"}, pairsNow()); diff != "" {
		t.Fatalf("answer before the join (-want +got):\n%s", diff)
	}

	// edgeflow serve, whose /sd/probes Prometheus discovers the probes from.
	calls := filepath.Join(dir, "calls.yaml")
	if err := os.WriteFile(calls, []byte("calls: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ef := startLogged(t, dir, "edgeflow", testkit.Binary(t), "serve", "--kubeconfig", c.Kubeconfig, "--calls", calls, "--default-latency", "10",
		"--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--probe-exporter-port", strconv.Itoa(port))
	var metrics string
	testkit.Eventually(t, 60*time.Second, "edgeflow's metrics address", func() bool {
		b, _ := os.ReadFile(ef)
		for _, l := range strings.Split(string(b), "\n") {
			if m := metricsAt.FindStringSubmatch(l); m != nil {
				metrics = m[1]
				return true
			}
		}
		return false
	})
	sdURL := "http://" + metrics + probesd.Path

	// A blackbox-exporter on every node's address, with the chart's module and arguments.
	objs := render(t, nil)
	bbConfig, _, _ := unstructuredString(find(t, objs, "ConfigMap", release+"-blackbox").Object, "data", "blackbox.yml")
	bbFile := filepath.Join(dir, "blackbox.yml")
	if err := os.WriteFile(bbFile, []byte(bbConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		addr := net.JoinHostPort(ips[n], strconv.Itoa(port))
		startLogged(t, dir, "blackbox-"+n, blackbox, "--config.file="+bbFile, "--web.listen-address="+addr)
		waitHTTP(t, "http://"+addr+"/-/healthy", 30*time.Second)
	}

	// Prometheus with the chart's probe job, its discovery pointed at this edgeflow.
	data, _, _ := unstructuredString(find(t, objs, "ConfigMap", release+"-scrape-config").Object, "data", "scrape_configs.yml")
	var chart struct {
		ScrapeConfigs []map[string]any `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal([]byte(data), &chart); err != nil {
		t.Fatal(err)
	}
	job := chart.ScrapeConfigs[0]
	sds, _ := job["http_sd_configs"].([]any)
	if len(sds) != 1 || job["static_configs"] != nil {
		t.Fatalf("the chart's probe job: want one http_sd_configs and no static_configs, got %v", job)
	}
	want := fmt.Sprintf("http://%s-metrics.%s.svc.cluster.local:9090%s", release, namespace, probesd.Path)
	if u := sds[0].(map[string]any)["url"]; u != want {
		t.Errorf("the chart's discovery URL %v, want %s (the metrics Service)", u, want)
	}
	job["http_sd_configs"] = []any{map[string]any{"url": sdURL, "refresh_interval": "1s"}}
	job["scrape_interval"], job["scrape_timeout"] = "1s", "1s"
	promCfg, err := yaml.Marshal(map[string]any{"scrape_configs": []any{job}})
	if err != nil {
		t.Fatal(err)
	}
	promFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(promFile, promCfg, 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t, "127.0.0.1")))
	startLogged(t, dir, "prometheus", prometheus, "--config.file="+promFile, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr)
	waitHTTP(t, "http://"+promAddr+"/-/ready", 60*time.Second)
	scraped := func(want []string) {
		t.Helper()
		var last []string
		if !testkit.WaitUntil(60*time.Second, func() bool {
			last = promTargets(t, "http://"+promAddr)
			return slices.Equal(last, want)
		}) {
			t.Fatalf("Prometheus' active probe targets %v, want %v", last, want)
		}
	}
	scraped([]string{
		"n1→n2 instance=127.0.0.3 via 127.0.0.2 up",
		"n2→n1 instance=127.0.0.2 via 127.0.0.3 up",
	})

	// A node joins: in the answer at its informer event, and scraped by Prometheus.
	if _, err := kubeapi.CreateNode(ctx, c.Client, kubeapi.NodeSpec{Name: "n3", Address: ips["n3"]}); err != nil {
		t.Fatal(err)
	}
	for n := ""; n != "n3"; {
		select {
		case n = <-added:
		case <-ctx.Done():
			t.Fatal("the Node informer never heard of n3")
		}
	}
	if diff := cmp.Diff([]string{"n1→n2", "n1→n3", "n2→n1", "n2→n3", "n3→n1", "n3→n2"}, pairsNow()); diff != "" {
		t.Fatalf("answer at n3's informer event (-want +got):\n%s", diff)
	}
	scraped([]string{
		"n1→n2 instance=127.0.0.3 via 127.0.0.2 up",
		"n1→n3 instance=127.0.0.4 via 127.0.0.2 up",
		"n2→n1 instance=127.0.0.2 via 127.0.0.3 up",
		"n2→n3 instance=127.0.0.4 via 127.0.0.3 up",
		"n3→n1 instance=127.0.0.2 via 127.0.0.4 up",
		"n3→n2 instance=127.0.0.3 via 127.0.0.4 up",
	})
}

// needBinary is the path of a Debian-packaged program (skip without it; fail in CI).
func needBinary(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found (Debian's package)", name)
		}
		t.Skipf("skipped: %s not found", name)
	}
	return p
}

// freePort is a TCP port free on host now.
func freePort(t *testing.T, host string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startLogged runs argv with its output in DIR/NAME.log (returned), killed if the test
// process dies, stopped (SIGTERM, then SIGKILL after 10 s) when t ends, its log's tail
// printed when t failed.
func startLogged(t *testing.T, dir, name string, argv ...string) string {
	t.Helper()
	logFile, _ := startLoggedWith(t, dir, name, testkit.StartChild, argv...)
	return logFile
}

// startLoggedWith is startLogged with the process started by start, which returns a channel
// that receives cmd.Wait's error when the process has exited (testkit.StartChild's contract).
// start may run cmd.Start elsewhere, such as on a thread in another network namespace, which
// must then outlive the process: Pdeathsig follows the thread that started it. It also
// returns the process.
func startLoggedWith(t *testing.T, dir, name string, start func(*exec.Cmd) (<-chan error, error), argv ...string) (string, *os.Process) {
	t.Helper()
	logFile := filepath.Join(dir, name+".log")
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited, err := start(cmd)
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { <-exited; f.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("%s's log (last 30 lines):\n%s", name, strings.Join(lines[max(0, len(lines)-30):], "\n"))
		}
	})
	return logFile, cmd.Process
}

// httptestRecorder is h's answer to GET probesd.Path.
func httptestRecorder(h http.Handler) []byte {
	rec := &recorder{header: http.Header{}}
	req, _ := http.NewRequest(http.MethodGet, probesd.Path, nil)
	h.ServeHTTP(rec, req)
	return rec.body
}

type recorder struct {
	header http.Header
	body   []byte
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { r.body = append(r.body, b...); return len(b), nil }
func (r *recorder) WriteHeader(int)             {}

// groupPairs reads an answer's groups as "source→target", checking each group probes the
// target's address through the source's exporter.
func groupPairs(t *testing.T, body []byte) []string {
	t.Helper()
	var gs []probesd.TargetGroup
	if err := json.Unmarshal(body, &gs); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	out := []string{}
	for _, g := range gs {
		out = append(out, g.Labels[probesd.LabelSourceNode]+"→"+g.Labels[probesd.LabelTargetNode])
	}
	slices.Sort(out)
	return out
}

// promTargets lists Prometheus' active targets of the probe job as "source→target
// instance=I via EXPORTER_HOST HEALTH", sorted.
func promTargets(t *testing.T, url string) []string {
	t.Helper()
	resp, err := http.Get(url + "/api/v1/targets?state=active")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r struct {
		Data struct {
			ActiveTargets []struct {
				Labels     map[string]string `json:"labels"`
				ScrapeURL  string            `json:"scrapeUrl"`
				Health     string            `json:"health"`
				ScrapePool string            `json:"scrapePool"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("/api/v1/targets: %v: %s", err, b)
	}
	out := []string{}
	for _, tg := range r.Data.ActiveTargets {
		if tg.Labels["job"] != "edgeflow-icmp" {
			continue
		}
		host := strings.TrimPrefix(tg.ScrapeURL, "http://")
		host, _, _ = strings.Cut(host, ":")
		out = append(out, fmt.Sprintf("%s→%s instance=%s via %s %s", tg.Labels["source_node"], tg.Labels["target_node"], tg.Labels["instance"], host, tg.Health))
	}
	slices.Sort(out)
	return out
}

// The probe DaemonSet's pod and Pod Security admission on the real API server. By default
// (latencyProbes.icmpSocket=unprivileged) the "baseline" and "restricted" levels reject it for
// the host network alone (hostNetwork, and the host port it implies) — no root, no capability;
// with icmpSocket=raw also for NET_RAW (restricted: and root). "privileged" admits both. And the
// per-pod net.ipv4.ping_group_range that would let it go without the node's is refused on the
// host network — what docs/security.md says.
func TestProbePodSecurity(t *testing.T) {
	t.Parallel()
	c, _ := startAPIServer(t, kubeapi.Options{})
	ctx := kubeapi.Context(t)
	hostNet := []string{"host namespaces (hostNetwork=true)", "hostPort (container \"blackbox-exporter\" uses hostPort 9115)"}
	rawOnly := []string{"NET_RAW", "runAsUser=0", "runAsNonRoot != true"}
	for _, tc := range []struct {
		socket, level string
		want, not     []string // in the refusal, and not; want nil: admitted
	}{
		{"unprivileged", "baseline", append([]string{`violates PodSecurity "baseline:latest"`}, hostNet...), rawOnly},
		{"unprivileged", "restricted", append([]string{`violates PodSecurity "restricted:latest"`}, hostNet...), rawOnly},
		{"unprivileged", "privileged", nil, nil},
		{"raw", "baseline", append([]string{`violates PodSecurity "baseline:latest"`,
			`non-default capabilities (container "blackbox-exporter" must not include "NET_RAW" in securityContext.capabilities.add)`}, hostNet...), nil},
		{"raw", "restricted", append([]string{`violates PodSecurity "restricted:latest"`, "runAsNonRoot != true", "runAsUser=0",
			`unrestricted capabilities (container "blackbox-exporter" must not include "NET_RAW" in securityContext.capabilities.add)`}, hostNet...), nil},
		{"raw", "privileged", nil, nil},
	} {
		var ds appsv1.DaemonSet
		convert(t, find(t, render(t, map[string]any{"latencyProbes": map[string]any{"icmpSocket": tc.socket}}), "DaemonSet", release+"-blackbox"), &ds)
		name := "pss-" + tc.socket + "-" + tc.level
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pod-security.kubernetes.io/enforce": tc.level}}}
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns.Name, Labels: ds.Spec.Template.Labels}, Spec: ds.Spec.Template.Spec}
		_, err := c.Client.CoreV1().Pods(ns.Name).Create(ctx, pod, metav1.CreateOptions{})
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s, %s: the probe pod refused: %v", tc.socket, tc.level, err)
		case tc.want != nil && err == nil:
			t.Errorf("%s, %s: the probe pod admitted", tc.socket, tc.level)
		case err != nil:
			t.Logf("%s, %s: %v", tc.socket, tc.level, err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s, %s: the refusal does not say %q: %v", tc.socket, tc.level, w, err)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(err.Error(), w) {
					t.Errorf("%s, %s: the refusal says %q: %v", tc.socket, tc.level, w, err)
				}
			}
		}
		if tc.socket == "unprivileged" && tc.level == "privileged" {
			// The pod cannot set the range itself on the host network: the sysctl is the node's.
			pod.Name, pod.Spec.SecurityContext.Sysctls = "probe-sysctl", []corev1.Sysctl{{Name: "net.ipv4.ping_group_range", Value: "65534 65534"}}
			_, err := c.Client.CoreV1().Pods(ns.Name).Create(ctx, pod, metav1.CreateOptions{})
			if err == nil || !strings.Contains(err.Error(), `"net.ipv4.ping_group_range": may not be specified when 'hostNetwork' is true`) {
				t.Errorf("a host-network probe pod setting net.ipv4.ping_group_range: %v; want it refused", err)
			} else {
				t.Logf("the per-pod sysctl on the host network: %v", err)
			}
		}
	}
}
