// Package ui is edgeflow's live web view: a read-only page that shows the nodes with their
// measured latencies, the pods by node, each call edge's weighted routes, the plan's cost
// against round-robin's, the last push with its answers and the degraded inputs. It is fed
// Snapshots by its owner (serve) and pushes them to browsers as server-sent events; every
// asset is embedded, so the page works on a cluster without internet.
package ui

import "time"

// Snapshot is one state of the control plane as the page shows it. The producer fills it; the
// view never reaches into the producer. A Snapshot is immutable once handed to Publish.
type Snapshot struct {
	// Publication is the number of the xDS publication shown (0: nothing published yet).
	Publication uint64    `json:"publication"`
	Time        time.Time `json:"time"`
	Policy      string    `json:"policy"`
	Nodes       []Node    `json:"nodes"`
	// Latency holds the measured (or given) latency of each ordered node pair, in ms; per zone
	// (LatencyPer "zone"), of each ordered zone pair, a zone to itself included.
	Latency []Latency `json:"latency"`
	// LatencyPer is "zone" when Latency lists zones (--latency-granularity), else "node".
	LatencyPer string    `json:"latency_per"`
	Services   []Service `json:"services"`
	Edges      []Edge    `json:"edges"`
	// CostMS is the served plan's cost, Σ rps × latency in ms·req/s, and RoundRobinCostMS what
	// round-robin's equal shares would cost on the same topology (-1: unknown).
	CostMS           float64 `json:"cost_ms"`
	RoundRobinCostMS float64 `json:"round_robin_cost_ms"`
	Push             Push    `json:"push"`
	// Degraded lists the inputs that are not as they should be (empty: all are).
	Degraded []Degraded `json:"degraded"`
}

// Node is a machine with the pods it runs.
type Node struct {
	Name     string `json:"name"`
	Locality string `json:"locality,omitempty"`
	Pods     []Pod  `json:"pods"`
}

// Pod is one replica of a service.
type Pod struct {
	Name    string `json:"name"`
	Service string `json:"service"`
}

// Latency is the latency from one node to another in ms.
type Latency struct {
	From string  `json:"from"`
	To   string  `json:"to"`
	MS   float64 `json:"ms"`
}

// Service is a service and its pods.
type Service struct {
	Name string   `json:"name"`
	Pods []string `json:"pods"`
}

// Edge is a call edge with its weighted routes.
type Edge struct {
	From   string  `json:"from"`
	To     string  `json:"to"`
	CostMS float64 `json:"cost_ms"`
	Routes []Route `json:"routes"`
}

// Route is the share of a caller pod's requests sent to a callee pod.
type Route struct {
	Caller    string  `json:"caller"`
	Callee    string  `json:"callee"`
	Fraction  float64 `json:"fraction"`
	RPS       float64 `json:"rps"`
	LatencyMS float64 `json:"latency_ms"`
}

// Push is the last publication's push and the clients' answers.
type Push struct {
	// At is when the publication was set in the snapshot cache.
	At time.Time `json:"at"`
	// Resources counts the per-node resource versions pushed, by xDS type (lds, rds, cds, eds).
	Resources map[string]int `json:"resources"`
	// Streams is the number of xDS streams open.
	Streams int `json:"streams"`
	// Converged says every client pushed to has answered (ACK or NACK); ConvergedAfterMS is
	// how long after At that was.
	Converged        bool    `json:"converged"`
	ConvergedAfterMS float64 `json:"converged_after_ms"`
	// NACKs counts the responses clients rejected since the previous publication.
	NACKs int `json:"nacks"`
}

// Degraded is an input that is missing, failing or stale, and what that means.
type Degraded struct {
	Input   string `json:"input"`
	Message string `json:"message"`
}
