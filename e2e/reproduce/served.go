package reproduce

import (
	"encoding/json"
	"fmt"
	"time"

	webui "github.com/edgeflow/edgeflow/internal/ui"
	"github.com/edgeflow/edgeflow/watcher/prom"
)

// Served is what serve had published when a slice ended: the callee pods' planned request
// rates, and the plan's network cost priced at the scenario's configured RTTs.
type Served struct {
	CalleeRPS map[string]float64
	// Cost is Σ route req/s × the configured RTT between the caller's and the callee's nodes
	// (0 on one node), in ms·req/s: what the plan costs on the testbed's delays, whatever RTTs
	// serve measured, so that the plans of different slices and policies are priced alike.
	Cost float64
	// Traffic is the plan's req/s from the caller's node to the callee's, per ordered pair of
	// distinct nodes; PlannedRTT the latency (ms) of each ordered node pair that serve planned
	// on (the publication's, measured), so that plans can be priced alike at serve's inputs
	// (costAt).
	Traffic, PlannedRTT map[[2]string]float64
	// Capacity is the capacities (req/s by pod) serve's estimator had in force (podCapacities),
	// read for the rows that measure them (Policy.Extra); nil otherwise.
	Capacity map[string]float64
	// QueueScale is the wait scales (by service) serve had in force (queueScales), read as
	// Capacity is; nil otherwise.
	QueueScale map[string]float64
	// Pooled is the services the plan in force pooled (least-request over all their pods:
	// pooledServices), read for the rows delivered by bands; nil otherwise.
	Pooled []string
	// Publications is how many plans serve published while the slice's measured load ran, its
	// warm-up included (-1: unknown); a row on measured pods' settling before it is not counted.
	Publications int
	// Warmup is the warm-up the slice got before measuring: the preset's, and for a row on
	// measured pods its settling before it (settler); Settled says the settle rule ended it
	// (true for the other rows), false that MaxEstimatorWarmup did.
	Warmup  time.Duration
	Settled bool
}

// costAt prices traffic (req/s per ordered node pair) at rtt (ms per ordered node pair):
// Σ req/s × ms; false if a pair with traffic has no latency.
func costAt(traffic, rtt map[[2]string]float64) (float64, bool) {
	var cost float64
	for pair, rps := range traffic {
		ms, ok := rtt[pair]
		if !ok {
			return 0, false
		}
		cost += rps * ms
	}
	return cost, true
}

// snapshot reads serve's last publication from its web view.
func snapshot(ui string) (*webui.Snapshot, error) {
	resp, err := metricsClient.Get("http://" + ui + "/snapshot.json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var snap webui.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		return nil, err
	}
	return &snap, nil
}

// planned reads serve's last publication from its web view's snapshot and prices it (price).
func planned(ui string, rtt map[[2]string]float64) (Served, error) {
	snap, err := snapshot(ui)
	if err != nil {
		return Served{}, err
	}
	return price(snap, rtt)
}

// onMeasuredLatency says why snap's publication is not planned on measured RTTs ("" when it
// is): serve publishes before Prometheus first answers, on its degraded plan (every node pair
// at one latency, prom.EqualLatencyMS: LATA's routes are then blind to the network), and
// replaces it when the measurements arrive (--prometheus-interval later, or more on a busy
// machine); a slice measured before that measures a plan other than the row's policy makes on
// the testbed's RTTs. On a testbed whose RTT matrix has distinct values (rtt: scenario A or B)
// a publication with every pair at one latency is the degraded plan, or one made while only
// some pairs were measured (the rest take the largest measured). Where the matrix is flat
// every pair measures about the same, and a plan made on the first measured pairs is the
// measured plan within the server's damping, so no push follows; there only the degraded
// plan's own latency tells it (the CI run on 75e5295 waited 90 s on a flat publication at
// 2.76 ms with every pair measured).
func onMeasuredLatency(snap *webui.Snapshot, nodes []string, rtt map[[2]string]float64) string {
	for _, d := range snap.Degraded {
		if d.Input == "latency" {
			return "latency degraded: " + d.Message
		}
	}
	if want := len(nodes) * (len(nodes) - 1); len(snap.Latency) != want {
		return fmt.Sprintf("the publication has %d node pairs' latency, want %d", len(snap.Latency), want)
	}
	for _, l := range snap.Latency[1:] {
		if l.MS != snap.Latency[0].MS {
			return ""
		}
	}
	if flat(rtt) && snap.Latency[0].MS != prom.EqualLatencyMS {
		return ""
	}
	return fmt.Sprintf("the publication has every node pair at %g ms (the degraded plan)", snap.Latency[0].MS)
}

// flat says whether every node pair of rtt has the same RTT (scenario "flat").
func flat(rtt map[[2]string]float64) bool {
	var first float64
	seen := false
	for _, v := range rtt {
		if seen && v != first {
			return false
		}
		first, seen = v, true
	}
	return true
}

// price sums snap's routes by callee pod and prices them at rtt (node pair → ms, either order).
func price(snap *webui.Snapshot, rtt map[[2]string]float64) (Served, error) {
	node := map[string]string{}
	for _, n := range snap.Nodes {
		for _, p := range n.Pods {
			node[p.Name] = n.Name
		}
	}
	out := Served{CalleeRPS: map[string]float64{}, Traffic: map[[2]string]float64{}}
	for _, e := range snap.Edges {
		for _, r := range e.Routes {
			out.CalleeRPS[r.Callee] += r.RPS
			from, to := node[r.Caller], node[r.Callee]
			if from == "" || to == "" {
				return Served{}, fmt.Errorf("route %s → %s: a pod the snapshot places on no node", r.Caller, r.Callee)
			}
			if from == to {
				continue
			}
			ms, ok := rtt[[2]string{from, to}]
			if !ok {
				ms, ok = rtt[[2]string{to, from}]
			}
			if !ok {
				return Served{}, fmt.Errorf("route %s → %s: no configured RTT between %s and %s", r.Caller, r.Callee, from, to)
			}
			out.Cost += r.RPS * ms
			out.Traffic[[2]string{from, to}] += r.RPS
		}
	}
	if len(out.CalleeRPS) == 0 {
		return Served{}, fmt.Errorf("serve has published no plan (publication %d)", snap.Publication)
	}
	out.PlannedRTT = map[[2]string]float64{}
	for _, l := range snap.Latency {
		out.PlannedRTT[[2]string{l.From, l.To}] = l.MS
	}
	return out, nil
}
