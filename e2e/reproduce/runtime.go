package reproduce

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/edgeflow/edgeflow/e2e/testbed"
)

// podPort is the port every pod serves on (its containerPort and its Service's targetPort).
const podPort = 9000

// aliasesPerNode is how many pod addresses each node has: node i (from 0) owns
// 198.18.0.(20(i+1)+1) … 198.18.0.(20(i+1)+aliasesPerNode), so 4 nodes use .21–.99.
const aliasesPerNode = 19

// podAddresses returns the pod addresses of every node (testbed.Config.Aliases).
func podAddresses(nodes []string) map[string][]string {
	out := map[string][]string{}
	for i, n := range nodes {
		for k := 1; k <= aliasesPerNode; k++ {
			out[n] = append(out[n], fmt.Sprintf("198.18.0.%d", 20*(i+1)+k))
		}
	}
	return out
}

// processRuntime is the fake kubelet's container runtime: each pod is a process of the pod
// binary in its node's network namespace, on one of the node's pod addresses, with its
// container's args (the application's parameters) and an xDS bootstrap naming it POD.NAMESPACE.
type processRuntime struct {
	tb       *testbed.Testbed
	podBin   string
	xdsAddr  string // the xDS server as pods reach it (inside the monitor namespace)
	logDir   string
	pool     map[string][]string // node → its pod addresses
	deadline time.Duration

	mu      sync.Mutex
	slow    map[string]float64 // component → the slowdown its next pod started gets (then removed)
	slowed  map[string]string  // component → the pod that got it
	cores   map[string]string  // node → the Unix socket of its cores (nodeCores); none: no --node-cpu
	running map[types.UID]*podProcess
	used    map[string]bool // addresses in use
	next    map[string]int  // node → where its next address search starts
}

type podProcess struct {
	name, node, ip string
	cmd            *exec.Cmd
	done           chan struct{}
}

func newProcessRuntime(tb *testbed.Testbed, podBin, xdsAddr, logDir string, pool map[string][]string) *processRuntime {
	return &processRuntime{tb: tb, podBin: podBin, xdsAddr: xdsAddr, logDir: logDir, pool: pool, deadline: 20 * time.Second,
		running: map[types.UID]*podProcess{}, used: map[string]bool{}, next: map[string]int{},
		slow: map[string]float64{}, slowed: map[string]string{}}
}

// setCores gives the pods started from now on their node's cores (node → Unix socket; nil:
// none).
func (r *processRuntime) setCores(socks map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cores = socks
}

// SlowNext gives the next pod of component (its app label) started `--slow factor`: slower
// than its peers, unseen by Kubernetes and edgeflow. Slowed returns its name once started.
func (r *processRuntime) SlowNext(component string, factor float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slow[component] = factor
}

// Slowed returns the pod of component that SlowNext slowed ("" before it started).
func (r *processRuntime) Slowed(component string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.slowed[component]
}

// allocate returns the node's next free pod address after the last one given out, as the
// host-local IPAM plugin does, so that a pod's address is not handed straight to the next pod:
// callers of the pod that left still hold a connection to that address in grpc's reconnect
// backoff (seconds, growing), and would skip the new pod until it expires. "" if none is free.
// r.mu is held.
func (r *processRuntime) allocate(node string) string {
	pool := r.pool[node]
	for k := range pool {
		i := (r.next[node] + k) % len(pool)
		if !r.used[pool[i]] {
			r.next[node] = i + 1
			return pool[i]
		}
	}
	return ""
}

// Start runs the pod's process and returns its IP once it listens.
func (r *processRuntime) Start(ctx context.Context, pod *corev1.Pod) (netip.Addr, error) {
	node := pod.Spec.NodeName
	r.mu.Lock()
	if p, ok := r.running[pod.UID]; ok {
		r.mu.Unlock()
		return netip.MustParseAddr(p.ip), nil
	}
	ip := r.allocate(node)
	if ip == "" {
		r.mu.Unlock()
		return netip.Addr{}, fmt.Errorf("pod %s: node %q has no free pod address", pod.Name, node)
	}
	r.used[ip] = true
	r.mu.Unlock()

	p, err := r.launch(pod, node, ip)
	if err != nil {
		r.mu.Lock()
		delete(r.used, ip)
		r.mu.Unlock()
		return netip.Addr{}, err
	}
	r.mu.Lock()
	r.running[pod.UID] = p
	r.mu.Unlock()
	if err := r.waitListening(ctx, p); err != nil {
		r.Stop(pod)
		return netip.Addr{}, err
	}
	return netip.MustParseAddr(ip), nil
}

func (r *processRuntime) launch(pod *corev1.Pod, node, ip string) (*podProcess, error) {
	bootstrap, err := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{"server_uri": r.xdsAddr,
			"channel_creds": []any{map[string]any{"type": "insecure"}}, "server_features": []string{"xds_v3"}}},
		"node": map[string]any{"id": pod.Name + "." + pod.Namespace, "cluster": "edgeflow-reproduce"},
	})
	if err != nil {
		return nil, err
	}
	var args []string
	if len(pod.Spec.Containers) > 0 {
		args = append(args, expandArgs(pod.Spec.Containers[0], ip)...)
	}
	args = append(args, "--name", pod.Name, "--node", node, "--listen", net.JoinHostPort(ip, fmt.Sprint(podPort)))
	r.mu.Lock()
	if sock := r.cores[node]; sock != "" {
		args = append(args, "--node-cpu", sock)
	}
	if f, ok := r.slow[pod.Labels["app"]]; ok {
		delete(r.slow, pod.Labels["app"])
		r.slowed[pod.Labels["app"]] = pod.Name
		args = append(args, "--slow", strconv.FormatFloat(f, 'g', -1, 64))
	}
	r.mu.Unlock()
	cmd := r.tb.Exec(node, r.podBin, args...)
	if cmd.Err != nil {
		return nil, cmd.Err
	}
	cmd.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP_CONFIG="+string(bootstrap))
	f, err := os.OpenFile(filepath.Join(r.logDir, pod.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	p := &podProcess{name: pod.Name, node: node, ip: ip, cmd: cmd, done: make(chan struct{})}
	go func() { // owned by the runtime: ends when the process exits (Stop kills it)
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// expandArgs returns c's args with $(NAME) replaced by the value of c's environment variable
// NAME, as the kubelet expands them: a literal value, or the pod's IP for one from the downward
// API's status.podIP (the only field this runtime fills). A reference to another name stays
// as written, as the kubelet leaves it.
func expandArgs(c corev1.Container, ip string) []string {
	var pairs []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			pairs = append(pairs, "$("+e.Name+")", e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			pairs = append(pairs, "$("+e.Name+")", ip)
		}
	}
	if len(pairs) == 0 {
		return c.Args
	}
	rep := strings.NewReplacer(pairs...)
	out := make([]string, len(c.Args))
	for i, a := range c.Args {
		out[i] = rep.Replace(a)
	}
	return out
}

// waitListening polls the pod's log until it says it serves.
func (r *processRuntime) waitListening(ctx context.Context, p *podProcess) error {
	ctx, cancel := context.WithTimeout(ctx, r.deadline)
	defer cancel()
	log := filepath.Join(r.logDir, p.name+".log")
	for {
		if b, err := os.ReadFile(log); err == nil && strings.Contains(string(b), "serving on "+net.JoinHostPort(p.ip, fmt.Sprint(podPort))) {
			return nil
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(log)
			return fmt.Errorf("pod %s exited on start: %s", p.name, lastLines(string(b), 10))
		case <-ctx.Done():
			return fmt.Errorf("pod %s: not serving within %v", p.name, r.deadline)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop sends SIGTERM, waits up to 5 s, then kills; it frees the pod's address.
func (r *processRuntime) Stop(pod *corev1.Pod) {
	r.mu.Lock()
	p, ok := r.running[pod.UID]
	delete(r.running, pod.UID)
	r.mu.Unlock()
	if !ok {
		return
	}
	stopProcess(p.cmd, p.done, 5*time.Second)
	r.mu.Lock()
	delete(r.used, p.ip)
	r.mu.Unlock()
}

// StopAll stops every pod still running (the experiment's cleanup).
func (r *processRuntime) StopAll() {
	r.mu.Lock()
	var all []*podProcess
	for uid, p := range r.running {
		all = append(all, p)
		delete(r.running, uid)
	}
	r.mu.Unlock()
	for _, p := range all {
		stopProcess(p.cmd, p.done, 5*time.Second)
	}
}

// Placement returns the running pods' nodes, pod name → node.
func (r *processRuntime) Placement() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for _, p := range r.running {
		out[p.name] = p.node
	}
	return out
}

// stopProcess sends SIGTERM, then SIGKILL after grace, and waits for done.
func stopProcess(cmd *exec.Cmd, done chan struct{}, grace time.Duration) {
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}
