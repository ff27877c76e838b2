// Package probesd serves the latency probes' targets as Prometheus HTTP service discovery
// (http_sd_configs): which node pings which, read from the cluster's Nodes at each request, so
// a node that joins is probed from the next discovery refresh on. It knows nothing of xDS or
// of the optimizer.
package probesd

import (
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Path is where edgeflow serves the answer on its metrics address.
const Path = "/sd/probes"

// Granularities of Config.Granularity.
const (
	// GranularityNode probes every ordered pair of nodes.
	GranularityNode = "node"
	// GranularityZone probes every ordered pair of zone representatives.
	GranularityZone = "zone"
	// GranularityAuto is node while nodes × (nodes − 1) ≤ MaxNodePairs, else zone (the rule
	// of edgeflow's --latency-granularity=auto).
	GranularityAuto = "auto"
)

// DefaultRepresentativeLabel is the node label (value "true") that marks a zone's
// representative.
const DefaultRepresentativeLabel = "edgeflow.io/latency-representative"

// Config says how the targets are derived from the Nodes.
type Config struct {
	// Port is the exporter's port on every node's address (the blackbox-exporter DaemonSet's).
	Port int
	// AddressType is the node address probed and used to reach the exporter (default
	// InternalIP). A node without one is neither probed nor probing.
	AddressType corev1.NodeAddressType
	// Granularity is GranularityNode (default), GranularityZone or GranularityAuto.
	Granularity string
	// MaxNodePairs bounds GranularityAuto's node pairs.
	MaxNodePairs int
	// RepresentativeLabel marks a zone's representative (default
	// DefaultRepresentativeLabel). When no node carries it, each zone's first node by name
	// represents it; a zone is a node's region/zone labels, a node without a zone label being
	// a zone of its own.
	RepresentativeLabel string
	// Nodes selects by label the nodes that run an exporter (the DaemonSet's placement, e.g.
	// "!node-role.kubernetes.io/control-plane"); a node it does not select is neither probed
	// nor probing, and cannot represent a zone. nil selects every node.
	Nodes labels.Selector
}

// TargetGroup is one target group of Prometheus' HTTP service discovery.
type TargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// Labels of every group, as the probe job's relabelling reads them (the chart's scrape.yaml,
// e2e/testbed.ScrapeConfig): the probe runs from source_node's exporter (__tmp_exporter) to the
// group's one target, target_node's address.
const (
	LabelSourceNode = "source_node"
	LabelTargetNode = "target_node"
	LabelExporter   = "__tmp_exporter"
)

// TargetGroups returns the probes among nodes: one group per ordered pair of probed nodes
// (Prometheus gives a group's labels to every target in it, and target_node differs per
// target), ordered by source then target name. It returns an empty, non-nil slice when fewer
// than two nodes are probed. Cost O(n log n + p) for n nodes and p pairs; nodes is not changed.
func TargetGroups(nodes []*corev1.Node, cfg Config) []TargetGroup {
	type probed struct{ name, address string }
	var ps []probed
	for _, n := range representatives(nodes, cfg) {
		if a := address(n, cfg.AddressType); a != "" {
			ps = append(ps, probed{n.Name, a})
		}
	}
	out := make([]TargetGroup, 0, len(ps)*max(len(ps)-1, 0))
	for _, src := range ps {
		exporter := net.JoinHostPort(src.address, strconv.Itoa(cfg.Port))
		for _, dst := range ps {
			if src.name == dst.name {
				continue
			}
			out = append(out, TargetGroup{Targets: []string{dst.address},
				Labels: map[string]string{LabelSourceNode: src.name, LabelTargetNode: dst.name, LabelExporter: exporter}})
		}
	}
	return out
}

// representatives returns the nodes probed, sorted by name: every node cfg.Nodes selects, or
// one per zone.
func representatives(nodes []*corev1.Node, cfg Config) []*corev1.Node {
	sorted := slices.Clone(nodes)
	if cfg.Nodes != nil {
		sorted = slices.DeleteFunc(sorted, func(n *corev1.Node) bool { return !cfg.Nodes.Matches(labels.Set(n.Labels)) })
	}
	slices.SortFunc(sorted, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	zone := cfg.Granularity == GranularityZone ||
		(cfg.Granularity == GranularityAuto && len(sorted)*(len(sorted)-1) > cfg.MaxNodePairs)
	if !zone {
		return sorted
	}
	label := cfg.RepresentativeLabel
	if label == "" {
		label = DefaultRepresentativeLabel
	}
	var labelled []*corev1.Node
	for _, n := range sorted {
		if n.Labels[label] == "true" {
			labelled = append(labelled, n)
		}
	}
	if len(labelled) > 0 {
		return labelled
	}
	seen := map[string]bool{}
	var first []*corev1.Node
	for _, n := range sorted {
		z := "node:" + n.Name
		if v := n.Labels[corev1.LabelTopologyZone]; v != "" {
			z = "zone:" + n.Labels[corev1.LabelTopologyRegion] + "/" + v
		}
		if !seen[z] {
			seen[z] = true
			first = append(first, n)
		}
	}
	return first
}

// address is the node's first address of type t (InternalIP when t is empty), or "".
func address(n *corev1.Node, t corev1.NodeAddressType) string {
	if t == "" {
		t = corev1.NodeInternalIP
	}
	for _, a := range n.Status.Addresses {
		if a.Type == t && a.Address != "" {
			return a.Address
		}
	}
	return ""
}

// Handler answers GET with TargetGroups of nodes() as JSON, the body Prometheus' http_sd
// expects. nodes is called once per request and must be safe for concurrent use (an
// informer's lister is); the handler is. The answer grows with the pairs: at 100 nodes 9,900
// groups, 1.2 MB, about 25 ms on a busy 2-core machine (BenchmarkHandler), Prometheus asking
// once per refresh interval; per zone it is zones².
func Handler(nodes func() []*corev1.Node, cfg Config) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		body, err := json.Marshal(TargetGroups(nodes(), cfg))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}

// InformerNodes returns the Nodes in a Node informer's cache, for Handler: a node is there
// before the informer's handlers hear of it, so the answer holds it from its informer event on.
func InformerNodes(nodes cache.SharedIndexInformer) func() []*corev1.Node {
	lister := corelisters.NewNodeLister(nodes.GetIndexer())
	return func() []*corev1.Node {
		ns, _ := lister.List(labels.Everything()) // a cache's List fails never
		return ns
	}
}
