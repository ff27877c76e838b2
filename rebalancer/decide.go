package rebalancer

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/edgeflow/edgeflow/optimizer"
)

// decider applies the safety rules to a plan's moves, in the plan's order (most gain first).
// It is pure: everything it reads is in its fields.
type decider struct {
	cfg         *Config
	now         time.Time
	world       *world
	pending     map[string][]pendingMove
	placed      map[types.UID]time.Time
	left        map[serviceNode]time.Time
	backoff     map[types.UID]backoffState
	namespaceOf map[string]string
	// podOf maps a topology pod key (optimizer.Service.PodKey) to its pod; shared pods (listed
	// in a second service as POD@SERVICE) are marked.
	podOf map[string]topoPod
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
//   - min_age: the pod is younger than MinAge;
//   - cooldown: the pod was placed by a move, or a move of its service left the destination,
//     within Cooldown;
//   - backoff: its last eviction was refused (429) and the back-off has not passed;
//   - replicas_not_ready: some pod of its service is not ready (or a move of it is still in
//     flight, or already chosen in this run): evicting it would take the service below its
//     ready replicas;
//   - node_full: the destination has no room for it by the scheduler's count (cpu, memory,
//     pod slots) after the moves chosen before it;
//   - max_moves, max_moves_per_node (leaving or entering), max_moves_per_namespace.
func (d *decider) decide(plan *optimizer.Rebalance, gain float64) []Move {
	var out []Move
	chosen := 0
	perNode, perNS := map[string]int{}, map[string]int{}
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
	p := d.world.pods[podKey{m.Namespace, m.Pod}]
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
	case d.cfg.MinAge > 0 && d.now.Sub(p.CreationTimestamp.Time) < d.cfg.MinAge:
		m.Reason = ReasonTooYoung
	case d.cooling(p, m):
		m.Reason = ReasonCooldown
	case d.now.Before(d.backoff[p.UID].until):
		m.Reason = ReasonBackoff
	case busy[m.Service] || len(d.pending[m.Service]) > 0 || !d.allReady(m.Service):
		m.Reason = ReasonReplicas
	case !d.fits(p, m.To):
		m.Reason = ReasonNodeFull
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
		cpu, mem := podRequests(p)
		d.world.nodes[m.To].reserve(cpu, mem)
	}
	return m
}

func (d *decider) cooling(p *corev1.Pod, m Move) bool {
	if d.cfg.Cooldown < 0 {
		return false
	}
	if at, ok := d.placed[p.UID]; ok && d.now.Sub(at) < d.cfg.Cooldown {
		return true
	}
	at, ok := d.left[serviceNode{m.Service, m.To}]
	return ok && d.now.Sub(at) < d.cfg.Cooldown
}

// allReady says whether every pod the service selects is ready (none pending, gated or
// starting).
func (d *decider) allReady(service string) bool {
	for _, p := range d.world.selected[service] {
		if !ready(p) {
			return false
		}
	}
	return true
}

// fits says whether the pod fits on node now, counting the replacements still on their way
// there (pending moves) and the moves chosen before it.
func (d *decider) fits(p *corev1.Pod, node string) bool {
	n := d.world.nodes[node]
	if n == nil {
		return false
	}
	cpu, mem := podRequests(p)
	probe := *n
	for _, ms := range d.pending {
		for _, pm := range ms {
			if pm.move.To == node {
				probe.reserve(pm.cpu, pm.mem)
			}
		}
	}
	return probe.fits(cpu, mem)
}
