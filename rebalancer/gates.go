package rebalancer

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
)

// The gate worker runs on every replica that acts (not only the leader). Rules:
//   - A gated pod older than GateTimeout is released without affinity, by any replica, also
//     one that has just started (the informer's first list queues every gated pod).
//   - A younger gated pod is released only by the leader: to its move's planned node when a
//     move of its owner is in flight and kube-scheduler would take it there now, else without
//     affinity at once. A replica that does not lead looks again when the timeout is due.
//   - A replacement released to its planned node and still not bound PlacementTimeout later is
//     deleted, once, by any replica: its controller recreates it, ungated (no move awaits it
//     any more), and the move counts as failed. Only a pod the state records as placed
//     (state.Placed, written before the pod is released with its annotations) is deleted:
//     the annotations alone are anyone's to write on their own pod.
//   - Every write is one PATCH whose tests pin the pod's UID and what the decision read.

// gateWorker works the gate queue until it is shut down (Run shuts it down when its context
// is done, then waits for this).
func (c *Controller) gateWorker(ctx context.Context, rec events.EventRecorder) {
	for {
		key, quit := c.queue.Get()
		if quit {
			return
		}
		after, err := c.syncPod(ctx, rec, key)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				c.log.Info("rebalancer: a gated pod (retried)", "pod", key, "error", err)
			}
			c.queue.AddRateLimited(key)
		case after > 0:
			c.queue.Forget(key)
			c.queue.AddAfter(key, after)
		default:
			c.queue.Forget(key)
		}
		c.queue.Done(key)
	}
}

// queueGated queues every gated pod (a new leader places the replacements of the moves it
// inherited at once).
func (c *Controller) queueGated() {
	objs, _ := c.podIndex.ByIndex(indexGate, gateGated)
	for _, o := range objs {
		if key, err := cache.MetaNamespaceKeyFunc(o); err == nil {
			c.queue.Add(key)
		}
	}
}

// syncPod applies the rules to one pod; a positive duration asks to look again after it.
func (c *Controller) syncPod(ctx context.Context, rec events.EventRecorder, key string) (time.Duration, error) {
	ns, name, _ := strings.Cut(key, "/")
	p, err := c.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil || p.DeletionTimestamp != nil {
		return 0, err
	}
	now := c.cfg.Clock.Now()
	switch {
	case hasGate(p):
		return c.syncGated(ctx, rec, p, now)
	case placing(p):
		return c.syncPlacing(ctx, rec, p, now)
	}
	return 0, nil
}

func (c *Controller) syncGated(ctx context.Context, rec events.EventRecorder, p *corev1.Pod, now time.Time) (time.Duration, error) {
	age := now.Sub(p.CreationTimestamp.Time)
	if age >= c.cfg.GateTimeout {
		return 0, c.releaseAs(ctx, p, "", ReleaseTimeout)
	}
	owner := metav1.GetControllerOf(p)
	c.mu.Lock()
	leading := c.leading
	i := -1
	if leading && owner != nil {
		i = c.st.inFlight(p.Namespace, owner)
	}
	var m moveRecord
	var others []resources // the other moves in flight to the same node
	if i >= 0 {
		m = c.st.Moves[i]
		for j, r := range c.st.Moves {
			if j != i && r.Outcome == outcomeInFlight && r.To == m.To {
				others = append(others, r.Requests)
			}
		}
	}
	c.mu.Unlock()
	if !leading {
		return c.cfg.GateTimeout - age + time.Second, nil
	}
	if i < 0 {
		return 0, c.releaseAs(ctx, p, "", ReleaseUnplanned)
	}
	why := ""
	u, err := c.nodeUse(m.To)
	switch {
	case err != nil:
		why = "the node is gone"
	default:
		for _, r := range others {
			u.reserve(r)
		}
		if why = unschedulable(p, u.node); why == "" && !u.fits(podRequests(p)) {
			why = "the node has no room for it"
		}
	}
	how, node := ReleasePlanned, m.To
	if why != "" {
		how, node = ReleaseNodeUnfit, ""
	}
	if how == ReleasePlanned {
		// Recorded, and the state written, before the pod carries edgeflow's annotations: a
		// replica deletes a pod past its placement timeout only on this record (syncPlacing).
		c.mu.Lock()
		c.st.Placed[p.UID] = now
		c.mu.Unlock()
		if err := c.saveState(ctx); err != nil {
			return 0, err
		}
	}
	if err := c.releaseAs(ctx, p, node, how); err != nil {
		return 0, err
	}
	c.mu.Lock()
	if j := c.st.find(m.PodUID, m.Evicted); j >= 0 {
		r := &c.st.Moves[j]
		r.Replacement = p.UID
		if how == ReleasePlanned {
			r.Outcome = outcomePlaced
			c.st.Placed[p.UID] = now
			c.st.setLeft(m.Service, m.From, now)
		} else {
			r.Outcome = outcomeUnplaced
		}
	}
	c.mu.Unlock()
	c.markDirty()
	if how == ReleasePlanned {
		rec.Eventf(p, nil, corev1.EventTypeNormal, "Placed", "Release",
			"edgeflow placed the pod on node %s, replacing %s", node, m.Pod)
	} else {
		rec.Eventf(p, nil, corev1.EventTypeWarning, "NotPlaced", "Release",
			"edgeflow released the pod without a node: its planned node %s cannot take it (%s)", m.To, why)
	}
	return 0, nil
}

// syncPlacing deletes a replacement that its planned node has not taken in PlacementTimeout,
// if edgeflow placed it (placedByEdgeflow); a pod that only carries the annotations is left
// alone, and logged.
func (c *Controller) syncPlacing(ctx context.Context, rec events.EventRecorder, p *corev1.Pod, now time.Time) (time.Duration, error) {
	at := placedAt(p)
	if wait := at.Add(c.cfg.PlacementTimeout).Sub(now); wait > 0 {
		return wait, nil
	}
	ours, err := c.placedByEdgeflow(ctx, p.UID)
	if err != nil {
		return 0, err
	}
	if !ours {
		c.log.Warn("rebalancer: a pod annotated as placed by edgeflow, which the state does not record as placed: left alone",
			"pod", p.Namespace+"/"+p.Name, "uid", p.UID, "placed_at", p.Annotations[AnnotationPlacedAt])
		return 0, nil
	}
	err = c.cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return 0, nil // gone already, or another replica deleted it
	}
	if err != nil {
		return 0, err
	}
	c.metrics.placementFailures.Inc()
	rec.Eventf(p, nil, corev1.EventTypeWarning, "PlacementFailed", "Delete",
		"edgeflow deleted the pod: it was not scheduled on its planned node %s within %v; its controller recreates it without a node", p.Annotations[AnnotationPlacedOn], c.cfg.PlacementTimeout)
	c.log.Info("rebalancer: placement failed, replacement deleted", "pod", p.Namespace+"/"+p.Name, "node", p.Annotations[AnnotationPlacedOn])
	c.mu.Lock()
	for i := range c.st.Moves {
		if c.st.Moves[i].Replacement == p.UID {
			c.st.Moves[i].Outcome = outcomeFailed
		}
	}
	delete(c.st.Placed, p.UID)
	c.mu.Unlock()
	c.markDirty()
	return 0, nil
}

// placedByEdgeflow says whether the state records the pod uid as placed by a move: the
// leader's own state, or, on a replica that does not lead, the state ConfigMap as the leader
// wrote it (one read). Only edgeflow's account writes that ConfigMap (the chart grants its
// update by name, to nobody else).
func (c *Controller) placedByEdgeflow(ctx context.Context, uid types.UID) (bool, error) {
	c.mu.Lock()
	leading := c.leading
	_, ok := c.st.Placed[uid]
	c.mu.Unlock()
	if leading {
		return ok, nil
	}
	st, err := c.loadState(ctx)
	if err != nil {
		return false, err
	}
	_, ok = st.Placed[uid]
	return ok, nil
}

// find returns the index of the move of the pod uid evicted at, or -1.
func (s *state) find(uid types.UID, evicted time.Time) int {
	for i := range s.Moves {
		if s.Moves[i].PodUID == uid && s.Moves[i].Evicted.Equal(evicted) {
			return i
		}
	}
	return -1
}

// releaseAs releases the pod (to node, if set) and counts it.
func (c *Controller) releaseAs(ctx context.Context, p *corev1.Pod, node, how string) error {
	if err := c.release(ctx, p, node); err != nil {
		return err
	}
	c.metrics.released.WithLabelValues(how).Inc()
	c.log.Info("rebalancer: released", "pod", p.Namespace+"/"+p.Name, "node", node, "how", how)
	return nil
}

// release lifts edgeflow's gate in one JSON PATCH and, if node is set, requires the node (a
// required node affinity may be set while a pod is gated; terms already required are kept
// and narrowed) and marks the pod with AnnotationPlacedOn/At. The patch tests the pod's UID,
// its gates and its affinity as read from the cache, so a pod changed meanwhile is not
// overwritten (the error is retried on the next look). A pod already released is no error.
func (c *Controller) release(ctx context.Context, p *corev1.Pod, node string) error {
	patch, err := releasePatch(p, node, c.cfg.Clock.Now())
	if err != nil {
		return err
	}
	_, err = c.cs.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

type jsonOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

func releasePatch(p *corev1.Pod, node string, now time.Time) ([]byte, error) {
	var rest []corev1.PodSchedulingGate
	for _, g := range p.Spec.SchedulingGates {
		if g.Name != GateName {
			rest = append(rest, g)
		}
	}
	if rest == nil {
		rest = []corev1.PodSchedulingGate{}
	}
	ops := []jsonOp{
		{"test", "/metadata/uid", p.UID},
		{"test", "/spec/schedulingGates", p.Spec.SchedulingGates},
		{"replace", "/spec/schedulingGates", rest},
	}
	if node != "" {
		spec := p.Spec.DeepCopy()
		requireNode(spec, node)
		if p.Spec.Affinity == nil {
			ops = append(ops, jsonOp{"add", "/spec/affinity", spec.Affinity})
		} else {
			ops = append(ops, jsonOp{"test", "/spec/affinity", p.Spec.Affinity}, jsonOp{"replace", "/spec/affinity", spec.Affinity})
		}
		at := now.UTC().Format(time.RFC3339)
		if p.Annotations == nil {
			ops = append(ops, jsonOp{"add", "/metadata/annotations", map[string]string{AnnotationPlacedOn: node, AnnotationPlacedAt: at}})
		} else {
			ops = append(ops, jsonOp{"add", "/metadata/annotations/" + jsonPointer(AnnotationPlacedOn), node},
				jsonOp{"add", "/metadata/annotations/" + jsonPointer(AnnotationPlacedAt), at})
		}
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("rebalancer: release patch: %w", err)
	}
	return b, nil
}

// jsonPointer escapes a key for a JSON pointer (RFC 6901).
func jsonPointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
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

// markDirty asks the leader's state writer to write the state; it never blocks.
func (c *Controller) markDirty() { c.stateDirty.Notify() }
