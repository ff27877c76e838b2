package demo

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/edgeflow/edgeflow/internal/demo/app"
	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// Scenario is what every policy run of an experiment shares: the emulated cluster and the load.
type Scenario struct {
	// Cluster configures the pods; its XDSServer is set by RunPolicy.
	Cluster Config
	// Load is the load into the topology's ingress services. Its Rate replaces the topology's
	// ingress rates (scaled in proportion), so the plan and the offered load agree.
	Load loadgen.Config
	// LBPolicy is the callers' load-balancing policy (xdsserver.Config.LBPolicy; "" means
	// round-robin over the policy's weights). With xds.LBLeastRequest the policy's allocation
	// is planned (Outcome.Plan) but every caller balances least-request over all callee pods.
	LBPolicy xds.LBPolicy
	// Logger receives the xDS server's logs (nil: discarded).
	Logger *slog.Logger
	// FeedbackWindow is the closed-loop policy's estimator window (0: DefaultFeedbackWindow).
	FeedbackWindow time.Duration
	// NoLatencyCorrection turns the closed-loop policy's latency correction off: it plans on
	// the topology's latencies (ICMP) as the other rows do.
	NoLatencyCorrection bool
}

// Outcome is the result of one policy run.
type Outcome struct {
	Policy optimizer.Policy
	// LBPolicy is the callers' load-balancing policy (Scenario.LBPolicy, default filled in).
	LBPolicy xds.LBPolicy
	// Load is the load generator's measurement of the end-to-end latency.
	Load *loadgen.Result
	// Plan is the allocation the xDS server published.
	Plan *optimizer.Allocation
	// Routes are the requests counted at the callees, per route, over the whole run (warm-up
	// included: the weights are final before the first request).
	Routes []RouteCount
	// Deviation compares Routes with Plan.
	Deviation Deviation
	// Pods are the pods' counters at the end of the run.
	Pods map[string]app.Stats
	// NACKs counts xDS responses the clients rejected (should be 0).
	NACKs float64
	// Wall is the time from the start of the stack to the outcome.
	Wall time.Duration
	// Feedback is the closed-loop policy's windows (nil for other policies).
	Feedback []FeedbackRound
}

// SetupTimeout bounds the wait for the xDS server's first publication and for every caller's
// xDS channel to become ready.
const SetupTimeout = 30 * time.Second

// WithIngressRate returns a copy of t whose ingress rates are scaled to sum to rate.
func WithIngressRate(t *optimizer.Topology, rate float64) (*optimizer.Topology, error) {
	var total float64
	for _, in := range t.Ingress {
		total += in.RPS
	}
	if !(total > 0) {
		return nil, fmt.Errorf("%w: the topology has no ingress rate to scale", optimizer.ErrInvalidTopology)
	}
	c := t.Clone()
	for i := range c.Ingress {
		c.Ingress[i].RPS *= rate / total
	}
	return c, nil
}

// Stack is one policy's running system: edgeflow's xDS server with that policy on 127.0.0.1 and
// a fresh emulated cluster whose callers use it. Several stacks can run side by side (each has
// its own ports), so an experiment can interleave policies in time.
type Stack struct {
	policy  optimizer.Policy
	scn     Scenario
	srv     *xdsserver.Server
	reg     *prometheus.Registry
	g       *grpc.Server
	cluster *Cluster
	started time.Time

	stop      context.CancelFunc // ends the xDS push loop and the closed loop
	serveDone chan error
	pushDone  chan error
	feedback  *feedback // closed-loop only
	fbDone    chan error
}

// StartStack starts the xDS server (policy p) and the cluster, publishes the cluster's topology
// with ingress rates scaled to sc.Load.Rate and latencies scaled by sc.Cluster.LatencyScale
// (so the plan's costs are those of the injected latencies), and waits (at most SetupTimeout) until every caller
// pod's xDS channel is ready. The stack runs until Close, which the caller must call; if
// StartStack fails it has stopped everything itself. ctx bounds only the start.
func StartStack(ctx context.Context, sc Scenario, p optimizer.Policy) (_ *Stack, err error) {
	topo, err := WithIngressRate(sc.Cluster.Topology, sc.Load.Rate)
	if err != nil {
		return nil, err
	}
	// The xDS server must plan with the latencies the cluster injects, as it would with
	// measured ones: scale the topology itself, and inject it unscaled.
	opts := sc.Cluster.Options
	if k := sc.Cluster.LatencyScale; k != 0 && k != 1 {
		if !(k > 0) {
			return nil, fmt.Errorf("demo: latency scale must be positive, got %v", k)
		}
		for i := range topo.Latency {
			topo.Latency[i].MS *= k
		}
		if d := opts.DefaultLatencyMS; d != nil {
			scaled := *d * k
			opts.DefaultLatencyMS = &scaled
		}
		sc.Cluster.LatencyScale, sc.Cluster.Options = 1, opts
	}
	logger := sc.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if sc.LBPolicy, err = xds.ParseLBPolicy(string(sc.LBPolicy)); err != nil {
		return nil, err
	}
	if p == optimizer.ClosedLoop {
		topo = withoutCapacity(topo) // it learns them
	}
	s := &Stack{policy: p, scn: sc, reg: prometheus.NewRegistry(), started: time.Now()}
	s.srv, err = xdsserver.New(xdsserver.Config{Policy: p, LBPolicy: sc.LBPolicy, Options: opts, DebounceQuiet: -1, Logger: logger, Registerer: s.reg})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo: xDS listener: %w", err)
	}
	s.g = grpc.NewServer()
	s.srv.Register(s.g)
	pushCtx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.serveDone, s.pushDone = make(chan error, 1), make(chan error, 1)
	go func() { s.serveDone <- s.g.Serve(lis) }()    // owned by the Stack; ends at Close
	go func() { s.pushDone <- s.srv.Run(pushCtx) }() // owned by the Stack; ends at Close
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	cc := sc.Cluster
	cc.Topology = topo
	cc.LBPolicy = sc.LBPolicy
	cc.XDSServer = lis.Addr().String()
	if s.cluster, err = Start(cc); err != nil {
		return nil, err
	}
	s.srv.Update(s.cluster.Topology())
	// A topology the server rejects, or resources the clients NACK, would leave these waits
	// hanging: the server logs why; give up after SetupTimeout.
	setup, setupDone := context.WithTimeout(ctx, SetupTimeout)
	defer setupDone()
	if err := s.srv.WaitPublished(setup, 1); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("demo: %s: the xDS server did not publish the topology within %v (see its log)", p, SetupTimeout)
	}
	if err := s.cluster.WaitReady(setup); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("demo: %s: %w", p, err)
	}
	if p == optimizer.ClosedLoop {
		if s.feedback, err = newFeedback(s.srv, s.cluster.Topology(), opts, s.cluster, cc.Workers, sc.FeedbackWindow, logger); err != nil {
			return nil, err
		}
		if sc.NoLatencyCorrection {
			s.feedback.latency = nil // planned on ICMP
		}
		s.fbDone = make(chan error, 1)
		go func() { s.fbDone <- s.feedback.run(pushCtx) }() // owned by the Stack; ends at Close
	}
	return s, nil
}

// withoutCapacity returns t without any configured service rate: the closed loop starts from
// none and measures them.
func withoutCapacity(t *optimizer.Topology) *optimizer.Topology {
	c := t.Clone()
	for i := range c.Services {
		c.Services[i].CapacityRPS = nil
		for j := range c.Services[i].Pods {
			c.Services[i].Pods[j].CapacityRPS = nil
		}
	}
	return c
}

// Policy returns the stack's allocation policy.
func (s *Stack) Policy() optimizer.Policy { return s.policy }

// Cluster returns the stack's cluster.
func (s *Stack) Cluster() *Cluster { return s.cluster }

// Load applies open-loop load at cfg's rate into the ingress pods and returns the measurement
// once every request has finished. Its rate should be the scenario's (the published plan
// assumes it). Calls must not overlap if their measurements are to be independent.
func (s *Stack) Load(ctx context.Context, cfg loadgen.Config) (*loadgen.Result, error) {
	send, err := s.cluster.Ingress()
	if err != nil {
		return nil, err
	}
	res, err := loadgen.Run(ctx, cfg, send)
	if err != nil {
		return nil, err
	}
	if err := s.cluster.Err(); err != nil {
		return nil, err
	}
	return res, nil
}

// Outcome reports the stack's run so far: load is the load measurement (e.g. merged over the
// stack's Load calls); the split is counted over every request the cluster received.
func (s *Stack) Outcome(load *loadgen.Result) *Outcome {
	plan := s.srv.Allocation()
	routes := s.cluster.Observed(nil, s.cluster.Received())
	var fb []FeedbackRound
	if s.feedback != nil {
		fb = s.feedback.Rounds()
	}
	return &Outcome{
		Feedback:  fb,
		Policy:    s.policy,
		LBPolicy:  s.scn.LBPolicy,
		Load:      load,
		Plan:      plan,
		Routes:    routes,
		Deviation: SplitDeviation(plan, routes),
		Pods:      s.cluster.Stats(),
		NACKs:     counterSum(s.reg, "edgeflow_xds_nacks_total"),
		Wall:      time.Since(s.started),
	}
}

// Close stops the cluster and the xDS server and waits for them. It returns the first error
// one of them failed with.
func (s *Stack) Close() error {
	var err error
	if s.cluster != nil {
		err = s.cluster.Close()
	}
	s.stop()
	s.g.Stop()
	if serr := <-s.serveDone; serr != nil && err == nil {
		err = fmt.Errorf("demo: xDS server: %w", serr)
	}
	if perr := <-s.pushDone; perr != nil && err == nil {
		err = perr
	}
	if s.fbDone != nil {
		if ferr := <-s.fbDone; ferr != nil && err == nil {
			err = ferr
		}
	}
	return err
}

// RunPolicy runs one policy on a fresh stack: StartStack, one Load of sc.Load, the Outcome, and
// Close — also on error or when ctx is done.
func RunPolicy(ctx context.Context, sc Scenario, p optimizer.Policy) (out *Outcome, err error) {
	s, err := StartStack(ctx, sc, p)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := s.Close(); cerr != nil && err == nil {
			out, err = nil, cerr
		}
	}()
	res, err := s.Load(ctx, sc.Load)
	if err != nil {
		return nil, err
	}
	return s.Outcome(res), nil
}

// WaitReady connects every caller pod's xDS channels and waits until all are READY: each has
// received its listener, route, clusters and endpoints from the xDS server and connected to a
// callee pod.
func (c *Cluster) WaitReady(ctx context.Context) error {
	for _, conn := range c.xdsConns {
		conn.Connect()
	}
	for _, conn := range c.xdsConns {
		for {
			s := conn.GetState()
			if s == connectivity.Ready {
				break
			}
			if !conn.WaitForStateChange(ctx, s) {
				return fmt.Errorf("demo: channel %s not ready (%v): %w", conn.CanonicalTarget(), s, ctx.Err())
			}
		}
	}
	return nil
}

func counterSum(g prometheus.Gatherer, name string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
