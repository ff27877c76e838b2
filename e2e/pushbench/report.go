package main

import (
	"fmt"
	"io"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// report prints the run's configuration, the summary table and a detail table, in Markdown.
func report(w io.Writer, cfg Config, results []sizeResult, load0, load1 string, took time.Duration) {
	fmt.Fprintf(w, "## Push to every sidecar, end to end (e2e/pushbench)\n\n")
	fmt.Fprintf(w, "- machine: %d CPUs, load average %s at start, %s at end: with other work running, the figures are indicative only\n",
		numCPU(), load0, load1)
	fmt.Fprintf(w, "- edgeflow: `%s serve --debounce-quiet %v --debounce-max %v --poll-interval %v%s` (policy lata, encoding locality)\n",
		cfg.Edgeflow, cfg.DebounceQuiet, cfg.DebounceMax, cfg.PollInterval, prefixed(" ", strings.Join(cfg.EdgeflowArgs, " ")))
	fmt.Fprintf(w, "- bare: `%s`, go-control-plane %s SnapshotCache(ads=false, IDHash), one snapshot per pod; on SIGHUP it reads, solves "+
		"and translates the same file with edgeflow's optimizer and xds.Translate (counted in its rounds, as in edgeflow's) and sets every snapshot\n",
		cfg.Bare, moduleVersion("github.com/envoyproxy/go-control-plane"))
	fmt.Fprintf(w, "- topology: N caller pods on 10 nodes, callee with %d pods on 10 other nodes (%d endpoints per ClusterLoadAssignment); "+
		"each round rotates the latencies so LATA moves every caller's weights\n", calleePods, calleePods)
	var lim syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	kind := "SOTW ADS stream"
	if cfg.Delta {
		kind = "delta ADS stream (subscribing by name; an EDS version is a response's system_version_info)"
	}
	fmt.Fprintf(w, "- clients: in the harness process, one %s per caller pod per server, %d stream(s) per gRPC connection "+
		"(open-file hard limit %d), LDS → RDS → CDS → EDS, every response ACKed%s; both fleets connected throughout\n", kind, cfg.StreamsPerConn, lim.Max,
		map[bool]string{true: ", every ClusterLoadAssignment unmarshalled and checked (-verify)"}[cfg.Verify])
	fmt.Fprintf(w, "- round: change = rename of the new file over the server's file + SIGHUP; done = every stream whose EDS version changed "+
		"holds it and has sent its ACK; rounds interleaved edgeflow, bare, …; %d warm-up + %d measured per side; per-stream "+
		"p50/p99 pooled over the measured rounds; RSS/stream = (server VmRSS with N streams converged − before they connected) / N\n",
		cfg.Warmup, cfg.Rounds)
	fmt.Fprintf(w, "- run took %v\n\n", took.Round(time.Second))

	fmt.Fprintln(w, "| streams | edgeflow median | bare median | ratio | edgeflow p50/p99 per stream | bare p50/p99 | RSS/stream edgeflow | bare |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		e, b := median(r.Edgeflow.Rounds), median(r.Bare.Rounds)
		fmt.Fprintf(w, "| %d | %s | %s | %.2f | %s / %s | %s / %s | %s | %s |\n", r.N, ms(e), ms(b), float64(e)/float64(b),
			ms(percentile(r.Edgeflow.PerStream, 0.5)), ms(percentile(r.Edgeflow.PerStream, 0.99)),
			ms(percentile(r.Bare.PerStream, 0.5)), ms(percentile(r.Bare.PerStream, 0.99)),
			perStream(r.Edgeflow, r.N), perStream(r.Bare, r.N))
	}

	fmt.Fprintln(w, "\nDetails: every measured round (sorted); EDS versions changed per round; responses received per changed stream "+
		"(1.00 = one EDS push each, nothing else); server CPU per round (median, until the server is idle again); the server's "+
		"own account of its publication (median; edgeflow's since_change runs from the watcher's Update to the last snapshot set).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| streams | side | rounds (ms) | changed | responses/stream | server CPU/round | server phases (median ms) | server RSS before → after |")
	fmt.Fprintln(w, "|---:|---|---|---:|---:|---:|---|---:|")
	for _, r := range results {
		for _, s := range []struct {
			name string
			res  sideResult
		}{{"edgeflow", r.Edgeflow}, {"bare", r.Bare}} {
			rounds := slices.Clone(s.res.Rounds)
			slices.Sort(rounds)
			var rs []string
			for _, d := range rounds {
				rs = append(rs, strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64))
			}
			unquiet := ""
			if s.res.Unquiet > 0 {
				unquiet = fmt.Sprintf(" (%d started before the servers were idle)", s.res.Unquiet)
			}
			fmt.Fprintf(w, "| %d | %s | %s%s | %s | %s | %s | %s | %.0f → %.0f MiB |\n", r.N, s.name, strings.Join(rs, ", "), unquiet,
				intsRange(s.res.Awaited), floatsRange(s.res.Responses), ms(median(s.res.CPU)), phases(s.name, s.res.PhaseTimes),
				float64(s.res.RSSBefore)/(1<<20), float64(s.res.RSSAfter)/(1<<20))
		}
	}
	fmt.Fprintln(w, "\nStages: when each stage of a round was done, from the change (median over the measured rounds, ms), "+
		"from the servers' own log lines and clocks (the machine's wall clock, as the harness's). compiled: edgeflow's watcher "+
		"hands the topology to the xDS server (signal, read, parse, compile), bare has read and parsed it; planned: bare's "+
		"solve compiles and plans; published: every node's snapshot set; first/last response: the first and last response to a "+
		"node the publication waits for, handed to gRPC; last ACK (server): its last answer received; (client): the round.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| streams | side | "+strings.Join(stageNames, " | ")+" |")
	fmt.Fprintln(w, "|---:|---|"+strings.Repeat("---:|", len(stageNames)))
	for _, r := range results {
		for _, s := range []struct {
			name string
			res  sideResult
		}{{"edgeflow", r.Edgeflow}, {"bare", r.Bare}} {
			cells := make([]string, len(stageNames))
			for i, k := range stageNames {
				cells[i] = "–"
				if ds := s.res.Stages[k]; len(ds) > 0 {
					cells[i] = strconv.FormatFloat(float64(median(ds))/1e6, 'f', 1, 64)
				}
			}
			fmt.Fprintf(w, "| %d | %s | %s |\n", r.N, s.name, strings.Join(cells, " | "))
		}
	}

	fmt.Fprintln(w)
	for _, r := range results {
		fmt.Fprintf(w, "- N=%d: %d gRPC connections per side; harness (both fleets) VmRSS %.0f → %.0f MiB, %s per stream\n",
			r.N, r.Conns, float64(r.HarnessRSSBefore)/(1<<20), float64(r.HarnessRSSAfter)/(1<<20),
			kib(float64(r.HarnessRSSAfter-r.HarnessRSSBefore)/float64(2*r.N)))
		if e, b := r.Edgeflow, r.Bare; e.RetainedAfter > 0 && b.RetainedAfter > 0 {
			fmt.Fprintf(w, "- N=%d retained after a forced GC (live heap + goroutine stacks): edgeflow %.1f → %.1f MiB, %s per stream; bare %.1f → %.1f MiB, %s per stream\n",
				r.N, float64(e.RetainedBefore)/(1<<20), float64(e.RetainedAfter)/(1<<20), kib(float64(e.RetainedAfter-e.RetainedBefore)/float64(r.N)),
				float64(b.RetainedBefore)/(1<<20), float64(b.RetainedAfter)/(1<<20), kib(float64(b.RetainedAfter-b.RetainedBefore)/float64(r.N)))
		}
	}
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

// phases formats the server's logged phases in the order the work happens.
func phases(side string, t map[string][]time.Duration) string {
	keys := []string{"read", "compile", "solve", "translate", "set", "since_change", "first_response", "last_response", "converged"}
	if side == "bare" {
		keys = []string{"read", "parse", "solve", "translate", "set", "total"}
	}
	var out []string
	for _, k := range keys {
		if ds := t[k]; len(ds) > 0 {
			out = append(out, fmt.Sprintf("%s %.1f", k, float64(median(ds))/1e6))
		}
	}
	return strings.Join(out, " · ")
}

func perStream(s sideResult, n int) string {
	return kib(float64(s.RSSAfter-s.RSSBefore) / float64(n))
}

func kib(bytes float64) string { return fmt.Sprintf("%.1f KiB", bytes/1024) }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

// median is the middle value (the mean of the two middle values of an even count).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile is the nearest-rank p-quantile (0 < p ≤ 1).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(p*float64(len(s))))-1)]
}

func intsRange(xs []int) string {
	if len(xs) == 0 {
		return "-"
	}
	lo, hi := slices.Min(xs), slices.Max(xs)
	if lo == hi {
		return strconv.Itoa(lo)
	}
	return fmt.Sprintf("%d–%d", lo, hi)
}

func floatsRange(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	lo, hi := slices.Min(xs), slices.Max(xs)
	if hi-lo < 0.005 {
		return fmt.Sprintf("%.2f", lo)
	}
	return fmt.Sprintf("%.2f–%.2f", lo, hi)
}

// moduleVersion is the version of a module this binary was built with (the bare server's is
// the same: one go.mod).
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return "(unknown version)"
}
