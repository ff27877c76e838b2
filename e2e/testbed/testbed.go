// Package testbed builds a real latency testbed for Go tests: one network namespace per emulated
// node, joined by a bridge whose forwarded packets are held per node pair by nqdelay (a userspace
// netem over NFQUEUE, in ./nqdelay), so that the round-trip time between two nodes is what the
// test configured. StartProbes adds the monitoring the product reads: a blackbox exporter per
// node probing every other node over ICMP, and a Prometheus scraping them with the labels
// source_node and target_node (see ScrapeConfig).
//
// The testbed needs root, iproute2, iptables with the physdev match and bridge netfilter, and a
// Go toolchain; StartProbes needs Debian's prometheus and prometheus-blackbox-exporter. It never
// touches the root namespace's interfaces, routes or firewall: the bridge lives in a namespace
// of its own, and every address is in 198.18.0.0/24 (RFC 2544 benchmarking).
package testbed

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	subnet    = "198.18.0" // the testbed's /24; node i is .i+1, the monitor .100
	monitorIP = subnet + ".100"
	maxNodes  = 99
	netnsDir  = "/var/run/netns" // where `ip netns` keeps its namespaces
	queueNum  = "0"              // NFQUEUE number; queues are per namespace, so every testbed has its own
	nqdelayRT = "20"             // SCHED_FIFO priority of nqdelay
	// exporterNice is the blackbox exporters' nice value: a larger share of a busy machine, so
	// that a reply is read soon after it arrives. Not real-time priority: an exporter at
	// SCHED_FIFO was seen spinning a CPU until the kernel throttled it, and ignoring SIGTERM.
	exporterNice = "-20"

	// Deadlines, generous because tests run on shared, busy machines.
	commandTimeout = 30 * time.Second // one ip/iptables/sysctl command
	buildTimeout   = 10 * time.Minute // go build of nqdelay
	readyTimeout   = 60 * time.Second // a started process becomes ready
	reloadTimeout  = 10 * time.Second // nqdelay reloads its matrix
	stopTimeout    = 30 * time.Second // a process exits after SIGTERM, before SIGKILL
)

// Config describes the emulated nodes and the latency between them.
type Config struct {
	// Nodes are the node names, e.g. {"edge-1", "edge-2"}: letters, digits, '.', '_' and '-'.
	// Node i (from 0) gets the address 198.18.0.(i+1); at most 99 nodes.
	Nodes []string
	// RTT is the round-trip time in milliseconds per unordered node pair; either order may be
	// given (both only with the same value). A missing pair has no added delay.
	RTT map[[2]string]float64
	// TCPPenalty is a delay in milliseconds that TCP packets from the first node of a pair to
	// the second pay on top of the pair's RTT, in that direction only (nqdelay's tcp lines):
	// a cost requests pay and ICMP probes do not see — an L7 penalty. Every TCP exchange
	// between the two nodes crosses that direction once per round trip (a request from the
	// first node, or the response to a request from the second), so a request either way takes
	// the pair's RTT plus the penalty.
	TCPPenalty map[[2]string]float64
	// ScrapeInterval is Prometheus's scrape and evaluation interval (whole milliseconds, at
	// least 200 ms); 0 means 1 s.
	ScrapeInterval time.Duration
	// MetricsTargets are HOST:PORT addresses inside the monitor namespace (see ListenMonitor)
	// that Prometheus also scrapes, as job "edgeflow-test-metrics": a test's own exporter
	// (e.g. of istio_requests_total).
	MetricsTargets []string
	// HonorLabelsTargets are HOST:PORT addresses inside the monitor namespace that Prometheus
	// scrapes as job HonorLabelsJob with honor_labels: true and the target labels
	// namespace="tenant", pod="forger" — what a pod's scrape under the community chart's
	// kubernetes-pods job, or a pushgateway's, looks like: the series keep the labels they
	// claim (job and instance included) and get the target's only where they claim none.
	HonorLabelsTargets []string
	// ScrapeConfigs are further jobs of Prometheus's configuration, as YAML list items under
	// scrape_configs (each starting "  - job_name: "), appended as given: e.g. a job discovering
	// pods through Kubernetes service discovery. Prometheus runs in the monitor namespace: an
	// address a job names must be reachable from there (see ListenMonitor).
	ScrapeConfigs string
	// Aliases are further addresses of a node, e.g. its pods' (198.18.0.x, distinct from every
	// node's and the monitor's .100): each is added to the node's eth0, and a packet between
	// two nodes is held the pair's RTT whichever of their addresses it carries.
	Aliases map[string][]string
}

// Testbed is a running topology. Its methods are safe for concurrent use. Everything it starts
// is stopped, and every namespace it creates is deleted, by the cleanup of the test given to
// Start, also when the test fails.
type Testbed struct {
	prefix         string              // random namespace-name prefix, e.g. "ef3a9c"
	dir            string              // configuration files, logs, the nqdelay binary
	nodes          []string            // in Config order
	ips            map[string]string   // node → IP
	aliases        map[string][]string // node → further addresses
	netns          map[string]string   // node → namespace
	swNS           string              // the bridge's namespace
	monNS          string              // the monitor's namespace
	interval       time.Duration
	metricsTargets []string
	honorTargets   []string
	scrapeConfigs  string
	rt             bool // chrt -f works here
	matrix         string
	nqBin          string

	transport *http.Transport // dials inside monNS

	mu         sync.Mutex
	created    []string              // namespaces created, in order
	rtt        map[[2]string]float64 // key in Config.Nodes order
	tcpPenalty map[[2]string]float64 // directed: Config.TCPPenalty
	procs      []*process            // every process started, in order
	nqdelay    *process
	prometheus *process
	promArgs   []string // nil until StartProbes
}

// RequireRoot skips the test, with one line saying why, when the process is not root or
// `ip netns` does not work here. When the environment has CI=true it fails the test instead:
// in CI these tests must run.
func RequireRoot(t testing.TB) {
	t.Helper()
	reason := rootProblem()
	if reason == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("testbed: %s (CI=true, so this test must run)", reason)
	}
	t.Skipf("testbed: %s", reason)
}

var (
	rootOnce   sync.Once
	rootReason string
)

// rootProblem says why the testbed cannot run here, or returns "" when it can.
func rootProblem() string {
	rootOnce.Do(func() {
		if uid := os.Geteuid(); uid != 0 {
			rootReason = fmt.Sprintf("needs root for network namespaces (euid %d)", uid)
			return
		}
		if _, err := exec.LookPath("ip"); err != nil {
			rootReason = "needs iproute2's ip: " + err.Error()
			return
		}
		ns := fmt.Sprintf("efprobe-%04x", rand.Uint32()&0xffff)
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			rootReason = fmt.Sprintf("`ip netns add` does not work here: %v: %s", err, firstLine(out))
			return
		}
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			rootReason = fmt.Sprintf("`ip netns del %s` does not work here: %v: %s", ns, err, firstLine(out))
		}
	})
	return rootReason
}

// Start builds the topology: a namespace per node and one for the monitor (198.18.0.100), each
// with an eth0 on a bridge that lives in a namespace of its own, whose FORWARD hook sends every
// packet between testbed addresses to nqdelay. nqdelay is built from this package's source with
// `go build` and runs at real-time priority (chrt -f 20) when the machine allows it; it holds
// each direction of a pair RTT/2. Namespace names start with a random prefix (e.g.
// "ef3a9c-n1") that no other namespace has, so neither a crashed earlier run nor a testbed
// running at the same time collides; every address, port and NFQUEUE lives inside the
// testbed's own namespaces, so testbeds of parallel tests do not meet. Start fails the test on
// any error; the test's cleanup tears everything down.
func Start(t testing.TB, cfg Config) *Testbed {
	t.Helper()
	begin := time.Now()
	tb, err := newTestbed(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.teardown(t) })
	if err := tb.up(); err != nil {
		t.Fatal(err)
	}
	rt := "real-time priority"
	if !tb.rt {
		rt = "NO real-time priority (chrt -f failed): expect late packets on a busy machine"
	}
	t.Logf("testbed: %d nodes up in %v, namespaces %s-*, nqdelay at %s", len(tb.nodes),
		time.Since(begin).Round(time.Millisecond), tb.prefix, rt)
	return tb
}

// newTestbed validates cfg and lays out a testbed in dir without creating anything.
func newTestbed(cfg Config, dir string) (*Testbed, error) {
	rtt, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	tb := &Testbed{
		dir:            dir,
		nodes:          append([]string(nil), cfg.Nodes...),
		ips:            map[string]string{},
		aliases:        cfg.Aliases,
		tcpPenalty:     cfg.TCPPenalty,
		netns:          map[string]string{},
		interval:       cfg.ScrapeInterval,
		metricsTargets: cfg.MetricsTargets,
		honorTargets:   cfg.HonorLabelsTargets,
		scrapeConfigs:  cfg.ScrapeConfigs,
		rtt:            rtt,
		matrix:         filepath.Join(dir, "matrix.txt"),
		nqBin:          filepath.Join(dir, "nqdelay"),
	}
	if tb.interval == 0 {
		tb.interval = time.Second
	}
	for {
		tb.setPrefix(fmt.Sprintf("ef%04x", rand.Uint32()&0xffff))
		if _, err := os.Stat(filepath.Join(netnsDir, tb.swNS)); errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	for i, n := range tb.nodes {
		tb.ips[n] = fmt.Sprintf("%s.%d", subnet, i+1)
	}
	tb.transport = &http.Transport{
		DialContext:         tb.dialMonitor,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	return tb, nil
}

// setPrefix names the testbed's namespaces after prefix.
func (tb *Testbed) setPrefix(prefix string) {
	tb.prefix = prefix
	tb.swNS, tb.monNS = prefix+"-sw", prefix+"-mon"
	for i, n := range tb.nodes {
		tb.netns[n] = fmt.Sprintf("%s-n%d", prefix, i+1)
	}
}

// validate checks cfg and returns its RTT matrix keyed by pairs in Nodes order.
func (cfg Config) validate() (map[[2]string]float64, error) {
	if len(cfg.Nodes) == 0 || len(cfg.Nodes) > maxNodes {
		return nil, fmt.Errorf("testbed: %d nodes, want 1 to %d", len(cfg.Nodes), maxNodes)
	}
	index := map[string]int{}
	for i, n := range cfg.Nodes {
		if n == "" || strings.Trim(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
			return nil, fmt.Errorf("testbed: node %d name %q: want letters, digits, '.', '_' or '-'", i, n)
		}
		if _, dup := index[n]; dup {
			return nil, fmt.Errorf("testbed: node %q listed twice", n)
		}
		index[n] = i
	}
	for pair, ms := range cfg.TCPPenalty {
		if _, err := orderedPair(index, pair[0], pair[1]); err != nil {
			return nil, fmt.Errorf("testbed: TCP penalty of %s→%s: %w", pair[0], pair[1], err)
		}
		if ms < 0 || math.IsNaN(ms) || math.IsInf(ms, 0) {
			return nil, fmt.Errorf("testbed: TCP penalty of %s→%s is %v ms, want a finite number ≥ 0", pair[0], pair[1], ms)
		}
	}
	rtt := map[[2]string]float64{}
	for pair, ms := range cfg.RTT {
		key, err := orderedPair(index, pair[0], pair[1])
		if err != nil {
			return nil, fmt.Errorf("testbed: RTT of %s–%s: %w", pair[0], pair[1], err)
		}
		if ms < 0 || math.IsNaN(ms) || math.IsInf(ms, 0) {
			return nil, fmt.Errorf("testbed: RTT of %s–%s is %v ms, want a finite number ≥ 0", pair[0], pair[1], ms)
		}
		if old, ok := rtt[key]; ok && old != ms {
			return nil, fmt.Errorf("testbed: RTT of %s–%s given twice, as %v and %v ms", key[0], key[1], old, ms)
		}
		rtt[key] = ms
	}
	seen := map[string]string{monitorIP: "the monitor"}
	for i, n := range cfg.Nodes {
		seen[fmt.Sprintf("%s.%d", subnet, i+1)] = "node " + n
	}
	for node, addrs := range cfg.Aliases {
		if _, ok := index[node]; !ok {
			return nil, fmt.Errorf("testbed: aliases of unknown node %q", node)
		}
		for _, a := range addrs {
			ip, err := netip.ParseAddr(a)
			if err != nil || !netip.MustParsePrefix(subnet+".0/24").Contains(ip) || ip.As4()[3] == 0 || ip.As4()[3] == 255 {
				return nil, fmt.Errorf("testbed: alias %q of node %s: want an address of %s.0/24", a, node, subnet)
			}
			if other, dup := seen[a]; dup {
				return nil, fmt.Errorf("testbed: alias %s of node %s is already %s's", a, node, other)
			}
			seen[a] = "node " + node
		}
	}
	if d := cfg.ScrapeInterval; d != 0 && (d < 200*time.Millisecond || d%time.Millisecond != 0) {
		return nil, fmt.Errorf("testbed: scrape interval %v: want whole milliseconds, at least 200ms", d)
	}
	return rtt, nil
}

// orderedPair returns {a, b} in node order, or an error naming the unknown node.
func orderedPair(index map[string]int, a, b string) ([2]string, error) {
	i, ok := index[a]
	if !ok {
		return [2]string{}, fmt.Errorf("unknown node %q", a)
	}
	j, ok := index[b]
	if !ok {
		return [2]string{}, fmt.Errorf("unknown node %q", b)
	}
	if i == j {
		return [2]string{}, fmt.Errorf("node %q paired with itself", a)
	}
	if i > j {
		a, b = b, a
	}
	return [2]string{a, b}, nil
}

// NodeIP returns node's address, 198.18.0.(i+1) for the i-th node of Config.Nodes. It panics if
// node is not one of them.
func (tb *Testbed) NodeIP(node string) string {
	ip, ok := tb.ips[node]
	if !ok {
		panic(fmt.Sprintf("testbed: NodeIP of unknown node %q", node))
	}
	return ip
}

// Exec returns a command that runs name with args inside node's network namespace, as
// `ip netns exec NS name args…` (ip execs name, so the started process is name itself). For an
// unknown node the command's Err is set, so that running it fails.
func (tb *Testbed) Exec(node, name string, args ...string) *exec.Cmd {
	ns, ok := tb.netns[node]
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...)
	if !ok {
		cmd.Err = fmt.Errorf("testbed: Exec %s: unknown node %q", name, node)
	}
	return cmd
}

// SetRTT sets the round-trip time between nodes a and b to ms milliseconds: it rewrites the
// matrix file, sends nqdelay SIGHUP, and returns once nqdelay has logged the reload. Packets
// already held keep their old delay.
func (tb *Testbed) SetRTT(a, b string, ms float64) error {
	index := map[string]int{}
	for i, n := range tb.nodes {
		index[n] = i
	}
	key, err := orderedPair(index, a, b)
	if err != nil {
		return fmt.Errorf("testbed: SetRTT %s–%s: %w", a, b, err)
	}
	if ms < 0 || math.IsNaN(ms) || math.IsInf(ms, 0) {
		return fmt.Errorf("testbed: SetRTT %s–%s: %v ms, want a finite number ≥ 0", a, b, ms)
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.nqdelay == nil || tb.nqdelay.exited() {
		return fmt.Errorf("testbed: SetRTT %s–%s: nqdelay is not running", a, b)
	}
	old, had := tb.rtt[key]
	tb.rtt[key] = ms
	if err := tb.writeMatrix(); err != nil {
		if had {
			tb.rtt[key] = old
		} else {
			delete(tb.rtt, key)
		}
		return fmt.Errorf("testbed: SetRTT %s–%s: %w", a, b, err)
	}
	if err := tb.reloadLocked(); err != nil {
		return fmt.Errorf("testbed: SetRTT %s–%s: %w", a, b, err)
	}
	return nil
}

// SetTCPPenalty sets the extra delay of TCP packets from node a to node b (Config.TCPPenalty;
// 0 removes it) as SetRTT sets an RTT: the matrix is rewritten, nqdelay reloads it, and packets
// already held keep their delay.
func (tb *Testbed) SetTCPPenalty(a, b string, ms float64) error {
	index := map[string]int{}
	for i, n := range tb.nodes {
		index[n] = i
	}
	if _, err := orderedPair(index, a, b); err != nil {
		return fmt.Errorf("testbed: SetTCPPenalty %s→%s: %w", a, b, err)
	}
	if ms < 0 || math.IsNaN(ms) || math.IsInf(ms, 0) {
		return fmt.Errorf("testbed: SetTCPPenalty %s→%s: %v ms, want a finite number ≥ 0", a, b, ms)
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.nqdelay == nil || tb.nqdelay.exited() {
		return fmt.Errorf("testbed: SetTCPPenalty %s→%s: nqdelay is not running", a, b)
	}
	key := [2]string{a, b}
	penalties := maps.Clone(tb.tcpPenalty)
	if penalties == nil {
		penalties = map[[2]string]float64{}
	}
	old := tb.tcpPenalty
	penalties[key] = ms
	tb.tcpPenalty = penalties
	if err := tb.writeMatrix(); err != nil {
		tb.tcpPenalty = old
		return fmt.Errorf("testbed: SetTCPPenalty %s→%s: %w", a, b, err)
	}
	if err := tb.reloadLocked(); err != nil {
		return fmt.Errorf("testbed: SetTCPPenalty %s→%s: %w", a, b, err)
	}
	return nil
}

// reloadLocked sends nqdelay SIGHUP and waits until it logged the reload of the matrix file.
// tb.mu is held.
func (tb *Testbed) reloadLocked() error {
	offset := tb.nqdelay.logSize()
	if err := tb.nqdelay.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		return fmt.Errorf("signal nqdelay: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reloadTimeout)
	defer cancel()
	var line string
	err := tb.nqdelay.waitLog(ctx, offset, func(l string) bool {
		line = l
		return strings.Contains(l, "nqdelay: reload")
	})
	if err != nil {
		return fmt.Errorf("waiting for nqdelay's reload: %w", err)
	}
	if !strings.Contains(line, "nqdelay: reloaded") {
		return errors.New(line)
	}
	return nil
}

// DelayStat is nqdelay's account of one directed node pair's packets since it started: how many
// it held, the sum of their release lateness (how late each left after its due time), and the
// 99th percentile of the last 4,096 packets' lateness. Two readings' difference is a slice's.
type DelayStat struct {
	Packets    int64
	LateSumUS  float64
	LastP99US  float64
	LastWindow int
}

// nqdelayStat matches a pair's line of nqdelay's statistics.
var nqdelayStat = regexp.MustCompile(`nqdelay: (\S+)→(\S+): target \S+, (\d+) packets, release lateness µs mean=\S+ max=\S+ sum=(\S+), last (\d+): p50=\S+ p90=\S+ p99=(\S+)`)

// DelayStats asks nqdelay for its statistics (SIGUSR1) and returns them by directed node pair
// (names; pairs that held no packet are absent).
func (tb *Testbed) DelayStats() (map[[2]string]DelayStat, error) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.nqdelay == nil || tb.nqdelay.exited() {
		return nil, errors.New("testbed: DelayStats: nqdelay is not running")
	}
	offset := tb.nqdelay.logSize()
	if err := tb.nqdelay.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		return nil, fmt.Errorf("testbed: DelayStats: signal nqdelay: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reloadTimeout)
	defer cancel()
	if err := tb.nqdelay.waitLog(ctx, offset, func(l string) bool { return strings.Contains(l, "nqdelay: statistics end") }); err != nil {
		return nil, fmt.Errorf("testbed: DelayStats: %w", err)
	}
	b, err := readFrom(tb.nqdelay.logPath, offset)
	if err != nil {
		return nil, fmt.Errorf("testbed: DelayStats: %w", err)
	}
	node := map[string]string{}
	for _, n := range tb.nodes {
		node[tb.NodeIP(n)] = n
	}
	out := map[[2]string]DelayStat{}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "nqdelay: statistics end") {
			break
		}
		m := nqdelayStat.FindStringSubmatch(l)
		if m == nil || node[m[1]] == "" || node[m[2]] == "" {
			continue // a pod address or the monitor: not a node pair
		}
		var st DelayStat
		st.Packets, _ = strconv.ParseInt(m[3], 10, 64)
		st.LateSumUS, _ = strconv.ParseFloat(m[4], 64)
		st.LastWindow, _ = strconv.Atoi(m[5])
		st.LastP99US, _ = strconv.ParseFloat(m[6], 64)
		out[[2]string{node[m[1]], node[m[2]]}] = st
	}
	return out, nil
}

// up creates the namespaces, the bridge and the delay.
func (tb *Testbed) up() error {
	// The bridge's namespace is created first and deleted last: while it exists its prefix is
	// taken. Another testbed (of this test process or another) may have taken the prefix since
	// newTestbed looked; `ip netns add` never reuses a name, so pick another then.
	for attempt := 0; ; attempt++ {
		err := tb.addNamespace(tb.swNS)
		if err == nil {
			break
		}
		if !errors.Is(err, errNamespaceExists) || attempt == 20 {
			return err
		}
		tb.setPrefix(fmt.Sprintf("ef%04x", rand.Uint32()&0xffff))
	}
	for _, args := range [][]string{
		{"-n", tb.swNS, "link", "set", "lo", "up"},
		{"-n", tb.swNS, "link", "add", "br0", "type", "bridge"},
		{"-n", tb.swNS, "link", "set", "br0", "up"},
	} {
		if err := command("ip", args...); err != nil {
			return err
		}
	}
	ports := append([]string(nil), tb.nodes...)
	ports = append(ports, "") // the monitor
	for i, node := range ports {
		ns, ip, veth := tb.netns[node], tb.ips[node], fmt.Sprintf("v%d", i+1)
		if node == "" {
			ns, ip, veth = tb.monNS, monitorIP, "vmon"
		}
		if err := tb.addNamespace(ns); err != nil {
			return err
		}
		for _, args := range [][]string{
			{"-n", ns, "link", "set", "lo", "up"},
			{"-n", tb.swNS, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
			{"-n", tb.swNS, "link", "set", veth, "master", "br0", "up"},
			{"-n", ns, "addr", "add", ip + "/24", "dev", "eth0"},
			{"-n", ns, "link", "set", "eth0", "up"},
		} {
			if err := command("ip", args...); err != nil {
				return err
			}
		}
		for _, a := range tb.aliases[node] { // none for the monitor ("")
			if err := command("ip", "-n", ns, "addr", "add", a+"/24", "dev", "eth0"); err != nil {
				return err
			}
		}
	}
	if err := command("ip", "netns", "exec", tb.swNS, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"); err != nil {
		return err
	}
	// The monitor's traffic (scrapes, a test's clients) has no delay: it bypasses the queue, so
	// that nqdelay's CPU goes to the delayed node pairs only.
	for _, dir := range []string{"-s", "-d"} {
		if err := command("ip", "netns", "exec", tb.swNS, "iptables", "-w", "-A", "FORWARD",
			"-m", "physdev", "--physdev-is-bridged", dir, monitorIP, "-j", "ACCEPT"); err != nil {
			return err
		}
	}
	if err := command("ip", "netns", "exec", tb.swNS, "iptables", "-w", "-A", "FORWARD",
		"-m", "physdev", "--physdev-is-bridged", "-s", subnet+".0/24", "-d", subnet+".0/24",
		"-j", "NFQUEUE", "--queue-num", queueNum); err != nil {
		return err
	}
	tb.rt = command("chrt", "-f", nqdelayRT, "true") == nil
	if err := buildNqdelay(tb.nqBin); err != nil {
		return err
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if err := tb.writeMatrix(); err != nil {
		return err
	}
	argv := append([]string{"ip", "netns", "exec", tb.swNS}, tb.realtime(nqdelayRT)...)
	argv = append(argv, tb.nqBin, "-queue", queueNum, "-matrix", tb.matrix)
	p, err := tb.startLocked("nqdelay", argv)
	if err != nil {
		return err
	}
	tb.nqdelay = p
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := p.waitLog(ctx, 0, func(l string) bool { return strings.Contains(l, "nqdelay: queue "+queueNum+" bound") }); err != nil {
		return fmt.Errorf("testbed: nqdelay did not bind its queue: %w", err)
	}
	return nil
}

// realtime returns the command prefix running a program at SCHED_FIFO priority prio, or nothing
// when the machine does not allow it.
func (tb *Testbed) realtime(prio string) []string {
	if !tb.rt {
		return nil
	}
	return []string{"chrt", "-f", prio}
}

func (tb *Testbed) addNamespace(ns string) error {
	if err := newNamespace(ns); err != nil {
		return err
	}
	tb.mu.Lock()
	tb.created = append(tb.created, ns)
	tb.mu.Unlock()
	return nil
}

// errNamespaceExists: `ip netns add` found the name taken.
var errNamespaceExists = errors.New("namespace exists")

// newNamespace runs `ip netns add ns`, which fails (errNamespaceExists) when the name is taken:
// the name is this caller's alone once it returns nil.
func newNamespace(ns string) error {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "add", ns).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("File exists")) {
			err = fmt.Errorf("%w: %w", errNamespaceExists, err)
		}
		return fmt.Errorf("testbed: ip netns add %s: %w: %s", ns, err, bytes.TrimSpace(out))
	}
	return nil
}

// writeMatrix writes nqdelay's matrix file (atomically: nqdelay may be reading it). Called with
// tb.mu held.
func (tb *Testbed) writeMatrix() error {
	var b bytes.Buffer
	b.WriteString("# ipA ipB rtt_ms (each direction is held rtt_ms/2)\n")
	for i, a := range tb.nodes {
		for _, c := range tb.nodes[i+1:] {
			ms := tb.rtt[[2]string{a, c}]
			for _, ipA := range append([]string{tb.ips[a]}, tb.aliases[a]...) {
				for _, ipC := range append([]string{tb.ips[c]}, tb.aliases[c]...) {
					fmt.Fprintf(&b, "%s %s %g # %s–%s\n", ipA, ipC, ms, a, c)
				}
			}
		}
	}
	if len(tb.tcpPenalty) > 0 {
		b.WriteString("# tcp ipSrc ipDst extra_ms (TCP packets from ipSrc to ipDst only)\n")
	}
	for _, from := range tb.nodes { // in node order: the file is the same every time
		for _, to := range tb.nodes {
			ms, ok := tb.tcpPenalty[[2]string{from, to}]
			if !ok || ms == 0 {
				continue
			}
			for _, ipF := range append([]string{tb.ips[from]}, tb.aliases[from]...) {
				for _, ipT := range append([]string{tb.ips[to]}, tb.aliases[to]...) {
					fmt.Fprintf(&b, "tcp %s %s %g # %s→%s\n", ipF, ipT, ms, from, to)
				}
			}
		}
	}
	tmp := tb.matrix + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("testbed: write matrix: %w", err)
	}
	if err := os.Rename(tmp, tb.matrix); err != nil {
		return fmt.Errorf("testbed: write matrix: %w", err)
	}
	return nil
}

// buildNqdelay builds the nqdelay command into bin.
func buildNqdelay(bin string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("testbed: build nqdelay: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, "github.com/edgeflow/edgeflow/e2e/testbed/nqdelay")
	// Build from the source next to this file when it is there (it is unless built with
	// -trimpath); otherwise from the working directory, which a test runs inside the module.
	if _, file, _, ok := runtime.Caller(0); ok {
		if dir := filepath.Join(filepath.Dir(file), "nqdelay"); isDir(dir) {
			cmd.Dir = dir
			cmd.Args[len(cmd.Args)-1] = "."
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: build nqdelay (%s in %s): %w\n%s", strings.Join(cmd.Args, " "), cmd.Dir, err, out)
	}
	return nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// command runs a short setup command and returns an error naming it, with its output.
func command(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testbed: %s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// teardown stops every process, waiting for each, prints the logs' tails if the test failed,
// and deletes the namespaces.
func (tb *Testbed) teardown(t testing.TB) {
	tb.transport.CloseIdleConnections()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	procs := tb.procs
	for i := len(procs) - 1; i >= 0; i-- {
		if err := procs[i].stop(stopTimeout); err != nil {
			t.Logf("testbed: teardown: %v", err)
		}
	}
	var usage []string
	for _, p := range procs {
		usage = append(usage, fmt.Sprintf("%s: %s", p.name, p.usage()))
	}
	t.Logf("testbed: stopped %s", strings.Join(usage, "; "))
	if t.Failed() {
		seen := map[string]bool{}
		for _, p := range procs {
			if seen[p.logPath] {
				continue
			}
			seen[p.logPath] = true
			t.Logf("testbed: %s (%s), last lines of %s:\n%s", p.name, p.usage(), p.logPath, p.tail(25))
		}
	}
	for i := len(tb.created) - 1; i >= 0; i-- {
		if err := command("ip", "netns", "del", tb.created[i]); err != nil {
			t.Errorf("testbed: teardown: %v", err)
		}
	}
	tb.created = nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

// lines calls f on every complete line of b until f returns true, and reports whether it did.
func lines(b []byte, f func(string) bool) bool {
	b = b[:bytes.LastIndexByte(b, '\n')+1]
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if f(sc.Text()) {
			return true
		}
	}
	return false
}
