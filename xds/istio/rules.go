package istio

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/edgeflow/edgeflow/internal/metrics"
	"google.golang.org/protobuf/proto"
	clientnetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"istio.io/client-go/pkg/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/edgeflow/edgeflow/optimizer"
)

// Node labels Istio reads a node's locality from.
const (
	RegionLabel  = "topology.kubernetes.io/region"
	ZoneLabel    = "topology.kubernetes.io/zone"
	SubzoneLabel = "topology.istio.io/subzone"
)

// RulesReconcilerConfig configures a RulesReconciler.
type RulesReconcilerConfig struct {
	Rules RulesConfig
	// Policy and Options plan the grouped topology (as the xDS server plans per pod); Damping
	// is the Planner's (optimizer.Planner): a recompute that moves less of the traffic leaves
	// the rules as they are.
	Policy  optimizer.Policy
	Options optimizer.Options
	Damping float64
	// Client reaches the cluster's Istio API.
	Client versioned.Interface
	// Nodes, when set, makes every pass give each node whose locality has a region and a zone
	// its own subzone (label SubzoneLabel = node name), so the mesh can tell nodes apart
	// (serve --istio-label-nodes). It is the only write to anything but DestinationRules.
	Nodes kubernetes.Interface
	// Resync, RetryInterval, Clock and Logger as in ReconcilerConfig.
	Resync        time.Duration
	RetryInterval time.Duration
	Clock         clock.WithTickerAndDelayedExecution
	Logger        *slog.Logger
	// Registerer, when set, receives the edgeflow_istio_* metrics.
	Registerer prometheus.Registerer
}

// RulesReconciler keeps the DestinationRules edgeflow owns (labelled ManagedByLabel=
// ManagedByValue, in every namespace) equal to DestinationRules of the latest topology's
// locality plan and the user's rules: it creates the missing ones, updates those whose spec
// differs and deletes those no longer wanted. It never writes a rule without the label.
//
// It is a watcher.Listener: Update records the latest topology and never blocks; Run plans
// and reconciles. Each pass re-reads the rules it needs from Run's informer (level-triggered:
// a lost event, a hand edit or a change to a user's rule is repaired by the next pass, at most
// Resync later). Nothing is written before the first Update. Update and Run are safe to call
// concurrently; Reconcile and Uninstall must not run while Run does.
type RulesReconciler struct {
	cfg     RulesReconcilerConfig
	log     *slog.Logger
	planner optimizer.Planner

	mu       sync.Mutex
	latest   *optimizer.Topology
	planned  *optimizer.Topology // the topology plan was made from
	plan     *LocalityPlan
	report   *RulesReport
	passes   *passLoop
	metrics  *rulesMetrics
	lastDesc string // the last granularity line logged
}

// NewRulesReconciler returns a RulesReconciler; it starts nothing (see Run).
func NewRulesReconciler(cfg RulesReconcilerConfig) (*RulesReconciler, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: no Client", ErrInvalidConfig)
	}
	if cfg.Resync < 0 || cfg.RetryInterval < 0 {
		return nil, fmt.Errorf("%w: negative Resync %v or RetryInterval %v", ErrInvalidConfig, cfg.Resync, cfg.RetryInterval)
	}
	if cfg.Policy == "" {
		cfg.Policy = optimizer.LATA
	}
	if _, err := optimizer.ParsePolicy(string(cfg.Policy)); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	cfg.Resync = cmpOr(cfg.Resync, DefaultResync)
	cfg.RetryInterval = cmpOr(cfg.RetryInterval, DefaultRetryInterval)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("component", "istio-destinationrules")
	r := &RulesReconciler{
		cfg:     cfg,
		log:     log,
		planner: optimizer.Planner{Policy: cfg.Policy, Options: cfg.Options, Damping: cfg.Damping},
		passes: &passLoop{clock: cfg.Clock, resync: cfg.Resync, retry: cfg.RetryInterval, log: log,
			what: "DestinationRule", owner: "RulesReconciler"},
	}
	var err error
	if r.metrics, err = newRulesMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	return r, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Update records t as the latest topology and wakes Run. It never blocks; the latest topology
// wins. t must not be modified afterwards.
func (r *RulesReconciler) Update(t *optimizer.Topology) {
	r.mu.Lock()
	r.latest = t
	r.mu.Unlock()
	r.passes.wake()
}

// Report returns what the last pass planned, edge by edge (nil before the first plan).
func (r *RulesReconciler) Report() *RulesReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.report
}

// Granularity says at which granularity the rules plan ("node", "locality", or "" before the
// first plan), for /readyz.
func (r *RulesReconciler) Granularity() string {
	if rep := r.Report(); rep != nil {
		return fmt.Sprintf("%s (%d localities, %d unlocated nodes)", rep.Granularity, rep.Localities, len(rep.Unlocated))
	}
	return ""
}

// Run plans and reconciles at once with the latest topology (if any), after every Update,
// then every Resync, and every RetryInterval while passes fail, until ctx is done (the caller
// owns ctx); it then returns nil and leaves the rules in place (see Uninstall). Nothing is
// written while Run is not running (Update only records): serve runs it only while its
// replica holds the Istio Lease, calling it again at each new term. Calls must not overlap.
//
// Run reads the DestinationRules through an informer of its own, indexed by namespace and by
// ownership: it starts it, waits for its first list before the first pass (without Istio's
// CRDs the list is retried and logged, and no pass runs), and stops it and waits for its
// goroutine before returning. A pass then reads only the callers', callees' and root
// namespaces' rules from the informer's cache, and edgeflow's own, with no request to the API
// server but its writes.
func (r *RulesReconciler) Run(ctx context.Context) error {
	inf, err := newRuleInformer(r.cfg.Client)
	if err != nil {
		return err
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		r.log.Warn("DestinationRule informer: list or watch failed; retrying", "err", err)
	}); err != nil {
		return fmt.Errorf("xds/istio: DestinationRule informer: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { // owned by this Run: cancelled and waited for below
		defer close(stopped)
		inf.RunWithContext(ctx)
	}()
	defer func() {
		cancel()
		<-stopped
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx done before the first list
	}
	src := indexedRules{inf.GetIndexer()}
	return r.passes.run(ctx, func(ctx context.Context) (bool, error) { return r.pass(ctx, src) })
}

// pass plans the latest topology (if it is new) and reconciles, reading rules from src; false
// before the first Update.
func (r *RulesReconciler) pass(ctx context.Context, src ruleSource) (bool, error) {
	r.mu.Lock()
	t := r.latest
	r.mu.Unlock()
	if t == nil {
		return false, nil
	}
	var errs []error
	if r.cfg.Nodes != nil {
		errs = append(errs, r.labelNodes(ctx, t))
	}
	p, err := r.planFor(t)
	if err != nil {
		return true, errors.Join(append(errs, err)...)
	}
	errs = append(errs, r.reconcile(ctx, p, src))
	return true, errors.Join(errs...)
}

// planFor returns the locality plan of t, damped: when the new plan moves less traffic than
// Damping, the rules keep the last plan's weights.
func (r *RulesReconciler) planFor(t *optimizer.Topology) (*LocalityPlan, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t == r.planned {
		return r.plan, nil
	}
	grouped, g, err := optimizer.GroupByLocality(t, r.cfg.Options)
	if err != nil {
		r.metrics.localities.Set(0)
		return nil, fmt.Errorf("xds/istio: locality plan: %w", err)
	}
	res, err := r.planner.Plan(grouped)
	if err != nil {
		return nil, fmt.Errorf("xds/istio: locality plan: %w", err)
	}
	alloc := res.Allocation
	if res.Push || r.plan == nil {
		r.planner.Pushed(res)
	} else {
		alloc = r.plan.Allocation
	}
	r.planned = t
	r.plan = &LocalityPlan{Topology: t, Grouping: g, Grouped: grouped, Allocation: alloc}
	desc := fmt.Sprintf("%s/%d/%v", g.Granularity(), len(g.Groups), g.Unlocated)
	if desc != r.lastDesc {
		r.lastDesc = desc
		r.log.Info("planning at the granularity the mesh can express", "granularity", g.Granularity(),
			"localities", len(g.Groups), "nodes", len(t.Nodes), "unlocated_nodes", g.Unlocated)
	}
	r.metrics.localities.Set(float64(len(g.Groups)))
	if g.PerNode {
		r.metrics.perNode.Set(1)
	} else {
		r.metrics.perNode.Set(0)
	}
	return r.plan, nil
}

// Reconcile makes one pass for plan p: it reads the DestinationRules of the namespaces Istio
// may take a rule from for p's edges (every caller's and callee's, and the root namespace) and
// edgeflow's own, computes DestinationRules(Rules, p, the user's rules) and creates, updates
// (only when the spec, labels or annotations it sets changed) and deletes edgeflow's so that
// they equal it. It goes on past a failing rule and returns every failure, each naming its
// rule. It reads from the API server (a LIST per such namespace, one of edgeflow's rules by
// label); Run's passes read its informer's cache instead.
func (r *RulesReconciler) Reconcile(ctx context.Context, p *LocalityPlan) error {
	return r.reconcile(ctx, p, apiRules{r.cfg.Client})
}

func (r *RulesReconciler) reconcile(ctx context.Context, p *LocalityPlan, src ruleSource) error {
	var user []*clientnetworkingv1.DestinationRule
	for _, ns := range ruleNamespaces(r.cfg.Rules, p) {
		rules, err := src.inNamespace(ctx, ns)
		if err != nil {
			return err
		}
		for _, dr := range rules {
			if !ownedRule(dr) {
				user = append(user, dr)
			}
		}
	}
	owned, err := src.owned(ctx)
	if err != nil {
		return err
	}
	have := map[string]*clientnetworkingv1.DestinationRule{}
	for _, dr := range owned {
		have[dr.Namespace+"/"+dr.Name] = dr
	}
	want, rep := DestinationRules(r.cfg.Rules, p, user)
	r.mu.Lock()
	changed := r.report == nil || !sameReport(r.report, rep)
	r.report = rep
	r.mu.Unlock()
	if changed {
		for _, e := range rep.Edges {
			if e.Skipped != "" {
				r.log.Warn("call edge left to Istio's defaults or the user's rule", "caller", e.Caller, "callee", e.Callee, "reason", e.Skipped)
			}
			if e.UserLB != "" {
				r.log.Info("call edge keeps the user's load balancer inside localities, not LEAST_REQUEST", "caller", e.Caller, "callee", e.Callee, "simple", e.UserLB, "based_on", e.BasedOn)
			}
		}
	}
	r.metrics.observe(rep)

	var errs []error
	for _, dr := range want {
		key := dr.Namespace + "/" + dr.Name
		old, ok := have[key]
		delete(have, key)
		var err error
		api := r.cfg.Client.NetworkingV1().DestinationRules(dr.Namespace)
		if !ok {
			_, err = api.Create(ctx, dr, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// Edgeflow's own, not yet in the informer's cache (created by the pass before),
				// is compared below; any other is not edgeflow's to touch.
				if cur, gerr := api.Get(ctx, dr.Name, metav1.GetOptions{}); gerr == nil && ownedRule(cur) {
					old, ok, err = cur, true, nil
				} else {
					err = fmt.Errorf("exists without label %s=%s; not touching it: %w", ManagedByLabel, ManagedByValue, err)
				}
			}
			if !ok {
				r.logWrite(err, "created", key)
			}
		}
		switch {
		case !ok:
		case !proto.Equal(&old.Spec, &dr.Spec) || !subsetOf(dr.Labels, old.Labels) || !subsetOf(dr.Annotations, old.Annotations) ||
			(old.Annotations[BasedOnAnnotation] != "" && dr.Annotations[BasedOnAnnotation] == ""):
			upd := old.DeepCopy()
			upd.Spec = *dr.Spec.DeepCopy()
			upd.Labels = mergeMaps(old.Labels, dr.Labels)
			upd.Annotations = mergeMaps(old.Annotations, dr.Annotations)
			if dr.Annotations[BasedOnAnnotation] == "" {
				delete(upd.Annotations, BasedOnAnnotation)
			}
			_, err = api.Update(ctx, upd, metav1.UpdateOptions{})
			r.logWrite(err, "updated", key)
		}
		if err = countRefused(r.metrics.refused, r.log, err, kindDestinationRule, "rule", key); err != nil {
			errs = append(errs, fmt.Errorf("xds/istio: DestinationRule %s: %w", key, err))
		}
	}
	for _, key := range sortedKeys(have) {
		errs = append(errs, r.delete(ctx, have[key]))
	}
	return errors.Join(errs...)
}

// Uninstall deletes every DestinationRule edgeflow owns, in every namespace, so Istio's
// defaults and the user's own rules apply again; without Istio's CRDs there is nothing to
// delete. Call it after Run has returned.
func (r *RulesReconciler) Uninstall(ctx context.Context) error {
	list, err := r.cfg.Client.NetworkingV1().DestinationRules(metav1.NamespaceAll).List(ctx,
		metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedByValue})
	if apierrors.IsNotFound(err) {
		return nil // Istio's CRDs are not installed: there is no rule to delete
	}
	if err != nil {
		return fmt.Errorf("xds/istio: list DestinationRules: %w", err)
	}
	var errs []error
	for _, dr := range list.Items {
		if strings.HasPrefix(dr.Name, ruleNamePrefix) {
			errs = append(errs, r.delete(ctx, dr))
		}
	}
	return errors.Join(errs...)
}

// Managed lists what Uninstall would delete, as "DestinationRule NAMESPACE/NAME" sorted; it
// writes nothing (uninstall --dry-run). Without Istio's CRDs the list is empty.
func (r *RulesReconciler) Managed(ctx context.Context) ([]string, error) {
	list, err := r.cfg.Client.NetworkingV1().DestinationRules(metav1.NamespaceAll).List(ctx,
		metav1.ListOptions{LabelSelector: ManagedByLabel + "=" + ManagedByValue})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("xds/istio: list DestinationRules: %w", err)
	}
	var out []string
	for _, dr := range list.Items {
		if strings.HasPrefix(dr.Name, ruleNamePrefix) {
			out = append(out, "DestinationRule "+dr.Namespace+"/"+dr.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

func (r *RulesReconciler) delete(ctx context.Context, dr *clientnetworkingv1.DestinationRule) error {
	key := dr.Namespace + "/" + dr.Name
	var opts metav1.DeleteOptions
	if dr.UID != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &dr.UID} // not one re-created since the list
	}
	err := r.cfg.Client.NetworkingV1().DestinationRules(dr.Namespace).Delete(ctx, dr.Name, opts)
	if apierrors.IsNotFound(err) {
		return nil
	}
	r.logWrite(err, "deleted", key)
	if err != nil {
		return fmt.Errorf("xds/istio: delete DestinationRule %s: %w", key, err)
	}
	return nil
}

func (r *RulesReconciler) logWrite(err error, what, key string) {
	if err == nil {
		r.log.Info("DestinationRule "+what, "rule", key)
	}
}

// labelNodes gives each node of t whose locality has a region and a zone the subzone of its
// own name (one PATCH per node whose label differs). A node whose name is no valid label value
// is reported and left alone.
func (r *RulesReconciler) labelNodes(ctx context.Context, t *optimizer.Topology) error {
	var errs []error
	for _, n := range t.Nodes {
		region, zone, subzone := optimizer.SplitLocality(n.Locality)
		if subzone == n.Name {
			continue
		}
		if region == "" || zone == "" {
			errs = append(errs, fmt.Errorf("xds/istio: node %s: no %s or %s label: Istio needs both before a subzone; not labelling it", n.Name, RegionLabel, ZoneLabel))
			continue
		}
		if len(n.Name) > 63 {
			errs = append(errs, fmt.Errorf("xds/istio: node %s: name longer than a label value (63); not labelling it", n.Name))
			continue
		}
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, SubzoneLabel, n.Name)
		if _, err := r.cfg.Nodes.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("xds/istio: label node %s: %w", n.Name, err))
			continue
		}
		r.log.Info("node labelled with its own subzone", "node", n.Name, "label", SubzoneLabel)
	}
	return errors.Join(errs...)
}

// refused says whether err is the API server refusing a write for the object itself: admission
// (a ValidatingAdmissionPolicy or webhook, a ResourceQuota: 403 Forbidden), validation (422
// Invalid) or its size (413). RBAC's 403 is a Forbidden too: a missing grant is counted the same
// way, never retried in a tight loop.
func refused(err error) bool {
	return err != nil && (apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsRequestEntityTooLargeError(err))
}

func sameReport(a, b *RulesReport) bool {
	if a.Granularity != b.Granularity || a.Localities != b.Localities || len(a.Edges) != len(b.Edges) {
		return false
	}
	for i := range a.Edges {
		x, y := a.Edges[i], b.Edges[i]
		if x.Caller != y.Caller || x.Callee != y.Callee || x.Rule != y.Rule || x.Skipped != y.Skipped || x.UserLB != y.UserLB {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// The metrics' namespace and subsystem: every name starts edgeflow_istio_.
const (
	metricNamespace = "edgeflow"
	metricSubsystem = "istio"
)

// labelStatus is the label name of edgeflow_istio_call_edges.
const labelStatus = "status"

type rulesMetrics struct {
	localities prometheus.Gauge
	perNode    prometheus.Gauge
	edges      *prometheus.GaugeVec
	deviation  prometheus.Gauge
	refused    *prometheus.CounterVec
}

// newRulesMetrics makes the metrics and registers them with reg (nil: with none). A
// registration that fails (a name registered twice, say) is returned as an error.
func newRulesMetrics(reg prometheus.Registerer) (m *rulesMetrics, err error) {
	defer func() { err = metrics.Registered("xds/istio", recover()) }()
	f := promauto.With(reg)
	return &rulesMetrics{
		localities: f.NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "localities",
			Help: "Locality groups the DestinationRule plan is made between."}),
		perNode: f.NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "per_node_localities",
			Help: "1 when every node is its own locality (the DestinationRule plan is per node), else 0."}),
		edges: f.NewGaugeVec(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "call_edges",
			Help: "Call edges by what became of them: written (a DestinationRule), skipped, conflict (a user's rule edgeflow cannot merge)."}, []string{labelStatus}),
		deviation: f.NewGauge(prometheus.GaugeOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "weight_deviation_ratio",
			Help: "Largest fraction of one call edge's planned traffic that integer locality weights send elsewhere."}),
		refused: refusedWrites(f, kindDestinationRule),
	}, nil
}

// The kind label values of edgeflow_istio_refused_writes_total.
const (
	kindDestinationRule = "DestinationRule"
	kindEnvoyFilter     = "EnvoyFilter"
	kindConfigMap       = "ConfigMap"
)

// refusedWrites makes edgeflow_istio_refused_writes_total{kind}, with a series at 0 for each
// of kinds (the objects the reconciler writes). Each Istio mode's reconciler makes its own.
func refusedWrites(f promauto.Factory, kinds ...string) *prometheus.CounterVec {
	c := f.NewCounterVec(prometheus.CounterOpts{Namespace: metricNamespace, Subsystem: metricSubsystem, Name: "refused_writes_total",
		Help: "Creates and updates of Istio's objects (kind: DestinationRule, EnvoyFilter, ConfigMap, the bootstrap ConfigMap) the API server refused (admission, quota, validation, size); the pass went on with the others."},
		[]string{"kind"})
	for _, k := range kinds {
		c.WithLabelValues(k)
	}
	return c
}

func (m *rulesMetrics) observe(rep *RulesReport) {
	var written, skipped, conflicts, dev float64
	for _, e := range rep.Edges {
		switch {
		case e.Conflict:
			conflicts++
		case e.Skipped != "":
			skipped++
		default:
			written++
		}
		dev = max(dev, e.Deviation)
	}
	m.edges.WithLabelValues("written").Set(written)
	m.edges.WithLabelValues("skipped").Set(skipped)
	m.edges.WithLabelValues("conflict").Set(conflicts)
	m.deviation.Set(dev)
}
