// Package app is the simulated microservice pod of edgeflow's testbeds. A Pod is a gRPC server
// whose work is simulated service time — a fixed number of workers, each request holding one
// for a drawn service time while sleeping, not spinning — so queueing and overload behave as on
// real pods without burning the machine's CPU (the schedule is computed in virtual time from
// the arrival times, so the machine's timer lag does not eat into a pod's capacity; see
// workerQueue). The pods of one node may share its cores (NodeCPU): a request then also holds
// one of the node's cores, so co-located pods contend. After its own work a pod calls its downstream
// services through gRPC client connections (in the testbeds: grpc-go xDS channels that carry the
// pod's own xDS identity), and it counts which caller pod sent each request, so a test can compare
// the traffic split it observed with the one it planned. It exports the telemetry a stock mesh
// has (Pod.Metrics: Istio's request metrics, cAdvisor's CPU usage, kube-state-metrics' CPU
// request).
package app

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The pods' gRPC API: one unary method taking google.protobuf.Empty and answering the serving
// pod's name as a google.protobuf.StringValue. Built from well-known types, so it needs no
// generated code.
const (
	ServiceName = "edgeflow.e2e.Pod"
	// MethodCall is the full method name clients invoke.
	MethodCall = "/" + ServiceName + "/Call"
)

// Request metadata a calling pod attaches, so the callee can inject the network delay between
// the two pods' nodes and count the route. Requests without them (the load generator) come from
// outside the cluster: no delay, counted under caller "".
const (
	MetadataCallerPod  = "x-edgeflow-caller-pod"
	MetadataCallerNode = "x-edgeflow-caller-node"
)

// Request metadata a calling pod attaches so the callee can label its metrics with the caller's
// workload, as Istio's sidecars exchange peer metadata. Absent, the source is "unknown".
const (
	MetadataCallerWorkload  = "x-edgeflow-caller-workload"
	MetadataCallerNamespace = "x-edgeflow-caller-namespace"
	MetadataCallerVersion   = "x-edgeflow-caller-version"
)

// Downstream is a service a pod calls for every request it serves.
type Downstream struct {
	// Service is the callee service's name (for error messages and the metrics' destination
	// labels).
	Service string
	// Namespace is the callee service's namespace; "" means "default".
	Namespace string
	// Rate is the number of calls per request served; a fractional part is the probability of
	// one more call (rate 1.5: one call, and a second one half of the time).
	Rate float64
	// Conn carries the calls, e.g. a grpc-go channel to xds:///SERVICE. The pod does not own it.
	Conn grpc.ClientConnInterface
	// Target is the target Conn dialled (grpc-go's ClientConn.CanonicalTarget, e.g.
	// "xds:///reviews"): the grpc_target label of the pod's attempt-duration stand-in.
	Target string
}

// Config describes a pod.
type Config struct {
	// Name is the pod's name; it is sent to callees as MetadataCallerPod.
	Name string
	// Node is the pod's (emulated) node; it is sent to callees as MetadataCallerNode.
	Node string
	// Workload is the pod's workload (its service's name in the testbeds); "" means Name.
	// Namespace is the pod's namespace ("" means "default") and Version its version label (""
	// means "v1"). They label the pod's metrics and are sent to callees.
	Workload, Namespace, Version string
	// NodeCPU, when set, is the pod's node's cores, shared with the other pods on it: a request
	// then needs one of the pod's workers and one of the node's cores, and its service time is
	// divided by the node's speed. Nil: the pod's workers only (a node with unlimited cores).
	NodeCPU *NodeCPU
	// Slowdown multiplies every drawn service time (2: the pod takes twice as long, say a
	// noisy neighbour or a throttled container); 0 means 1. Like a node's speed, it is hidden.
	// Pod.SetSlowdown changes it while the pod serves.
	Slowdown float64
	// CPURequest is the pod's CPU request in cores, exported as kube-state-metrics does; 0
	// exports none.
	CPURequest float64
	// CPULimit is the pod's CPU limit in cores (limits.cpu), enforced per CPUPeriod as the
	// kernel's CFS bandwidth control does (quota.go): in each period the pod's requests run at
	// most CPULimit × CPUPeriod of service time, the rest waiting, throttled, for the next
	// period. 0: no limit. CPUPeriod 0 means DefaultCPUPeriod.
	CPULimit  float64
	CPUPeriod time.Duration
	// Workers is the number of requests the pod works on at once (≥ 1). Further requests wait,
	// first come first served. A worker is held for the service time only, not while the pod
	// waits for its downstream calls (as in an asynchronous server): the pod's capacity is
	// Workers / mean service time, whatever the latency downstream.
	Workers int
	// ServiceTime draws each request's service time; nil means zero.
	ServiceTime ServiceTime
	// Delay, if set, returns the network delay to inject on a request from a pod on callerNode
	// ("" for requests from outside). The pod sleeps it on arrival, before queueing for a worker;
	// the request arrives at its reception plus the delay, however late the timer (see handle).
	// Nil injects nothing (a real network provides the delay).
	Delay func(callerNode string) time.Duration
	// Downstream are called in order, sequentially, after the pod's own work (as Bookinfo's
	// productpage calls details, then reviews).
	Downstream []Downstream
	// Locality, if set, returns the xDS locality of the callee at peer address addr as grpc-go
	// labels its client metrics (grpc.lb.locality, gRFC A76's string, e.g. `{region="",
	// zone="n2", sub_zone="edgeflow/band"}`), and the pod exports its stand-in of grpc-go's
	// OpenTelemetry grpc.client.attempt.duration (see metrics.go). "" for an address it does
	// not know: grpc-go's value for a pick without a locality. Nil exports no attempt metric.
	Locality func(addr string) string
}

// Pod is a simulated microservice pod. Its methods are safe for concurrent use.
type Pod struct {
	cfg      Config
	queue    *workerQueue
	quota    *cpuQuota // nil: no CPU limit
	metrics  *podMetrics
	busy     atomic.Int64  // simulated CPU time, ns
	slowdown atomic.Uint64 // math.Float64bits of the slowdown in force (cfg.Slowdown at first)

	mu       sync.Mutex
	received map[string]uint64 // by caller pod

	served  atomic.Uint64
	failed  atomic.Uint64
	waiting atomic.Int64
	deepest atomic.Int64
}

// NewPod validates cfg and returns the pod. It starts nothing: register it on a gRPC server
// (Register) or serve it on a listener (Serve).
func NewPod(cfg Config) (*Pod, error) {
	if cfg.Name == "" {
		return nil, errors.New("app: pod without a name")
	}
	if cfg.Workers < 1 {
		return nil, fmt.Errorf("app: pod %s: workers must be ≥ 1, got %d", cfg.Name, cfg.Workers)
	}
	if cfg.Slowdown == 0 {
		cfg.Slowdown = 1
	}
	if !(cfg.Slowdown > 0) || math.IsInf(cfg.Slowdown, 0) {
		return nil, fmt.Errorf("app: pod %s: slowdown must be positive and finite, got %v", cfg.Name, cfg.Slowdown)
	}
	if !(cfg.CPURequest >= 0) || math.IsInf(cfg.CPURequest, 0) {
		return nil, fmt.Errorf("app: pod %s: bad CPU request %v", cfg.Name, cfg.CPURequest)
	}
	var quota *cpuQuota
	if cfg.CPULimit != 0 {
		if cfg.CPUPeriod == 0 {
			cfg.CPUPeriod = DefaultCPUPeriod
		}
		var err error
		if quota, err = newCPUQuota(cfg.CPULimit, cfg.CPUPeriod); err != nil {
			return nil, fmt.Errorf("app: pod %s: %w", cfg.Name, err)
		}
	}
	if cfg.Workload == "" {
		cfg.Workload = cfg.Name
	}
	if cfg.Namespace == "" {
		cfg.Namespace = defaultNamespace
	}
	if cfg.Version == "" {
		cfg.Version = defaultVersion
	}
	for _, d := range cfg.Downstream {
		if d.Conn == nil {
			return nil, fmt.Errorf("app: pod %s: downstream %s has no connection", cfg.Name, d.Service)
		}
		if !(d.Rate >= 0) || math.IsInf(d.Rate, 0) {
			return nil, fmt.Errorf("app: pod %s: downstream %s: bad rate %v", cfg.Name, d.Service, d.Rate)
		}
	}
	p := &Pod{cfg: cfg, queue: newWorkerQueue(cfg.Workers), quota: quota, received: map[string]uint64{}}
	p.slowdown.Store(math.Float64bits(cfg.Slowdown))
	p.metrics = newPodMetrics(p)
	return p, nil
}

// SetSlowdown changes the pod's slowdown (Config.Slowdown; 0 means 1) from the next request it
// draws a service time for: the world changing under a running test (a pod that becomes a noisy
// neighbour's victim). Requests already drawn keep theirs. It returns an error for a slowdown
// that is not positive and finite. Safe for concurrent use.
func (p *Pod) SetSlowdown(f float64) error {
	if f == 0 {
		f = 1
	}
	if !(f > 0) || math.IsInf(f, 0) {
		return fmt.Errorf("app: pod %s: slowdown must be positive and finite, got %v", p.cfg.Name, f)
	}
	p.slowdown.Store(math.Float64bits(f))
	return nil
}

// Name returns the pod's name.
func (p *Pod) Name() string { return p.cfg.Name }

// Register registers the pod's service on s.
func (p *Pod) Register(s grpc.ServiceRegistrar) {
	s.RegisterService(&serviceDesc, p)
}

// Serve serves the pod on lis until ctx is done, then stops the server (cancelling requests in
// flight), waits for their handlers to return, and returns nil. It closes lis. Other errors come
// from grpc.Server.Serve.
func (p *Pod) Serve(ctx context.Context, lis net.Listener) error {
	s := grpc.NewServer(grpc.WaitForHandlers(true))
	p.Register(s)
	stopped := make(chan struct{})
	go func() { // owned by Serve: ends when ctx is done or Serve returns
		select {
		case <-ctx.Done():
			s.Stop()
		case <-stopped:
		}
	}()
	err := s.Serve(lis)
	close(stopped)
	s.Stop()
	if ctx.Err() != nil || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Stats is a snapshot of a pod's counters.
type Stats struct {
	// Received counts requests by the caller pod that sent them ("" = from outside the cluster),
	// counted on arrival.
	Received map[string]uint64
	// Served counts requests answered successfully; Failed those answered with an error
	// (cancelled, timed out, or a downstream call failed).
	Served, Failed uint64
	// Waiting is the number of requests queued for a worker (or a core of the node) now;
	// MaxWaiting the most there have been at once.
	Waiting, MaxWaiting int64
}

// Stats returns a snapshot of the pod's counters.
func (p *Pod) Stats() Stats {
	p.mu.Lock()
	rcv := make(map[string]uint64, len(p.received))
	for k, v := range p.received {
		rcv[k] = v
	}
	p.mu.Unlock()
	return Stats{Received: rcv, Served: p.served.Load(), Failed: p.failed.Load(), Waiting: p.waiting.Load(), MaxWaiting: p.deepest.Load()}
}

// handle serves one request: inject the network delay, queue for a worker (and a core of the
// node), hold it for the service time, then make the downstream calls. The request arrives,
// for the metrics and the queue, when the network delay is over: at its reception plus the
// delay, a point in time rather than the moment a timer fires. A timer fires late (a fraction
// of a millisecond on an idle machine, more on a busy one), and a remote request that paid
// that lateness for its network delay and again for its service time would pay more than its
// round-trip time — an L7 cost the topology does not have. Admitted at its arrival and held
// until a finish computed from it, it pays one late timer, as a local request does.
func (p *Pod) handle(ctx context.Context) (*wrapperspb.StringValue, error) {
	caller := peerOf(ctx)
	p.mu.Lock()
	p.received[caller.pod]++
	p.mu.Unlock()

	arrival := time.Now()
	if p.cfg.Delay != nil {
		arrival = arrival.Add(p.cfg.Delay(caller.node))
		if err := sleep(ctx, time.Until(arrival)); err != nil {
			p.failed.Add(1) // lost in the network: it never reached the pod's sidecar
			return nil, err
		}
	}
	out, err := p.serve(ctx, arrival)
	p.metrics.inbound(ctx, caller, time.Since(arrival), err)
	if err != nil {
		p.failed.Add(1)
		return nil, err
	}
	p.served.Add(1)
	return out, nil
}

// serve does the pod's work, for a request that arrived at arrival, and its downstream calls.
func (p *Pod) serve(ctx context.Context, arrival time.Time) (*wrapperspb.StringValue, error) {
	if err := p.work(ctx, arrival); err != nil {
		return nil, err
	}
	out := metadata.AppendToOutgoingContext(ctx, MetadataCallerWorkload, p.cfg.Workload,
		MetadataCallerNamespace, p.cfg.Namespace, MetadataCallerVersion, p.cfg.Version)
	for _, d := range p.cfg.Downstream {
		for range calls(d.Rate) {
			start := time.Now()
			var callee grpcpeer.Peer
			_, err := Call(out, d.Conn, p.cfg.Name, p.cfg.Node, grpc.Peer(&callee))
			took := time.Since(start)
			p.metrics.outbound(ctx, d, took, err)
			if p.cfg.Locality != nil {
				locality := ""
				if callee.Addr != nil {
					locality = p.cfg.Locality(callee.Addr.String())
				}
				p.metrics.attempt(d, locality, took, err)
			}
			if err != nil {
				st := status.Convert(err)
				return nil, status.Errorf(st.Code(), "%s → %s: %s", p.cfg.Name, d.Service, st.Message())
			}
		}
	}
	return wrapperspb.String(p.cfg.Name), nil
}

// work queues the request, arrived at arrival, for a worker (and a core) and holds it for the
// service time. The busy time is counted when the request leaves, also when it is cancelled:
// it keeps its worker and core until its scheduled finish (workerQueue).
func (p *Pod) work(ctx context.Context, arrival time.Time) error {
	var service time.Duration
	if p.cfg.ServiceTime != nil {
		service = p.cfg.ServiceTime.Draw()
	}
	if f := math.Float64frombits(p.slowdown.Load()); f != 1 {
		service = time.Duration(float64(service) * f)
	}
	start, finish, cpu := admitLimited(p.queue, p.cfg.NodeCPU, p.quota, arrival, service)
	now := time.Now()
	defer p.busy.Add(int64(cpu))
	if start.After(now) {
		n := p.waiting.Add(1)
		for d := p.deepest.Load(); n > d && !p.deepest.CompareAndSwap(d, n); d = p.deepest.Load() {
		}
		err := sleep(ctx, start.Sub(now))
		p.waiting.Add(-1)
		if err != nil {
			return err
		}
	}
	return sleep(ctx, time.Until(finish))
}

// BusyTime is the pod's simulated CPU time so far: the sum of the service times (divided by
// its node's speed) of the requests it has worked on, each counted when it leaves.
func (p *Pod) BusyTime() time.Duration { return time.Duration(p.busy.Load()) }

// calls turns a call rate into a number of calls: the integer part, plus one with probability
// equal to the fractional part.
func calls(rate float64) int {
	n := math.Floor(rate)
	if f := rate - n; f > 0 && rand.Float64() < f {
		n++
	}
	return int(n)
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// peer is what a request's metadata says of its caller.
type peer struct {
	pod, node, workload, namespace, version string
}

func peerOf(ctx context.Context) peer {
	md, _ := metadata.FromIncomingContext(ctx)
	get := func(key string) string {
		if v := md.Get(key); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	return peer{pod: get(MetadataCallerPod), node: get(MetadataCallerNode), workload: get(MetadataCallerWorkload),
		namespace: get(MetadataCallerNamespace), version: get(MetadataCallerVersion)}
}

// Call invokes MethodCall on conn as pod fromPod on node fromNode (both may be empty for a
// caller outside the cluster) and returns the name of the pod that served it.
func Call(ctx context.Context, conn grpc.ClientConnInterface, fromPod, fromNode string, opts ...grpc.CallOption) (string, error) {
	if fromPod != "" || fromNode != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataCallerPod, fromPod, MetadataCallerNode, fromNode)
	}
	var out wrapperspb.StringValue
	if err := conn.Invoke(ctx, MethodCall, &emptypb.Empty{}, &out, opts...); err != nil {
		return "", err
	}
	return out.GetValue(), nil
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Call",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			p := srv.(*Pod)
			if interceptor == nil {
				return p.handle(ctx)
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: MethodCall}
			return interceptor(ctx, in, info, func(ctx context.Context, _ any) (any, error) { return p.handle(ctx) })
		},
	}},
	Metadata: "edgeflow/internal/demo/app/pod.go",
}
