package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// side is one server under test: its process, the file it follows, its clients and results.
type side struct {
	name  string // "edgeflow" or "bare"
	srv   *server
	file  string
	addr  string // xDS
	pprof string // base URL of /debug/pprof/, "" when the server has none
	fl    *fleet
	// published matches the server's log line of publication (or reload) number k; converged,
	// when not nil, its line saying that publication k's last answer is in.
	published, converged func(line string, k int) bool
	res                  sideResult
}

// sideResult is what was measured of one side at one size.
type sideResult struct {
	Rounds     []time.Duration            // measured rounds: change → last awaited stream's ACK
	PerStream  []time.Duration            // every awaited stream of every measured round: change → its ACK
	Awaited    []int                      // streams whose EDS version changed, per measured round
	Responses  []float64                  // responses received per awaited stream, per measured round
	CPU        []time.Duration            // server CPU time per measured round (to quiet after it)
	PhaseTimes map[string][]time.Duration // the server's logged phases (solve, translate, set, …)
	// Stages are, per measured round, when each stage of the push was done, from the change
	// (see stages), read from the server's own log lines and clock; the last is the client's.
	Stages    map[string][]time.Duration
	RSSBefore int64 // server VmRSS, topology published, before clients connect
	RSSAfter  int64 // server VmRSS, every client converged on the first version
	Unquiet   int   // rounds that started before the servers were quiet (limit reached)
	// RetainedBefore and RetainedAfter are, at the moments of RSSBefore and RSSAfter, the
	// server's live heap and goroutine stacks after a forced GC (runtime.MemStats HeapAlloc +
	// StackInuse, from /debug/pprof/heap?gc=1); 0 without -profile.
	RetainedBefore, RetainedAfter int64
}

// sizeResult is one size's measurements.
type sizeResult struct {
	N                int
	Edgeflow, Bare   sideResult
	HarnessRSSBefore int64
	HarnessRSSAfter  int64
	Conns            int // gRPC client connections per side
}

// runSize starts both servers on a fresh topology of n callers, connects the clients to both,
// runs cfg.Warmup + cfg.Rounds interleaved rounds (edgeflow, bare, edgeflow, …) and stops
// everything it started.
func runSize(ctx context.Context, cfg Config, n int, dir string, progress io.Writer) (res sizeResult, err error) {
	res.N = n
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	total := cfg.Warmup + cfg.Rounds
	files := make([][]byte, total+1)
	want := make([][]string, total+1)
	for r := range files {
		files[r] = benchTopology(n, r)
		if want[r], err = expectedEDS(files[r], n); err != nil {
			return res, err
		}
	}
	ef := &side{name: "edgeflow", file: filepath.Join(dir, "topology-edgeflow.yaml"), res: newSideResult(),
		published: func(line string, k int) bool {
			return strings.Contains(line, `msg="xds: published"`) && logFields(line)["publication"] == strconv.Itoa(k)
		},
		converged: func(line string, k int) bool {
			return strings.Contains(line, `msg="xds: converged"`) && logFields(line)["publication"] == strconv.Itoa(k)
		}}
	bare := &side{name: "bare", file: filepath.Join(dir, "topology-bare.yaml"), res: newSideResult(),
		published: func(line string, k int) bool {
			return strings.HasPrefix(line, "pushbench-bare: published ") && logFields(line)["load"] == strconv.Itoa(k)
		}}
	sides := []*side{ef, bare}
	for _, s := range sides {
		if err := os.WriteFile(s.file, files[0], 0o644); err != nil {
			return res, err
		}
	}
	defer func() {
		for _, s := range sides {
			if s.fl != nil {
				s.fl.close()
			}
			if s.srv != nil {
				s.srv.stop(5 * time.Second)
			}
		}
	}()

	// Start both servers and wait for their first publication.
	efArgs := []string{cfg.Edgeflow, "serve", "-f", ef.file, "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
		"--debounce-quiet", cfg.DebounceQuiet.String(), "--debounce-max", cfg.DebounceMax.String(),
		"--poll-interval", cfg.PollInterval.String(),
		// the fleet's streams share connections when open files are short; the server's bound
		// on streams per connection must admit them
		"--xds-max-streams-per-connection", strconv.Itoa(max(cfg.StreamsPerConn, xdsserver.DefaultMaxStreamsPerConnection))}
	efArgs = append(efArgs, cfg.EdgeflowArgs...)
	bareArgs := []string{cfg.Bare, "-f", bare.file, "-xds-address", "127.0.0.1:0"}
	if cfg.ProfileDir != "" {
		efArgs = append(efArgs, "--profiling-address", "127.0.0.1:0")
		bareArgs = append(bareArgs, "-pprof-address", "127.0.0.1:0")
	}
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if ef.srv, err = startServer("edgeflow serve", filepath.Join(dir, "edgeflow.log"), efArgs); err != nil {
		return res, err
	}
	if bare.srv, err = startServer("pushbench-bare", filepath.Join(dir, "bare.log"), bareArgs); err != nil {
		return res, err
	}
	line, err := ef.srv.waitLine(startCtx, 0, "its xDS address", func(l string) bool { return strings.HasPrefix(l, "edgeflow serve: xDS on ") })
	if err != nil {
		return res, err
	}
	var metrics string
	if _, err := fmt.Sscanf(line, "edgeflow serve: xDS on %s metrics %s", &ef.addr, &metrics); err != nil {
		return res, fmt.Errorf("pushbench: cannot read edgeflow's addresses from %q: %w", line, err)
	}
	ef.addr = strings.TrimSuffix(ef.addr, ",")
	if cfg.ProfileDir != "" {
		line, err := ef.srv.waitLine(startCtx, 0, "its profiling address", func(l string) bool { return strings.HasPrefix(l, "edgeflow serve: profiling on ") })
		if err != nil {
			return res, err
		}
		ef.pprof = strings.TrimSpace(strings.TrimPrefix(line, "edgeflow serve: profiling on "))
	}
	if _, err := ef.srv.waitLine(startCtx, 0, "publication 1", func(l string) bool { return ef.published(l, 1) }); err != nil {
		return res, err
	}
	line, err = bare.srv.waitLine(startCtx, 0, "its xDS address", func(l string) bool { return strings.HasPrefix(l, "pushbench-bare: xDS on ") })
	if err != nil {
		return res, err
	}
	f := strings.Fields(strings.TrimPrefix(line, "pushbench-bare: xDS on "))
	bare.addr = strings.TrimSuffix(f[0], ",")
	if len(f) > 2 && f[1] == "pprof" {
		bare.pprof = strings.TrimSuffix(f[2], ",")
	}

	// Connect the clients, one side after the other; measure the servers' resident memory
	// before and after.
	pids := []int{ef.srv.pid(), bare.srv.pid()}
	runtime.GC()
	waitQuiet(ctx, 10*time.Second, pids...)
	if res.HarnessRSSBefore, err = rssBytes(os.Getpid()); err != nil {
		return res, err
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = callerPod(i)
	}
	for _, s := range sides {
		if cfg.ProfileDir != "" && s.pprof != "" {
			if s.res.RetainedBefore, err = retainedBytes(ctx, s.pprof); err != nil {
				return res, err
			}
			waitQuiet(ctx, 10*time.Second, pids...)
		}
	}
	for _, s := range sides {
		if s.res.RSSBefore, err = rssBytes(s.srv.pid()); err != nil {
			return res, err
		}
		t0 := time.Now()
		s.fl = newFleet(s.name, n, cfg.Verify, cfg.Delta)
		done, _ := s.fl.expect(want[0])
		if err := s.fl.connect(ctx, s.addr, ids, cfg.StreamsPerConn); err != nil {
			return res, err
		}
		if err := s.await(ctx, done, 5*time.Minute); err != nil {
			return res, fmt.Errorf("pushbench: %s: first version: %w", s.name, err)
		}
		fmt.Fprintf(progress, "pushbench: N=%d: %d %s streams on %d connections converged in %v\n",
			n, n, s.name, len(s.fl.conns), time.Since(t0).Round(time.Millisecond))
	}
	res.Conns = len(ef.fl.conns)
	runtime.GC()
	waitQuiet(ctx, 10*time.Second, pids...)
	for _, s := range sides {
		if s.res.RSSAfter, err = rssBytes(s.srv.pid()); err != nil {
			return res, err
		}
	}
	for _, s := range sides { // after every RSS: the forced GC frees the garbage RSS still holds
		if cfg.ProfileDir != "" && s.pprof != "" {
			if s.res.RetainedAfter, err = retainedBytes(ctx, s.pprof); err != nil {
				return res, err
			}
		}
	}
	if res.HarnessRSSAfter, err = rssBytes(os.Getpid()); err != nil {
		return res, err
	}

	var prof *profiler
	if cfg.ProfileDir != "" {
		prof = newProfiler(filepath.Join(cfg.ProfileDir, strconv.Itoa(n)), progress)
		if err := prof.begin(ctx, ef, bare); err != nil {
			return res, err
		}
	}
	var warm [2]time.Duration // warm-up round time per side, sizes the CPU profile windows
	for r := 1; r <= total; r++ {
		measured := r > cfg.Warmup
		for si, s := range sides {
			var profDone func() error
			if prof != nil && measured {
				profDone = prof.cpu(ctx, s, r, warm[si])
			}
			d, err := s.round(ctx, cfg, r, files[r], want[r-1], want[r], []*server{ef.srv, bare.srv}, measured)
			if profDone != nil {
				err = errors.Join(err, profDone())
			}
			if err != nil {
				return res, err
			}
			if !measured {
				warm[si] = d
			}
			kind := "measured"
			if !measured {
				kind = "warm-up"
			}
			fmt.Fprintf(progress, "pushbench: N=%d %s round %d (%s): %v\n", n, s.name, r, kind, d.Round(10*time.Microsecond))
		}
	}
	if prof != nil {
		if err := prof.end(ctx, ef, bare); err != nil {
			return res, err
		}
	}
	res.Edgeflow, res.Bare = ef.res, bare.res
	return res, nil
}

// await waits for done, failing on a stream failure, the server's exit or after limit.
func (s *side) await(ctx context.Context, done <-chan struct{}, limit time.Duration) error {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-done:
		return nil
	case <-s.fl.failed:
		return s.fl.err
	case <-s.srv.done:
		return s.srv.running()
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return fmt.Errorf("not converged after %v: %s", limit, s.fl.missing())
	}
}

// round r of one side: once both servers are quiet, the topology of round r is written to a
// temporary name, and the clock starts as it is renamed over the side's file and the server
// is sent SIGHUP; it stops when every stream whose EDS version changes holds the new version
// and has ACKed it. It returns that time.
func (s *side) round(ctx context.Context, cfg Config, r int, file []byte, prev, cur []string, servers []*server, measured bool) (time.Duration, error) {
	pids := []int{servers[0].pid(), servers[1].pid()}
	tmp := s.file + ".tmp"
	if err := os.WriteFile(tmp, file, 0o644); err != nil {
		return 0, err
	}
	diff := make([]string, len(cur))
	for i := range cur {
		if cur[i] != prev[i] {
			diff[i] = cur[i]
		}
	}
	runtime.GC() // the harness's own garbage, collected before the clock starts
	quiet := waitQuiet(ctx, 10*time.Second, pids...)
	for _, srv := range servers {
		if err := srv.running(); err != nil {
			return 0, err
		}
	}
	var responses0 int64
	for i := range s.fl.responses {
		responses0 += s.fl.responses[i].Load()
	}
	cpu0, err := cpuTime(s.srv.pid())
	if err != nil {
		return 0, errors.Join(s.srv.running(), err)
	}
	mark := s.srv.lineCount()
	done, awaited := s.fl.expect(diff)
	if awaited == 0 {
		return 0, fmt.Errorf("pushbench: %s round %d changes no caller's EDS version", s.name, r)
	}
	t0 := time.Now()
	if err := os.Rename(tmp, s.file); err != nil {
		return 0, err
	}
	if err := syscall.Kill(s.srv.pid(), syscall.SIGHUP); err != nil {
		return 0, err
	}
	if err := s.await(ctx, done, cfg.RoundTimeout); err != nil {
		return 0, fmt.Errorf("pushbench: %s round %d: %w", s.name, r, err)
	}
	var last int64
	per := make([]time.Duration, 0, awaited)
	for i := range diff {
		if diff[i] != "" {
			at := s.fl.arrivals[i].Load()
			last = max(last, at)
			per = append(per, time.Duration(at-t0.UnixNano()))
		}
	}
	d := time.Duration(last - t0.UnixNano())
	// The server's own account of the publication (its phases), then its CPU once quiet.
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	line, err := s.srv.waitLine(lctx, mark, fmt.Sprintf("publication of round %d", r), func(l string) bool { return s.published(l, r+1) })
	if err != nil {
		return 0, err
	}
	var convLine, watchLine string
	// An edgeflow that logs no change_at (one built before the stage breakdown) logs no
	// convergence either: its rounds are timed without stages.
	if s.converged != nil && logFields(line)["change_at"] != "" {
		if convLine, err = s.srv.waitLine(lctx, mark, fmt.Sprintf("convergence of round %d", r), func(l string) bool { return s.converged(l, r+1) }); err != nil {
			return 0, err
		}
		watchLine, _ = s.srv.waitLine(lctx, mark, "the watcher's reload", func(l string) bool { return strings.Contains(l, `msg="watcher: topology file reloaded"`) })
	}
	waitQuiet(ctx, 10*time.Second, s.srv.pid())
	cpu1, err := cpuTime(s.srv.pid())
	if err != nil {
		return 0, errors.Join(s.srv.running(), err)
	}
	if !measured {
		return d, nil
	}
	var responses1 int64
	for i := range s.fl.responses {
		responses1 += s.fl.responses[i].Load()
	}
	res := &s.res
	res.Rounds = append(res.Rounds, d)
	res.PerStream = append(res.PerStream, per...)
	res.Awaited = append(res.Awaited, awaited)
	res.Responses = append(res.Responses, float64(responses1-responses0)/float64(awaited))
	res.CPU = append(res.CPU, cpu1-cpu0)
	if !quiet {
		res.Unquiet++
	}
	fields := logFields(line)
	for _, l := range []string{watchLine, convLine} {
		for k, v := range logFields(l) {
			if k == "since_change" {
				k = "converged" // the convergence line's, not the publication's
			}
			fields[k] = v
		}
	}
	for k, v := range fields {
		if dur, err := time.ParseDuration(v); err == nil {
			res.PhaseTimes[k] = append(res.PhaseTimes[k], dur)
		}
	}
	for k, v := range stages(fields, t0, d) {
		res.Stages[k] = append(res.Stages[k], v)
	}
	return d, nil
}

func newSideResult() sideResult {
	return sideResult{PhaseTimes: map[string][]time.Duration{}, Stages: map[string][]time.Duration{}}
}

// stageNames are the stages of a round in order, each timed from the change (rename +
// SIGHUP) to its end: the server has the new topology compiled (edgeflow: the watcher hands
// it to the xDS server; bare: parsed and compiled), planned, translated, published (every
// node's snapshot set), the first and the last response to a changed stream handed to gRPC
// (edgeflow only), the last answer received (edgeflow only), and the client's last ACK sent
// (the round). From the servers' log lines: their clocks and the harness's are the same
// machine's wall clock.
var stageNames = []string{"compiled", "planned", "translated", "published", "first response", "last response", "last ACK (server)", "last ACK (client)"}

// stages computes a round's stages (stageNames) from the server's log fields: edgeflow's
// change_at (its watcher's Update) and durations since it; bare's at (SIGHUP received) and
// its phases.
func stages(f map[string]string, t0 time.Time, round time.Duration) map[string]time.Duration {
	dur := func(k string) (time.Duration, bool) {
		d, err := time.ParseDuration(f[k])
		return d, err == nil
	}
	out := map[string]time.Duration{"last ACK (client)": round}
	if at, err := time.Parse(time.RFC3339Nano, f["change_at"]); err == nil { // edgeflow
		c := at.Sub(t0)
		out["compiled"] = c
		solve, ok1 := dur("solve")
		translate, ok2 := dur("translate")
		if ok1 && ok2 {
			out["planned"], out["translated"] = c+solve, c+solve+translate
		}
		for stage, k := range map[string]string{"published": "since_change", "first response": "first_response",
			"last response": "last_response", "last ACK (server)": "converged"} {
			if d, ok := dur(k); ok {
				out[stage] = c + d
			}
		}
		return out
	}
	if at, err := time.Parse(time.RFC3339Nano, f["at"]); err == nil { // bare
		c := at.Sub(t0)
		for _, k := range []string{"read", "parse"} {
			if d, ok := dur(k); ok {
				c += d
			}
		}
		out["compiled"] = c
		if d, ok := dur("solve"); ok {
			out["planned"] = c + d // bare's solve compiles and plans
			if t, ok := dur("translate"); ok {
				out["translated"] = c + d + t
				if set, ok := dur("set"); ok {
					out["published"] = c + d + t + set
				}
			}
		}
	}
	return out
}
