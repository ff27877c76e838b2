// Package rebalancer is LARP as a Kubernetes controller: every period (and on demand) it reads
// the live topology, plans moves from where pods run now toward a LARP placement
// (optimizer.PlanRebalance), and carries out the best few — through the Eviction API, so
// PodDisruptionBudgets hold — while a scheduling gate makes each replacement land on its
// planned node. It is dry-run by default, acts only as the leader of a Lease, and never imports
// xds: it talks to the Kubernetes API and uses the optimizer.
//
// Rules (what keeps it safe when things go wrong):
//   - Only a leader's replacements are gated (the webhook, run.go expects); with no leader
//     nothing is gated, and any acting replica lifts a gate older than GateTimeout (gates.go).
//   - A target node is checked as kube-scheduler would (fit.go); a replacement that still does
//     not bind within PlacementTimeout is deleted once and recreated ungated.
//   - Dry-run writes nothing: no Lease, no eviction, no gate lifted, no event, no state.
//   - What a leader must hand over lives in one ConfigMap (state.go), written before every
//     eviction and read by the next leader before it acts; limits count over the last period.
//   - Lock order: stateStore.mu before Controller.mu; no API call is made holding Controller.mu.
package rebalancer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/edgeflow/edgeflow/internal/latest"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher/kube"
)

// GateName is the scheduling gate the webhook puts on new pods of managed workloads; the
// controller lifts it, with a node affinity to the planned node when the pod replaces one it
// moved.
const GateName = "edgeflow.io/placement"

// Defaults of Config.
const (
	DefaultPeriod               = 10 * time.Minute
	DefaultThreshold            = 0.05
	DefaultMaxMoves             = 3
	DefaultMaxMovesPerNode      = 1
	DefaultMaxMovesPerNamespace = 2
	DefaultMinAge               = 5 * time.Minute
	DefaultCooldown             = time.Hour
	DefaultGateTimeout          = 2 * time.Minute
	DefaultPlacementTimeout     = 2 * time.Minute
	// DefaultRateChange: a change of the offered rate by a quarter re-plans (rate.go): above
	// the noise of a rate measured over a window of a minute, below the 100 → 300 req/s step
	// that made the paper experiment's placement lose (issue 38).
	DefaultRateChange = 0.25
	// DefaultRateCheck is how often the offered rate is compared with the last plan's.
	DefaultRateCheck = 30 * time.Second
	// DefaultKubeQPS and DefaultKubeBurst are the client rate limits edgeflow's commands give
	// every Kubernetes client (client-go's own default, 5 and 10, would take minutes to release
	// a thousand gated pods).
	DefaultKubeQPS   = 50
	DefaultKubeBurst = 100
)

// Skip reasons: the label values of edgeflow_rebalance_moves_skipped_total and the Reason of
// a Move the controller does not carry out.
const (
	ReasonDryRun          = "dry_run"
	ReasonBelowThreshold  = "below_threshold"
	ReasonMaxMoves        = "max_moves"
	ReasonMaxPerNode      = "max_moves_per_node"
	ReasonMaxPerNamespace = "max_moves_per_namespace"
	ReasonBarePod         = "bare_pod"
	ReasonDaemonSet       = "daemonset"
	ReasonTooYoung        = "min_age"
	ReasonCooldown        = "cooldown"
	ReasonReplicas        = "replicas_not_ready"
	// ReasonSettling: the placement is still changing — a move is in flight, or a pod of a
	// managed service is starting (not ready, created within 2 × GateTimeout +
	// PlacementTimeout) — so the plan was computed on a topology that lacks it, and its later
	// moves assume ones not made yet.
	ReasonSettling = "placement_settling"
	ReasonNodeFull = "node_full"
	ReasonPDB      = "pdb"
	ReasonBackoff  = "backoff"
	ReasonBlocked  = "blocked"
	ReasonGone     = "pod_gone"
	ReasonError    = "error"
	// ReasonSingleReplica: the pod's service has one pod; evicting it is an outage
	// (Config.AllowSingleReplica allows it).
	ReasonSingleReplica = "single_replica"
	// ReasonUnschedulable: kube-scheduler would not put the pod on the planned node (cordoned,
	// a taint it does not tolerate, its node selector or required node affinity).
	ReasonUnschedulable = "node_unschedulable"
	// ReasonUnsupported: the pod has a scheduling constraint the rebalancer cannot check
	// (required inter-pod affinity or anti-affinity, volume topology, a hard topology spread,
	// host ports), or its controller is not a ReplicaSet or a StatefulSet.
	ReasonUnsupported = "unsupported_constraint"
	// ReasonNewLeader: this replica became the leader less than a period ago; it moves nothing
	// before a period has passed.
	ReasonNewLeader = "new_leader"
)

// Config configures a Controller.
type Config struct {
	// Client reaches the cluster (required).
	Client kubernetes.Interface
	// Informers are the process's shared informers (kube.NewInformers with AllPods, on
	// Namespaces), also read by the watcher; nil means the controller makes its own, and
	// starts and stops them.
	Informers *kube.Informers
	// Topology returns the current live topology (watcher.Live.Current); nil means not known
	// yet. Its nodes carry allocatable cpu and memory, its services the ready pods.
	Topology func() *optimizer.Topology
	// Namespaces and Selector say which Services are managed, as kube.Config does (the webhook
	// gates pods that back one of them).
	Namespaces []string
	Selector   string
	// DefaultLatencyMS is given to optimizer.Compile (nil: every pair must be in the topology).
	DefaultLatencyMS *float64

	// DryRun plans and reports but writes nothing to the cluster: no eviction, no gate
	// release, no event, no Lease; the webhook gates nothing.
	DryRun bool
	// AllowSingleReplica lets the controller evict the only pod of a service (an outage
	// wherever no PodDisruptionBudget forbids it). Off by default.
	AllowSingleReplica bool
	// Period between runs (0: DefaultPeriod); Trigger runs at once.
	Period time.Duration
	// Threshold is the least relative fall of the predicted cost (network + queueing) worth acting on (0:
	// DefaultThreshold; negative: act on any fall).
	Threshold float64
	// MaxMoves bounds the evictions of one run, MaxMovesPerNode those leaving or entering one
	// node, MaxMovesPerNamespace those of one namespace (0: the defaults).
	MaxMoves, MaxMovesPerNode, MaxMovesPerNamespace int
	// MinAge: a pod younger than this is not moved (0: DefaultMinAge; negative: no minimum).
	MinAge time.Duration
	// Cooldown: a pod placed by a move is not moved again, and no pod of its service moves back
	// to the node it left, within Cooldown (0: DefaultCooldown; negative: none).
	Cooldown time.Duration
	// GateTimeout: a gated pod not released within it is released without affinity, by any
	// replica that acts (0: DefaultGateTimeout).
	GateTimeout time.Duration
	// PlacementTimeout: a replacement released to its planned node and still not bound after
	// it is deleted once, so that its controller recreates it ungated; the move counts as
	// failed (0: DefaultPlacementTimeout).
	PlacementTimeout time.Duration
	// Tolerance is optimizer.RebalanceOptions.Tolerance.
	Tolerance float64
	// RateChange: when the offered rate (Σ of the topology's ingress rates) differs from the
	// one the last plan was made at by more than this fraction, the controller plans again
	// without waiting for Period (rate.go; 0: DefaultRateChange, negative: never). RateCheck is
	// how often it looks (0: DefaultRateCheck).
	RateChange float64
	RateCheck  time.Duration
	// MaxNodeUtilization is the highest planned utilisation the plan gives a node
	// (optimizer.Options.MaxNodeUtilization): 0 means optimizer.DefaultMaxNodeUtilization,
	// negative no limit.
	MaxNodeUtilization float64
	// Budget bounds the planning search (optimizer.RebalanceOptions.Budget; 0:
	// optimizer.DefaultPlaceBudget, negative: no limit).
	Budget time.Duration

	// Identity names this replica in the Lease and in Events (default: the hostname).
	Identity string
	// LeaderWebhook resolves a replica's Identity (the Lease's holder) to the host:port its
	// webhook listens on. With it, a replica that does not lead forwards each review it gets to
	// the leader's webhook (ServeWebhook): only the leader knows its moves in flight, and the
	// webhook Service spreads the API server's calls over every replica. Nil: no forwarding
	// (only the reviews that reach the leader can gate).
	LeaderWebhook func(ctx context.Context, identity string) (string, error)
	// Clock is the time source (nil: clock.RealClock{}).
	Clock clock.WithTickerAndDelayedExecution
	// Logger and Registerer as elsewhere (nil: slog.Default(), metrics not registered).
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (cfg *Config) defaults() {
	if cfg.Period <= 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.Threshold == 0 {
		cfg.Threshold = DefaultThreshold
	}
	if cfg.MaxMoves <= 0 {
		cfg.MaxMoves = DefaultMaxMoves
	}
	if cfg.MaxMovesPerNode <= 0 {
		cfg.MaxMovesPerNode = DefaultMaxMovesPerNode
	}
	if cfg.MaxMovesPerNamespace <= 0 {
		cfg.MaxMovesPerNamespace = DefaultMaxMovesPerNamespace
	}
	if cfg.MinAge == 0 {
		cfg.MinAge = DefaultMinAge
	}
	if cfg.Cooldown == 0 {
		cfg.Cooldown = DefaultCooldown
	}
	if cfg.GateTimeout <= 0 {
		cfg.GateTimeout = DefaultGateTimeout
	}
	if cfg.PlacementTimeout <= 0 {
		cfg.PlacementTimeout = DefaultPlacementTimeout
	}
	if cfg.Budget == 0 {
		cfg.Budget = optimizer.DefaultPlaceBudget
	}
	if cfg.RateChange == 0 {
		cfg.RateChange = DefaultRateChange
	}
	if cfg.RateCheck <= 0 {
		cfg.RateCheck = DefaultRateCheck
	}
	if cfg.MaxNodeUtilization == 0 {
		cfg.MaxNodeUtilization = optimizer.DefaultMaxNodeUtilization
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
}

// Move is one planned pod move and what the controller does with it.
type Move struct {
	Namespace string `json:"namespace"`
	Service   string `json:"service"`
	Pod       string `json:"pod"`
	From      string `json:"from"`
	To        string `json:"to"`
	// CostAfter is the predicted LATA cost once this move and those before it are done.
	CostAfter float64 `json:"cost_after"`
	// Action is "evict" for a move carried out (or that would be, in dry-run), else "skip".
	Action string `json:"action"`
	// Reason says why a move is skipped (one of the Reason constants); empty when evicted.
	Reason string `json:"reason,omitempty"`
}

// Report is one run's plan: the predicted LATA cost now and at the target, and each move.
type Report struct {
	Time       time.Time `json:"time"`
	DryRun     bool      `json:"dry_run"`
	CostBefore float64   `json:"cost_before"`
	CostTarget float64   `json:"cost_target"`
	// QueueingBefore and QueueingTarget are the predicted queueing parts of the cost
	// (optimizer.Rebalance), in ms·req/s.
	QueueingBefore float64 `json:"queueing_before"`
	QueueingTarget float64 `json:"queueing_target"`
	// UtilizationBefore and UtilizationTarget are every node's planned use now and at the
	// target; MaxNodeUtilization the limit the target keeps (0: none).
	UtilizationBefore  []optimizer.NodeUse `json:"utilization_before"`
	UtilizationTarget  []optimizer.NodeUse `json:"utilization_target"`
	MaxNodeUtilization float64             `json:"max_node_utilization"`
	// Gain is the relative fall of the predicted cost, network + queueing (what the plan
	// minimises): (before − target) / before.
	Gain      float64 `json:"gain"`
	Threshold float64 `json:"threshold"`
	// Truncated says the planning budget cut the search: the target is the best found in time.
	Truncated bool `json:"truncated,omitempty"`
	// Settling says what kept the placement changing in this run (a move in flight, a pod
	// starting): every move that got that far is skipped with placement_settling.
	Settling string `json:"settling,omitempty"`
	Moves    []Move `json:"moves"`
}

// Evictions counts the moves the report carries out (or would, in dry-run).
func (r *Report) Evictions() int {
	n := 0
	for _, m := range r.Moves {
		if m.Action == ActionEvict {
			n++
		}
	}
	return n
}

// skipped lists the moves the report does not carry out, each as NS/POD FROM→TO: REASON, in
// the plan's order, for the run's log line.
func (r *Report) skipped() []string {
	var out []string
	for _, m := range r.Moves {
		if m.Action != ActionEvict {
			out = append(out, fmt.Sprintf("%s/%s %s→%s: %s", m.Namespace, m.Pod, m.From, m.To, m.Reason))
		}
	}
	return out
}

// Actions of a Move.
const (
	ActionEvict = "evict"
	ActionSkip  = "skip"
)

// Controller is the rebalancer. Run starts it; Plan computes a report without acting.
type Controller struct {
	cfg      Config
	log      *slog.Logger
	cs       kubernetes.Interface
	selector labels.Selector
	trigger  latest.Signal // Trigger's request for a run now
	metrics  *metrics

	pods     corelisters.PodLister
	podIndex cache.Indexer
	services []corelisters.ServiceLister
	nodes    corelisters.NodeLister
	inf      *kube.Informers
	ownInf   bool // the controller made inf: Stop stops it
	// queue holds the keys (NAMESPACE/NAME) of gated pods and of replacements not yet bound,
	// for the gate worker (gates.go); Run makes it (acting only) before the informers start.
	queue    workqueue.TypedRateLimitingInterface[string]
	synced   chan struct{} // closed once the caches synced
	syncOnce sync.Once
	store    stateStore

	mu   sync.Mutex
	st   state // the leader's state (state.go); read-only copy in dry-run
	last *Report
	// prevTarget is the last plan's target (pods per node of each service), which the next
	// plan prefers while it is still as cheap: the moves of several runs head for one target.
	// It is not handed over: a new leader plans afresh.
	prevTarget map[string]map[string]int
	// plannedRate is the offered rate the last plan was made at (ratePlanned: there was one),
	// the reference of rate-aware planning (rate.go).
	plannedRate float64
	ratePlanned bool
	leading     bool
	leadSince   time.Time
	leader      string        // the Lease's holder as last observed (OnNewLeader); "" before
	forwardErr  string        // the last forwarding failure logged ("": none since the last success)
	stateDirty  latest.Signal // the state changed: writeState writes it
}

// New validates cfg and registers the metrics; it starts nothing.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil {
		return nil, errors.New("rebalancer: Config.Client is nil")
	}
	if cfg.Topology == nil {
		return nil, errors.New("rebalancer: Config.Topology is nil")
	}
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("rebalancer: selector %q: %w", cfg.Selector, err)
	}
	if cfg.MaxNodeUtilization > 1 || math.IsNaN(cfg.MaxNodeUtilization) {
		return nil, fmt.Errorf("rebalancer: max node utilization %v: want at most 1 (0: the default, negative: no limit)", cfg.MaxNodeUtilization)
	}
	cfg.defaults()
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, log: cfg.Logger, cs: cfg.Client, selector: sel, metrics: m,
		synced: make(chan struct{}), st: newState()}
	if err := c.setupInformers(); err != nil {
		return nil, err
	}
	return c, nil
}

// setupInformers builds the informers (started by Start): every pod and node of the cluster
// (the resources a node has free depend on every pod on it), and the Services of the managed
// namespaces. Pods are indexed by node and by gate state; gated pods and replacements not yet
// bound go to the gate worker's queue.
func (c *Controller) setupInformers() error {
	c.inf = c.cfg.Informers
	if c.inf == nil {
		var err error
		if c.inf, err = kube.NewInformers(kube.InformersConfig{Client: c.cs, Namespaces: c.cfg.Namespaces, AllPods: true}); err != nil {
			return fmt.Errorf("rebalancer: %w", err)
		}
		c.ownInf = true
	}
	if !c.inf.AllPods() || len(c.inf.Pods) != 1 {
		return errors.New("rebalancer: the shared informers must watch every pod (kube.InformersConfig.AllPods)")
	}
	if !slices.Equal(c.inf.Namespaces(), kube.UniqueNamespaces(c.cfg.Namespaces)) {
		return fmt.Errorf("rebalancer: the informers watch namespaces %v, the controller wants %v", c.inf.Namespaces(), c.cfg.Namespaces)
	}
	pods := c.inf.Pods[0].Informer
	if err := pods.AddIndexers(cache.Indexers{indexNode: indexPodNode, indexGate: indexPodGate}); err != nil {
		return fmt.Errorf("rebalancer: pod indexes: %w", err)
	}
	c.pods, c.nodes, c.podIndex = corelisters.NewPodLister(pods.GetIndexer()), corelisters.NewNodeLister(c.inf.Nodes.GetIndexer()), pods.GetIndexer()
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.podEvent(obj) },
		UpdateFunc: func(_, obj any) { c.podEvent(obj) },
	}); err != nil {
		return fmt.Errorf("rebalancer: pod event handler: %w", err)
	}
	for _, s := range c.inf.Services {
		c.services = append(c.services, corelisters.NewServiceLister(s.Informer.GetIndexer()))
	}
	return nil
}

// podEvent queues a gated pod, or a replacement released to its node and not bound, for the
// gate worker; it never blocks.
func (c *Controller) podEvent(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.DeletionTimestamp != nil || !(hasGate(p) || placing(p)) || c.queue == nil {
		return
	}
	c.queue.Add(p.Namespace + "/" + p.Name)
}

// Start starts the informers and waits for their caches; they stop when ctx is done and
// Stop (or Run's return) waits for them.
func (c *Controller) Start(ctx context.Context) error {
	c.inf.Start(ctx)
	if err := c.inf.WaitForCacheSync(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("rebalancer: %w", err)
	}
	c.syncOnce.Do(func() { close(c.synced) })
	return nil
}

// Synced says whether Start has synced the caches.
func (c *Controller) Synced() bool {
	select {
	case <-c.synced:
		return true
	default:
		return false
	}
}

// WaitSynced waits until Start has synced the caches, or ctx is done (its error).
func (c *Controller) WaitSynced(ctx context.Context) error {
	select {
	case <-c.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop waits for the informers started by Start, unless they are shared (their context must be
// done), and shuts the gate queue down.
func (c *Controller) Stop() {
	if c.ownInf {
		c.inf.Stop()
	}
	if c.queue != nil {
		c.queue.ShutDown()
	}
}

// Trigger asks for a run now (on demand); it never blocks.
func (c *Controller) Trigger() { c.trigger.Notify() }

// Last returns the report of the last run (nil before the first).
func (c *Controller) Last() *Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// Acting says whether the controller may change the cluster: not dry-run.
func (c *Controller) Acting() bool { return !c.cfg.DryRun }

// Plan computes the report of a run from the current topology and pods, without acting: the
// moves the controller would carry out are marked evict (also in dry-run), the others skip
// with their reason. The informers must have synced (Start).
func (c *Controller) Plan() (*Report, error) {
	t := c.cfg.Topology()
	if t == nil {
		return nil, errors.New("rebalancer: no topology yet")
	}
	now := c.cfg.Clock.Now()
	w, err := c.readCaches()
	if err != nil {
		return nil, err
	}
	placed := w.forPlanning(t)
	m, err := optimizer.Compile(placed, optimizer.Options{DefaultLatencyMS: c.cfg.DefaultLatencyMS, MaxNodeUtilization: max(0, c.cfg.MaxNodeUtilization)})
	if err != nil {
		return nil, fmt.Errorf("rebalancer: %w", err)
	}
	c.mu.Lock()
	prev := c.prevTarget
	c.mu.Unlock()
	plan, err := optimizer.PlanRebalance(m, optimizer.RebalanceOptions{Tolerance: c.cfg.Tolerance, Budget: max(0, c.cfg.Budget),
		Previous: prev, PreviousTolerance: c.cfg.Threshold})
	if err != nil {
		return nil, fmt.Errorf("rebalancer: %w", err)
	}
	r := &Report{Time: now, DryRun: c.cfg.DryRun, CostBefore: plan.CostBefore, CostTarget: plan.CostTarget,
		QueueingBefore: plan.QueueingBefore, QueueingTarget: plan.QueueingTarget,
		UtilizationBefore: plan.UtilizationBefore, UtilizationTarget: plan.UtilizationTarget,
		MaxNodeUtilization: max(0, c.cfg.MaxNodeUtilization), Threshold: c.cfg.Threshold, Truncated: plan.Truncated}
	if before := plan.CostBefore + plan.QueueingBefore; before > 0 {
		r.Gain = (before - plan.CostTarget - plan.QueueingTarget) / before
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prevTarget = plan.TargetCounts
	c.plannedRate, c.ratePlanned = offeredRate(t), true
	c.st.expire(now, &c.cfg)
	d := decider{cfg: &c.cfg, now: now, snap: w, st: &c.st, namespaceOf: namespaceOf(t), podOf: podsOf(t)}
	if c.leading && now.Sub(c.leadSince) < c.cfg.Period {
		d.newLeader = true
	}
	r.Moves = d.decide(plan, r.Gain)
	r.Settling = d.settling
	return r, nil
}

// namespaceOf maps each service key of t to its namespace.
func namespaceOf(t *optimizer.Topology) map[string]string {
	out := make(map[string]string, len(t.Services))
	for i := range t.Services {
		out[t.Services[i].Key()] = t.Services[i].NamespaceOrDefault()
	}
	return out
}

// podsOf maps each pod key of t to its pod.
func podsOf(t *optimizer.Topology) map[string]topoPod {
	out := map[string]topoPod{}
	for i := range t.Services {
		s := &t.Services[i]
		for k := range s.Pods {
			name, shared := podName(s.Pods[k].Name)
			out[s.PodKey(&s.Pods[k])] = topoPod{key: podKey{s.NamespaceOrDefault(), name}, shared: shared}
		}
	}
	return out
}

// podName strips the "@SERVICE" suffix watcher.Live gives a pod listed in a second service.
func podName(name string) (string, bool) {
	if i := strings.IndexByte(name, '@'); i >= 0 {
		return name[:i], true
	}
	return name, false
}
