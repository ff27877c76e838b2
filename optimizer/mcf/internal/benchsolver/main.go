// Command benchsolver times edgeflow's mcf solver side by side with LEMON
// 1.3.1's NetworkSimplex on the dense transportation instances of
// lemon_tp.cc, interleaving the two so both see the same machine noise.
//
//	go run ./optimizer/mcf/internal/benchsolver [-sizes 5,50,200,500,1000,2000]
//	    [-modes rand,uniform] [-rounds R] [-reps K] [-seed 1] [-maxcost 1000]
//
// It compiles ../lemonbench/lemon_tp.cc with g++ -O2 -DNDEBUG -std=c++17
// -llemon into ~/.cache/edgeflow/lemon/ (keyed by the file's hash; needs
// Debian's liblemon-dev and g++). For every (mode, n) it starts one
// lemon_tp --serve process, which generates the instance and builds the
// graph once, and runs R rounds; each round asks LEMON for K solves (every
// solve's solve_ms printed) and runs K edgeflow Solve calls in process on
// a prebuilt Transport with a reused Solver, alternating which goes first;
// for n < 200 it runs 3R rounds of K*ceil(200/n) solves, since small solves
// are cheap and the first solves of a round run on cold caches. It checks that both
// report the same optimal cost and prints, per mode, the medians over all
// R*K solves. edgeflow's time is the whole Solve call on a warm, reused
// Solver. LEMON's is given twice, from the same solves: "whole" is
// lemon_tp's solve_ms (construct NetworkSimplex on the prebuilt graph, which
// shuffles the arcs, set the maps, run(), totalCost()), the like-for-like
// figure for a caller solving one instance; "run()" is run() alone (its
// run_ms), the strictest anchor, as if LEMON too kept a warm solver.
//
// With -mem it reports memory instead: what edgeflow allocates on a first
// and on a warm Solve, this process's peak RSS (the instance plus the
// solver) and a LEMON process's peak RSS on the same instance. Run the
// built binary for that, one size and mode per run (go build -o
// /tmp/benchsolver ...; /tmp/benchsolver -mem -sizes 2000 -modes rand): the
// peak RSS is the process's high-water mark, and under go run it includes
// the go command's.
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/edgeflow/edgeflow/optimizer/mcf"
	"github.com/edgeflow/edgeflow/optimizer/mcf/internal/tpgen"
)

// Config is what the flags set.
type Config struct {
	Sizes   []int
	Modes   []string
	Rounds  int
	Reps    int
	Seed    uint64
	MaxCost int64
	Source  string // lemon_tp.cc
	Mem     bool
	CPU     int
}

func main() {
	var cfg Config
	sizes := flag.String("sizes", "5,50,200,500,1000,2000", "comma-separated n (instances are n x n)")
	modes := flag.String("modes", "rand,uniform", "comma-separated instance modes: rand, uniform")
	flag.IntVar(&cfg.Rounds, "rounds", 7, "interleaved rounds per (mode, n); n < 200 uses 3R")
	flag.IntVar(&cfg.Reps, "reps", 3, "solves per round and side; n < 200 uses K*ceil(200/n)")
	flag.Uint64Var(&cfg.Seed, "seed", 1, "splitmix64 seed")
	flag.Int64Var(&cfg.MaxCost, "maxcost", 1000, "costs are 1 + next()%maxcost")
	flag.IntVar(&cfg.CPU, "cpu", runtime.NumCPU()-1, "pin the measuring thread and LEMON to this CPU, so both see the same load (-1: no pinning)")
	flag.BoolVar(&cfg.Mem, "mem", false, "report memory instead of time: edgeflow's allocations and this process's peak RSS, LEMON's peak RSS (peak RSS is per process: use one size and one mode per run)")
	flag.StringVar(&cfg.Source, "cc", "", "path of lemon_tp.cc (default: ../lemonbench/lemon_tp.cc beside this program)")
	flag.Parse()
	var err error
	if cfg.Sizes, err = parseSizes(*sizes); err != nil {
		fatal(err)
	}
	for _, m := range strings.Split(*modes, ",") {
		if m != "rand" && m != "uniform" {
			fatal(fmt.Errorf("unknown mode %q (want rand or uniform)", m))
		}
		cfg.Modes = append(cfg.Modes, m)
	}
	if cfg.Rounds < 1 || cfg.Reps < 1 || cfg.MaxCost < 1 {
		fatal(errors.New("-rounds, -reps and -maxcost must be >= 1"))
	}
	if cfg.Source == "" {
		cfg.Source = defaultSource()
	}
	bin, err := buildLemon(cfg.Source)
	if err != nil {
		fatal(err)
	}
	if cfg.CPU >= 0 {
		// The main goroutine stays on this thread; LEMON processes
		// started from it inherit the affinity.
		runtime.LockOSThread()
		if err := pinThread(cfg.CPU); err != nil {
			fatal(fmt.Errorf("pinning to CPU %d: %w", cfg.CPU, err))
		}
	}
	if cfg.Mem {
		if err := memory(cfg, bin); err != nil {
			fatal(err)
		}
		return
	}
	if err := run(cfg, bin); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchsolver:", err)
	os.Exit(1)
}

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad size %q in -sizes", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func defaultSource() string {
	const rel = "optimizer/mcf/internal/lemonbench/lemon_tp.cc"
	if _, err := os.Stat(rel); err == nil {
		return rel
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		return filepath.Join(filepath.Dir(file), "..", "lemonbench", "lemon_tp.cc")
	}
	return rel
}

// buildLemon compiles src once per content hash into the user cache.
func buildLemon(src string) (string, error) {
	code, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("reading the LEMON harness: %w", err)
	}
	sum := sha256.Sum256(code)
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "edgeflow", "lemon")
	bin := filepath.Join(dir, "lemon_tp-"+hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if _, err := os.Stat("/usr/include/lemon/network_simplex.h"); err != nil {
		return "", errors.New("LEMON headers not found (/usr/include/lemon/network_simplex.h): " +
			"install them with `apt-get install -y --no-install-recommends liblemon-dev g++` (make bench-solver does)")
	}
	if _, err := exec.LookPath("g++"); err != nil {
		return "", errors.New("g++ not found: install it with `apt-get install -y --no-install-recommends liblemon-dev g++`")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
	cmd := exec.Command("g++", "-O2", "-DNDEBUG", "-std=c++17", "-o", tmp, src, "-llemon")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("compiling %s (is liblemon-dev installed?): %v\n%s", src, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "benchsolver: built %s\n", bin)
	return bin, nil
}

// row is one line of the result table.
type row struct {
	n               int
	lemon, lemonRun []float64 // ms per LEMON solve: whole, run() alone
	edgeflow        []float64 // ms per Solve
	cost            int64
}

func run(cfg Config, bin string) error {
	fmt.Printf("# benchsolver: seed %d, maxcost %d, %d rounds x %d reps per side (n < 200: 3x the rounds, ceil(200/n)x the reps), GOMAXPROCS %d, pinned to CPU %d, %s\n",
		cfg.Seed, cfg.MaxCost, cfg.Rounds, cfg.Reps, runtime.GOMAXPROCS(0), cfg.CPU, runtime.Version())
	fmt.Printf("# LEMON whole: %s solve_ms (construct NetworkSimplex + arc shuffle + run() + totalCost()); LEMON run(): run() alone, same solves\n", filepath.Base(bin))
	fmt.Printf("# edgeflow: mcf.Solver.Solve on a prebuilt Transport, warm reused Solver; ratios are edgeflow / LEMON\n")
	failed := false
	for _, mode := range cfg.Modes {
		var rows []row
		for _, n := range cfg.Sizes {
			r, err := measure(cfg, bin, mode, n)
			if err != nil {
				return err
			}
			if r.cost < 0 {
				failed = true
			}
			rows = append(rows, r)
		}
		printTable(mode, rows)
	}
	if failed {
		return errors.New("LEMON and edgeflow disagree on an optimal cost")
	}
	return nil
}

func measure(cfg Config, bin, mode string, n int) (row, error) {
	c, s, d := tpgen.Dense(n, n, cfg.Seed, mode == "uniform", cfg.MaxCost)
	p := &mcf.Transport{Sources: n, Sinks: n, Cost: c, Supply: s, Demand: d}
	solver := mcf.NewSolver()
	dst, cost, err := solver.Solve(p, nil) // warm-up: workspace sized
	if err != nil {
		return row{}, fmt.Errorf("%s n=%d: %w", mode, n, err)
	}
	lemon, err := startLemon(bin, mode, n, cfg)
	if err != nil {
		return row{}, err
	}
	defer lemon.close()
	r := row{n: n, cost: cost}
	reps, rounds := cfg.Reps, cfg.Rounds
	if n < 200 {
		// Small solves are cheap. More solves per round keep the
		// first, cold ones of a round (after the other side ran) from
		// setting the median; three times the rounds interleave the two
		// sides more finely against machine noise.
		reps *= (200 + n - 1) / n
		rounds *= 3
	}
	goSide := func() {
		// No collection may run while Solve is timed: Solve does not
		// allocate, but this program does between rounds.
		runtime.GC()
		old := debug.SetGCPercent(-1)
		defer debug.SetGCPercent(old)
		for k := 0; k < reps; k++ {
			t0 := time.Now()
			dst, _, _ = solver.Solve(p, dst)
			r.edgeflow = append(r.edgeflow, float64(time.Since(t0).Nanoseconds())/1e6)
		}
	}
	for round := 0; round < rounds; round++ {
		if round%2 == 1 {
			goSide()
		}
		times, runTimes, lcost, err := lemon.solve(reps)
		if err != nil {
			return row{}, fmt.Errorf("LEMON %s n=%d: %w", mode, n, err)
		}
		r.lemon = append(r.lemon, times...)
		r.lemonRun = append(r.lemonRun, runTimes...)
		if lcost != cost {
			fmt.Fprintf(os.Stderr, "benchsolver: %s n=%d: LEMON cost %d, edgeflow cost %d\n", mode, n, lcost, cost)
			r.cost = -1
		}
		if round%2 == 0 {
			goSide()
		}
	}
	fmt.Fprintf(os.Stderr, "benchsolver: %s n=%d done\n", mode, n)
	return r, nil
}

// lemonServer is a lemon_tp --serve process holding the instance's graph:
// each request runs K NetworkSimplex solves on it.
type lemonServer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startLemon(bin, mode string, n int, cfg Config) (*lemonServer, error) {
	args := []string{strconv.Itoa(n), strconv.Itoa(n), strconv.FormatUint(cfg.Seed, 10), mode,
		strconv.FormatInt(cfg.MaxCost, 10), "1", "ns", "--serve"}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", bin, strings.Join(args, " "), err)
	}
	ls := &lemonServer{cmd: cmd, in: in, out: bufio.NewReader(out)}
	line, err := ls.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready") {
		ls.close()
		return nil, fmt.Errorf("%s %s: no ready line (harness without --serve?): %q %v", bin, strings.Join(args, " "), line, err)
	}
	return ls, nil
}

// solve runs k solves and returns their whole times and their run() times
// (ms) and the optimal cost.
func (ls *lemonServer) solve(k int) (whole, run []float64, cost int64, err error) {
	if _, err := fmt.Fprintf(ls.in, "%d\n", k); err != nil {
		return nil, nil, 0, err
	}
	line, err := ls.out.ReadString('\n')
	if err != nil {
		return nil, nil, 0, err
	}
	fields := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			fields[k] = v
		}
	}
	if fields["optimal"] != "1" {
		return nil, nil, 0, fmt.Errorf("not optimal: %s", line)
	}
	if cost, err = strconv.ParseInt(fields["total_cost"], 10, 64); err != nil {
		return nil, nil, 0, fmt.Errorf("no total_cost: %s", line)
	}
	if whole, err = parseTimes(fields["solve_ms_each"], k); err != nil {
		return nil, nil, 0, fmt.Errorf("solve_ms_each: %w: %s", err, line)
	}
	if run, err = parseTimes(fields["run_ms_each"], k); err != nil {
		return nil, nil, 0, fmt.Errorf("run_ms_each (harness older than run() timing?): %w: %s", err, line)
	}
	return whole, run, cost, nil
}

// parseTimes parses k comma-separated milliseconds.
func parseTimes(s string, k int) ([]float64, error) {
	var times []float64
	for _, v := range strings.Split(s, ",") {
		t, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, err
		}
		times = append(times, t)
	}
	if len(times) != k {
		return nil, fmt.Errorf("%d times, want %d", len(times), k)
	}
	return times, nil
}

func (ls *lemonServer) close() error {
	fmt.Fprintln(ls.in, "q")
	ls.in.Close()
	return ls.cmd.Wait()
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func printTable(mode string, rows []row) {
	fmt.Printf("\nmode %s\n", mode)
	fmt.Printf("%6s | %14s | %14s | %13s | %11s | %11s | %s\n",
		"n", "LEMON whole ms", "LEMON run() ms", "edgeflow ms", "vs whole", "vs run()", "cost")
	fmt.Printf("%s\n", strings.Repeat("-", 98))
	for _, r := range rows {
		l, lr, e := median(r.lemon), median(r.lemonRun), median(r.edgeflow)
		cost := strconv.FormatInt(r.cost, 10)
		if r.cost < 0 {
			cost = "MISMATCH"
		}
		fmt.Printf("%6d | %14.4f | %14.4f | %13.4f | %11.2f | %11.2f | %s\n", r.n, l, lr, e, e/l, e/lr, cost)
	}
	fmt.Println("(medians of every solve; vs whole = edgeflow / LEMON whole, vs run() = edgeflow / LEMON run())")
}

// memory reports, per (mode, n): the instance's size, what a fresh Solver
// allocates on its first Solve (its workspace plus the result) and on a
// warm one, this process's peak RSS so far (instance + solver + Go runtime),
// and the peak RSS of a LEMON process solving the same instance once
// (graph + NetworkSimplex, from the child's rusage).
func memory(cfg Config, bin string) error {
	fmt.Printf("%-8s %6s %12s %14s %12s %14s %14s\n", "mode", "n", "instance MB", "1st solve KB", "warm allocs", "self maxrss MB", "LEMON maxrss MB")
	for _, mode := range cfg.Modes {
		for _, n := range cfg.Sizes {
			c, s, d := tpgen.Dense(n, n, cfg.Seed, mode == "uniform", cfg.MaxCost)
			p := &mcf.Transport{Sources: n, Sinks: n, Cost: c, Supply: s, Demand: d}
			runtime.GC()
			var m0, m1, m2 runtime.MemStats
			runtime.ReadMemStats(&m0)
			solver := mcf.NewSolver()
			dst, _, err := solver.Solve(p, nil)
			if err != nil {
				return err
			}
			runtime.ReadMemStats(&m1)
			dst, _, _ = solver.Solve(p, dst)
			runtime.ReadMemStats(&m2)
			var ru syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
			cmd := exec.Command(bin, strconv.Itoa(n), strconv.Itoa(n), strconv.FormatUint(cfg.Seed, 10), mode,
				strconv.FormatInt(cfg.MaxCost, 10), "1", "ns")
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("LEMON: %w", err)
			}
			lru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
			inst := 8 * (len(c) + len(s) + len(d))
			fmt.Printf("%-8s %6d %12.1f %14.1f %12d %14.1f %14.1f\n", mode, n, float64(inst)/(1<<20),
				float64(m1.TotalAlloc-m0.TotalAlloc)/1024, m2.Mallocs-m1.Mallocs,
				float64(ru.Maxrss)/1024, float64(lru.Maxrss)/1024)
			runtime.KeepAlive(dst)
		}
	}
	return nil
}

// pinThread restricts the calling OS thread to one CPU.
func pinThread(cpu int) error {
	var mask [16]uint64
	if cpu >= 64*len(mask) {
		return errors.New("CPU index too large")
	}
	mask[cpu/64] |= 1 << (cpu % 64)
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, uintptr(len(mask)*8), uintptr(unsafe.Pointer(&mask[0])))
	if e != 0 {
		return e
	}
	return nil
}
