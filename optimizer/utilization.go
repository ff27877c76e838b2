package optimizer

import (
	"fmt"
	"math"
)

// The load a placement puts on its nodes, and the queueing it causes (docs/architecture.md,
// "LARP, exactly": headroom and queueing).
//
// Planned load. LATA fixes every pod's load by its capacity share, whatever the placement:
// ℓ_p = Λ_s · w_p / Σ_{p'∈s} w_p' (Λ_s the service's load from ingress and calls).
//
// CPU used. A pod p of service s with a service rate μ_p (Pod.CapacityRPS, measured by the
// closed loop, else the service's capacity_rps × w_p) serves μ_p requests/s on its cores,
// which are its CPU request (the cores the estimator divides by: μ = cores / CPU-seconds per
// request). At load ℓ_p it uses
//
//	cpu_p = cpu request_s · min(1, ℓ_p/μ_p)
//
// (a pod cannot use more than its cores: one loaded past μ is saturated, not bigger). A pod
// without a service rate uses its whole request: cpu_p = cpu request_s.
//
// Planned utilisation of node v with C_v cores (Node.CoreCount):
//
//	U_v = Σ_{p on v} cpu_p / (1000 · C_v)
//
// A node of unknown cores (C_v = 0) has none. Placement keeps U_v ≤ Model.MaxNodeUtilization.
//
// Queueing with shared cores. Pod p is an M/M/1 queue whose service rate is scaled by the share
// of its node's cores the other pods leave: μ'_p = μ_p · (1 − o_p), o_p = U_v − cpu_p/(1000·C_v)
// (0 on a node of unknown cores). Its queueing, in ms·req/s like the network cost (mean sojourn
// in ms times rate), is 1000·ℓ_p/(μ'_p − ℓ_p) = 1000·ρ_p/(1 − z_p), with ρ_p = ℓ_p/μ_p and
// z_p = o_p + ρ_p; alone on its node it is lata-q's M/M/1 term. Past lata-q's utilisation cap
// c (Model.UtilizationCap), where the queue is saturated and M/M/1 is no model, the term
// continues along its tangent at z = c, so it stays finite and convex:
// 1000·ρ_p·(1/(1−c) + (z_p−c)/(1−c)²). Pods without a service rate add no queueing.

// podLoad returns ℓ_p of pod k of service s: its capacity share of the service's load.
func (m *Model) podLoad(s, k int) float64 {
	sm := &m.Services[s]
	tw := sm.TotalWeight()
	if tw <= 0 {
		return 0
	}
	return sm.Load * sm.Pods[k].Weight / tw
}

// PodCPU returns the CPU, in millicores, pod k of service s uses at its planned load (see the
// formula above). O(pods of s).
func (m *Model) PodCPU(s, k int) float64 {
	sm := &m.Services[s]
	mu := sm.Pods[k].CapacityRPS
	if !(mu > 0) {
		return float64(sm.CPU)
	}
	return float64(sm.CPU) * min(1, m.podLoad(s, k)/mu)
}

// NodeUse is one node's planned use under a placement.
type NodeUse struct {
	Node string `json:"node" yaml:"node"`
	// Cores is the node's cores (Node.CoreCount); 0: unknown, and Utilization is 0.
	Cores int `json:"cores" yaml:"cores"`
	// CPU is Σ cpu_p over its pods, in millicores (Model.PodCPU).
	CPU float64 `json:"cpu" yaml:"cpu"`
	// Utilization is CPU / (1000 · Cores).
	Utilization float64 `json:"utilization" yaml:"utilization"`
}

// LoadSplit is the predicted cost of a placement split in two: Network, the optimal LATA cost
// (Σ rps × latency over the routes), and Queueing, Σ over the pods with a service rate of their
// M/M/1 queueing with shared cores (see above); both in ms·req/s. Nodes is the planned use of
// every node, in model order.
type LoadSplit struct {
	Network  float64
	Queueing float64
	Nodes    []NodeUse
}

// nodeCPU returns Σ cpu_p per node for the per-pod nodes (pods numbered service by service, in
// model order; -1: unplaced, not counted).
func (m *Model) nodeCPU(cpu []float64, nodes []int) []float64 {
	sum := make([]float64, len(m.Nodes))
	for i, u := range nodes {
		if u >= 0 {
			sum[u] += cpu[i]
		}
	}
	return sum
}

// podCPUs returns PodCPU of every pod, numbered service by service.
func (m *Model) podCPUs() []float64 {
	var out []float64
	for s, sm := range m.Services {
		for k := range sm.Pods {
			out = append(out, m.PodCPU(s, k))
		}
	}
	return out
}

// coreMillis returns 1000 · C_v, 0 when v's cores are unknown.
func (m *Model) coreMillis(v int) float64 { return 1000 * float64(m.Nodes[v].CoreCount()) }

// queueTerm is pod p's queueing in ms·req/s at own utilisation rho = ℓ_p/μ_p on a node whose
// other pods use the share o of its cores (see above); cap is the utilisation cap.
func queueTerm(rho, o, cap float64) float64 {
	z := o + rho
	if z < cap {
		return 1000 * rho / (1 - z)
	}
	return 1000 * rho * (1/(1-cap) + (z-cap)/((1-cap)*(1-cap)))
}

// queueing returns the queueing of the per-pod nodes (see LoadSplit), given PodCPU of every pod.
func (m *Model) queueing(cpu []float64, nodes []int) float64 {
	used := m.nodeCPU(cpu, nodes)
	var q float64
	i := 0
	for s, sm := range m.Services {
		for k, p := range sm.Pods {
			u := nodes[i]
			if p.CapacityRPS > 0 && u >= 0 {
				o := 0.0
				if c := m.coreMillis(u); c > 0 {
					o = (used[u] - cpu[i]) / c
				}
				q += queueTerm(m.podLoad(s, k)/p.CapacityRPS, o, m.UtilizationCap)
			}
			i++
		}
	}
	return q
}

// nodeUses returns every node's planned use under the per-pod nodes.
func (m *Model) nodeUses(cpu []float64, nodes []int) []NodeUse {
	used := m.nodeCPU(cpu, nodes)
	out := make([]NodeUse, len(m.Nodes))
	for v, n := range m.Nodes {
		out[v] = NodeUse{Node: n.Name, Cores: n.CoreCount(), CPU: used[v]}
		if c := m.coreMillis(v); c > 0 {
			out[v].Utilization = used[v] / c
		}
	}
	return out
}

// placedNodes returns every pod's node index as the model places it (-1: unplaced).
func (m *Model) placedNodes() []int {
	var nodes []int
	for _, sm := range m.Services {
		for _, p := range sm.Pods {
			nodes = append(nodes, p.Node)
		}
	}
	return nodes
}

// Split returns the predicted cost of the model's placement (every pod's Node) split into its
// network and queueing parts, and every node's planned use. The network part is Plan(m, LATA)'s
// cost; a pod without a node is an error naming it.
func (m *Model) Split() (*LoadSplit, error) {
	for _, sm := range m.Services {
		for _, p := range sm.Pods {
			if p.Node < 0 {
				return nil, fmt.Errorf("%w: pod %q (service %q) has no node", ErrInvalidTopology, p.Name, sm.Name)
			}
		}
	}
	alloc, err := Plan(m, LATA)
	if err != nil {
		return nil, err
	}
	cpu, nodes := m.podCPUs(), m.placedNodes()
	return &LoadSplit{Network: alloc.Cost, Queueing: m.queueing(cpu, nodes), Nodes: m.nodeUses(cpu, nodes)}, nil
}

// utilizationUnits is the integer unit placement counts planned cpu in: 10⁻⁶ core, so that
// sums are exact and the checks deterministic.
const utilizationUnits = 1e3 // per millicore

// podLoadUnits returns PodCPU of every pod in utilizationUnits, rounded up (saturating).
func (m *Model) podLoadUnits() []int64 {
	cpu := m.podCPUs()
	out := make([]int64, len(cpu))
	for i, c := range cpu {
		out[i] = toUnits(math.Ceil(c * utilizationUnits))
	}
	return out
}

// nodeLoadCap returns the most planned cpu, in utilizationUnits rounded down, node v may carry
// under the model's MaxNodeUtilization; unlimited without a limit or when v's cores are unknown.
func (m *Model) nodeLoadCap(v int) int64 {
	c := m.coreMillis(v)
	if m.MaxNodeUtilization == 0 || c == 0 {
		return unlimited
	}
	return toUnits(math.Floor(m.MaxNodeUtilization * c * utilizationUnits))
}

func toUnits(x float64) int64 {
	if x >= math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return int64(x)
}
