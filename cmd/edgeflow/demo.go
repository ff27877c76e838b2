package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeflow/edgeflow/examples"
	"github.com/edgeflow/edgeflow/internal/demo"
	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

func init() { subcommands = append(subcommands, newDemoCommand) }

// The demo's default scenario. The bundled Bookinfo topology puts 3–4 pods of each service on
// 4 nodes with scenario A's round-trip times (4–12 ms between nodes). The knobs are chosen as a
// reader would size such a deployment, not tuned to a result:
//   - 300 req/s is the top load level of the paper's Bookinfo runs (the paper's rates: 100, 200,
//     300 RPS), where it saw Localization collapse.
//   - One worker per pod (a pod limited to one CPU serving CPU-bound requests) with a 6 ms mean
//     exponential service time gives each pod a capacity of ~167 req/s. A balanced share is 100 req/s for productpage, details and ratings (3 pods)
//     and 75 req/s for reviews (4 pods): 60 % and 45 % utilisation, the usual autoscaling
//     target. Service time and network time are then the same order (a few ms each), as in
//     Bookinfo, where each hop is cheap and the network matters.
//   - Localization, which ignores load, sends 2/3 of details' calls to one pod (200 req/s,
//     120 % of its capacity) and half of ratings' to one pod (150 req/s, 90 %): it overloads,
//     as the paper measured. Round-robin, OptTraffic and LATA keep every pod at its share.
//   - 10 s per policy gives 3,000 measured requests each (P99 rests on the slowest 30) and
//     keeps one rate of the demo at about a minute: rows × (10 s + 4 × 0.3 s) plus a few
//     seconds of start-up, with six rows (five policies and least-request). --rates
//     150,300,450 runs three of those, 3–3.5
//     minutes; the defaults are not cut for it, because at 150 req/s the P99 already rests on
//     the slowest 15 requests. It is measured in 4 rounds of 2.5 s, the policies
//     taking turns, so that a stall of this shared 2-core machine does not land on one policy
//     only; each slice follows 0.3 s of unrecorded load, 2–3 times what a pod's queue at 60 %
//     needs to reach its steady state (its relaxation time is ~0.1 s). An overloaded pod's queue grows for as long as
//     the overload lasts, so Localization's latencies grow with the slice length.
//   - A 5 s timeout is far above any healthy latency here: overload shows as latency (and a
//     lower achieved rate), not as errors that would drop out of the percentiles.
//   - least-request is the baseline users run when round-robin hurts: round-robin's equal
//     shares, but every caller's gRPC client balances LEAST_REQUEST (power of two choices)
//     over all pods of the callee, steering away from pods with requests in flight. It is
//     not an allocation, so it has no plan cost.
const (
	demoRate        = 300
	demoWorkers     = 1
	demoServiceTime = 6 * time.Millisecond
	demoDuration    = 10 * time.Second
	demoRounds      = 4
	demoWarmup      = 300 * time.Millisecond
	demoTimeout     = 5 * time.Second
)

type demoFlags struct {
	logger         *slog.Logger // nil: warnings as text to stderr
	topology       string
	duration       time.Duration
	warmup         time.Duration
	rate           float64
	workers        int
	serviceTime    time.Duration
	latencyScale   float64
	timeout        time.Duration
	rates          []string // --rates: one table per rate; replaces rate (not both: cobra checks)
	policies       []string
	rounds         int
	seed           uint64
	utilizationCap float64
	minBandShare   float64
	nodeSpeed      []string // --node-speed NODE=FACTOR,…
	slowPods       []string // --slow-pods POD=FACTOR,…
	l7Penalty      []string // --l7-penalty FROM:TO=DURATION,…
	noCorrection   bool     // --latency-correction=false
	output         string   // -o: table or json
}

// parseMode returns the named row, or a usage error naming the rows there are.
func parseMode(name string) (demo.Row, error) {
	r, err := demo.ParseRow(name)
	if err != nil {
		return demo.Row{}, badInput("--policies: unknown policy %q (want one of %s)", name, strings.Join(demo.RowNames(), ", "))
	}
	return r, nil
}

// parseRates parses --rates: every value a number in (0, 100000].
func parseRates(values []string) ([]float64, error) {
	if len(values) == 0 {
		return nil, badInput("--rates is empty")
	}
	out := make([]float64, 0, len(values))
	for _, v := range values {
		r, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return nil, badInput("--rates: %q is not a number", v)
		}
		if !(r > 0) || r > 1e5 {
			return nil, badInput("--rates: %q is not in (0, 100000]", v)
		}
		out = append(out, r)
	}
	return out, nil
}

// maxFactor bounds --node-speed and --slow-pods factors: beyond it a typo, not a world.
const maxFactor = 1000

// parseFactors parses a NAME=FACTOR list (--node-speed, --slow-pods): every NAME one of names
// (what names it is: "node", "pod"), given once, and every FACTOR a number in (0, maxFactor].
func parseFactors(flag, what string, values []string, names []string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, v := range values {
		name, text, ok := strings.Cut(strings.TrimSpace(v), "=")
		if !ok || name == "" {
			return nil, badInput("%s: %q is not %s=FACTOR", flag, v, strings.ToUpper(what))
		}
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return nil, badInput("%s %s: factor %q is not a number", flag, name, text)
		}
		if !(f > 0) || f > maxFactor {
			return nil, badInput("%s %s: factor %v is not in (0, %d]", flag, name, f, maxFactor)
		}
		if !slices.Contains(names, name) {
			return nil, badInput("%s: unknown %s %q (the topology's: %s)", flag, what, name, strings.Join(names, ", "))
		}
		if _, dup := out[name]; dup {
			return nil, badInput("%s: %s %s is given twice", flag, what, name)
		}
		out[name] = f
	}
	return out, nil
}

// maxL7Penalty bounds --l7-penalty delays: beyond it a typo, not a path.
const maxL7Penalty = 10 * time.Second

// parsePenalties parses --l7-penalty: FROM:TO=DURATION, each a directed pair of two distinct
// nodes of nodes, given once, with a Go duration in (0, maxL7Penalty].
func parsePenalties(values []string, nodes []string) (map[demo.NodePair]time.Duration, error) {
	out := map[demo.NodePair]time.Duration{}
	for _, v := range values {
		pair, text, ok := strings.Cut(strings.TrimSpace(v), "=")
		from, to, ok2 := strings.Cut(pair, ":")
		if !ok || !ok2 || from == "" || to == "" {
			return nil, badInput("--l7-penalty: %q is not FROM:TO=DURATION (node names, e.g. n1:n2=3ms)", v)
		}
		d, err := time.ParseDuration(text)
		if err != nil {
			return nil, badInput("--l7-penalty %s:%s: %q is not a duration (e.g. 3ms)", from, to, text)
		}
		if d <= 0 || d > maxL7Penalty {
			return nil, badInput("--l7-penalty %s:%s: %v is not in (0, %v]", from, to, d, maxL7Penalty)
		}
		for _, n := range []string{from, to} {
			if !slices.Contains(nodes, n) {
				return nil, badInput("--l7-penalty %s:%s: unknown node %q (the topology's: %s)", from, to, n, strings.Join(nodes, ", "))
			}
		}
		if from == to {
			return nil, badInput("--l7-penalty %s:%s: name two nodes (a same-node path is the baseline the latency correction subtracts)", from, to)
		}
		p := demo.NodePair{From: from, To: to}
		if _, dup := out[p]; dup {
			return nil, badInput("--l7-penalty: %s:%s is given twice", from, to)
		}
		out[p] = d
	}
	return out, nil
}

func newDemoCommand() *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo [--duration D] [--rate RPS | --rates RPS,RPS,…] [--topology FILE]",
		Short: "Run every allocation policy and least-request on an emulated cluster on loopback and compare tail latency",
		Long: "demo runs the whole loop in one process on 127.0.0.1: a gRPC server per pod of the topology\n" +
			"(default: the bundled Bookinfo on 4 emulated nodes, latency scenario A) whose work is simulated\n" +
			"service time (workers × exponential service time, sleeping), the round-trip time between the\n" +
			"emulated nodes injected by each callee, edgeflow's xDS server, a real grpc-go xDS client per\n" +
			"caller pod (xDS node id = pod name), and open-loop constant-rate load into the ingress pods.\n" +
			"Each policy gets its own xDS server and cluster; the policies take turns under load for\n" +
			"--rounds rounds (progress on stderr). Then it prints one table: end-to-end latency (measured\n" +
			"from the intended send time), errors, achieved rate, the deepest queue at any pod, and the\n" +
			"largest deviation of the observed per-route split from the planned one.\n\n" +
			"Besides the allocation policies, the row least-request is the baseline users run: round-robin's\n" +
			"equal shares with every caller's gRPC client balancing LEAST_REQUEST (power of two choices)\n" +
			"over all pods of the callee (the xDS cluster's lb_policy).\n\n" +
			"--rates runs several loads one after another, each on fresh stacks planned for it, and prints\n" +
			"one table per rate, in the order given. One rate takes about rows × (--duration + --rounds ×\n" +
			"--warmup) plus a few seconds of start-up: with the defaults ~11 s a row, ~1.2 min for the six\n" +
			"rows, so --rates 150,300,450 takes 3.5–4 min (--duration 5s\n" +
			"nearly halves that, with half the samples). -o json (or yaml) prints the rows as JSON instead (one\n" +
			"object per row and rate: policy, rate, mean/p50/p90/p99 in ms, errors, achieved rate).\n\n" +
			"The pods of a node share its cores (the topology's cores, else its cpu rounded up; unlimited\n" +
			"without either): a request holds one of its pod's workers and one of the node's cores.\n" +
			"--node-speed and --slow-pods make the world heterogeneous behind edgeflow's back: the topology\n" +
			"it plans with does not say. Every pod serves a stock mesh's telemetry on its own /metrics\n" +
			"port: Istio's istio_requests_total and istio_request_duration_milliseconds, the simulated busy\n" +
			"time as cAdvisor's container_cpu_usage_seconds_total (a stand-in: the pods sleep), the CPU\n" +
			"request as kube-state-metrics' kube_pod_container_resource_requests, and each caller's call\n" +
			"times by callee locality as grpc-go's OpenTelemetry grpc.client.attempt.duration (a stand-in:\n" +
			"grpc_client_attempt_duration_seconds{grpc_lb_locality}).\n\n" +
			"--l7-penalty FROM:TO=DURATION makes the path from FROM's pods to TO's pods (directed) cost more\n" +
			"than the topology's RTT, hidden from edgeflow too: the closed-loop row finds it from the\n" +
			"telemetry and routes around it; the other rows plan on the topology's latencies.",
		Example: "  edgeflow demo\n  edgeflow demo --duration 5s --rate 200\n  edgeflow demo --rates 150,300,450   # low, middle and high load, one table each\n" +
			"  edgeflow demo --policies round-robin,least-request,lata\n  edgeflow demo --latency-scale 2   # scenario B\n" +
			"  edgeflow demo --node-speed n3=0.5 --slow-pods reviews-1=2   # a slow node and a slow pod, unseen by edgeflow\n" +
			"  edgeflow demo --policies lata,closed-loop --l7-penalty n3:n4=3ms   # scenario (C): a hidden L7 penalty on n3 → n4\n" +
			"  edgeflow demo --rates 100,200 -o json",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.logger = newLogger(cmd, slog.LevelWarn)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			_, err := runDemo(ctx, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.topology, "topology", "f", "", "topology file with placed pods (default: the bundled Bookinfo)")
	fl.DurationVar(&f.duration, "duration", demoDuration, "measured time per policy (split over the rounds)")
	fl.IntVar(&f.rounds, "rounds", demoRounds, "rounds: each gives every policy duration/rounds of load in turn")
	fl.DurationVar(&f.warmup, "warmup", demoWarmup, "load before each slice of measurement, not recorded")
	fl.Float64Var(&f.rate, "rate", demoRate, "requests per second into the ingress services (replaces the topology's ingress rates, in proportion)")
	fl.StringSliceVar(&f.rates, "rates", nil, "several --rate values, run one after another with one table each (instead of --rate; ~1 min per rate with the defaults)")
	fl.IntVar(&f.workers, "workers", demoWorkers, "workers per pod (requests worked on at once)")
	fl.DurationVar(&f.serviceTime, "service-time", demoServiceTime, "mean service time per request per pod (exponential)")
	fl.Float64Var(&f.latencyScale, "latency-scale", 1, "multiply every node-to-node latency (2 = the paper's scenario B)")
	fl.DurationVar(&f.timeout, "timeout", demoTimeout, "end-to-end request timeout (a timed-out request counts as an error)")
	fl.StringSliceVar(&f.policies, "policies", demo.RowNames(), "policies to run, in order (the optimizer's, and least-request)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the pods' service-time draws")
	fl.Float64Var(&f.utilizationCap, "utilization-cap", optimizer.DefaultUtilizationCap, "lata-q: the most of a pod's service rate it is loaded to, in (0, 1)")
	fl.Float64Var(&f.minBandShare, "min-band-share", optimizer.DefaultMinBandShare, "lata-q, closed-loop: the least share of a caller pod's calls sent to a node farther than its nearest in use, in [0, 0.5) (0: none)")
	fl.StringSliceVar(&f.nodeSpeed, "node-speed", nil, "NODE=FACTOR,…: a node's speed, hidden from edgeflow (0.5: its pods' service times double)")
	fl.StringSliceVar(&f.slowPods, "slow-pods", nil, "POD=FACTOR,…: multiply a pod's service times, hidden from edgeflow (2: twice as slow)")
	fl.BoolFunc("latency-correction", "closed-loop: correct the topology's latencies by the L7 penalties it measures (default true; false: plan on the topology's latencies, as the other rows)",
		func(v string) error {
			on, err := strconv.ParseBool(v)
			f.noCorrection = !on
			return err
		})
	fl.StringSliceVar(&f.l7Penalty, "l7-penalty", nil, "FROM:TO=DURATION,…: calls from FROM's pods to TO's pods (nodes; directed) pay DURATION beyond the RTT, hidden from edgeflow")
	outputVar(cmd, &f.output, "output format: table, json or yaml (one object per row and rate, for scripts)", "table", "json", "yaml")
	cmd.MarkFlagsMutuallyExclusive("rate", "rates")
	return cmd
}

// demoInput is the validated input of a demo run.
type demoInput struct {
	name     string
	topology *optimizer.Topology
	modes    []demo.Row
	rates    []float64      // one table each, in order
	scenario demo.Scenario  // Load.Rate is set per rate
	slice    loadgen.Config // one round's load of one policy; Rate is set per rate
	// nodeSpeed and slowPods are the hidden world (--node-speed, --slow-pods), by name;
	// l7Penalty too (--l7-penalty), by directed node pair.
	nodeSpeed, slowPods map[string]float64
	l7Penalty           map[demo.NodePair]time.Duration
}

func (f demoFlags) input(stdin io.Reader, stderr io.Writer) (*demoInput, error) {
	switch {
	case f.duration <= 0:
		return nil, badInput("--duration must be positive, got %v", f.duration)
	case f.warmup < 0:
		return nil, badInput("--warmup must not be negative, got %v", f.warmup)
	case !(f.rate > 0) || f.rate > 1e5:
		return nil, badInput("--rate must be in (0, 100000], got %v", f.rate)
	case f.workers < 1:
		return nil, badInput("--workers must be ≥ 1, got %d", f.workers)
	case f.serviceTime < 0:
		return nil, badInput("--service-time must not be negative, got %v", f.serviceTime)
	case !(f.latencyScale > 0) || f.latencyScale > 1e3:
		return nil, badInput("--latency-scale must be in (0, 1000], got %v", f.latencyScale)
	case f.timeout <= 0:
		return nil, badInput("--timeout must be positive, got %v", f.timeout)
	case len(f.policies) == 0:
		return nil, badInput("--policies is empty")
	case f.rounds < 1 || time.Duration(f.rounds) > f.duration/time.Millisecond:
		return nil, badInput("--rounds must be between 1 and --duration in ms, got %d", f.rounds)
	}
	in := &demoInput{rates: []float64{f.rate}}
	if f.rates != nil {
		var err error
		if in.rates, err = parseRates(f.rates); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	for _, s := range f.policies {
		m, err := parseMode(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		if seen[m.Name] {
			return nil, badInput("--policies: %s is listed twice", m.Name)
		}
		seen[m.Name] = true
		in.modes = append(in.modes, m)
	}
	var err error
	if f.topology == "" {
		in.name = "bundled Bookinfo"
		in.topology, err = optimizer.ParseTopology(bytes.NewReader(examples.Bookinfo()), "bookinfo.yaml")
	} else {
		in.name = f.topology
		in.topology, err = readTopology(f.topology, stdin)
	}
	if err != nil {
		return nil, err
	}
	if in.topology, err = demo.WithIngressRate(in.topology, in.rates[0]); err != nil {
		return nil, err
	}
	in.topology = demo.WithServiceRates(in.topology, f.workers, f.serviceTime)
	for _, s := range in.topology.Services {
		if len(s.Pods) == 0 {
			return nil, badInput("%s: service %s has no placed pods (the demo needs pods on nodes; see edgeflow place -o topology)", in.name, s.Name)
		}
		for _, p := range s.Pods {
			if p.Node == "" {
				return nil, badInput("%s: pod %s has no node", in.name, p.Name)
			}
		}
	}
	if !(f.utilizationCap > 0 && f.utilizationCap < 1) {
		return nil, badInput("--utilization-cap must be in (0, 1), got %v", f.utilizationCap)
	}
	if !(f.minBandShare >= 0 && f.minBandShare < 0.5) {
		return nil, badInput("--min-band-share must be in [0, 0.5), got %v", f.minBandShare)
	}
	opts := optimizer.Options{UtilizationCap: f.utilizationCap, MinBandShare: f.minBandShare}
	if _, err := optimizer.Compile(in.topology, opts); err != nil {
		return nil, err
	}
	var nodes, pods []string
	for _, n := range in.topology.Nodes {
		nodes = append(nodes, n.Name)
	}
	for _, s := range in.topology.Services {
		for _, p := range s.Pods {
			pods = append(pods, p.Name)
		}
	}
	if in.nodeSpeed, err = parseFactors("--node-speed", "node", f.nodeSpeed, nodes); err != nil {
		return nil, err
	}
	if in.slowPods, err = parseFactors("--slow-pods", "pod", f.slowPods, pods); err != nil {
		return nil, err
	}
	if in.l7Penalty, err = parsePenalties(f.l7Penalty, nodes); err != nil {
		return nil, err
	}
	in.scenario = demo.Scenario{
		Cluster: demo.Config{
			Topology:     in.topology,
			Options:      opts,
			Workers:      f.workers,
			ServiceTime:  f.serviceTime,
			LatencyScale: f.latencyScale,
			Seed:         f.seed,
			NodeSpeed:    in.nodeSpeed,
			PodSlowdown:  in.slowPods,
			L7Penalty:    in.l7Penalty,
		},
		Load:                loadgen.Config{Rate: in.rates[0], Warmup: f.warmup, Duration: f.duration, Timeout: f.timeout},
		NoLatencyCorrection: f.noCorrection,
		// The xDS server's warnings (NACKs, rejected topologies) are worth seeing.
		Logger: f.logger,
	}
	if in.scenario.Logger == nil {
		in.scenario.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	in.slice = in.scenario.Load
	in.slice.Duration = f.duration / time.Duration(f.rounds)
	return in, nil
}

// runDemo runs the demo, one rate after another, and returns the outcomes it printed: per
// rate, one per row, in the order of the rows.
func runDemo(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, f demoFlags) ([][]*demo.Outcome, error) {
	in, err := f.input(stdin, stderr)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	pods := 0
	for _, s := range in.topology.Services {
		pods += len(s.Pods)
	}
	rates := make([]string, len(in.rates))
	for i, r := range in.rates {
		rates[i] = strconv.FormatFloat(r, 'g', -1, 64)
	}
	fmt.Fprintf(stderr, "edgeflow demo: %s, %d pods on %d nodes, %s req/s, %d worker(s)/pod, service time exp(mean %v), latency ×%g\n",
		in.name, pods, len(in.topology.Nodes), strings.Join(rates, ", "), f.workers, f.serviceTime, f.latencyScale)
	load := time.Duration(len(in.rates)*len(in.modes)) * (f.duration + time.Duration(f.rounds)*in.slice.Warmup)
	fmt.Fprintf(stderr, "edgeflow demo: %v per policy in %d rounds of %v, each after a %v warm-up: %v of load in all\n",
		f.duration, f.rounds, in.slice.Duration, in.slice.Warmup, load)
	if w := hiddenWorld(in); w != "" {
		fmt.Fprintf(stderr, "edgeflow demo: hidden from edgeflow: %s\n", w)
	}
	var all [][]*demo.Outcome
	var rows []demoRow
	for k, rate := range in.rates {
		if len(in.rates) > 1 {
			if f.output == "table" {
				if k > 0 {
					fmt.Fprintln(stdout)
				}
				fmt.Fprintf(stdout, "== %g req/s (%d of %d) ==\n", rate, k+1, len(in.rates))
			}
			fmt.Fprintf(stderr, "edgeflow demo: %g req/s (%d of %d)\n", rate, k+1, len(in.rates))
		}
		outcomes, err := runDemoRate(ctx, stdout, stderr, in, f, rate)
		if err != nil {
			return nil, err
		}
		all = append(all, outcomes)
		for i, o := range outcomes {
			rows = append(rows, newDemoRow(in.modes[i].Name, rate, o))
		}
	}
	if f.output != "table" {
		format := f.output
		if format == "yaml" {
			format = "yaml-json-keys"
		}
		if err := writeStructured(stdout, format, rows); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(stderr, "edgeflow demo: done in %.1fs\n", time.Since(start).Seconds())
	return all, nil
}

// demoRow is one row of `demo -o json`: one policy's result at one rate. Latencies are in
// milliseconds, measured from the intended send time, errors excluded (as in the table).
type demoRow struct {
	Policy string  `json:"policy"`
	Rate   float64 `json:"rate"` // offered, requests/s
	MeanMS float64 `json:"mean_ms"`
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	Errors int     `json:"errors"`
	// Achieved is successful responses per second from the first send to the last response.
	Achieved float64 `json:"achieved_rate"`
}

func newDemoRow(policy string, rate float64, o *demo.Outcome) demoRow {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	l := o.Load.Latency
	return demoRow{Policy: policy, Rate: rate, MeanMS: ms(l.Mean()), P50MS: ms(l.Quantile(0.5)), P90MS: ms(l.Quantile(0.9)),
		P99MS: ms(l.Quantile(0.99)), Errors: o.Load.Errors, Achieved: o.Load.Achieved()}
}

// hiddenWorld describes --node-speed, --slow-pods and --l7-penalty, "" when none is given.
func hiddenWorld(in *demoInput) string {
	var parts []string
	for _, w := range []struct {
		what    string
		factors map[string]float64
	}{{"node speed", in.nodeSpeed}, {"pod slowdown", in.slowPods}} {
		for _, name := range slices.Sorted(maps.Keys(w.factors)) {
			parts = append(parts, fmt.Sprintf("%s %s ×%g", w.what, name, w.factors[name]))
		}
	}
	pairs := slices.SortedFunc(maps.Keys(in.l7Penalty), func(a, b demo.NodePair) int {
		return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To))
	})
	for _, p := range pairs {
		parts = append(parts, fmt.Sprintf("L7 penalty %s → %s +%v", p.From, p.To, in.l7Penalty[p]))
	}
	return strings.Join(parts, ", ")
}

// runDemoRate runs every row at one rate (demo.Run) and prints its table.
func runDemoRate(ctx context.Context, stdout, stderr io.Writer, in *demoInput, f demoFlags, rate float64) ([]*demo.Outcome, error) {
	sc := in.scenario
	sc.Load.Rate = rate
	slice := in.slice
	slice.Rate = rate
	pods := 0
	for _, s := range in.topology.Services {
		pods += len(s.Pods)
	}
	res, err := demo.Run(ctx, demo.Experiment{Scenario: sc, Rows: in.modes, Slice: slice, Rounds: f.rounds,
		Started: func(stacks int, took time.Duration) {
			fmt.Fprintf(stderr, "edgeflow demo: %d xDS servers and %d pods with their xDS clients ready in %.1fs\n",
				stacks, pods*stacks, took.Seconds())
		},
		Progress: func(round, row int, r *loadgen.Result) {
			fmt.Fprintf(stderr, "[round %d/%d] %-13s p50 %8s  p99 %8s  errors %d  generator lag ≤ %s\n", round+1, f.rounds, in.modes[row].Name,
				fmtMS(r.Latency.Quantile(0.5)), fmtMS(r.Latency.Quantile(0.99)), r.Errors, fmtMS(r.MaxSendLag))
		}})
	if err != nil {
		return nil, err
	}
	if f.output != "table" {
		return res.Outcomes, nil
	}
	if err := writeDemoTable(stdout, in, f, rate, res.Outcomes, res.RoundsBelow(demo.BaselineRow(in.modes)), pairedVsLATA(in.modes, res)); err != nil {
		return nil, err
	}
	return res.Outcomes, nil
}

// lagWarning is the generator lag above which the table notes that the machine was too busy to
// keep the schedule (the lag is in the measured latencies, as it should be, but it is the
// machine's, not the policy's).
const lagWarning = 50 * time.Millisecond

// pairedVsLATA compares lata-q and least-request with lata, paired by round: the change of
// the P99 over the whole run, and the rounds in which the row's P99 was at or below lata's.
func pairedVsLATA(rows []demo.Row, res *demo.Result) []string {
	lata := slices.IndexFunc(rows, func(r demo.Row) bool { return r.Name == string(optimizer.LATA) })
	if lata < 0 {
		return nil
	}
	var out []string
	for i, r := range rows {
		if r.Name != string(optimizer.LATAQ) && r.Name != demo.LeastRequest {
			continue
		}
		p := res.Pair(i, lata)
		same := ""
		if plan := res.Outcomes[i].Plan; plan != nil && plan.ServedAsLATA {
			same = " — the same routes: lata-q serves lata's plan at this load (its own was no cheaper), so the difference is the testbed's noise"
		}
		out = append(out, fmt.Sprintf("%s vs lata: P99 %s vs %s (%s); P99 at or below lata's in %d/%d rounds%s", r.Name,
			fmtMS(p.P99), fmtMS(p.OtherP99), change(float64(p.P99), float64(p.OtherP99)), p.AtOrBelow, p.Rounds, same))
	}
	return out
}

func writeDemoTable(w io.Writer, in *demoInput, f demoFlags, rate float64, outcomes []*demo.Outcome, belowRR, vsLATA []string) error {
	var base *demo.Outcome
	if i := demo.BaselineRow(in.modes); i >= 0 {
		base = outcomes[i]
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tMEAN\tP50\tP90\tP99\tP99 vs RR\tROUNDS P99<RR\tERRORS\tRATE(req/s)\tMAX QUEUE\tSPLIT DEV(pp)\tWORST ROUTE (planned → observed)\tPLAN COST")
	for i, o := range outcomes {
		r := o.Load
		vs, rounds := "—", "—"
		if belowRR[i] != "" {
			rounds = belowRR[i]
		}
		if base != nil && base.Load.Latency.Quantile(0.99) > 0 {
			vs = change(float64(r.Latency.Quantile(0.99)), float64(base.Load.Latency.Quantile(0.99)))
		}
		d := o.Deviation
		worst := "—"
		if d.Requests > 0 {
			worst = fmt.Sprintf("%s→%s %.1f%% → %.1f%%", d.Caller, d.Callee, 100*d.Planned, 100*d.Observed)
		}
		cost := fmt.Sprintf("%.0f", o.Plan.Cost)
		if in.modes[i].LB != xds.LBRoundRobin {
			cost = "—" // not an allocation: its flows are decided request by request
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%.1f\t%s\t%.1f\t%s\t%s\n", in.modes[i].Name,
			fmtMS(r.Latency.Mean()), fmtMS(r.Latency.Quantile(0.5)), fmtMS(r.Latency.Quantile(0.9)), fmtMS(r.Latency.Quantile(0.99)),
			vs, rounds, r.Errors, r.Achieved(), deepestQueue(o), d.PP, worst, cost)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(&buf, "\n%s on %d emulated nodes (latency ×%g), %g req/s open-loop, %v per policy in %d rounds of %v\n",
		in.name, len(in.topology.Nodes), f.latencyScale, rate, f.duration, f.rounds, in.slice.Duration)
	fmt.Fprintf(&buf, "(policies taking turns, each slice after %v of unrecorded load); %d worker(s)/pod, exponential\n", in.slice.Warmup, f.workers)
	fmt.Fprintf(&buf, "service time mean %v (simulated: sleeping, not CPU; a node's pods share its cores, the topology's\n", f.serviceTime)
	fmt.Fprintf(&buf, "cores or cpu); node RTT injected by the callee.\n")
	if w := hiddenWorld(in); w != "" {
		fmt.Fprintf(&buf, "Hidden from edgeflow: %s.\n", w)
	}
	fmt.Fprintf(&buf, "Latency from the intended send time, errors excluded; RATE = successful responses per second from\n")
	fmt.Fprintf(&buf, "the first send to the last response (below the offered rate when responses fall behind);\n")
	fmt.Fprintf(&buf, "ROUNDS P99<RR = rounds in which the policy's P99 beat round-robin's of the same round;\n")
	fmt.Fprintf(&buf, "MAX QUEUE = most requests waiting for a worker or core at one pod; SPLIT DEV = largest |observed − planned|\n")
	fmt.Fprintf(&buf, "route share of any caller pod, counted at the callees; PLAN COST = Σ rps × latency, ms·req/s.\n")
	for _, l := range vsLATA {
		fmt.Fprintln(&buf, l)
	}
	for _, m := range in.modes {
		if m.LB == xds.LBLeastRequest {
			fmt.Fprintf(&buf, "%s: round-robin's shares served as one locality of all pods under the xDS cluster's lb_policy\n", m.Name)
			fmt.Fprintf(&buf, "LEAST_REQUEST (choice_count 2); its SPLIT DEV is from round-robin's equal shares, and it has no plan.\n")
			break
		}
	}
	busy := false
	for i, o := range outcomes {
		name := in.modes[i].Name
		if len(o.Load.ErrorKinds) > 0 {
			fmt.Fprintf(&buf, "%s: errors: %s\n", name, errorKinds(o.Load.ErrorKinds))
		}
		if o.NACKs > 0 {
			fmt.Fprintf(&buf, "%s: the xDS clients rejected %.0f responses (NACK; see the log above)\n", name, o.NACKs)
		}
		if o.Load.MaxSendLag > lagWarning {
			fmt.Fprintf(&buf, "%s: the machine was busy: the load generator fell up to %s behind schedule (in the latencies)\n",
				name, fmtMS(o.Load.MaxSendLag))
			busy = true
		}
	}
	if busy {
		fmt.Fprintf(&buf, "Stalls of a busy machine land in the tail: compare the rounds, or rerun on a quieter machine or at\n")
		fmt.Fprintf(&buf, "real-time priority (as root: chrt -f 10 edgeflow demo; the demo sleeps, it uses about a third of a core).\n")
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// errorKinds lists error counts, most frequent first.
func errorKinds(kinds map[string]int) string {
	type kind struct {
		msg string
		n   int
	}
	var ks []kind
	for m, n := range kinds {
		ks = append(ks, kind{m, n})
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].n > ks[j].n || ks[i].n == ks[j].n && ks[i].msg < ks[j].msg })
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = fmt.Sprintf("%d × %s", k.n, k.msg)
	}
	return strings.Join(parts, "; ")
}

// deepestQueue names the pod whose queue was deepest and how deep it got.
func deepestQueue(o *demo.Outcome) string {
	pod, n := "", int64(-1)
	for name, st := range o.Pods {
		if st.MaxWaiting > n || st.MaxWaiting == n && name < pod {
			pod, n = name, st.MaxWaiting
		}
	}
	if pod == "" {
		return "—"
	}
	return fmt.Sprintf("%d %s", n, pod)
}

// fmtMS prints a latency in milliseconds with a precision that suits its size.
func fmtMS(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms >= 1000:
		return fmt.Sprintf("%.0fms", ms)
	case ms >= 100:
		return fmt.Sprintf("%.1fms", ms)
	default:
		return fmt.Sprintf("%.2fms", ms)
	}
}
