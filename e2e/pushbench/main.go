// Command pushbench answers "how long until every sidecar follows a change?" end to end: the
// real `edgeflow serve` binary against a bare go-control-plane server (pushbench-bare, in its
// own process) serving the same resources, each followed by the same raw ADS clients.
//
// Per size N it generates a topology file (N caller pods on 10 nodes, a callee service of 50
// pods on 10 other nodes, caller → callee), starts both servers on it, connects N clients to
// each (one SOTW ADS stream per caller pod — delta ADS with -delta —, node id = pod name,
// following LDS → RDS → CDS → EDS and ACKing everything; both fleets stay connected for the
// whole run), then runs interleaved
// rounds — edgeflow, bare, edgeflow, … — in which a new topology (latencies rotated, so LATA
// moves every caller's weights) is renamed over the side's file and the server gets SIGHUP.
// A round is timed from the rename until every stream whose EDS version changed holds the new
// version and has handed its ACK to gRPC. It prints a Markdown table per N: the median round
// on each side, their ratio, per-stream arrival p50/p99 and server resident memory per stream.
//
//	make bench-push BENCH_PUSH_FLAGS='-sizes 1000 -rounds 3'
//	bin/pushbench -edgeflow bin/edgeflow -bare bin/pushbench-bare -sizes 1000,5000,10000
//
// Besides the rounds it prints a stage breakdown from the servers' own log lines: when the
// topology was compiled, planned, translated, published, when the first and last response
// was handed to gRPC and the last answer came in (edgeflow serve's "xds: converged" line).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config is one benchmark run.
type Config struct {
	// Sizes are the stream counts N, one run of both servers each.
	Sizes []int
	// Warmup rounds (per side, not measured) precede Rounds measured rounds per side.
	Warmup, Rounds int
	// Edgeflow and Bare are the server binaries (bin/edgeflow, bin/pushbench-bare).
	Edgeflow, Bare string
	// EdgeflowArgs are extra arguments for `edgeflow serve`.
	EdgeflowArgs []string
	// DebounceQuiet, DebounceMax and PollInterval are edgeflow serve's flags of those names.
	DebounceQuiet, DebounceMax, PollInterval time.Duration
	// StreamsPerConn is how many ADS streams share one gRPC client connection; 0 means 1 if
	// the open-file hard limit allows it for both fleets at the largest size, else the fewest
	// that fit. One value for the whole run, so that sizes compare.
	StreamsPerConn int
	// RoundTimeout bounds one round.
	RoundTimeout time.Duration
	// ProfileDir, when set, receives CPU, mutex, block and allocation profiles of the servers that serve
	// net/http/pprof (see profiler).
	ProfileDir string
	// WorkDir holds topology files and server logs; "" means a temporary folder, removed after
	// a successful run.
	WorkDir string
	// Verify makes every client unmarshal and check every ClusterLoadAssignment it receives
	// (more client CPU in the measured rounds).
	Verify bool
	// Delta makes the clients open delta ADS streams (DeltaAggregatedResources) instead of
	// SOTW ones: a weight change then sends each stream only the assignments that changed.
	Delta bool
}

func main() {
	cfg := Config{}
	// The defaults are the settings of the independent end-to-end probe of issue 42 (what a
	// user of `edgeflow serve -f` waits for): no quiet period, a 10 ms debounce bound, 50 streams
	// per connection, every response checked.
	sizes := flag.String("sizes", "1000,10000", "stream counts N, comma-separated")
	flag.IntVar(&cfg.Rounds, "rounds", 5, "measured rounds per side and size")
	flag.IntVar(&cfg.Warmup, "warmup", 1, "warm-up rounds per side and size (not measured)")
	flag.StringVar(&cfg.Edgeflow, "edgeflow", "bin/edgeflow", "the edgeflow binary")
	flag.StringVar(&cfg.Bare, "bare", "bin/pushbench-bare", "the bare go-control-plane server (e2e/pushbench/bare)")
	extra := flag.String("edgeflow-args", "", "extra arguments for edgeflow serve, space-separated")
	flag.DurationVar(&cfg.DebounceQuiet, "debounce-quiet", -time.Millisecond, "edgeflow serve --debounce-quiet (negative: push every change at once)")
	flag.DurationVar(&cfg.DebounceMax, "debounce-max", 10*time.Millisecond, "edgeflow serve --debounce-max")
	flag.DurationVar(&cfg.PollInterval, "poll-interval", time.Hour, "edgeflow serve --poll-interval (long: SIGHUP is the trigger)")
	flag.IntVar(&cfg.StreamsPerConn, "streams-per-conn", 50, "ADS streams per gRPC client connection (0: 1 if the open-file hard limit allows it for both fleets at the largest size, else the fewest that fit)")
	flag.DurationVar(&cfg.RoundTimeout, "round-timeout", 2*time.Minute, "longest a round may take")
	flag.StringVar(&cfg.ProfileDir, "profile", "", "folder for CPU, mutex, block and allocation profiles of the servers during the measured rounds")
	flag.StringVar(&cfg.WorkDir, "workdir", "", "folder for topology files and server logs (default: a temporary folder)")
	flag.BoolVar(&cfg.Verify, "verify", true, "clients unmarshal and check every ClusterLoadAssignment")
	flag.BoolVar(&cfg.Delta, "delta", false, "delta ADS streams (DeltaAggregatedResources) instead of SOTW")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "pushbench: unexpected arguments:", flag.Args())
		os.Exit(2)
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "pushbench: -sizes: bad size %q\n", s)
			os.Exit(2)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	cfg.EdgeflowArgs = strings.Fields(*extra)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		stop()
		os.Exit(1)
	}
}

// run runs the benchmark and prints the report on out, progress on progress. Every process it
// starts is stopped before it returns.
func run(ctx context.Context, cfg Config, out, progress io.Writer) ([]sizeResult, error) {
	switch {
	case len(cfg.Sizes) == 0:
		return nil, errors.New("pushbench: -sizes: no size given")
	case cfg.Rounds < 1:
		return nil, fmt.Errorf("pushbench: -rounds %d: need at least 1", cfg.Rounds)
	case cfg.Warmup < 0:
		return nil, fmt.Errorf("pushbench: -warmup %d: need 0 or more", cfg.Warmup)
	case cfg.StreamsPerConn < 0:
		return nil, fmt.Errorf("pushbench: -streams-per-conn %d: need 0 or more", cfg.StreamsPerConn)
	}
	for _, bin := range []string{cfg.Edgeflow, cfg.Bare} {
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("pushbench: %w (make bench-push builds it)", err)
		}
	}
	maxN := 0
	for _, n := range cfg.Sizes {
		maxN = max(maxN, n)
	}
	// The harness holds two fleets' connections; each server, one fleet's.
	perConn, hardLimit, err := chooseStreamsPerConn(cfg.StreamsPerConn, maxN)
	if err != nil {
		return nil, err
	}
	if cfg.StreamsPerConn == 0 {
		fmt.Fprintf(progress, "pushbench: %d stream(s) per gRPC connection: the smallest with which 2 × %d streams fit the open-file hard limit %d\n",
			perConn, maxN, hardLimit)
	}
	cfg.StreamsPerConn = perConn
	dir, removeDir := cfg.WorkDir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "pushbench-")
		if err != nil {
			return nil, err
		}
		dir, removeDir = d, true
	}
	load0 := loadAverage()
	start := time.Now()
	var results []sizeResult
	for _, n := range cfg.Sizes {
		res, err := runSize(ctx, cfg, n, filepath.Join(dir, strconv.Itoa(n)), progress)
		if err != nil {
			return results, fmt.Errorf("%w\n(topology files and server logs kept in %s)", err, dir)
		}
		results = append(results, res)
	}
	report(out, cfg, results, load0, loadAverage(), time.Since(start))
	if removeDir {
		os.RemoveAll(dir)
	}
	return results, nil
}

// fileSlack is the open files the harness needs besides the fleets' connections.
const fileSlack = 1024

// chooseStreamsPerConn returns perConn when it is set, else the smallest count of streams
// per gRPC connection with which both fleets of maxN streams fit the open-file hard limit. It
// raises the soft limit (inherited by the servers) as far as needed.
func chooseStreamsPerConn(perConn, maxN int) (int, uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, err
	}
	need := func(k int) uint64 { return uint64(2*((maxN+k-1)/k) + fileSlack) }
	if perConn == 0 {
		perConn = 1
		for need(perConn) > lim.Max {
			perConn++
		}
	}
	if need(perConn) > lim.Max {
		return 0, 0, fmt.Errorf("pushbench: %d streams per connection need %d open files, the hard limit is %d "+
			"(raise it, or leave -streams-per-conn 0 to choose)", perConn, need(perConn), lim.Max)
	}
	if lim.Cur < need(perConn) {
		lim.Cur = need(perConn)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, 0, err
		}
	}
	return perConn, lim.Max, nil
}

// loadAverage is the 1-minute load average ("?" if unknown).
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(data)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

// numCPU is the machine's CPU count, for the report.
func numCPU() int { return runtime.NumCPU() }
