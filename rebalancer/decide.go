package rebalancer

import (
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/edgeflow/edgeflow/optimizer"
)

// decider applies the safety rules to a plan's moves, in the plan's order (most gain first).
// It is pure: everything it reads is in its fields; it reserves the chosen moves' requests on
// the snapshot's nodes.
type decider struct {
	cfg         *Config
	now         time.Time
	snap        *cacheSnapshot
	st          *state
	namespaceOf map[string]string
	// podOf maps a topology pod key (optimizer.Service.PodKey) to its pod; shared pods (listed
	// in a second service as POD@SERVICE) are marked.
	podOf map[string]topoPod
	// newLeader: this replica has led for less than a period; nothing moves yet.
	newLeader bool
	// settling names what keeps the placement changing (a move in flight, a pod starting);
	// empty when it is still. Set by decide.
	settling string
}

type topoPod struct {
	key    podKey
	shared bool
}

// decide marks each move evict or skip. The rules, in order (the first that applies is the
// reason):
//   - below_threshold: the plan's predicted gain is under the threshold — nothing moves;
//   - blocked: the optimizer found no feasible order for it;
//   - pod_gone: the pod is not in the cache, or is terminating;
//   - bare_pod / daemonset: a pod without a controller, or a DaemonSet's, is never evicted;
//   - unsupported_constraint: its controller is not a ReplicaSet or StatefulSet, or it has a
//     scheduling constraint the rebalancer cannot check (fit.go, unsupported);
//   - single_replica: its service has one pod (unless AllowSingleReplica);
//   - min_age: the pod is younger than MinAge;
//   - cooldown: the pod was placed by a move, or a move of its service left the destination,
//     within Cooldown;
//   - backoff: its last eviction was refused (429) and the back-off has not passed;
//   - replicas_not_ready: some pod of its service is not ready (or a move of it is still in
//     flight, or already chosen in this run): evicting it would take the service below its
//     ready replicas;
//   - node_unschedulable: kube-scheduler would not put it on the destination (cordoned, a
//     taint it does not tolerate, its node selector or required node affinity);
//   - node_full: the destination has no room for it by the scheduler's count (every requested
//     resource, pod slots) after the moves in flight and those chosen before it;
//   - placement_settling: a move is in flight, or a pod of a managed service is starting (not
//     ready, younger than 2 × GateTimeout + PlacementTimeout): the topology the plan was
//     computed on lacks it (EndpointSlices list ready pods), and each planned move's cost
//     assumes the moves before it were made;
//   - new_leader: this replica has led for less than a period;
//   - max_moves, max_moves_per_node (leaving or entering), max_moves_per_namespace: counted
//     over the last period, with the moves of earlier leaders (the state they handed over).
func (d *decider) decide(plan *optimizer.Rebalance, gain float64) []Move {
	var out []Move
	chosen := 0
	perNode, perNS := map[string]int{}, map[string]int{}
	for _, r := range d.st.Moves {
		if d.now.Sub(r.Evicted) < d.cfg.Period {
			chosen++
			perNode[r.From]++
			perNode[r.To]++
			perNS[r.Namespace]++
		}
	}
	d.settling = d.changing()
	busy := map[string]bool{} // services with a move chosen in this run
	for _, pm := range plan.Moves {
		out = append(out, d.one(pm, gain, &chosen, perNode, perNS, busy))
	}
	for _, pm := range plan.Blocked {
		m := d.move(pm)
		m.Action, m.Reason = ActionSkip, ReasonBlocked
		out = append(out, m)
	}
	return out
}

func (d *decider) move(pm optimizer.Move) Move {
	name := d.podOf[pm.Pod].key.name
	if name == "" {
		name = pm.Pod
	}
	return Move{Namespace: d.namespaceOf[pm.Service], Service: pm.Service, Pod: name, From: pm.From, To: pm.To,
		CostAfter: pm.CostAfter}
}

func (d *decider) one(pm optimizer.Move, gain float64, chosen *int, perNode, perNS map[string]int, busy map[string]bool) Move {
	m := d.move(pm)
	m.Action = ActionSkip
	if gain < d.cfg.Threshold {
		m.Reason = ReasonBelowThreshold
		return m
	}
	if d.podOf[pm.Pod].shared {
		m.Reason = ReasonBlocked // a pod backing two services: its other service is not planned with it
		return m
	}
	p := d.snap.pods[podKey{m.Namespace, m.Pod}]
	var owner *metav1.OwnerReference
	if p != nil {
		owner = metav1.GetControllerOf(p)
	}
	switch {
	case p == nil || p.DeletionTimestamp != nil || p.Spec.NodeName != m.From:
		m.Reason = ReasonGone
	case owner == nil:
		m.Reason = ReasonBarePod
	case owner.Kind == "DaemonSet":
		m.Reason = ReasonDaemonSet
	case owner.Kind != "ReplicaSet" && owner.Kind != "StatefulSet", unsupported(p) != "":
		m.Reason = ReasonUnsupported
	case !d.cfg.AllowSingleReplica && len(d.snap.selected[m.Service]) <= 1:
		m.Reason = ReasonSingleReplica
	case d.cfg.MinAge > 0 && d.now.Sub(p.CreationTimestamp.Time) < d.cfg.MinAge:
		m.Reason = ReasonTooYoung
	case d.cooling(p, m):
		m.Reason = ReasonCooldown
	case d.now.Before(d.st.Backoff[p.UID].Until):
		m.Reason = ReasonBackoff
	case busy[m.Service] || d.st.serviceInFlight(m.Service) || !d.allReady(m.Service):
		m.Reason = ReasonReplicas
	case d.snap.nodes[m.To] == nil || unschedulable(p, d.snap.nodes[m.To].node) != "":
		m.Reason = ReasonUnschedulable
	case !d.fits(p, m.To):
		m.Reason = ReasonNodeFull
	case d.settling != "":
		m.Reason = ReasonSettling
	case d.newLeader:
		m.Reason = ReasonNewLeader
	case *chosen >= d.cfg.MaxMoves:
		m.Reason = ReasonMaxMoves
	case perNode[m.From] >= d.cfg.MaxMovesPerNode || perNode[m.To] >= d.cfg.MaxMovesPerNode:
		m.Reason = ReasonMaxPerNode
	case perNS[m.Namespace] >= d.cfg.MaxMovesPerNamespace:
		m.Reason = ReasonMaxPerNamespace
	default:
		m.Action = ActionEvict
		*chosen++
		perNode[m.From]++
		perNode[m.To]++
		perNS[m.Namespace]++
		busy[m.Service] = true
		d.snap.nodes[m.To].reserve(podRequests(p))
	}
	return m
}

func (d *decider) cooling(p *corev1.Pod, m Move) bool {
	if d.cfg.Cooldown < 0 {
		return false
	}
	if at, ok := d.st.Placed[p.UID]; ok && d.now.Sub(at) < d.cfg.Cooldown {
		return true
	}
	at, ok := d.st.leftAt(m.Service, m.To)
	return ok && d.now.Sub(at) < d.cfg.Cooldown
}

// changing says what keeps the placement from being still: a move in flight (evicted, its
// replacement not placed yet), or a pod of a managed service starting — not ready and created
// within 2 × GateTimeout + PlacementTimeout (the longest a replacement may take to be placed;
// an older pod that is not ready is broken, not starting, and is left to replicas_not_ready).
// It returns "" when the placement is still.
func (d *decider) changing() string {
	for _, r := range d.st.Moves {
		if r.Outcome == outcomeInFlight {
			return "move of " + r.Namespace + "/" + r.Pod + " in flight"
		}
	}
	starting := 2*d.cfg.GateTimeout + d.cfg.PlacementTimeout
	for _, svc := range slices.Sorted(maps.Keys(d.snap.selected)) {
		for _, p := range d.snap.selected[svc] {
			if !ready(p) && d.now.Sub(p.CreationTimestamp.Time) < starting {
				return "pod " + p.Namespace + "/" + p.Name + " starting"
			}
		}
	}
	return ""
}

// allReady says whether every pod the service selects is ready (none pending, gated or
// starting).
func (d *decider) allReady(service string) bool {
	for _, p := range d.snap.selected[service] {
		if !ready(p) {
			return false
		}
	}
	return true
}

// fits says whether the pod fits on node now, counting the replacements still on their way
// there (moves in flight) and the moves chosen before it.
func (d *decider) fits(p *corev1.Pod, node string) bool {
	n := d.snap.nodes[node]
	if n == nil {
		return false
	}
	probe := n.clone()
	for _, r := range d.st.Moves {
		if r.Outcome == outcomeInFlight && r.To == node {
			probe.reserve(r.Requests)
		}
	}
	return probe.fits(podRequests(p))
}
