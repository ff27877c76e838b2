package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeflow/edgeflow/e2e/loadgen"
	"github.com/edgeflow/edgeflow/e2e/loopback"
	"github.com/edgeflow/edgeflow/examples"
	"github.com/edgeflow/edgeflow/optimizer"
)

func init() { subcommands = append(subcommands, newDemoCommand) }

// The demo's default scenario. The bundled Bookinfo topology puts 3–4 pods of each service on
// 4 nodes with scenario A's round-trip times (4–12 ms between nodes). The knobs are chosen as a
// reader would size such a deployment, not tuned to a result:
//   - 300 req/s is the top load level of the paper's Bookinfo runs (EXPERIMENT.md: 100, 200,
//     300 RPS), where it saw Localization collapse.
//   - One worker per pod with a 6 ms mean exponential service time gives each pod a capacity of
//     ~167 req/s. A balanced share is 100 req/s for productpage, details and ratings (3 pods)
//     and 75 req/s for reviews (4 pods): 60 % and 45 % utilisation, the usual autoscaling
//     target. Service time and network time are then the same order (a few ms each), as in
//     Bookinfo, where each hop is cheap and the network matters.
//   - Localization, which ignores load, sends 2/3 of details' calls to one pod (200 req/s,
//     120 % of its capacity) and half of ratings' to one pod (150 req/s, 90 %): it overloads,
//     as the paper measured. Round-robin, OptTraffic and LATA keep every pod at its share.
//   - 10 s per policy after a 1 s warm-up gives ~3,000 measured requests each (P99 rests on
//     the slowest ~30) and keeps the whole demo under a minute.
const (
	demoRate        = 300
	demoWorkers     = 1
	demoServiceTime = 6 * time.Millisecond
	demoDuration    = 10 * time.Second
	demoWarmup      = time.Second
	demoTimeout     = 5 * time.Second
)

type demoFlags struct {
	topology     string
	duration     time.Duration
	warmup       time.Duration
	rate         float64
	workers      int
	serviceTime  time.Duration
	latencyScale float64
	timeout      time.Duration
	policies     []string
	seed         uint64
}

func newDemoCommand() *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo [--duration D] [--rate RPS] [--topology FILE]",
		Short: "Run every allocation policy on an emulated cluster on loopback and compare tail latency",
		Long: "demo runs the whole loop in one process on 127.0.0.1: a gRPC server per pod of the topology\n" +
			"(default: the bundled Bookinfo on 4 emulated nodes, latency scenario A) whose work is simulated\n" +
			"service time (workers × exponential service time, sleeping), the round-trip time between the\n" +
			"emulated nodes injected by each callee, edgeflow's xDS server, a real grpc-go xDS client per\n" +
			"caller pod (xDS node id = pod name), and open-loop constant-rate load into the ingress pods.\n" +
			"It runs each policy in turn on a fresh cluster, reporting progress on stderr, then prints one\n" +
			"table: end-to-end latency (measured from the intended send time), errors, achieved rate, and\n" +
			"the largest deviation of the observed per-route split from the planned one.",
		Example: "  edgeflow demo\n  edgeflow demo --duration 5s --rate 200\n  edgeflow demo --latency-scale 2   # scenario B",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			_, err := runDemo(ctx, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.topology, "topology", "f", "", "topology file with placed pods (default: the bundled Bookinfo)")
	fl.DurationVar(&f.duration, "duration", demoDuration, "measured time per policy")
	fl.DurationVar(&f.warmup, "warmup", demoWarmup, "load before each measurement, not recorded")
	fl.Float64Var(&f.rate, "rate", demoRate, "requests per second into the ingress services (replaces the topology's ingress rates, in proportion)")
	fl.IntVar(&f.workers, "workers", demoWorkers, "workers per pod (requests worked on at once)")
	fl.DurationVar(&f.serviceTime, "service-time", demoServiceTime, "mean service time per request per pod (exponential)")
	fl.Float64Var(&f.latencyScale, "latency-scale", 1, "multiply every node-to-node latency (2 = the paper's scenario B)")
	fl.DurationVar(&f.timeout, "timeout", demoTimeout, "end-to-end request timeout (a timed-out request counts as an error)")
	fl.StringSliceVar(&f.policies, "policies", policyNames(), "policies to run, in order")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the pods' service-time draws")
	return cmd
}

func policyNames() []string {
	var out []string
	for _, p := range optimizer.Policies() {
		out = append(out, string(p))
	}
	return out
}

// demoInput is the validated input of a demo run.
type demoInput struct {
	name     string
	topology *optimizer.Topology
	policies []optimizer.Policy
	scenario loopback.Scenario
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
	}
	in := &demoInput{}
	for _, s := range f.policies {
		p, err := optimizer.ParsePolicy(strings.TrimSpace(s))
		if err != nil {
			return nil, usageError{err}
		}
		in.policies = append(in.policies, p)
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
	if in.topology, err = loopback.WithIngressRate(in.topology, f.rate); err != nil {
		return nil, err
	}
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
	if _, err := optimizer.Compile(in.topology, optimizer.Options{}); err != nil {
		return nil, err
	}
	in.scenario = loopback.Scenario{
		Cluster: loopback.Config{
			Topology:     in.topology,
			Workers:      f.workers,
			ServiceTime:  f.serviceTime,
			LatencyScale: f.latencyScale,
			Seed:         f.seed,
		},
		Load: loadgen.Config{Rate: f.rate, Warmup: f.warmup, Duration: f.duration, Timeout: f.timeout},
		// The xDS server's warnings (NACKs, rejected topologies) are worth seeing.
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	return in, nil
}

// runDemo runs the demo and returns the outcomes it printed.
func runDemo(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, f demoFlags) ([]*loopback.Outcome, error) {
	in, err := f.input(stdin, stderr)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	pods := 0
	for _, s := range in.topology.Services {
		pods += len(s.Pods)
	}
	fmt.Fprintf(stderr, "edgeflow demo: %s, %d pods on %d nodes, %g req/s, %d worker(s)/pod, service time exp(mean %v), latency ×%g; %v per policy after %v warm-up\n",
		in.name, pods, len(in.topology.Nodes), f.rate, f.workers, f.serviceTime, f.latencyScale, f.duration, f.warmup)
	var outcomes []*loopback.Outcome
	for i, p := range in.policies {
		fmt.Fprintf(stderr, "[%d/%d] %-12s running…\n", i+1, len(in.policies), p)
		o, err := loopback.RunPolicy(ctx, in.scenario, p)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("demo interrupted during %s: %w", p, ctx.Err())
			}
			return nil, fmt.Errorf("demo: %s: %w", p, err)
		}
		r := o.Load
		fmt.Fprintf(stderr, "[%d/%d] %-12s done in %.1fs: p50 %s, p99 %s, %d errors, split within %.1f pp of plan\n",
			i+1, len(in.policies), p, o.Wall.Seconds(), fmtMS(r.Latency.Quantile(0.5)), fmtMS(r.Latency.Quantile(0.99)), r.Errors, o.Deviation.PP)
		outcomes = append(outcomes, o)
	}
	if err := writeDemoTable(stdout, in, f, outcomes); err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "edgeflow demo: done in %.1fs\n", time.Since(start).Seconds())
	return outcomes, nil
}

func writeDemoTable(w io.Writer, in *demoInput, f demoFlags, outcomes []*loopback.Outcome) error {
	var base *loopback.Outcome
	for _, o := range outcomes {
		if o.Policy == optimizer.RoundRobin {
			base = o
		}
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tMEAN\tP50\tP90\tP99\tP99 vs RR\tERRORS\tRATE(req/s)\tSPLIT DEV(pp)\tWORST ROUTE (planned → observed)\tPLAN COST")
	for _, o := range outcomes {
		r := o.Load
		vs := "—"
		if base != nil && base.Load.Latency.Quantile(0.99) > 0 {
			vs = change(float64(r.Latency.Quantile(0.99)), float64(base.Load.Latency.Quantile(0.99)))
		}
		d := o.Deviation
		worst := "—"
		if d.Requests > 0 {
			worst = fmt.Sprintf("%s→%s %.1f%% → %.1f%%", d.Caller, d.Callee, 100*d.Planned, 100*d.Observed)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%.1f\t%.1f\t%s\t%.0f\n", o.Policy,
			fmtMS(r.Latency.Mean()), fmtMS(r.Latency.Quantile(0.5)), fmtMS(r.Latency.Quantile(0.9)), fmtMS(r.Latency.Quantile(0.99)),
			vs, r.Errors, r.Achieved(), d.PP, worst, o.Plan.Cost)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(&buf, "\n%s on %d emulated nodes (latency ×%g), %g req/s open-loop for %v per policy (after %v warm-up);\n",
		in.name, len(in.topology.Nodes), f.latencyScale, f.rate, f.duration, f.warmup)
	fmt.Fprintf(&buf, "%d worker(s)/pod, exponential service time mean %v (simulated: sleeping, not CPU); callee-injected node RTT.\n",
		f.workers, f.serviceTime)
	fmt.Fprintf(&buf, "Latency from the intended send time, errors excluded; RATE = successful responses / measured time;\n")
	fmt.Fprintf(&buf, "SPLIT DEV = largest |observed − planned| route share of any caller pod, counted at the callees;\n")
	fmt.Fprintf(&buf, "PLAN COST = Σ rps × latency of the published allocation, ms·req/s.\n")
	for _, o := range outcomes {
		if len(o.Load.ErrorKinds) > 0 || o.NACKs > 0 {
			fmt.Fprintf(&buf, "%s: errors %v, xDS NACKs %.0f\n", o.Policy, o.Load.ErrorKinds, o.NACKs)
		}
	}
	_, err := w.Write(buf.Bytes())
	return err
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
