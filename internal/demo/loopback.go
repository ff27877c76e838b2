// Package demo runs a topology's pods in one process on 127.0.0.1, as a small stand-in for
// the network-namespace testbed: every pod is an app.Pod on its own port; a caller pod reaches
// its callees through grpc-go xDS channels (target xds:///SERVICE) carrying its own xDS identity
// (node id = pod name), against the management server the caller names; and the latency between
// the emulated nodes is injected by the callee, which sleeps the round-trip time between the
// caller's node and its own (the caller sends its node in request metadata) before it queues
// for a worker. The whole round trip is slept on the request path: one timer instead of two, and
// the callee's queue sees the same arrivals, shifted. Requests from outside (the load
// generator) carry no node and get no delay. The pods of a node share its cores
// (optimizer.Node.CoreCount; app.NodeCPU), at a speed only the demo knows (Config.NodeSpeed),
// and each pod serves the telemetry a stock mesh has on its own /metrics port (MetricsURLs).
// RunPolicy runs one allocation policy end to end: edgeflow's xDS server, a fresh cluster,
// open-loop load, and the observed split.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"
	xdsclient "google.golang.org/grpc/xds" // registers the xDS resolver and balancers

	"github.com/edgeflow/edgeflow/internal/demo/app"
	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/prom"
	"github.com/edgeflow/edgeflow/xds"
)

// Config describes the emulated cluster.
type Config struct {
	// Topology gives the nodes, the latency between them, the services with their placed pods
	// and the call graph. It is not modified.
	Topology *optimizer.Topology
	// Options are used to compile Topology (e.g. a default latency for missing node pairs).
	Options optimizer.Options
	// Workers is every pod's number of workers (≥ 1).
	Workers int
	// ServiceTime is every pod's mean service time, exponentially distributed.
	ServiceTime time.Duration
	// LatencyScale multiplies every latency of Topology (the paper's scenario B is 2: every
	// round-trip time doubled);
	// 0 means 1.
	LatencyScale float64
	// Seed seeds the pods' service-time generators (each pod derives its own stream).
	Seed uint64
	// XDSServer is the management server's HOST:PORT the pods' xDS clients connect to.
	XDSServer string
	// NodeSpeed, by node name, divides the service times of the node's pods (0.5: the node
	// takes twice as long); a node not listed has speed 1. PodSlowdown, by pod name,
	// multiplies a pod's service times. Both are the world's hidden truth: the topology the
	// xDS server plans with does not say. Unknown names are an error.
	NodeSpeed, PodSlowdown map[string]float64
	// L7Penalty, by directed node pair, is a delay the callee adds to every request from a pod
	// on From to a pod on To, on top of the round-trip time (not scaled by LatencyScale): what
	// a path pays beyond its ICMP RTT (a sidecar's or a middlebox's cost) that the topology's
	// latencies do not say. Hidden like NodeSpeed: the closed loop must find it from the
	// telemetry. Unknown nodes, a pair of one node (its cost is every same-node path's, the
	// baseline the correction subtracts) and a delay that is not positive are errors.
	L7Penalty map[NodePair]time.Duration
	// LBPolicy is the callers' load-balancing policy (Scenario.LBPolicy): the locality their
	// attempt metrics name follows it, as grpc-go's follows the EDS localities edgeflow sends
	// (see attemptLocality).
	LBPolicy xds.LBPolicy
}

// NodePair is a directed pair of nodes: requests from pods on From to pods on To.
type NodePair struct{ From, To string }

func (p NodePair) String() string { return p.From + ":" + p.To }

// Cluster is a running emulated cluster. Its methods but Close are safe for concurrent use.
type Cluster struct {
	topo     *optimizer.Topology // with pod addresses
	podSvc   map[string]string   // pod → service
	byAddr   map[string]podAt    // pod address → the pod; written by Start only
	pods     []*app.Pod
	conns    []*grpc.ClientConn // every channel the cluster created
	xdsConns []*grpc.ClientConn // the caller pods' xDS channels
	ingress  []ingressTarget
	metrics  map[string]string // pod → its /metrics URL
	servers  []*http.Server    // the pods' metrics servers

	cancel context.CancelFunc
	wg     sync.WaitGroup
	errMu  sync.Mutex
	err    error

	wrrMu sync.Mutex
}

type ingressTarget struct {
	conn    *grpc.ClientConn
	weight  float64 // requests per second planned into this pod
	current float64 // smooth weighted round-robin state
}

// Start binds a port on 127.0.0.1 for every pod of cfg.Topology, creates the caller pods' xDS
// channels (they connect lazily) and serves every pod. The pods serve until Close, which the
// caller must call, also when the run fails; after an error Start has stopped everything itself.
func Start(cfg Config) (*Cluster, error) {
	if cfg.Topology == nil {
		return nil, errors.New("demo: no topology")
	}
	if cfg.Workers < 1 {
		return nil, fmt.Errorf("demo: workers must be ≥ 1, got %d", cfg.Workers)
	}
	if cfg.ServiceTime < 0 {
		return nil, fmt.Errorf("demo: negative service time %v", cfg.ServiceTime)
	}
	scale := cfg.LatencyScale
	if scale == 0 {
		scale = 1
	}
	if !(scale > 0) {
		return nil, fmt.Errorf("demo: latency scale must be positive, got %v", cfg.LatencyScale)
	}
	if cfg.XDSServer == "" {
		return nil, errors.New("demo: no xDS server address")
	}
	m, err := optimizer.Compile(cfg.Topology, cfg.Options)
	if err != nil {
		return nil, err
	}
	nodes, err := nodeCPUs(cfg)
	if err != nil {
		return nil, err
	}
	if err := checkPenalty(cfg); err != nil {
		return nil, err
	}
	topo := cfg.Topology.Clone()
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cluster{topo: topo, podSvc: map[string]string{}, byAddr: map[string]podAt{}, metrics: map[string]string{}, cancel: cancel}
	// Bind first: the addresses are part of the topology the xDS server publishes.
	listeners := map[string]net.Listener{} // closed by the pods' servers once they serve
	ok := false
	defer func() {
		if !ok {
			closeAll(listeners)
			c.Close()
		}
	}()
	for si := range topo.Services {
		for pi := range topo.Services[si].Pods {
			p := &topo.Services[si].Pods[pi]
			if p.Node == "" {
				return nil, fmt.Errorf("demo: pod %s is not placed on a node", p.Name)
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, fmt.Errorf("demo: pod %s: %w", p.Name, err)
			}
			listeners[p.Name] = lis
			p.Address = lis.Addr().String()
			c.podSvc[p.Name] = topo.Services[si].Name
			c.byAddr[p.Address] = podAt{name: p.Name, node: p.Node}
		}
	}

	for si, s := range topo.Services {
		sm := &m.Services[si]
		for pi, p := range s.Pods {
			podNode := sm.Pods[pi].Node
			var downstream []app.Downstream
			var builder resolver.Builder
			for _, e := range m.Calls {
				if e.From != si {
					continue
				}
				if builder == nil {
					if builder, err = xdsResolver(cfg.XDSServer, p.Name, p.Node); err != nil {
						return nil, err
					}
				}
				callee := m.Services[e.To].Name
				calleeSvc := &topo.Services[e.To]
				conn, err := grpc.NewClient("xds:///"+callee,
					grpc.WithResolvers(builder),
					grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					return nil, fmt.Errorf("demo: pod %s: channel to %s: %w", p.Name, callee, err)
				}
				c.conns = append(c.conns, conn)
				c.xdsConns = append(c.xdsConns, conn)
				downstream = append(downstream, app.Downstream{Service: calleeSvc.Name, Namespace: calleeSvc.NamespaceOrDefault(),
					Rate: e.Rate, Conn: conn, Target: conn.CanonicalTarget()})
			}
			pod, err := app.NewPod(app.Config{
				Name:        p.Name,
				Node:        p.Node,
				Workload:    s.Name,
				Namespace:   s.NamespaceOrDefault(),
				Workers:     cfg.Workers,
				ServiceTime: app.NewExponential(cfg.ServiceTime, cfg.Seed^hash(p.Name)),
				NodeCPU:     nodes[p.Node],
				Slowdown:    cfg.PodSlowdown[p.Name],
				CPURequest:  float64(s.CPU) / 1000,
				Delay:       rttFrom(m, podNode, scale, cfg.L7Penalty),
				Downstream:  downstream,
				Locality:    c.attemptLocality(cfg.LBPolicy),
			})
			if err != nil {
				return nil, fmt.Errorf("demo: %w", err)
			}
			c.pods = append(c.pods, pod)
		}
	}

	for _, in := range topo.Ingress {
		si, _ := m.ServiceIndex(in.Service)
		sm := &m.Services[si]
		total := sm.TotalWeight()
		for pi, p := range topo.Services[si].Pods {
			conn, err := grpc.NewClient("passthrough:///"+p.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, fmt.Errorf("demo: ingress to %s: %w", p.Name, err)
			}
			c.conns = append(c.conns, conn)
			share := 1 / float64(len(sm.Pods))
			if total > 0 {
				share = sm.Pods[pi].Weight / total
			}
			c.ingress = append(c.ingress, ingressTarget{conn: conn, weight: in.RPS * share})
		}
	}

	for _, pod := range c.pods {
		if err := c.serveMetrics(pod); err != nil {
			return nil, err
		}
	}
	for _, pod := range c.pods {
		lis := listeners[pod.Name()]
		delete(listeners, pod.Name()) // Serve owns it now
		c.wg.Add(1)
		go func() { // owned by the Cluster; ends at Close
			defer c.wg.Done()
			if err := pod.Serve(ctx, lis); err != nil {
				c.fail(fmt.Errorf("demo: pod %s: %w", pod.Name(), err))
			}
		}()
	}
	ok = true
	return c, nil
}

// nodeCPUs returns the shared cores of every node that has a core count (capped at the number
// of workers its pods have, beyond which cores change nothing) or a speed; nil for the others,
// whose pods are bound by their own workers only. It also checks cfg's pod slowdowns.
func nodeCPUs(cfg Config) (map[string]*app.NodeCPU, error) {
	workers := map[string]int{}    // node → its pods' workers
	podNode := map[string]string{} // pod → node
	for _, s := range cfg.Topology.Services {
		for _, p := range s.Pods {
			workers[p.Node] += cfg.Workers
			podNode[p.Name] = p.Node
		}
	}
	out := map[string]*app.NodeCPU{}
	for _, n := range cfg.Topology.Nodes {
		speed, cores := cfg.NodeSpeed[n.Name], min(n.CoreCount(), workers[n.Name])
		if cores == 0 && speed == 0 {
			continue
		}
		cpu, err := app.NewNodeCPU(app.NodeConfig{Name: n.Name, Cores: cores, Speed: speed})
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		out[n.Name] = cpu
	}
	for node := range cfg.NodeSpeed {
		if !slices.ContainsFunc(cfg.Topology.Nodes, func(n optimizer.Node) bool { return n.Name == node }) {
			return nil, fmt.Errorf("demo: node speed of %q: no such node in the topology", node)
		}
	}
	for pod, f := range cfg.PodSlowdown {
		if _, ok := podNode[pod]; !ok {
			return nil, fmt.Errorf("demo: slowdown of pod %q: no such pod in the topology", pod)
		}
		if !(f > 0) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("demo: slowdown of pod %q: must be positive and finite, got %v", pod, f)
		}
	}
	return out, nil
}

// serveMetrics serves the pod's /metrics on a port of its own on 127.0.0.1, until Close.
func (c *Cluster) serveMetrics(pod *app.Pod) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo: pod %s: metrics listener: %w", pod.Name(), err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", pod.Metrics())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	c.servers = append(c.servers, srv)
	c.metrics[pod.Name()] = "http://" + lis.Addr().String() + "/metrics"
	c.wg.Add(1)
	go func() { // owned by the Cluster; ends at Close
		defer c.wg.Done()
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			c.fail(fmt.Errorf("demo: pod %s: metrics: %w", pod.Name(), err))
		}
	}()
	return nil
}

// MetricsURLs returns, by pod name, the URL of the pod's /metrics (Prometheus text: Istio's
// request metrics, a stand-in for cAdvisor's CPU usage, and the pod's CPU request; see
// internal/demo/app). The caller must not modify it.
func (c *Cluster) MetricsURLs() map[string]string { return c.metrics }

func closeAll(ls map[string]net.Listener) {
	for _, l := range ls {
		l.Close()
	}
}

// xdsResolver returns an xds:/// resolver whose xDS client identifies as node id pod: each
// channel built with it has its own xDS client, so one process holds many identities.
func xdsResolver(server, pod, node string) (resolver.Builder, error) {
	bootstrap, err := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      server,
			"channel_creds":   []any{map[string]any{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{
			"id":       pod,
			"cluster":  "edgeflow-loopback",
			"locality": map[string]any{"zone": node},
		},
	})
	if err != nil {
		return nil, err
	}
	b, err := xdsclient.NewXDSResolverWithConfigForTesting(bootstrap)
	if err != nil {
		return nil, fmt.Errorf("demo: pod %s: xDS bootstrap: %w", pod, err)
	}
	return b, nil
}

// rttFrom returns the delay a pod on node `to` injects for requests from a pod on another node:
// the round-trip time between the nodes, scaled, plus the pair's L7 penalty. Requests from
// outside (no node) get none.
func rttFrom(m *optimizer.Model, to int, scale float64, penalty map[NodePair]time.Duration) func(string) time.Duration {
	toName := m.Nodes[to].Name
	return func(from string) time.Duration {
		if from == "" {
			return 0
		}
		u, ok := m.NodeIndex(from)
		if !ok {
			return 0
		}
		return time.Duration(m.Latency.At(u, to)*scale*float64(time.Millisecond)) + penalty[NodePair{from, toName}]
	}
}

// checkPenalty checks cfg's L7 penalties (Config.L7Penalty).
func checkPenalty(cfg Config) error {
	nodes := map[string]bool{}
	for _, n := range cfg.Topology.Nodes {
		nodes[n.Name] = true
	}
	for p, d := range cfg.L7Penalty {
		for _, n := range []string{p.From, p.To} {
			if !nodes[n] {
				return fmt.Errorf("demo: L7 penalty %s: no node %q in the topology", p, n)
			}
		}
		if p.From == p.To {
			return fmt.Errorf("demo: L7 penalty %s: a pair of one node (a same-node path is the baseline the latency correction subtracts; name two nodes)", p)
		}
		if d <= 0 {
			return fmt.Errorf("demo: L7 penalty %s: %v, want a positive delay", p, d)
		}
	}
	return nil
}

// podAt is a pod and its node.
type podAt struct{ name, node string }

// attemptLocality returns the pods' Config.Locality: the xDS locality grpc-go labels a call
// attempt with (grpc.lb.locality) for the callee at an address, as edgeflow's EDS gives it
// under lb (xds/build.go): under LBBands one locality per band (zone: the callee's node,
// sub_zone: xds.BandSubZone); under LBLeastRequest one locality of all pods (sub_zone:
// xds.AllPodsSubZone); otherwise one per pod (zone: its node, sub_zone: its name). (A pod the
// caller reaches only at priority 1, the failover locality, is labelled as at priority 0: the
// demo's pods do not fail.)
func (c *Cluster) attemptLocality(lb xds.LBPolicy) func(addr string) string {
	return func(addr string) string {
		p, ok := c.byAddr[addr]
		if !ok {
			return ""
		}
		switch lb {
		case xds.LBBands:
			return prom.Locality{Zone: p.node, SubZone: xds.BandSubZone}.String()
		case xds.LBLeastRequest:
			return prom.Locality{SubZone: xds.AllPodsSubZone}.String()
		}
		return prom.Locality{Zone: p.node, SubZone: p.name}.String()
	}
}

func hash(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

func (c *Cluster) fail(err error) {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

// Err returns the first error a pod's server failed with, or nil.
func (c *Cluster) Err() error {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return c.err
}

// Topology returns the cluster's topology: the configured one with every pod's Address set to
// where it serves. The caller must not modify it.
func (c *Cluster) Topology() *optimizer.Topology { return c.topo }

// Close stops every pod and closes every channel the cluster created, and waits for the pods'
// servers to return. It is idempotent; it returns the first error a pod's server failed with.
func (c *Cluster) Close() error {
	c.cancel()
	for _, srv := range c.servers {
		srv.Close()
	}
	c.wg.Wait()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
	return c.Err()
}

var errNoIngress = errors.New("demo: the topology has no ingress")

// Ingress returns a loadgen.Request that sends each request to a pod of an ingress service,
// directly (as an ingress gateway would; a timeout is reported as context.DeadlineExceeded), spread over the pods in proportion to the topology's
// ingress rates and the pods' capacity weights by smooth weighted round-robin, so every pod
// receives the share the allocation policies assume.
func (c *Cluster) Ingress() (loadgen.Request, error) {
	if len(c.ingress) == 0 {
		return nil, errNoIngress
	}
	return func(ctx context.Context, _ int) error {
		_, err := app.Call(ctx, c.nextIngress(), "", "")
		if status.Code(err) == codes.DeadlineExceeded {
			// Wherever the deadline struck, it is the load generator's timeout.
			return fmt.Errorf("%w (%s)", context.DeadlineExceeded, status.Convert(err).Message())
		}
		return err
	}, nil
}

// nextIngress is nginx's smooth weighted round-robin: deterministic, and every prefix of the
// sequence is within one request of the weights.
func (c *Cluster) nextIngress() *grpc.ClientConn {
	c.wrrMu.Lock()
	defer c.wrrMu.Unlock()
	var total float64
	best := -1
	for i := range c.ingress {
		t := &c.ingress[i]
		t.current += t.weight
		total += t.weight
		if best < 0 || t.current > c.ingress[best].current {
			best = i
		}
	}
	c.ingress[best].current -= total
	return c.ingress[best].conn
}

// Received is, per callee pod, the number of requests received from each caller pod ("" for
// requests from outside the cluster).
type Received map[string]map[string]uint64

// Received returns a snapshot of every pod's arrival counters.
func (c *Cluster) Received() Received {
	out := Received{}
	for _, p := range c.pods {
		out[p.Name()] = p.Stats().Received
	}
	return out
}

// SetSlowdown changes the named pod's slowdown while it serves (app.Pod.SetSlowdown; Config's
// PodSlowdown at start): the hidden truth changing under a running test. An unknown pod, or a
// slowdown that is not positive and finite, is an error.
func (c *Cluster) SetSlowdown(pod string, f float64) error {
	for _, p := range c.pods {
		if p.Name() == pod {
			return p.SetSlowdown(f)
		}
	}
	return fmt.Errorf("demo: slowdown of pod %q: no such pod in the cluster", pod)
}

// Stats returns a snapshot of every pod's counters, by pod name.
func (c *Cluster) Stats() map[string]app.Stats {
	out := map[string]app.Stats{}
	for _, p := range c.pods {
		out[p.Name()] = p.Stats()
	}
	return out
}
