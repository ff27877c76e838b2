// Package reproduce is edgeflow's reproduction of the paper's experiment with the whole live
// loop on the real-delay testbed: 4 node namespaces with the scenario's RTT matrix (nqdelay,
// the userspace netem), the applications as Deployments in a real kube-apiserver placed by the
// real kube-scheduler, each pod a process in its node's namespace (started by the fake kubelet
// through processRuntime), blackbox-exporter + Prometheus → `edgeflow serve --kubeconfig
// --prometheus-url` → xDS → every caller pod's grpc-go xDS client, `edgeflow rebalance
// --dry-run=false` placing the proposed and beyond rows, and an open-loop load generator.
// TestReproduce runs it (make reproduce) and writes the report (report.go, plot.go).
package reproduce

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Component is one service of an application: a Deployment of Replicas pods requesting CPU,
// each calling Calls (services of the same application) in order for every request it serves.
type Component struct {
	Name     string
	Replicas int
	CPU      string
	Calls    []string
}

// App is an application: its components, the first of which takes the load.
type App struct {
	Name       string
	Components []Component
}

// Entry is the service the load generator calls.
func (a App) Entry() string { return a.Components[0].Name }

// The paper's two applications with the paper's kind of replica ratios (3 caller pods and 2
// callee pods sharing nodes, which favour OptTraffic): every caller service has 3 pods and every
// service it calls 2, so no placement gives each caller pod a callee pod of its own. CPU
// requests as in examples/bookinfo.yaml and examples/dag.yaml. Neutral is the other set the
// experiment runs (REPRODUCE_REPLICAS=neutral), where a placement can give every caller pod a
// callee pod of its own; docs/reproduction.md ("What is structurally different from the
// paper") says what each set favours.
var (
	Bookinfo = App{Name: "bookinfo", Components: []Component{
		{Name: "productpage", Replicas: 3, CPU: "500m", Calls: []string{"details", "reviews"}},
		{Name: "details", Replicas: 2, CPU: "250m"},
		{Name: "reviews", Replicas: 3, CPU: "500m", Calls: []string{"ratings"}},
		{Name: "ratings", Replicas: 2, CPU: "250m"},
	}}
	DAG = App{Name: "dag", Components: []Component{
		{Name: "a", Replicas: 3, CPU: "500m", Calls: []string{"b"}},
		{Name: "b", Replicas: 2, CPU: "500m", Calls: []string{"c"}},
		{Name: "c", Replicas: 3, CPU: "500m", Calls: []string{"d"}},
		{Name: "d", Replicas: 2, CPU: "500m", Calls: []string{"e"}},
		{Name: "e", Replicas: 3, CPU: "500m"},
	}}
)

// PaperApps are the applications of the paper's regime (preset "paper"): 3–5 replicas per
// component in ratios that favour OptTraffic, as the seed says — every service called has at
// least as many pods as the testbed has nodes, so a placement can give every caller pod a callee
// pod on its own node, the case OptTraffic's same-node-first rule is made for. Every pod's CPU
// limit is its request (PaperWorkload.LimitCPU): 100m for the called services, 300m for the
// entry service, whose 3 pods take every request whatever the policy (at 300 req/s, 100 req/s
// a pod: a 100m pod would collapse under every row alike).
var PaperApps = []App{
	{Name: "bookinfo", Components: []Component{
		{Name: "productpage", Replicas: 3, CPU: "300m", Calls: []string{"details", "reviews"}},
		{Name: "details", Replicas: 4, CPU: "100m"},
		{Name: "reviews", Replicas: 4, CPU: "100m", Calls: []string{"ratings"}},
		{Name: "ratings", Replicas: 5, CPU: "100m"},
	}},
	{Name: "dag", Components: []Component{
		{Name: "a", Replicas: 3, CPU: "300m", Calls: []string{"b"}},
		{Name: "b", Replicas: 4, CPU: "100m", Calls: []string{"c"}},
		{Name: "c", Replicas: 4, CPU: "100m", Calls: []string{"d"}},
		{Name: "d", Replicas: 5, CPU: "100m", Calls: []string{"e"}},
		{Name: "e", Replicas: 5, CPU: "100m"},
	}},
}

// PaperWorkload is the pods' work in the paper's regime, calibrated (calibration run 2,
// docs/benchmarks/paper-experiment.md): a request holds one of its pod's 2 workers and one of
// its node's core (1 a node, as the nodes tell Kubernetes: Preset.NodeCPU "1") for 1.1 ms on
// average, 0.8 ms of it fixed; and each pod's CPU is limited to its request as CFS quota
// (LimitCPU): a 100m pod runs at most 10 ms of work a 100 ms period, about 91 requests a
// second. A hop costs about 1 ms (with gRPC's own) until a pod's limit binds; Localization,
// which keeps each entry pod's requests on its node, loads the called pods on the 3 entry nodes
// with 33 req/s at 100 req/s (never throttled: mean 11.6 ms, P99 25.8 ms measured, the paper's
// 11 and 22 ± 30 %) and 100 req/s at 300 (past the limit: the queue grows, mean 2.7 s). Every
// pod exports a mesh's telemetry (Metrics), which the rows on measured pods plan on.
var PaperWorkload = Workload{Workers: 2, ServiceTime: 1100 * time.Microsecond, ServiceFixed: 800 * time.Microsecond, NodeCores: 1,
	LimitCPU: true, Metrics: true}

// PaperRows are the paper preset's rows: the paper's seven, then the two that plan on what the
// pods' telemetry measures (issue 39's rows beyond the paper): lata-q on the scheduler's
// placement and closed-loop. The controls (lata-w10, closed-loop-rr, closed-loop-cap80) run
// only where named.
var PaperRows = []string{"default-k8s", "least-request", "localization", "opttraffic", "lata-only", "proposed", "beyond",
	"lata-q", "closed-loop"}

// ClosedLoopApp is Bookinfo with the paper's replica ratios (3 caller pods, 2 callee pods) as
// the closed loop's comparison runs it (preset "closedloop", issue 37): each pod requests the one
// core its one worker can use, so that the utilisation law's cores (the CPU request) are the
// pod's truth, and the nodes' 3 cores (ClosedLoopWorkload, NodeCPU "3") fit the 10 pods with
// room for the scheduler to choose.
var ClosedLoopApp = App{Name: "bookinfo", Components: []Component{
	{Name: "productpage", Replicas: 3, CPU: "1", Calls: []string{"details", "reviews"}},
	{Name: "details", Replicas: 2, CPU: "1"},
	{Name: "reviews", Replicas: 3, CPU: "1", Calls: []string{"ratings"}},
	{Name: "ratings", Replicas: 2, CPU: "1"},
}}

// ClosedLoopWorkload is the pods' work in the closed loop's comparison: one worker, 15 ms
// exponential (67 req/s a pod: the 2-pod services' 133 req/s bound the application, 111 with
// one pod 1.5× slower), each node's pods sharing its 3 cores (a node with 3 pods contends at high
// load), and the telemetry a mesh exports, which lata-q and closed-loop estimate capacities from.
var ClosedLoopWorkload = Workload{Workers: 1, ServiceTime: 15 * time.Millisecond, NodeCores: 3, Metrics: true}

// Neutral is the neutral replica set: 3 pods per service, 4 for the service with the most
// callers' traffic per pod (reviews, b), the replicas of examples/bookinfo.yaml and dag.yaml.
var Neutral = map[string]int{"productpage": 3, "details": 3, "reviews": 4, "ratings": 3, "a": 3, "b": 4, "c": 3, "d": 3, "e": 3}

// Nodes are the testbed's worker nodes (and the Kubernetes nodes' names).
var Nodes = []string{"n1", "n2", "n3", "n4"}

// ScenarioA is the RTT matrix of latency scenario A in ms; scenario B doubles every entry.
var ScenarioA = map[[2]string]float64{
	{"n1", "n2"}: 4, {"n1", "n3"}: 8, {"n1", "n4"}: 12,
	{"n2", "n3"}: 6, {"n2", "n4"}: 10, {"n3", "n4"}: 4,
}

// FlatRTT is the RTT of every node pair in scenario "flat": the closed loop's testbed
// (TestClosedLoopOnTestbed), where no node is nearer to another than the rest, so that what
// sets a callee pod's planned share is its capacity (and being on its caller's node).
const FlatRTT = 2.0

// Scenario returns the RTT matrix of scenario "A", "B" (A doubled) or "flat" (every pair
// FlatRTT).
func Scenario(name string) (map[[2]string]float64, error) {
	out := map[[2]string]float64{}
	if name == "flat" {
		for k := range ScenarioA {
			out[k] = FlatRTT
		}
		return out, nil
	}
	scale := map[string]float64{"A": 1, "B": 2}[name]
	if scale == 0 {
		return nil, fmt.Errorf("unknown scenario %q (want A, B or flat)", name)
	}
	for k, v := range ScenarioA {
		out[k] = v * scale
	}
	return out, nil
}

// Policy is one row of the experiment: how pods are placed and how traffic is allocated.
type Policy struct {
	Name string
	// Allocation is `edgeflow serve --policy`; LB its --lb-policy.
	Allocation, LB string
	// LARP: the placement is `edgeflow rebalance --dry-run=false`'s, else the scheduler's.
	LARP bool
	// Flags are further flags of serve for this row.
	Flags []string
	// Extra: a row beyond the paper's seven, run only where a preset names it (Preset.Policies).
	Extra bool
}

// estimatorFlags are serve's flags for the rows that plan on capacities measured from the pods'
// telemetry (lata-q, closed-loop): the estimator's window, two scrapes of the pods
// (podScrapeInterval), the fewest increase() needs.
var estimatorFlags = []string{"--prometheus-window", (2 * podScrapeInterval).String()}

// Policies are the experiment's rows, in order: the paper's seven, then the closed loop's
// comparison (issue 37: least-request, lata and lata-q on measured capacities and closed-loop,
// all on the scheduler's placement), which need the pods' telemetry (Workload.Metrics).
var Policies = []Policy{
	{Name: "default-k8s", Allocation: "round-robin", LB: "round-robin"},
	{Name: "least-request", Allocation: "round-robin", LB: "least-request"},
	{Name: "localization", Allocation: "localization", LB: "round-robin"},
	{Name: "opttraffic", Allocation: "opttraffic", LB: "round-robin"},
	{Name: "lata-only", Allocation: "lata", LB: "round-robin"},
	{Name: "proposed", Allocation: "lata", LB: "round-robin", LARP: true},
	{Name: "beyond", Allocation: "lata-q", LB: "round-robin", LARP: true},
	{Name: "lata-q", Allocation: "lata-q", LB: "round-robin", Flags: estimatorFlags, Extra: true},
	{Name: "closed-loop", Allocation: "closed-loop", LB: "bands", Flags: estimatorFlags, Extra: true},
	// Controls that take closed-loop apart from lata-only one difference at a time: lata with
	// the estimator rows' serve settings, and closed-loop delivered by round-robin (no bands).
	{Name: "lata-w10", Allocation: "lata", LB: "round-robin", Flags: estimatorFlags, Extra: true},
	{Name: "closed-loop-rr", Allocation: "closed-loop", LB: "round-robin", Flags: estimatorFlags, Extra: true},
	// closed-loop with lata-q's utilisation cap at 0.8 instead of 0.9: a service whose load
	// reaches 0.8 of its measured capacity is pooled (least-request over all its pods) rather
	// than banded. The control for the plan's tail near saturation (docs/closed-loop/README.md).
	{Name: "closed-loop-cap80", Allocation: "closed-loop", LB: "bands", Flags: slices.Concat(estimatorFlags, []string{"--utilization-cap", "0.8"}), Extra: true},
}

// Workload is the pods' simulated work, as in `edgeflow demo`: one worker per pod and a 6 ms
// mean exponential service time (a capacity of ~167 req/s per pod), so that at the paper's
// 100–300 req/s a balanced pod runs at 20–60 % and a pod given most of its service's traffic
// overloads, as the paper saw Localization do.
type Workload struct {
	Workers     int
	ServiceTime time.Duration
	// ServiceFixed is the part of ServiceTime every request takes, the rest exponential
	// (app.Shifted); 0: exponential.
	ServiceFixed time.Duration
	// Metrics: every pod serves its /metrics (Istio's request metrics, the busy time as
	// cAdvisor's CPU usage, its CPU request) on POD_IP:15020 and is annotated for Prometheus's
	// kubernetes-pods job (podScrapeJob), which then scrapes it every podScrapeInterval.
	Metrics bool
	// LimitCPU gives every pod a CPU limit equal to its request (limits.cpu, Kubernetes's
	// Guaranteed class), enforced as the kernel's CFS quota per 100 ms period (pod
	// --cpu-limit, app.Config.CPULimit): a pod runs at most its request's share of a core in
	// any period, the rest of its work waiting, throttled, for the next.
	LimitCPU bool
	// NodeCores, when positive, is how many cores each node's pods share (app.NodeCPU, served
	// to the pod processes by the harness: nodeCores): a request holds one of its pod's workers
	// and one of its node's cores, so pods packed onto a node contend as on a real machine. 0:
	// each pod is bound by its own workers only (the model of the runs before 2026-12-05).
	NodeCores int
	// NodeSpeed divides every service time on a node (0.5: twice as long), the world's hidden
	// truth: Kubernetes and edgeflow are not told. A node not listed runs at speed 1. Setting it
	// gives the pods node cores (unlimited when NodeCores is 0).
	NodeSpeed map[string]float64
}

// DefaultWorkload is the pods' work in every preset.
var DefaultWorkload = Workload{Workers: 1, ServiceTime: 6 * time.Millisecond}

// Preset is what one invocation runs.
type Preset struct {
	Name      string
	Apps      []App
	Scenarios []string
	// Rates are the constant load levels (req/s); FindMax adds the highest rate at which
	// default-k8s keeps P99 under 1 s (findMax: in steps of MaxStep above the last rate, or of
	// MaxStep/4 below it when the last rate already fails).
	Rates   []float64
	FindMax bool
	MaxStep float64
	// Runs per cell; each run gives every policy Duration of measured load after Warmup.
	Runs             int
	Duration, Warmup time.Duration
	Timeout          time.Duration
	// Policies, if set, are the names of the rows to run (default: all of Policies).
	Policies []string
	// Settle is the unmeasured load a new placement gets before its first slice (0:
	// SettleTime; negative: none).
	Settle time.Duration
	// RebalancePeriod and RebalanceWindow are `edgeflow rebalance`'s --period and
	// --prometheus-window (0: 10 s and 20 s).
	RebalancePeriod, RebalanceWindow time.Duration
	// Workload is the pods' work (nil: DefaultWorkload); NodeCPU the nodes' CPU as Kubernetes
	// sees it (a quantity; "": 4 cores), which should be Workload.NodeCores where that is set.
	Workload *Workload
	NodeCPU  string
	// Reruns is how many times an unhealthy slice (HealthBounds) is run again before its last
	// result is kept, flagged (0: DefaultReruns; negative: none, the health still recorded).
	Reruns int
	// Seed is the seed of the slices' order within a placement (interleave); 0 means 1.
	Seed uint64
	// Slow names components one of whose pods runs slower than its peers by the factor given,
	// unseen by Kubernetes and edgeflow (the pod's --slow): the closed loop's scenario (B). The
	// scheduler's placement only: not with LARP rows, whose placement starts the pods anew.
	Slow map[string]float64
	// L7Penalty is a hidden L7 penalty: ms that every TCP round trip between the two nodes of
	// a pair pays beyond its RTT, which ICMP (and so Kubernetes and edgeflow's probes) does not
	// see (testbed.Config.TCPPenalty, from the first node to the second), by "NODE:NODE": the
	// closed loop's scenario (C), found by its latency correction from grpc-go's attempt metric.
	L7Penalty map[string]float64
	// Poisson sends the load at Poisson arrival times instead of a constant rate (loadgen's
	// Config.Poisson; REPRODUCE_ARRIVALS=poisson): many independent clients, as a cluster's
	// users are. A constant rate split round-robin gives each pod a near-even stream, which a
	// pod throttled by its CPU quota pays nothing for until its limit.
	Poisson bool
	// Smoke: the run is checked for what holds on any run of a working loop (smokeProblems,
	// reportProblems: every row served, the report whole, the plans' network cost in the
	// policies' order, the rebalancer settled), not for the paper's P99 claims (checkClaims).
	Smoke bool
}

// rebalancePeriod and rebalanceWindow are p.RebalancePeriod and p.RebalanceWindow, or 10 s
// and 20 s if unset: a run every 10 s on RTTs averaged over 20 s (a 3 s period on 4 s windows
// planned on topologies and RTTs still moving, and its targets flipped).
func (p Preset) rebalancePeriod() time.Duration { return cmp.Or(p.RebalancePeriod, 10*time.Second) }
func (p Preset) rebalanceWindow() time.Duration { return cmp.Or(p.RebalanceWindow, 20*time.Second) }

// DefaultReruns is Preset.Reruns's default.
const DefaultReruns = 2

// reruns is p.Reruns, DefaultReruns if unset, 0 if negative.
func (p Preset) reruns() int {
	switch {
	case p.Reruns < 0:
		return 0
	case p.Reruns == 0:
		return DefaultReruns
	}
	return p.Reruns
}

// workload is p.Workload, or DefaultWorkload if unset.
func (p Preset) workload() Workload {
	if p.Workload == nil {
		return DefaultWorkload
	}
	return *p.Workload
}

// seed is p.Seed, or 1 if unset.
func (p Preset) seed() uint64 { return cmp.Or(p.Seed, 1) }

// settleTime is p.Settle, SettleTime if unset, 0 if negative (none).
func (p Preset) settleTime() time.Duration {
	switch {
	case p.Settle < 0:
		return 0
	case p.Settle == 0:
		return SettleTime
	}
	return p.Settle
}

// Rows returns the policies the preset runs, in Policies order: those it names, or the
// paper's seven (the rows not Extra).
func (p Preset) Rows() []Policy {
	var out []Policy
	for _, q := range Policies {
		if len(p.Policies) == 0 && !q.Extra || slices.Contains(p.Policies, q.Name) {
			out = append(out, q)
		}
	}
	return out
}

// Presets: smoke is CI's, the live loop end to end at its smallest (one app, scenario B, every
// row once at 100 req/s, slices of 2 s after 1 s of warm-up, no unmeasured settle load on a new
// placement, the rebalancer every 5 s on RTTs over 10 s: ~3 minutes here), checked only for
// what holds on any run (Smoke); quick (one app, scenario B, the middle rate, 5 runs) and full,
// the paper's grid with 5 runs per cell (the paper used 10), each slice 5 s measured after 1 s
// of warm-up so that the grid's 420 slices fit in about 75 minutes here (the committed report's
// run), are checked for the paper's P99 claims (make reproduce); paper is the paper's regime
// (PaperApps, PaperWorkload: calibrated against the paper's Localization figures; PaperRows: the
// paper's seven rows and the two on measured pods; 10 runs of 10 s slices, the grid of record, run
// in parts: make reproduce PRESET=paper SETUP=APP/SCENARIO); queueing is
// full's model and grid under its own name (1 worker, 6 ms exponential, no CPU limits: the tail
// is queueing, not the network), reported apart from paper's; closedloop is issue 37's comparison
// (ClosedLoopApp, ClosedLoopWorkload: closed-loop against least-request, lata and lata-q, with
// REPRODUCE_SLOW for its scenario (B); make reproduce PRESET=closedloop), whose claims the report
// states (closedLoopSection) and nothing asserts.
var Presets = map[string]Preset{
	"smoke": {Name: "smoke", Smoke: true, Apps: []App{Bookinfo}, Scenarios: []string{"B"}, Rates: []float64{100},
		Runs: 1, Duration: 2 * time.Second, Warmup: time.Second, Timeout: 5 * time.Second, Settle: -1, Reruns: -1,
		RebalancePeriod: 5 * time.Second, RebalanceWindow: 10 * time.Second},
	"paper": {Name: "paper", Apps: PaperApps, Scenarios: []string{"A", "B"}, Rates: []float64{100, 200, 300},
		Policies: PaperRows, Workload: &PaperWorkload, NodeCPU: "1", Runs: 10, Duration: 10 * time.Second, Warmup: 3 * time.Second, Timeout: 5 * time.Second},
	"closedloop": {Name: "closedloop", Apps: []App{ClosedLoopApp}, Scenarios: []string{"A"}, Rates: []float64{50, 80, 100},
		Policies: []string{"least-request", "lata-only", "lata-q", "closed-loop"}, Workload: &ClosedLoopWorkload, NodeCPU: "3",
		Runs: 3, Duration: 20 * time.Second, Warmup: 3 * time.Second, Timeout: 5 * time.Second},
	"queueing": {Name: "queueing", Apps: []App{Bookinfo, DAG}, Scenarios: []string{"A", "B"}, Rates: []float64{100, 200, 300},
		FindMax: true, MaxStep: 100, Runs: 5, Duration: 5 * time.Second, Warmup: time.Second, Timeout: 5 * time.Second},
	"quick": {Name: "quick", Apps: []App{Bookinfo}, Scenarios: []string{"B"}, Rates: []float64{200},
		Runs: 5, Duration: 10 * time.Second, Warmup: 2 * time.Second, Timeout: 5 * time.Second},
	"full": {Name: "full", Apps: []App{Bookinfo, DAG}, Scenarios: []string{"A", "B"}, Rates: []float64{100, 200, 300},
		FindMax: true, MaxStep: 100, Runs: 5, Duration: 5 * time.Second, Warmup: time.Second, Timeout: 5 * time.Second},
}

// Override narrows or changes a preset from the environment, for a run that fits the time at
// hand: REPRODUCE_APPS (bookinfo,dag), REPRODUCE_SCENARIOS (A,B), REPRODUCE_RATES (req/s,
// comma-separated), REPRODUCE_RUNS, REPRODUCE_DURATION (measured time per slice), REPRODUCE_WARMUP (unmeasured load before it),
// REPRODUCE_POLICIES (names),
// REPRODUCE_REPLICAS (COMPONENT=N,…: another replica count for the named components; "neutral":
// the Neutral set), REPRODUCE_CPU (COMPONENT=QUANTITY,…: another CPU request, and limit where
// the workload limits CPU), REPRODUCE_WORKLOAD (service=D,fixed=D,workers=N,cores=N,limit=0|1,metrics=0|1:
// the pods' work, for a calibration: parseWorkload),
// REPRODUCE_SLOW (COMPONENT=FACTOR,…: one pod of each component named that much slower than its
// peers, unseen: Preset.Slow),
// REPRODUCE_L7_PENALTY (NODE:NODE=MS,…: a hidden L7 penalty between two nodes: Preset.L7Penalty),
// REPRODUCE_NODE_SPEED (NODE=FACTOR,…: nodes slower or faster than the rest, unseen by
// Kubernetes and edgeflow: HEART's heterogeneous cluster), REPRODUCE_ARRIVALS (poisson or
// constant: Preset.Poisson), REPRODUCE_FIND_MAX (0 or 1). The
// report names the preset and says what ran.
func Override(p Preset, getenv func(string) string) (Preset, error) {
	if v := getenv("REPRODUCE_APPS"); v != "" {
		own := p.Apps // the preset's replicas, where it has the app
		p.Apps = nil
		for _, name := range strings.Split(v, ",") {
			i := slices.IndexFunc(own, func(a App) bool { return a.Name == name })
			switch {
			case i >= 0:
				p.Apps = append(p.Apps, own[i])
			case name == Bookinfo.Name:
				p.Apps = append(p.Apps, Bookinfo)
			case name == DAG.Name:
				p.Apps = append(p.Apps, DAG)
			default:
				return p, fmt.Errorf("REPRODUCE_APPS: unknown app %q (want bookinfo, dag)", name)
			}
		}
		p.Name += "+apps"
	}
	if v := getenv("REPRODUCE_SCENARIOS"); v != "" {
		p.Scenarios = strings.Split(v, ",")
		for _, s := range p.Scenarios {
			if _, err := Scenario(s); err != nil {
				return p, fmt.Errorf("REPRODUCE_SCENARIOS: %w", err)
			}
		}
		p.Name += "+scenarios"
	}
	if v := getenv("REPRODUCE_RATES"); v != "" {
		p.Rates = nil
		for _, r := range strings.Split(v, ",") {
			x, err := strconv.ParseFloat(r, 64)
			if err != nil || !(x > 0) {
				return p, fmt.Errorf("REPRODUCE_RATES: bad rate %q", r)
			}
			p.Rates = append(p.Rates, x)
		}
		p.Name += "+rates"
	}
	if v := getenv("REPRODUCE_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return p, fmt.Errorf("REPRODUCE_RUNS: bad count %q", v)
		}
		p.Runs = n
		p.Name += "+runs"
	}
	if v := getenv("REPRODUCE_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return p, fmt.Errorf("REPRODUCE_DURATION: bad duration %q", v)
		}
		p.Duration = d
		p.Name += "+duration"
	}
	if v := getenv("REPRODUCE_WARMUP"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return p, fmt.Errorf("REPRODUCE_WARMUP: bad duration %q", v)
		}
		p.Warmup = d
		p.Name += "+warmup"
	}
	if v := getenv("REPRODUCE_POLICIES"); v != "" {
		p.Policies = strings.Split(v, ",")
		for _, name := range p.Policies {
			if !slices.ContainsFunc(Policies, func(q Policy) bool { return q.Name == name }) {
				return p, fmt.Errorf("REPRODUCE_POLICIES: unknown policy %q", name)
			}
		}
		p.Name += "+policies"
	}
	if v := getenv("REPRODUCE_REPLICAS"); v != "" {
		set := map[string]int{}
		if v == "neutral" {
			for _, a := range p.Apps {
				for _, c := range a.Components {
					set[c.Name] = Neutral[c.Name]
				}
			}
		} else {
			for _, kv := range strings.Split(v, ",") {
				name, count, ok := strings.Cut(kv, "=")
				n, err := strconv.Atoi(count)
				if !ok || err != nil || n < 1 {
					return p, fmt.Errorf("REPRODUCE_REPLICAS: bad entry %q (want COMPONENT=N, N ≥ 1)", kv)
				}
				set[name] = n
			}
		}
		apps, err := withComponents(p.Apps, set, func(c *Component, n int) { c.Replicas = n })
		if err != nil {
			return p, fmt.Errorf("REPRODUCE_REPLICAS: %w", err)
		}
		p.Apps = apps
		p.Name += "+replicas"
	}
	if v := getenv("REPRODUCE_CPU"); v != "" {
		set := map[string]string{}
		for _, kv := range strings.Split(v, ",") {
			name, q, ok := strings.Cut(kv, "=")
			cpu, err := resource.ParseQuantity(q)
			if !ok || err != nil || cpu.Sign() <= 0 {
				return p, fmt.Errorf("REPRODUCE_CPU: bad entry %q (want COMPONENT=QUANTITY, a positive CPU quantity such as 300m)", kv)
			}
			set[name] = q
		}
		apps, err := withComponents(p.Apps, set, func(c *Component, q string) { c.CPU = q })
		if err != nil {
			return p, fmt.Errorf("REPRODUCE_CPU: %w", err)
		}
		p.Apps = apps
		p.Name += "+cpu"
	}
	if v := getenv("REPRODUCE_WORKLOAD"); v != "" {
		w, err := parseWorkload(p.workload(), v)
		if err != nil {
			return p, fmt.Errorf("REPRODUCE_WORKLOAD: %w", err)
		}
		p.Workload = &w
		p.Name += "+workload"
	}
	if v := getenv("REPRODUCE_SLOW"); v != "" {
		p.Slow = map[string]float64{}
		for _, kv := range strings.Split(v, ",") {
			name, factor, ok := strings.Cut(kv, "=")
			f, err := strconv.ParseFloat(factor, 64)
			if !ok || err != nil || !(f > 0) || math.IsInf(f, 0) || !slices.ContainsFunc(p.Apps, func(a App) bool {
				return slices.ContainsFunc(a.Components, func(c Component) bool { return c.Name == name })
			}) {
				return p, fmt.Errorf("REPRODUCE_SLOW: bad entry %q (want COMPONENT=FACTOR, COMPONENT one of the apps %v, FACTOR > 0)", kv, appNames(p.Apps))
			}
			p.Slow[name] = f
		}
		if slices.ContainsFunc(p.Rows(), func(q Policy) bool { return q.LARP }) {
			return p, fmt.Errorf("REPRODUCE_SLOW: the slowed pods are the scheduler's placement's; run it without the LARP rows (REPRODUCE_POLICIES)")
		}
		p.Name += "+slow"
	}
	if v := getenv("REPRODUCE_NODE_SPEED"); v != "" {
		w := p.workload()
		w.NodeSpeed = map[string]float64{}
		for _, kv := range strings.Split(v, ",") {
			node, speed, ok := strings.Cut(kv, "=")
			f, err := strconv.ParseFloat(speed, 64)
			if !ok || err != nil || !(f > 0) || math.IsInf(f, 0) || !slices.Contains(Nodes, node) {
				return p, fmt.Errorf("REPRODUCE_NODE_SPEED: bad entry %q (want NODE=FACTOR, NODE one of %v, FACTOR > 0)", kv, Nodes)
			}
			w.NodeSpeed[node] = f
		}
		p.Workload = &w
		p.Name += "+speed"
	}
	if v := getenv("REPRODUCE_L7_PENALTY"); v != "" {
		p.L7Penalty = map[string]float64{}
		for _, kv := range strings.Split(v, ",") {
			pair, ms, ok := strings.Cut(kv, "=")
			a, b, ok2 := strings.Cut(pair, ":")
			x, err := strconv.ParseFloat(ms, 64)
			if !ok || !ok2 || a == b || err != nil || !(x > 0) || math.IsInf(x, 0) || !slices.Contains(Nodes, a) || !slices.Contains(Nodes, b) {
				return p, fmt.Errorf("REPRODUCE_L7_PENALTY: bad entry %q (want NODE:NODE=MS, two nodes of %v, MS > 0)", kv, Nodes)
			}
			p.L7Penalty[a+":"+b] = x
		}
		p.Name += "+l7"
	}
	switch v := getenv("REPRODUCE_ARRIVALS"); v {
	case "":
	case "poisson", "constant":
		p.Poisson = v == "poisson"
		p.Name += "+" + v
	default:
		return p, fmt.Errorf("REPRODUCE_ARRIVALS: %q (want poisson or constant)", v)
	}
	if v := getenv("REPRODUCE_FIND_MAX"); v != "" {
		p.FindMax = v == "1"
		p.Name += "+findmax"
	}
	return p, nil
}

// withComponents returns a copy of apps with apply(component, value) done to every component
// set names, or an error naming a component of set that no app has.
func withComponents[T any](apps []App, set map[string]T, apply func(*Component, T)) ([]App, error) {
	used := map[string]bool{}
	out := make([]App, len(apps))
	for i, a := range apps {
		out[i] = App{Name: a.Name, Components: slices.Clone(a.Components)}
		for j, c := range out[i].Components {
			if v, ok := set[c.Name]; ok {
				apply(&out[i].Components[j], v)
				used[c.Name] = true
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(set)) {
		if !used[name] {
			return nil, fmt.Errorf("no component %q in the apps %v", name, appNames(apps))
		}
	}
	return out, nil
}

// parseWorkload changes w by KEY=VALUE pairs, comma-separated: service (the mean service time,
// a duration), fixed (its fixed part), workers, cores (NodeCores), limit (0 or 1: LimitCPU),
// metrics (0 or 1: Metrics, which the estimator rows need).
func parseWorkload(w Workload, v string) (Workload, error) {
	for _, kv := range strings.Split(v, ",") {
		key, val, ok := strings.Cut(kv, "=")
		var err error
		switch key {
		case "service", "fixed":
			var d time.Duration
			if d, err = time.ParseDuration(val); err == nil && d < 0 {
				err = errors.New("negative")
			}
			if key == "service" {
				w.ServiceTime = d
			} else {
				w.ServiceFixed = d
			}
		case "workers", "cores":
			var n int
			if n, err = strconv.Atoi(val); err == nil && (n < 0 || key == "workers" && n < 1) {
				err = errors.New("out of range")
			}
			if key == "workers" {
				w.Workers = n
			} else {
				w.NodeCores = n
			}
		case "limit", "metrics":
			if val != "0" && val != "1" {
				err = errors.New("want 0 or 1")
			}
			if key == "limit" {
				w.LimitCPU = val == "1"
			} else {
				w.Metrics = val == "1"
			}
		default:
			ok = false
		}
		if !ok || err != nil {
			return w, fmt.Errorf("bad entry %q (want service=D, fixed=D, workers=N, cores=N, limit=0|1 or metrics=0|1)", kv)
		}
	}
	if w.ServiceFixed > w.ServiceTime {
		return w, fmt.Errorf("fixed %v is more than service %v", w.ServiceFixed, w.ServiceTime)
	}
	return w, nil
}

// tcpPenalty is p.L7Penalty as testbed.Config.TCPPenalty takes it (nil: none).
func (p Preset) tcpPenalty() map[[2]string]float64 {
	if len(p.L7Penalty) == 0 {
		return nil
	}
	out := map[[2]string]float64{}
	for pair, ms := range p.L7Penalty {
		a, b, _ := strings.Cut(pair, ":")
		out[[2]string{a, b}] = ms
	}
	return out
}

// appNames lists the apps' names.
func appNames(apps []App) []string {
	var out []string
	for _, a := range apps {
		out = append(out, a.Name)
	}
	return out
}

// replicaCounts describes an app's replicas, e.g. "productpage 3, details 3".
func replicaCounts(a App) string {
	var parts []string
	for _, c := range a.Components {
		parts = append(parts, fmt.Sprintf("%s %d", c.Name, c.Replicas))
	}
	return strings.Join(parts, ", ")
}
