package install

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

const controlPlaneLabel = "node-role.kubernetes.io/control-plane"

// probeDaemonSet is the chart's probe DaemonSet rendered with values.
func probeDaemonSet(t *testing.T, values map[string]any) (*appsv1.DaemonSet, []string) {
	t.Helper()
	objs := render(t, values)
	var ds appsv1.DaemonSet
	convert(t, find(t, objs, "DaemonSet", release+"-blackbox"), &ds)
	return &ds, deploymentArgs(t, objs)
}

// The exporter stays off control-plane nodes unless asked: by default no toleration (of their
// taint or any other), a required node affinity excluding node-role.kubernetes.io/control-plane,
// and edgeflow told the same (--probe-node-selector), so /sd/probes lists no pair from or to a
// node without an exporter. latencyProbes.controlPlane tolerates their NoSchedule taint and
// lifts both; latencyProbes.tolerations add to either.
func TestProbeExporterPlacement(t *testing.T) {
	t.Parallel()
	notCP := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: controlPlaneLabel, Operator: corev1.NodeSelectorOpDoesNotExist}}}}
	cpToleration := corev1.Toleration{Key: controlPlaneLabel, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	edge := corev1.Toleration{Key: "edge", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}
	for _, tc := range []struct {
		name        string
		values      map[string]any
		terms       []corev1.NodeSelectorTerm
		tolerations []corev1.Toleration
		selector    string // edgeflow's --probe-node-selector
	}{
		{"defaults", nil, notCP, nil, "!" + controlPlaneLabel},
		{"another taint", map[string]any{"latencyProbes": map[string]any{"tolerations": []any{map[string]any{"key": "edge", "operator": "Equal", "value": "true", "effect": "NoSchedule"}}}},
			notCP, []corev1.Toleration{edge}, "!" + controlPlaneLabel},
		{"control plane asked for", map[string]any{"latencyProbes": map[string]any{"controlPlane": true}}, nil, []corev1.Toleration{cpToleration}, ""},
		{"control plane and another taint", map[string]any{"latencyProbes": map[string]any{"controlPlane": true,
			"tolerations": []any{map[string]any{"key": "edge", "operator": "Equal", "value": "true", "effect": "NoSchedule"}}}},
			nil, []corev1.Toleration{cpToleration, edge}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, args := probeDaemonSet(t, tc.values)
			spec := ds.Spec.Template.Spec
			var terms []corev1.NodeSelectorTerm
			if a := spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
				terms = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			}
			if diff := cmp.Diff(tc.terms, terms); diff != "" {
				t.Errorf("required node affinity (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.tolerations, spec.Tolerations); diff != "" {
				t.Errorf("tolerations (-want +got):\n%s", diff)
			}
			for _, tol := range spec.Tolerations {
				if tol.Key == "" && tol.Operator == corev1.TolerationOpExists && tc.values == nil {
					t.Errorf("a toleration of every taint: %v", tol)
				}
			}
			var selector string
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--probe-node-selector="); ok {
					selector = v
				}
			}
			if selector != tc.selector {
				t.Errorf("edgeflow's --probe-node-selector %q, want %q", selector, tc.selector)
			}
		})
	}
}

// A NetworkPolicy admits only Prometheus' pods (latencyProbes.networkPolicy.prometheus: by
// default namespace monitoring, pods app.kubernetes.io/name=prometheus; a value given replaces
// them whole) to the exporter's port, selecting exactly the DaemonSet's pods; off when disabled.
func TestProbeExporterNetworkPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		values         map[string]any
		nsLabels, pods map[string]string
		port           int
		want           bool
	}{
		{"defaults", nil, map[string]string{"kubernetes.io/metadata.name": "monitoring"}, map[string]string{"app.kubernetes.io/name": "prometheus"}, 9115, true},
		{"Prometheus elsewhere, another port", map[string]any{"latencyProbes": map[string]any{"port": 9200, "networkPolicy": map[string]any{
			"prometheus": []any{map[string]any{
				"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "observability"}},
				"podSelector":       map[string]any{"matchLabels": map[string]any{"app": "prometheus", "component": "server"}}}}}}},
			map[string]string{"kubernetes.io/metadata.name": "observability"}, map[string]string{"app": "prometheus", "component": "server"}, 9200, true},
		{"disabled", map[string]any{"latencyProbes": map[string]any{"networkPolicy": map[string]any{"enabled": false}}}, nil, nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.values)
			var ds appsv1.DaemonSet
			convert(t, find(t, objs, "DaemonSet", release+"-blackbox"), &ds)
			var np *networkingv1.NetworkPolicy
			for _, o := range objs {
				if o.GetKind() == "NetworkPolicy" && o.GetName() == release+"-blackbox" {
					np = &networkingv1.NetworkPolicy{}
					convert(t, o, np)
				}
			}
			if !tc.want {
				if np != nil {
					t.Fatal("a NetworkPolicy rendered though disabled")
				}
				return
			}
			if np == nil {
				t.Fatal("no NetworkPolicy for the exporter")
			}
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil || sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) || np.Namespace != namespace {
				t.Errorf("the NetworkPolicy %s/%s selects %v (%v), not the exporter's pods %v", np.Namespace, np.Name, np.Spec.PodSelector, err, ds.Spec.Template.Labels)
			}
			tcp := corev1.ProtocolTCP
			port := intstr.FromInt32(int32(tc.port))
			want := networkingv1.NetworkPolicySpec{
				PodSelector: np.Spec.PodSelector,
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{
						NamespaceSelector: &metav1.LabelSelector{MatchLabels: tc.nsLabels},
						PodSelector:       &metav1.LabelSelector{MatchLabels: tc.pods},
					}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			}
			if diff := cmp.Diff(want, np.Spec); diff != "" {
				t.Errorf("NetworkPolicy (-want +got):\n%s", diff)
			}
		})
	}
}

// The exporter's privileges. By default (icmpSocket=unprivileged) the pod runs as user and
// group 65534, non-root, and every container drops every capability and adds none, with no
// privilege escalation and a read-only root filesystem; an init container checks the node's
// net.ipv4.ping_group_range. icmpSocket=raw is root with NET_RAW only and no check. Either way:
// the host network, the exporter bound to the node's address only, RuntimeDefault seccomp, no
// service account token, one module, icmp, that needs no raw socket (no dont_fragment).
func TestProbeExporterSecurityContext(t *testing.T) {
	t.Parallel()
	i64 := func(v int64) *int64 { return &v }
	yes, no := true, false
	unprivileged := &corev1.SecurityContext{RunAsNonRoot: &yes, AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes, Privileged: &no,
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	raw := &corev1.SecurityContext{RunAsUser: i64(0), RunAsNonRoot: &no, AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes, Privileged: &no,
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_RAW"}}}
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	for _, tc := range []struct {
		name      string
		values    map[string]any
		pod       *corev1.PodSecurityContext
		container *corev1.SecurityContext
		check     bool // the init container
	}{
		{"defaults", nil, &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: i64(65534), RunAsGroup: i64(65534), SeccompProfile: seccomp}, unprivileged, true},
		{"another group", map[string]any{"latencyProbes": map[string]any{"runAsUser": 1000, "runAsGroup": 2000}},
			&corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: i64(1000), RunAsGroup: i64(2000), SeccompProfile: seccomp}, unprivileged, true},
		{"raw sockets", map[string]any{"latencyProbes": map[string]any{"icmpSocket": "raw"}}, &corev1.PodSecurityContext{SeccompProfile: seccomp}, raw, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.values)
			var ds appsv1.DaemonSet
			convert(t, find(t, objs, "DaemonSet", release+"-blackbox"), &ds)
			spec := ds.Spec.Template.Spec
			if diff := cmp.Diff(tc.pod, spec.SecurityContext); diff != "" {
				t.Errorf("pod securityContext (-want +got):\n%s", diff)
			}
			if len(spec.Containers) != 1 {
				t.Fatalf("%d containers", len(spec.Containers))
			}
			ctrs := append(slices.Clone(spec.InitContainers), spec.Containers...)
			for _, c := range ctrs {
				if diff := cmp.Diff(tc.container, c.SecurityContext); diff != "" {
					t.Errorf("container %s securityContext (-want +got):\n%s", c.Name, diff)
				}
			}
			if got := len(spec.InitContainers) == 1 && strings.Contains(strings.Join(spec.InitContainers[0].Command, " "), "/proc/sys/net/ipv4/ping_group_range"); got != tc.check {
				t.Errorf("the ping_group_range check: %v, want %v (init containers %v)", got, tc.check, spec.InitContainers)
			}
			if !spec.HostNetwork || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken || len(spec.Volumes) != 1 || spec.Volumes[0].ConfigMap == nil {
				t.Errorf("host network %v, service account token %v, volumes %v", spec.HostNetwork, spec.AutomountServiceAccountToken, spec.Volumes)
			}
			ctr := spec.Containers[0]
			if !slices.Contains(ctr.Args, "--web.listen-address=$(HOST_IP):9115") || len(ctr.Env) != 1 || ctr.Env[0].ValueFrom.FieldRef.FieldPath != "status.hostIP" {
				t.Errorf("the exporter listens at %v with %v, want the node's address only", ctr.Args, ctr.Env)
			}
			data, _, _ := unstructuredString(find(t, objs, "ConfigMap", release+"-blackbox").Object, "data", "blackbox.yml")
			var cfg struct {
				Modules map[string]map[string]any `json:"modules"`
			}
			if err := yaml.UnmarshalStrict([]byte(data), &cfg); err != nil {
				t.Fatal(err)
			}
			want := map[string]map[string]any{"icmp": {"prober": "icmp", "timeout": "5s",
				"icmp": map[string]any{"preferred_ip_protocol": "ip4", "ip_protocol_fallback": false}}}
			if diff := cmp.Diff(want, cfg.Modules); diff != "" {
				t.Errorf("blackbox modules (-want +got):\n%s", diff)
			}
		})
	}
}

// The chart's unprivileged exporter, for real: Debian's blackbox-exporter (0.23; the chart's
// image is 0.25, whose ICMP prober chooses its socket the same way, prober/icmp.go: an
// unprivileged "udp4" ICMP socket first, a raw one only if that fails, and raw always for
// dont_fragment) runs with the chart's arguments, module, user and group, with no capability
// at all, in a network namespace of its own — whose net.ipv4.ping_group_range the test sets, so
// the host's is never touched and needs no restoring. It probes 127.0.0.1 by ICMP once the range
// covers its group, and not before; the chart's init check refuses, naming the range and the
// way out, and then passes.
func TestProbeExporterUnprivileged(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (a network namespace of its own, whose net.ipv4.ping_group_range it sets)")
	}
	blackbox, setpriv := needBinary(t, "prometheus-blackbox-exporter"), needBinary(t, "setpriv")
	hostRange, err := os.ReadFile("/proc/sys/net/ipv4/ping_group_range")
	if err != nil {
		t.Fatal(err)
	}
	objs := render(t, nil)
	var ds appsv1.DaemonSet
	convert(t, find(t, objs, "DaemonSet", release+"-blackbox"), &ds)
	spec := ds.Spec.Template.Spec
	uid, gid := *spec.SecurityContext.RunAsUser, *spec.SecurityContext.RunAsGroup
	check := spec.InitContainers[0].Command

	// The exporter's files, readable by its user.
	dir, err := os.MkdirTemp("", "edgeflow-probe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bbConfig, _, _ := unstructuredString(find(t, objs, "ConfigMap", release+"-blackbox").Object, "data", "blackbox.yml")
	if err := os.WriteFile(filepath.Join(dir, "blackbox.yml"), []byte(bbConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range spec.Containers[0].Args {
		a = strings.ReplaceAll(a, "$(HOST_IP)", "127.0.0.1") // the node's address, here the namespace's loopback
		a = strings.ReplaceAll(a, "/etc/blackbox/", dir+"/")
		args = append(args, a)
	}
	asChart := []string{setpriv, "--reuid=" + strconv.FormatInt(uid, 10), "--regid=" + strconv.FormatInt(gid, 10), "--clear-groups",
		"--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"}

	ns := newNetns(t)
	setRange := func(r string) {
		t.Helper()
		if err := ns.do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte(r), 0o644) }); err != nil {
			t.Fatal(err)
		}
	}
	runCheck := func() (string, error) {
		var out []byte
		err := ns.do(func() error {
			var err error
			out, err = exec.Command(asChart[0], append(asChart[1:], check...)...).CombinedOutput()
			return err
		})
		return strings.TrimSpace(string(out)), err
	}

	// A new namespace's range is the kernel's default, "1 0": no group.
	setRange("1\t0")
	out, err := runCheck()
	if err == nil || !strings.Contains(out, fmt.Sprintf(`net.ipv4.ping_group_range is "1 0": it does not cover group %d`, gid)) || !strings.Contains(out, "latencyProbes.icmpSocket=raw") {
		t.Errorf("the init check with the range \"1 0\": %v, %q; want a failure naming the range and the way out", err, out)
	}
	_, proc := startLoggedWith(t, dir, "blackbox", ns.start, append(asChart, append([]string{blackbox}, args...)...)...)
	transport := &http.Transport{DialContext: ns.dial, DisableKeepAlives: true}
	t.Cleanup(transport.CloseIdleConnections)
	client := &http.Client{Timeout: 20 * time.Second, Transport: transport}
	base := "http://127.0.0.1:" + strconv.Itoa(int(spec.Containers[0].Ports[0].ContainerPort))
	testkit.Eventually(t, 30*time.Second, "the exporter's /-/healthy", func() bool {
		resp, err := client.Get(base + "/-/healthy")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", proc.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fmt.Sprintf("Uid:\t%d\t%d\t%d\t%d", uid, uid, uid, uid), fmt.Sprintf("Gid:\t%d\t%d\t%d\t%d", gid, gid, gid, gid),
		"CapPrm:\t0000000000000000", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000"} {
		if !strings.Contains(string(status), want+"\n") {
			t.Errorf("the exporter's /proc/PID/status lacks %q:\n%s", want, status)
		}
	}
	probe := func() map[string]float64 {
		t.Helper()
		resp, err := client.Get(base + "/probe?module=icmp&target=127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return promSamples(t, resp.Body, "probe_success", `probe_icmp_duration_seconds{phase="rtt"}`)
	}
	if got := probe(); got["probe_success"] != 0 {
		t.Errorf("probe with the range \"1 0\": %v; want probe_success 0 (no ICMP socket for group %d)", got, gid)
	}

	// The range covers the group: the check passes and the exporter pings.
	setRange(fmt.Sprintf("%d\t%d", gid, gid))
	if out, err := runCheck(); err != nil {
		t.Errorf("the init check with the range covering %d: %v, %q", gid, err, out)
	}
	got := probe()
	if got["probe_success"] != 1 || got[`probe_icmp_duration_seconds{phase="rtt"}`] <= 0 {
		t.Errorf("probe of 127.0.0.1 as user %d group %d with no capability: %v; want probe_success 1 and an RTT", uid, gid, got)
	}
	t.Logf("as user %d, group %d, no capability: %v", uid, gid, got)
	if now, _ := os.ReadFile("/proc/sys/net/ipv4/ping_group_range"); string(now) != string(hostRange) {
		t.Errorf("the host's ping_group_range changed: %q, was %q", now, hostRange)
	}
}

// promSamples reads the named samples (name{labels} as printed) of a Prometheus text answer.
func promSamples(t *testing.T, r io.Reader, names ...string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("%s: %v", sc.Text(), err)
		}
		out[name] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// netns is a network namespace of the test's own, with its loopback up, held by one locked OS
// thread that runs whatever do hands it: what it opens (sockets, /proc/sys/net files) and
// starts (processes) is in the namespace. The thread ends, and the namespace with the last
// process in it, when the test does.
type netns struct{ run chan func() }

func newNetns(t *testing.T) *netns {
	t.Helper()
	n := &netns{run: make(chan func())}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread, in another namespace, ends with this goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		ready <- loopbackUp()
		for f := range n.run {
			f()
		}
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(n.run) }) // after the processes' cleanups (Pdeathsig follows this thread)
	return n
}

// do runs f on the namespace's thread.
func (n *netns) do(f func() error) error {
	errc := make(chan error, 1)
	n.run <- func() { errc <- f() }
	return <-errc
}

// start starts cmd inside the namespace, on its thread (which outlives the processes started
// on it: the namespace's cleanup runs after theirs), and returns a channel that receives
// cmd.Wait's error when the process has exited (startLoggedWith's start).
func (n *netns) start(cmd *exec.Cmd) (<-chan error, error) {
	if err := n.do(cmd.Start); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return exited, nil
}

// dial connects from inside the namespace (the socket is made on its thread).
func (n *netns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// loopbackUp sets the current thread's namespace's lo up (a new namespace's is down).
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}
