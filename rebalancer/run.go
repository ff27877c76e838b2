package rebalancer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"

	"github.com/edgeflow/edgeflow/internal/leader"
)

// LeaderConfig is the Lease the replicas elect their leader on; only the leader acts. The
// election is internal/leader's (LeaseDuration, RenewDeadline and RetryPeriod 0: 15 s, 10 s,
// 2 s).
type LeaderConfig = leader.Config

// DefaultLeaseName is the Lease's default name.
const DefaultLeaseName = "edgeflow-rebalancer"

// Backoff of a refused eviction (429): doubled on each refusal, up to the period.
const initialBackoff = 10 * time.Second

// Run starts the informers and runs the controller until ctx is done; it returns nil then,
// after every goroutine it started has stopped.
//
// Acting (not dry-run), it runs the gate worker (gates.go) on this replica whether it leads or
// not, and takes part in the leader election on le's Lease; while it leads, it reads the state
// the last leader left (state.go), then plans every Period (and on Trigger), and places the
// replacements of its moves. A replica that loses the Lease stops acting at once; its leader
// loop has ended before it stands for election again.
//
// In dry-run it plans every Period (and on Trigger) and writes nothing: no Lease, no event, no
// gate released. It reads the state in le's namespace when le names one.
func (c *Controller) Run(ctx context.Context, le LeaderConfig) error {
	if c.cfg.DryRun {
		return c.runDry(ctx, le)
	}
	if le.Namespace == "" || le.Name == "" {
		return fmt.Errorf("rebalancer: the Lease needs a namespace and a name")
	}
	c.store = stateStore{namespace: le.Namespace, name: le.Name + stateSuffix}
	id := c.identity()
	if c.Synced() {
		return errors.New("rebalancer: Run after Start: Run starts the informers itself")
	}
	// Before the informers start: their handlers queue gated pods.
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "edgeflow-rebalancer-gates"})
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer c.Stop()
	defer wg.Wait()
	defer c.queue.ShutDown()
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
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.gateWorker(ctx, rec)
	}()
	onNew := le.OnNewLeader
	le.OnNewLeader = func(identity string) {
		c.mu.Lock()
		c.leader = identity
		c.mu.Unlock()
		if onNew != nil {
			onNew(identity)
		}
	}
	if err := leader.Run(ctx, c.cs.CoordinationV1(), le, id, func(lctx context.Context) { c.lead(lctx, rec) }); err != nil {
		return fmt.Errorf("rebalancer: leader election: %w", err)
	}
	return nil
}

// runDry plans every period, writing nothing.
func (c *Controller) runDry(ctx context.Context, le LeaderConfig) error {
	defer c.Stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if le.Namespace != "" && le.Name != "" {
		c.store = stateStore{namespace: le.Namespace, name: le.Name + stateSuffix}
	}
	c.log.Info("rebalancer: dry-run", "period", c.cfg.Period)
	period := time.NewTicker(c.cfg.Period)
	defer period.Stop()
	rate := time.NewTicker(c.cfg.RateCheck)
	defer rate.Stop()
	ran := false
	for {
		if !ran && c.cfg.Topology() != nil {
			ran = true
			if c.store.name != "" {
				st, err := c.loadState(ctx) // a read: the moves other replicas made count
				if err != nil {
					c.log.Info("rebalancer: dry-run: state not read", "error", err)
				} else {
					c.mu.Lock()
					c.st = st
					c.mu.Unlock()
				}
			}
			c.runOnce(ctx, nil)
		}
		// The topology may not be known yet (the watcher reads the same informers, synced at
		// the same moment): look again soon rather than a period later.
		var retry <-chan time.Time
		if !ran {
			retry = time.After(100 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-period.C:
			ran = false
		case <-c.trigger.C():
			ran = false
		case <-rate.C:
			ran = ran && !c.replanForRate()
		case <-retry:
		}
	}
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

// Leader is the identity of the Lease's holder as this replica last observed it ("" before it
// observed one); it may be this replica's own.
func (c *Controller) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

// PodIP is the IP of a pod in the controller's pod cache (every namespace's pods): e.g. the
// leader's, to forward webhook reviews to (Config.LeaderWebhook). The informers must have
// synced.
func (c *Controller) PodIP(namespace, name string) (string, error) {
	p, err := c.pods.Pods(namespace).Get(name)
	if err != nil {
		return "", fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	if p.Status.PodIP == "" {
		return "", fmt.Errorf("pod %s/%s has no IP", namespace, name)
	}
	return p.Status.PodIP, nil
}

// Leading says whether this replica holds the Lease.
func (c *Controller) Leading() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leading
}

// lead is the leader's loop; it returns when lctx is done (the lease lost or Run's context),
// after the goroutine it started (the state writer) has stopped. It reads the state the last
// leader left before anything else; until it has, it neither gates nor moves.
func (c *Controller) lead(lctx context.Context, rec events.EventRecorder) {
	for {
		st, err := c.loadState(lctx)
		if err == nil {
			c.mu.Lock()
			c.st = st
			c.mu.Unlock()
			break
		}
		c.log.Error("rebalancer: the leader cannot read its state; it does not act until it can", "error", err)
		select {
		case <-lctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	c.setLeading(true)
	defer c.setLeading(false)
	c.log.Info("rebalancer: leading", "identity", c.identity(), "period", c.cfg.Period,
		"moves_in_flight", len(c.st.Moves))
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.writeState(lctx)
	}()
	c.queueGated()
	period := time.NewTicker(c.cfg.Period)
	defer period.Stop()
	rate := time.NewTicker(c.cfg.RateCheck)
	defer rate.Stop()
	ran := false
	for {
		if !ran && c.cfg.Topology() != nil {
			ran = true
			c.runOnce(lctx, rec)
		}
		select {
		case <-lctx.Done():
			return
		case <-period.C:
			ran = false
		case <-c.trigger.C():
			ran = false
		case <-rate.C:
			ran = ran && !c.replanForRate()
		}
	}
}

// replanForRate says whether the offered rate left the band around the last plan's (rate.go),
// and if so logs it and counts it: the caller then plans again.
func (c *Controller) replanForRate() bool {
	ref, now, moved := c.rateChanged()
	if moved {
		c.log.Info("rebalancer: the offered rate changed: planning again", "planned_at", ref, "now", now, "change", c.cfg.RateChange)
		c.metrics.rateReplans.Inc()
	}
	return moved
}

// writeState writes the state whenever it changed (one write in flight; changes meanwhile
// are written next), until ctx is done. A failed write is retried a second later.
func (c *Controller) writeState(ctx context.Context) {
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.stateDirty.C():
		case <-retry:
		}
		retry = nil
		if err := c.saveState(ctx); err != nil && ctx.Err() == nil {
			c.log.Error("rebalancer: writing the state (retried)", "error", err)
			retry = time.After(time.Second)
		}
	}
}

func (c *Controller) setLeading(on bool) {
	c.mu.Lock()
	c.leading = on
	if on {
		c.leadSince = c.cfg.Clock.Now()
	}
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
	if !c.cfg.DryRun && rec != nil {
		c.act(ctx, r, rec)
	}
	c.metrics.runs.WithLabelValues("ok").Inc()
	c.metrics.lastRun.Set(float64(r.Time.UnixNano()) / 1e9)
	c.metrics.gain.Set(r.Gain)
	c.metrics.cost.WithLabelValues("current").Set(r.CostBefore / 1000) // ms·req/s → s·req/s
	c.metrics.cost.WithLabelValues("target").Set(r.CostTarget / 1000)
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
	c.log.Info("rebalancer: run", "dry_run", r.DryRun, "cost_before", r.CostBefore, "cost_target", r.CostTarget,
		"gain", r.Gain, "planned", len(r.Moves), "evicted", r.Evictions(), "skipped", r.skipped(), "settling", r.Settling)
	return r
}

// act evicts the report's chosen moves, in order. Every move is first recorded in flight in
// the state, and the state written, before any eviction (the replacement may be created, and
// gated, before Evict returns; a leader that dies now hands the moves over); if the state
// cannot be written nothing is evicted. A refused eviction (429: a PodDisruptionBudget)
// backs off and is marked skip pdb, a pod already gone pod_gone, any other error error.
func (c *Controller) act(ctx context.Context, r *Report, rec events.EventRecorder) {
	now := c.cfg.Clock.Now()
	type chosen struct {
		m   *Move
		pod *corev1.Pod
	}
	var todo []chosen
	c.mu.Lock()
	for i := range r.Moves {
		m := &r.Moves[i]
		if m.Action != ActionEvict {
			continue
		}
		pod, err := c.pods.Pods(m.Namespace).Get(m.Pod)
		owner := (*metav1.OwnerReference)(nil)
		if err == nil {
			owner = metav1.GetControllerOf(pod)
		}
		if owner == nil {
			m.Action, m.Reason = ActionSkip, ReasonGone
			continue
		}
		c.st.Moves = append(c.st.Moves, moveRecord{recordedMove: recordedMove(*m), PodUID: pod.UID,
			Owner: owner.UID, OwnerKind: owner.Kind, OwnerName: owner.Name,
			Requests: podRequests(pod), Evicted: now})
		todo = append(todo, chosen{m, pod})
	}
	c.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	drop := func(uid types.UID) {
		c.st.Moves = slices.DeleteFunc(c.st.Moves, func(r moveRecord) bool { return r.PodUID == uid && r.Evicted.Equal(now) })
	}
	if err := c.saveState(ctx); err != nil {
		c.log.Error("rebalancer: the moves are not recorded; nothing is evicted", "error", err)
		c.mu.Lock()
		for _, t := range todo {
			drop(t.pod.UID)
			t.m.Action, t.m.Reason = ActionSkip, ReasonError
		}
		c.mu.Unlock()
		return
	}
	for _, t := range todo {
		m, pod := t.m, t.pod
		err := c.cs.PolicyV1().Evictions(m.Namespace).Evict(ctx, &policyv1.Eviction{
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
		drop(pod.UID)
		m.Action = ActionSkip
		switch {
		case apierrors.IsTooManyRequests(err):
			m.Reason = ReasonPDB
			b := c.st.Backoff[pod.UID]
			b.Delay = min(max(2*b.Delay, initialBackoff), c.cfg.Period)
			b.Until = c.cfg.Clock.Now().Add(b.Delay)
			c.st.Backoff[pod.UID] = b
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			m.Reason = ReasonGone
		default:
			m.Reason = ReasonError
		}
		c.mu.Unlock()
		c.log.Info("rebalancer: eviction refused", "pod", m.Namespace+"/"+m.Pod, "reason", m.Reason, "error", err)
	}
	c.markDirty()
}

// expects says whether the webhook gates the pod: this replica leads and a move of the pod's
// owner (namespace, kind, name and UID) is in flight (the pod replaces the pod that move
// evicted).
func (c *Controller) expects(p *corev1.Pod) bool {
	owner := metav1.GetControllerOf(p)
	if owner == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leading && c.st.inFlight(p.Namespace, owner) >= 0
}
