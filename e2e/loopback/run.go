package loopback

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/edgeflow/edgeflow/e2e/app"
	"github.com/edgeflow/edgeflow/e2e/loadgen"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// Scenario is what every policy run of an experiment shares: the emulated cluster and the load.
type Scenario struct {
	// Cluster configures the pods; its XDSServer is set by RunPolicy.
	Cluster Config
	// Load is the load into the topology's ingress services. Its Rate replaces the topology's
	// ingress rates (scaled in proportion), so the plan and the offered load agree.
	Load loadgen.Config
	// Logger receives the xDS server's logs (nil: discarded).
	Logger *slog.Logger
}

// Outcome is the result of one policy run.
type Outcome struct {
	Policy optimizer.Policy
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
	// Wall is the run's wall time, set-up and teardown included.
	Wall time.Duration
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

// RunPolicy runs one policy on a fresh emulated cluster: it starts edgeflow's xDS server
// (policy p) on 127.0.0.1, starts the cluster's pods against it, publishes the cluster's
// topology, waits until every caller's xDS channel is ready, applies the load, and stops
// everything it started before it returns — also on error or when ctx is done.
func RunPolicy(ctx context.Context, sc Scenario, p optimizer.Policy) (out *Outcome, err error) {
	start := time.Now()
	topo, err := WithIngressRate(sc.Cluster.Topology, sc.Load.Rate)
	if err != nil {
		return nil, err
	}
	logger := sc.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	srv, err := xds.NewServer(xds.Config{Policy: p, Options: sc.Cluster.Options, DebounceQuiet: -1, Logger: logger, Registerer: reg})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("loopback: xDS listener: %w", err)
	}
	g := grpc.NewServer()
	srv.Register(g)

	runCtx, cancel := context.WithCancel(ctx)
	serveDone, pushDone := make(chan error, 1), make(chan error, 1)
	go func() { serveDone <- g.Serve(lis) }()   // ends at g.Stop below
	go func() { pushDone <- srv.Run(runCtx) }() // ends at cancel below
	var cluster *Cluster
	defer func() {
		if cluster != nil {
			if cerr := cluster.Close(); cerr != nil && err == nil {
				err = cerr
			}
		}
		cancel()
		g.Stop()
		if serr := <-serveDone; serr != nil && err == nil {
			err = fmt.Errorf("loopback: xDS server: %w", serr)
		}
		if perr := <-pushDone; perr != nil && err == nil {
			err = perr
		}
	}()

	cc := sc.Cluster
	cc.Topology = topo
	cc.XDSServer = lis.Addr().String()
	cluster, err = Start(cc)
	if err != nil {
		return nil, err
	}
	srv.Update(cluster.Topology())
	// A topology the server rejects, or resources the clients NACK, would leave these waits
	// hanging: the server logs why; give up after SetupTimeout.
	setup, setupDone := context.WithTimeout(runCtx, SetupTimeout)
	defer setupDone()
	if err := srv.WaitPublished(setup, 1); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("loopback: the xDS server did not publish the topology within %v (see its log)", SetupTimeout)
	}
	if err := cluster.WaitReady(setup); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	send, err := cluster.Ingress()
	if err != nil {
		return nil, err
	}
	res, err := loadgen.Run(runCtx, sc.Load, send)
	if err != nil {
		return nil, err
	}
	if err := cluster.Err(); err != nil {
		return nil, err
	}
	plan := srv.Allocation()
	routes := cluster.Observed(nil, cluster.Received())
	out = &Outcome{
		Policy:    p,
		Load:      res,
		Plan:      plan,
		Routes:    routes,
		Deviation: SplitDeviation(plan, routes),
		Pods:      cluster.Stats(),
		NACKs:     counterSum(reg, "edgeflow_xds_nacks_total"),
	}
	out.Wall = time.Since(start)
	return out, nil
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
				return fmt.Errorf("loopback: channel %s not ready (%v): %w", conn.CanonicalTarget(), s, ctx.Err())
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
