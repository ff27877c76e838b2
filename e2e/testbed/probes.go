package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// ProbeJob is the job label of every probe series.
	ProbeJob = "edgeflow-icmp"
	// HonorLabelsJob is the job of Config.HonorLabelsTargets.
	HonorLabelsJob = "edgeflow-test-honor-labels"

	exporterPort   = "9115"
	prometheusAddr = "127.0.0.1:9090" // inside the monitor namespace
	// timeoutOffset is what the blackbox exporter keeps of Prometheus's scrape timeout for
	// answering: a probe may last the scrape timeout minus this.
	timeoutOffset = "0.1"
)

// blackboxConfig is the exporters' configuration: one ICMP module over IPv4. Its timeout is
// only a ceiling; the scrape timeout, less timeoutOffset, is shorter.
const blackboxConfig = `modules:
  icmp:
    prober: icmp
    timeout: 5s
    icmp:
      preferred_ip_protocol: ip4
      ip_protocol_fallback: false
`

// ScrapeConfig returns the Prometheus configuration (prometheus.yml) that scrapes a blackbox
// exporter on every node (listening on NODE_IP:9115, with an ICMP module named icmp) for an
// ICMP probe of every other node. Every probe series carries the labels
// job="edgeflow-icmp", source_node (the node the probe runs from), target_node (the node
// probed), and instance (the target's IP). interval is the scrape and evaluation interval, and
// the scrape timeout; 0 means 1 s. ips must hold the IP of every node, else ScrapeConfig panics.
func ScrapeConfig(nodes []string, ips map[string]string, interval time.Duration) string {
	if interval <= 0 {
		interval = time.Second
	}
	d := promDuration(interval)
	var b strings.Builder
	fmt.Fprintf(&b, `# edgeflow's latency probes: the blackbox exporter of each node pings every other node.
# Every series carries source_node (the node the probe runs from) and target_node (the node probed).
global:
  scrape_interval: %s
  scrape_timeout: %s
  evaluation_interval: %s
scrape_configs:
  - job_name: %s
    metrics_path: /probe
    params:
      module: [icmp]
    static_configs:
`, d, d, d, ProbeJob)
	for _, src := range nodes {
		for _, dst := range nodes {
			if src == dst {
				continue
			}
			fmt.Fprintf(&b, `      - targets: [%q]
        labels: {source_node: %q, target_node: %q, __tmp_exporter: %q}
`, ipOf(ips, dst), src, dst, net.JoinHostPort(ipOf(ips, src), exporterPort))
		}
	}
	b.WriteString(`    relabel_configs:
      # Probe the target through the source node's exporter; instance is the target's IP.
      - source_labels: [__address__]
        target_label: __param_target
      - source_labels: [__address__]
        target_label: instance
      - source_labels: [__tmp_exporter]
        target_label: __address__
`)
	return b.String()
}

func ipOf(ips map[string]string, node string) string {
	ip, ok := ips[node]
	if !ok || ip == "" {
		panic(fmt.Sprintf("testbed: ScrapeConfig: no IP for node %q", node))
	}
	return ip
}

// promDuration formats d as a Prometheus duration ("1s", "500ms").
func promDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}

// StartProbes starts a prometheus-blackbox-exporter in every node's namespace (listening on
// NODE_IP:9115, probing from inside that node, at nice -20) and a Prometheus in the monitor
// namespace (listening on 127.0.0.1:9090 there, with the configuration of ScrapeConfig, a data
// directory in a temporary directory, and --web.enable-lifecycle). It returns once every
// exporter answers and Prometheus is ready, and fails the test otherwise. Prometheus 2.42 hands
// its targets to the scrapers only after about 5 s (its discovery manager's fixed update
// period), so the first samples appear 5–6 s after StartProbes or StartPrometheus returns: poll
// for them. The processes stop in t's cleanup, or in Start's, whichever comes first.
func (tb *Testbed) StartProbes(t testing.TB) {
	t.Helper()
	begin := time.Now()
	t.Cleanup(func() { tb.stopProbes(t) })
	if err := tb.startProbes(); err != nil {
		t.Fatal(err)
	}
	t.Logf("testbed: %d blackbox exporters and Prometheus ready in %v", len(tb.nodes), time.Since(begin).Round(time.Millisecond))
}

func (tb *Testbed) startProbes() error {
	for _, bin := range []string{"prometheus", "prometheus-blackbox-exporter"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("testbed: StartProbes: %w (Debian package %s)", err, bin)
		}
	}
	tb.mu.Lock()
	if tb.promArgs != nil {
		tb.mu.Unlock()
		return errors.New("testbed: StartProbes called twice")
	}
	bbConfig := filepath.Join(tb.dir, "blackbox.yml")
	promConfig := filepath.Join(tb.dir, "prometheus.yml")
	if err := os.WriteFile(bbConfig, []byte(blackboxConfig), 0o644); err != nil {
		tb.mu.Unlock()
		return fmt.Errorf("testbed: StartProbes: %w", err)
	}
	promYAML := ScrapeConfig(tb.nodes, tb.ips, tb.interval)
	if len(tb.metricsTargets) > 0 {
		promYAML += "  - job_name: edgeflow-test-metrics\n    static_configs:\n      - targets: ["
		for i, t := range tb.metricsTargets {
			if i > 0 {
				promYAML += ", "
			}
			promYAML += fmt.Sprintf("%q", t)
		}
		promYAML += "]\n"
	}
	if len(tb.honorTargets) > 0 {
		promYAML += "  - job_name: " + HonorLabelsJob + "\n    honor_labels: true\n    static_configs:\n      - targets: ["
		for i, t := range tb.honorTargets {
			if i > 0 {
				promYAML += ", "
			}
			promYAML += fmt.Sprintf("%q", t)
		}
		promYAML += "]\n        labels: {namespace: tenant, pod: forger}\n"
	}
	if tb.scrapeConfigs != "" {
		promYAML += strings.TrimRight(tb.scrapeConfigs, "\n") + "\n"
	}
	if err := os.WriteFile(promConfig, []byte(promYAML), 0o644); err != nil {
		tb.mu.Unlock()
		return fmt.Errorf("testbed: StartProbes: %w", err)
	}
	var exporters []*process
	for _, node := range tb.nodes {
		argv := []string{"ip", "netns", "exec", tb.netns[node], "nice", "-n", exporterNice}
		argv = append(argv, "prometheus-blackbox-exporter", "--config.file="+bbConfig,
			"--web.listen-address="+net.JoinHostPort(tb.ips[node], exporterPort), "--timeout-offset="+timeoutOffset)
		p, err := tb.startLocked("blackbox "+node, argv)
		if err != nil {
			tb.mu.Unlock()
			return err
		}
		exporters = append(exporters, p)
	}
	tb.promArgs = []string{"ip", "netns", "exec", tb.monNS, "prometheus",
		"--config.file=" + promConfig,
		"--storage.tsdb.path=" + filepath.Join(tb.dir, "prometheus-data"),
		"--web.listen-address=" + prometheusAddr,
		"--web.enable-lifecycle",
	}
	p, err := tb.startLocked("prometheus", tb.promArgs)
	if err != nil {
		tb.mu.Unlock()
		return err
	}
	tb.prometheus = p
	tb.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for i, node := range tb.nodes {
		url := "http://" + net.JoinHostPort(tb.ips[node], exporterPort) + "/-/healthy"
		if err := tb.waitHTTP(ctx, exporters[i], url); err != nil {
			return fmt.Errorf("testbed: blackbox exporter of %s not ready: %w", node, err)
		}
	}
	if err := tb.waitHTTP(ctx, p, tb.PrometheusURL()+"/-/ready"); err != nil {
		return fmt.Errorf("testbed: prometheus not ready: %w", err)
	}
	return nil
}

// stopProbes stops the exporters and Prometheus.
func (tb *Testbed) stopProbes(t testing.TB) {
	tb.transport.CloseIdleConnections()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, p := range tb.procs {
		if p != tb.nqdelay {
			if err := p.stop(stopTimeout); err != nil {
				t.Logf("testbed: %v", err)
			}
		}
	}
}

// PrometheusURL returns the base URL of Prometheus, "http://127.0.0.1:9090". The address is in
// the monitor namespace: reach it through PrometheusTransport.
func (tb *Testbed) PrometheusURL() string { return "http://" + prometheusAddr }

// PrometheusTransport returns an HTTP transport whose connections are opened inside the
// monitor namespace, so that a client in the test process reaches Prometheus (and the
// exporters, at NODE_IP:9115). It is shared by the testbed; its idle connections are closed on
// teardown.
func (tb *Testbed) PrometheusTransport() http.RoundTripper { return tb.transport }

// StopPrometheus sends Prometheus SIGTERM and waits for it to exit.
func (tb *Testbed) StopPrometheus() error {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	p := tb.prometheus
	if p == nil || p.exited() {
		return errors.New("testbed: StopPrometheus: prometheus is not running")
	}
	tb.prometheus = nil
	err := p.stop(stopTimeout)
	tb.transport.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("testbed: StopPrometheus: %w", err)
	}
	return nil
}

// StartPrometheus starts Prometheus again, on the same data directory and configuration, after
// StopPrometheus. It returns once Prometheus answers /-/ready.
func (tb *Testbed) StartPrometheus() error {
	tb.mu.Lock()
	switch {
	case tb.promArgs == nil:
		tb.mu.Unlock()
		return errors.New("testbed: StartPrometheus before StartProbes")
	case tb.prometheus != nil && !tb.prometheus.exited():
		tb.mu.Unlock()
		return errors.New("testbed: StartPrometheus: prometheus is already running")
	}
	p, err := tb.startLocked("prometheus", tb.promArgs)
	if err != nil {
		tb.mu.Unlock()
		return err
	}
	tb.prometheus = p
	tb.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := tb.waitHTTP(ctx, p, tb.PrometheusURL()+"/-/ready"); err != nil {
		return fmt.Errorf("testbed: StartPrometheus: not ready: %w", err)
	}
	return nil
}

// waitHTTP polls url through the transport until it answers 200 OK, p exits, or ctx ends.
func (tb *Testbed) waitHTTP(ctx context.Context, p *process, url string) error {
	client := &http.Client{Transport: tb.transport, Timeout: 2 * time.Second}
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	var last error
	for {
		if err := p.checkRunning(); err != nil {
			return err
		}
		resp, err := client.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last attempt: %v; last lines of %s:\n%s", ctx.Err(), last, p.logPath, p.tail(15))
		case <-ticker.C:
		}
	}
}

// ListenMonitor opens a listener inside the monitor namespace, where Prometheus runs: a test
// serves its own metrics there (Config.MetricsTargets).
func (tb *Testbed) ListenMonitor(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNamespace(tb.monNS, func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// DialMonitor opens a connection from inside the monitor namespace (which reaches every node
// and has no added delay): e.g. a load generator's, playing a client outside the cluster.
func (tb *Testbed) DialMonitor(ctx context.Context, network, addr string) (net.Conn, error) {
	return tb.dialMonitor(ctx, network, addr)
}

// MonitorIP is the monitor namespace's address on the bridge, 198.18.0.100.
func (tb *Testbed) MonitorIP() string { return monitorIP }

// dialMonitor opens a connection from inside the monitor namespace.
func (tb *Testbed) dialMonitor(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := inNamespace(tb.monNS, func() error {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		conn = c
		return err
	})
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, err
	}
	return conn, nil
}

// inNamespace runs f on an OS thread switched into network namespace ns; sockets f creates
// belong to ns. The thread goes back to its original namespace before it is released; if that
// fails, the thread stays locked and the runtime discards it.
func inNamespace(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("testbed: open current network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(filepath.Join(netnsDir, ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("testbed: open namespace %s: %w", ns, err)
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread() // still in the original namespace
			errc <- fmt.Errorf("testbed: enter namespace %s: %w", ns, err)
			return
		}
		ferr := f()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it exits with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("testbed: leave namespace %s: %w", ns, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
