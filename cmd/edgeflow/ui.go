package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgeflow/edgeflow/internal/metrics"
	"github.com/edgeflow/edgeflow/internal/ui"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// publisher is what publicationFollower reads from the xDS server.
type publisher interface {
	Published() uint64
	Publication() (uint64, *optimizer.Topology, *optimizer.Allocation)
	WaitPublished(ctx context.Context, n uint64) error
	WaitConverged(ctx context.Context, n uint64) error
}

var _ publisher = (*xdsserver.Server)(nil)

// The metrics the follower reads.
const (
	pushesTotal = "edgeflow_xds_pushes_total"
	nacksTotal  = "edgeflow_xds_nacks_total"
	fileErrors  = "edgeflow_watcher_topology_errors_total"
	streamsOpen = "edgeflow_xds_connected_clients"
)

// followerTick is how often the follower re-reads the degraded inputs and the clients' answers
// between publications.
const followerTick = time.Second

// publicationFollower follows serve's publications: at each one it sets the plan-cost gauges
// (the served plan's and round-robin's on the same topology) and, when the web view is on,
// hands it a ui.Snapshot of the publication: the topology it was planned from, as the server
// keeps it. It is a watcher.Listener (serve fans the topologies out to it) only to count the
// topology file's rejected reads since the last good one.
type publicationFollower struct {
	srv      publisher
	gatherer prometheus.Gatherer
	policy   optimizer.Policy
	opts     optimizer.Options
	checks   func() []watcher.Check // nil: no checks (file source)
	view     *ui.View               // nil: no web view
	log      *slog.Logger
	cost     *prometheus.GaugeVec

	mu       sync.Mutex
	fileErrs float64 // edgeflow_watcher_topology_errors_total when the last good topology came
}

func newPublicationFollower(srv publisher, reg *prometheus.Registry, policy optimizer.Policy, opts optimizer.Options,
	checks func() []watcher.Check, view *ui.View, logger *slog.Logger) (_ *publicationFollower, err error) {
	defer func() { err = metrics.Registered("plan cost", recover()) }()
	cost := promauto.With(reg).NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: "plan", Name: "latency_cost_seconds",
		Help: "Latency cost of the allocation served (allocation=served) and of round-robin's equal shares on the same topology (allocation=round_robin): Σ requests/s × network latency in seconds, the network latency accrued per second of traffic."},
		[]string{labelAllocation})
	return &publicationFollower{srv: srv, gatherer: reg, policy: policy, opts: opts, checks: checks, view: view, log: logger, cost: cost}, nil
}

// Update notes that a good topology came (the file's rejected reads count from here). It
// never blocks.
func (p *publicationFollower) Update(*optimizer.Topology) {
	errs := p.gather().sum(fileErrors)
	p.mu.Lock()
	p.fileErrs = errs
	p.mu.Unlock()
}

// Run follows the publications until ctx is done (the caller owns ctx); it returns nil then,
// once the waiters it started have ended.
func (p *publicationFollower) Run(ctx context.Context) error {
	var (
		snap         *ui.Snapshot
		planDegraded []ui.Degraded // what snapshot found wrong with snap's topology
		lastNACKs    float64
		waiters      sync.WaitGroup
		stopWait     = func() {}
		next         <-chan struct{}  // closed when a publication after snap's is out
		converged    <-chan time.Time // when snap's publication was answered by every client
	)
	defer waiters.Wait()
	defer func() { stopWait() }()
	lastPush := p.gather().byLabel(pushesTotal, "type")
	// Without the web view only the cost gauges are kept, at each publication.
	var tick <-chan time.Time
	if p.view != nil {
		t := time.NewTicker(followerTick)
		defer t.Stop()
		tick = t.C
	}
	for {
		n := p.srv.Published()
		g := p.gather()
		if snap == nil || n != snap.Publication {
			stopWait()
			at := time.Now()
			snap = &ui.Snapshot{RoundRobinCostMS: -1, Time: at}
			if n > 0 {
				snap = p.snapshot(at)
				n = snap.Publication // the publication shown: n, or one after it
				pushes, nacks := g.byLabel(pushesTotal, "type"), g.sum(nacksTotal)
				snap.Push.Resources = map[string]int{}
				for t, v := range pushes {
					snap.Push.Resources[t] = int(v - lastPush[t])
				}
				snap.Push.NACKs = int(nacks - lastNACKs)
				snap.Push.Streams = int(g.sum(streamsOpen))
				lastPush, lastNACKs = pushes, nacks
			}
			wctx, cancelWait := context.WithCancel(ctx)
			stopWait = cancelWait
			next, converged = p.wait(wctx, &waiters, n, p.view != nil)
			planDegraded = snap.Degraded
			snap.Degraded = append(slices.Clone(planDegraded), p.degraded(g)...)
			p.show(snap)
		}
		cp := *snap
		select {
		case <-ctx.Done():
			return nil
		case <-next:
			continue
		case at := <-converged:
			cp.Push.Converged, cp.Push.ConvergedAfterMS = true, float64(at.Sub(snap.Push.At).Microseconds())/1000
			converged = nil
		case <-tick:
		}
		// Between publications: the answers to the last push, and the inputs.
		g = p.gather()
		cp.Push.Streams = int(g.sum(streamsOpen))
		if nacks := g.sum(nacksTotal); nacks != lastNACKs {
			cp.Push.NACKs += int(nacks - lastNACKs)
			lastNACKs = nacks
		}
		if d := append(slices.Clone(planDegraded), p.degraded(g)...); !sameDegraded(d, snap.Degraded) {
			cp.Degraded = d
		}
		if !samePushAndInputs(&cp, snap) {
			snap = &cp
			p.show(snap)
		}
	}
}

// wait starts the waiters of publication n: next is closed once a later publication is out,
// converged (with answers) receives when every client pushed to has answered. Both end when
// ctx is done.
func (p *publicationFollower) wait(ctx context.Context, wg *sync.WaitGroup, n uint64, answers bool) (<-chan struct{}, <-chan time.Time) {
	next, converged := make(chan struct{}), make(chan time.Time, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if p.srv.WaitPublished(ctx, n+1) == nil {
			close(next)
		}
	}()
	if !answers {
		return next, nil
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if n > 0 && p.srv.WaitConverged(ctx, n) == nil {
			converged <- time.Now()
		}
	}()
	return next, converged
}

func samePushAndInputs(a, b *ui.Snapshot) bool {
	return a.Push.Converged == b.Push.Converged && a.Push.NACKs == b.Push.NACKs && a.Push.Streams == b.Push.Streams &&
		sameDegraded(a.Degraded, b.Degraded)
}

func (p *publicationFollower) show(s *ui.Snapshot) {
	if p.view == nil {
		return
	}
	if err := p.view.Publish(s); err != nil {
		p.log.Error("web view", "error", err)
	}
}

// snapshot describes the server's last publication: its topology, the allocation served and
// their costs. The topology is the one the server planned from, not the follower's last
// Update, which may come after the server has published (it follows the server in serve's
// fan-out).
func (p *publicationFollower) snapshot(at time.Time) *ui.Snapshot {
	n, t, a := p.srv.Publication()
	s := &ui.Snapshot{Publication: n, Time: at, Policy: string(p.policy), RoundRobinCostMS: -1, Push: ui.Push{At: at}}
	if a != nil {
		s.CostMS = a.Cost
		s.Policy = string(a.Policy)
		for _, c := range a.Calls {
			e := ui.Edge{From: c.From, To: c.To, CostMS: c.Cost}
			for _, r := range c.Routes {
				e.Routes = append(e.Routes, ui.Route(r))
			}
			s.Edges = append(s.Edges, e)
		}
		p.cost.WithLabelValues("served").Set(a.Cost / 1000)
	}
	if t == nil {
		return s
	}
	byNode := map[string]*ui.Node{}
	for _, nd := range t.Nodes {
		s.Nodes = append(s.Nodes, ui.Node{Name: nd.Name, Locality: nd.Locality, Pods: []ui.Pod{}})
	}
	for i := range s.Nodes {
		byNode[s.Nodes[i].Name] = &s.Nodes[i]
	}
	for _, sv := range t.Services {
		key := sv.Key()
		us := ui.Service{Name: key, Pods: []string{}}
		for i := range sv.Pods {
			// PodKey ("POD.NAMESPACE" outside the default namespace) is the name the plan's
			// routes give, so the page can draw each route between its pods.
			name := sv.PodKey(&sv.Pods[i])
			us.Pods = append(us.Pods, name)
			if nd := byNode[sv.Pods[i].Node]; nd != nil {
				nd.Pods = append(nd.Pods, ui.Pod{Name: name, Service: key})
			}
		}
		s.Services = append(s.Services, us)
	}
	m, err := optimizer.Compile(t, p.opts)
	if err != nil {
		s.Degraded = append(s.Degraded, ui.Degraded{Input: "topology", Message: err.Error()})
		return s
	}
	s.LatencyPer = "node"
	if zones := m.Latency.Zones(); zones != nil {
		// Per zone: the zone pairs (a node × node list would be nodes² entries).
		s.LatencyPer = "zone"
		for g, a := range zones {
			for h, b := range zones {
				s.Latency = append(s.Latency, ui.Latency{From: a, To: b, MS: m.Latency.ZoneAt(g, h)})
			}
		}
	} else {
		for i, a := range m.Nodes {
			for j, b := range m.Nodes {
				if i != j {
					s.Latency = append(s.Latency, ui.Latency{From: a.Name, To: b.Name, MS: m.Latency.At(i, j)})
				}
			}
		}
	}
	// The cost alone: the round-robin allocation's routes (callers × callee pods) cost more
	// than the publication's own plan, at the moment its push goes out.
	rr, err := optimizer.RoundRobinCost(m)
	if err != nil {
		p.log.Warn("web view: round-robin plan", "error", err)
		return s
	}
	s.RoundRobinCostMS = rr
	p.cost.WithLabelValues("round_robin").Set(rr / 1000)
	return s
}

// degraded lists the inputs that are failing or stale: the cluster sources' readiness checks,
// and a topology file whose last reads were rejected.
func (p *publicationFollower) degraded(g gathered) []ui.Degraded {
	out := []ui.Degraded{}
	if p.checks != nil {
		for _, c := range p.checks() {
			if !c.OK {
				out = append(out, ui.Degraded{Input: c.Name, Message: c.Message})
			}
		}
	}
	p.mu.Lock()
	since := p.fileErrs
	p.mu.Unlock()
	if errs := g.sum(fileErrors); errs > since {
		out = append(out, ui.Degraded{Input: "topology file",
			Message: fmt.Sprintf("%.0f reads rejected since the last good one (see the log); serving the last good topology", errs-since)})
	}
	if v := g.sum("edgeflow_watcher_degraded_plan"); v > 0 {
		out = append(out, ui.Degraded{Input: "latency", Message: "no usable latency: the capacity-weighted plan is served"})
	}
	if v := g.sum("edgeflow_latency_unmeasured_pairs"); v > 0 {
		out = append(out, ui.Degraded{Input: "latency", Message: fmt.Sprintf("%.0f node pairs unmeasured (default or largest measured latency used)", v)})
	}
	return out
}

func sameDegraded(a, b []ui.Degraded) bool { return slices.Equal(a, b) }

// gathered is one gathering of the registry, by metric name.
type gathered map[string][]*dto.Metric

// gather reads the registry once (nothing when it fails: the metrics then read 0).
func (p *publicationFollower) gather() gathered {
	fams, err := p.gatherer.Gather()
	if err != nil {
		p.log.Debug("web view: gathering metrics", "error", err)
	}
	g := gathered{}
	for _, f := range fams {
		g[f.GetName()] = f.GetMetric()
	}
	return g
}

// sum adds up every series of the named counter or gauge; 0 when it is absent.
func (g gathered) sum(name string) float64 {
	var sum float64
	for _, m := range g[name] {
		sum += value(m)
	}
	return sum
}

// byLabel adds up the named metric's series by the value of one label.
func (g gathered) byLabel(name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range g[name] {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] += value(m)
			}
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}

// webView makes serve's publication follower and, with --ui-address, the web view's HTTP
// server (serve listens for it). The follower must be added to the listeners and run; the
// server is served in serve's run group (runGroup.ServeHTTP), which shuts it down.
func (f *serveFlags) webView(srv *xdsserver.Server, reg *prometheus.Registry, policy optimizer.Policy, opts optimizer.Options,
	cluster *watcher.Live, logger *slog.Logger) (*publicationFollower, *http.Server, error) {
	var view *ui.View
	var uiSrv *http.Server
	if f.uiAddress != "" {
		view = ui.New(ui.Config{})
		// The event stream sets a deadline per write, so the write timeout bounds only the
		// page and its assets.
		uiSrv = newHTTPServer(view.Handler(), time.Minute)
	}
	var checks func() []watcher.Check
	if cluster != nil {
		checks = cluster.Checks
	}
	follower, err := newPublicationFollower(srv, reg, policy, opts, checks, view, logger)
	if err != nil {
		return nil, nil, err
	}
	return follower, uiSrv, nil
}
