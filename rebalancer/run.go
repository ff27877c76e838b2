package rebalancer

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/edgeflow/edgeflow/optimizer"
)

// LeaderConfig is the Lease the replicas elect their leader on; only the leader acts.
type LeaderConfig struct {
	Namespace, Name string
	// LeaseDuration, RenewDeadline and RetryPeriod as in client-go's leaderelection (0: 15 s,
	// 10 s, 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// DefaultLeaseName is the Lease's default name.
const DefaultLeaseName = "edgeflow-rebalancer"

// Backoff of a refused eviction (429): doubled on each refusal, up to the period.
const initialBackoff = 10 * time.Second

// Run starts the informers and takes part in the leader election on le's Lease until ctx is
// done; while it leads, it runs every Period (and on Trigger) and releases gated pods. A
// replica that loses the Lease stops acting at once and stands for election again. Run
// returns nil when ctx is done, after every goroutine it started has stopped.
func (c *Controller) Run(ctx context.Context, le LeaderConfig) error {
	if le.Namespace == "" || le.Name == "" {
		return fmt.Errorf("rebalancer: the Lease needs a namespace and a name")
	}
	if le.LeaseDuration <= 0 {
		le.LeaseDuration = 15 * time.Second
	}
	if le.RenewDeadline <= 0 {
		le.RenewDeadline = 10 * time.Second
	}
	if le.RetryPeriod <= 0 {
		le.RetryPeriod = 2 * time.Second
	}
	id := c.identity()
	ctx, cancel := context.WithCancel(ctx)
	defer c.Stop()
	defer cancel()
	if err := c.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: c.cs.EventsV1()})
	defer broadcaster.Shutdown()
	if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		return fmt.Errorf("rebalancer: events: %w", err)
	}
	rec := broadcaster.NewRecorder(scheme.Scheme, "edgeflow-rebalancer")
	lock := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name},
		Client: c.cs.CoordinationV1(), LockConfig: resourcelock.ResourceLockConfig{Identity: id}}
	for ctx.Err() == nil {
		elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: le.LeaseDuration, RenewDeadline: le.RenewDeadline, RetryPeriod: le.RetryPeriod,
			ReleaseOnCancel: true, Name: le.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) { c.lead(lctx, rec) },
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return fmt.Errorf("rebalancer: leader election: %w", err)
		}
		elector.Run(ctx) // returns when ctx is done or the lease is lost
	}
	return nil
}

func (c *Controller) identity() string {
	if c.cfg.Identity != "" {
		return c.cfg.Identity
	}
	if h, err := os.Hostname(); err == nil {
		return h
	}
	return "edgeflow"
}

// Leading says whether this replica holds the Lease.
func (c *Controller) Leading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leading
}

// lead is the leader's loop; it returns when lctx is done (the lease lost or Run's context).
func (c *Controller) lead(lctx context.Context, rec events.EventRecorder) {
	c.setLeading(true)
	defer c.setLeading(false)
	c.log.Info("rebalancer: leading", "identity", c.identity(), "dryRun", c.cfg.DryRun, "period", c.cfg.Period)
	period := time.NewTicker(c.cfg.Period)
	defer period.Stop()
	gates := time.NewTicker(time.Second)
	defer gates.Stop()
	ran := false
	for {
		if !ran && c.cfg.Topology() != nil {
			ran = true
			c.runOnce(lctx, rec)
		}
		c.releaseGated(lctx, rec)
		select {
		case <-lctx.Done():
			return
		case <-period.C:
			ran = false
		case <-c.trigger:
			ran = false
		case <-c.gated:
		case <-gates.C:
		}
	}
}

func (c *Controller) setLeading(on bool) {
	c.mu.Lock()
	c.leading = on
	c.mu.Unlock()
	if on {
		c.metrics.leader.Set(1)
	} else {
		c.metrics.leader.Set(0)
	}
}

// RunOnce plans and, unless dry-run, carries out the plan's chosen moves. It is what the
// leader does every period; it returns the report.
func (c *Controller) runOnce(ctx context.Context, rec events.EventRecorder) *Report {
	r, err := c.Plan()
	if err != nil {
		c.metrics.runs.WithLabelValues("error").Inc()
		c.log.Error("rebalancer: planning", "error", err)
		return nil
	}
	if !c.cfg.DryRun {
		c.act(ctx, r, rec)
	}
	c.metrics.runs.WithLabelValues("ok").Inc()
	c.metrics.lastRun.Set(float64(r.Time.UnixNano()) / 1e9)
	c.metrics.gain.Set(r.Gain)
	c.metrics.cost.WithLabelValues("current").Set(r.CostBefore)
	c.metrics.cost.WithLabelValues("target").Set(r.CostTarget)
	for _, m := range r.Moves {
		switch {
		case m.Action == ActionEvict && r.DryRun:
			c.metrics.skipped.WithLabelValues(ReasonDryRun).Inc()
		case m.Action == ActionEvict:
			c.metrics.moves.Inc()
		default:
			c.metrics.skipped.WithLabelValues(m.Reason).Inc()
		}
	}
	c.mu.Lock()
	c.last = r
	c.mu.Unlock()
	c.log.Info("rebalancer: run", "dryRun", r.DryRun, "costBefore", r.CostBefore, "costTarget", r.CostTarget,
		"gain", r.Gain, "planned", len(r.Moves), "evicted", r.Evictions())
	return r
}

// act evicts the report's chosen moves, in order. A move is recorded as pending before its
// eviction (the replacement may be created, gated, before Evict returns); a refused eviction
// (429: a PodDisruptionBudget) backs off and is marked skip pdb, a pod already gone pod_gone,
// any other error error.
func (c *Controller) act(ctx context.Context, r *Report, rec events.EventRecorder) {
	for i := range r.Moves {
		m := &r.Moves[i]
		if m.Action != ActionEvict {
			continue
		}
		pod, err := c.pods.Pods(m.Namespace).Get(m.Pod)
		if err != nil {
			m.Action, m.Reason = ActionSkip, ReasonGone
			continue
		}
		cpu, mem := podRequests(pod)
		pm := pendingMove{move: *m, evicted: c.cfg.Clock(), cpu: cpu, mem: mem}
		c.mu.Lock()
		c.pending[m.Service] = append(c.pending[m.Service], pm)
		c.mu.Unlock()
		err = c.cs.PolicyV1().Evictions(m.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: m.Pod, Namespace: m.Namespace},
			// Only this incarnation of the pod: one recreated under the same name is not evicted.
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}})
		if err == nil {
			rec.Eventf(pod, nil, corev1.EventTypeNormal, "Rebalance", "Evict",
				"edgeflow moves the pod from node %s to node %s (predicted LATA cost %.1f → %.1f)", m.From, m.To, r.CostBefore, m.CostAfter)
			c.log.Info("rebalancer: evicted", "pod", m.Namespace+"/"+m.Pod, "from", m.From, "to", m.To)
			continue
		}
		c.mu.Lock()
		c.pending[m.Service] = slices.DeleteFunc(c.pending[m.Service], func(p pendingMove) bool { return p.evicted == pm.evicted && p.move.Pod == m.Pod })
		if len(c.pending[m.Service]) == 0 {
			delete(c.pending, m.Service)
		}
		m.Action = ActionSkip
		switch {
		case apierrors.IsTooManyRequests(err):
			m.Reason = ReasonPDB
			b := c.backoff[pod.UID]
			b.delay = min(max(2*b.delay, initialBackoff), c.cfg.Period)
			b.until = c.cfg.Clock().Add(b.delay)
			c.backoff[pod.UID] = b
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			m.Reason = ReasonGone
		default:
			m.Reason = ReasonError
		}
		c.mu.Unlock()
		c.log.Info("rebalancer: eviction refused", "pod", m.Namespace+"/"+m.Pod, "reason", m.Reason, "error", err)
	}
}

// releaseGated lifts the gate of every gated pod: the replacement of a pending move of its
// service gets a required node affinity to the move's node (if that node still has room); a
// pod no move awaits, or gated longer than GateTimeout, is released without affinity. A pod
// is never left gated: whatever fails here is retried on the next tick, and the timeout
// releases it without affinity.
func (c *Controller) releaseGated(ctx context.Context, rec events.EventRecorder) {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return
	}
	var gated []*corev1.Pod
	for _, p := range pods {
		if hasGate(p) && p.DeletionTimestamp == nil {
			gated = append(gated, p)
		}
	}
	if len(gated) == 0 {
		return
	}
	slices.SortFunc(gated, func(a, b *corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	w, err := c.world()
	if err != nil {
		return
	}
	now := c.cfg.Clock()
	for _, p := range gated {
		svc := c.serviceOf(p)
		c.mu.Lock()
		ms := c.pending[svc]
		var node, how string
		switch {
		case now.Sub(p.CreationTimestamp.Time) > c.cfg.GateTimeout:
			how = ReleaseTimeout
		case svc == "" || len(ms) == 0:
			how = ReleaseUnplanned
		default:
			pm := ms[0]
			how = ReleasePlanned
			if n := w.nodes[pm.move.To]; n == nil || !n.fits(podRequests(p)) {
				how = ReleaseNodeFull
			} else {
				node = pm.move.To
			}
		}
		c.mu.Unlock()
		if err := c.release(ctx, p, node); err != nil {
			c.log.Info("rebalancer: releasing a gated pod (retried)", "pod", p.Namespace+"/"+p.Name, "error", err)
			continue
		}
		c.metrics.released.WithLabelValues(how).Inc()
		var replaced string
		c.mu.Lock()
		if (how == ReleasePlanned || how == ReleaseNodeFull) && len(c.pending[svc]) > 0 {
			pm := c.pending[svc][0]
			replaced = pm.move.Pod
			c.pending[svc] = c.pending[svc][1:]
			if len(c.pending[svc]) == 0 {
				delete(c.pending, svc)
			}
			if how == ReleasePlanned {
				c.placed[p.UID] = now
				c.left[serviceNode{svc, pm.move.From}] = now
				w.nodes[node].reserve(podRequests(p))
			}
		}
		c.mu.Unlock()
		if how == ReleasePlanned {
			rec.Eventf(p, nil, corev1.EventTypeNormal, "Placed", "Release",
				"edgeflow placed the pod on node %s, replacing %s", node, replaced)
		}
		c.log.Info("rebalancer: released", "pod", p.Namespace+"/"+p.Name, "node", node, "how", how)
	}
}

// release removes the gate and, if node is set, requires the node (a required node affinity
// may be set while a pod is gated; terms already required are kept and narrowed).
func (c *Controller) release(ctx context.Context, p *corev1.Pod, node string) error {
	cur, err := c.cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if cur.UID != p.UID || !hasGate(cur) {
		return nil
	}
	cur = cur.DeepCopy()
	cur.Spec.SchedulingGates = slices.DeleteFunc(cur.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == GateName })
	if node != "" {
		requireNode(&cur.Spec, node)
	}
	_, err = c.cs.CoreV1().Pods(p.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// requireNode adds "metadata.name In [node]" to the pod's required node affinity: a new term
// when there is none, else to every term (the terms are ORed, so each must require it).
func requireNode(spec *corev1.PodSpec, node string) {
	req := corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{req}}}}
		return
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchFields = append(terms[i].MatchFields, req)
	}
}

// serviceOf returns the key of the first managed service (by key) whose selector picks the
// pod, or "".
func (c *Controller) serviceOf(p *corev1.Pod) string {
	var keys []string
	for _, l := range c.services {
		svcs, err := l.Services(p.Namespace).List(c.selector)
		if err != nil {
			continue
		}
		for _, s := range svcs {
			if len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(p.Labels)) {
				keys = append(keys, optimizer.QualifiedName(s.Name, s.Namespace))
			}
		}
	}
	if len(keys) == 0 {
		return ""
	}
	slices.Sort(keys)
	return keys[0]
}
