package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/e2e/testbed"
	"go.uber.org/goleak"
)

// TestPushBench runs the whole harness small (N=50, 1 warm-up + 2 measured rounds per side)
// against the real binaries, over SOTW and over delta streams: every client of both servers
// converges on every round's EDS version, each changed stream gets exactly one EDS response,
// the table prints, and no process or goroutine outlives the run. The delta run profiles
// (-profile): it saves the profiles and reports each server's retained memory.
func TestPushBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts edgeflow serve and the bare server; skipped with -short")
	}
	defer goleak.VerifyNone(t)
	edgeflow, bare := buildServers(t)
	for _, delta := range []bool{false, true} {
		name := "sotw"
		if delta {
			name = "delta"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out, progress bytes.Buffer
			cfg := Config{Sizes: []int{50}, Warmup: 1, Rounds: 2, Edgeflow: edgeflow, Bare: bare,
				DebounceQuiet: time.Millisecond, DebounceMax: 5 * time.Millisecond, PollInterval: time.Hour,
				StreamsPerConn: 0, RoundTimeout: time.Minute, Verify: true, Delta: delta}
			if delta {
				cfg.ProfileDir = t.TempDir()
			}
			results, err := run(ctx, cfg, &out, &progress)
			t.Log("progress:\n" + progress.String())
			if err != nil {
				t.Fatal(err)
			}
			t.Log("report:\n" + out.String())
			if kids := testbed.Children(); len(kids) > 0 {
				t.Errorf("processes left running: %v", kids)
			}
			if len(results) != 1 || results[0].N != 50 {
				t.Fatalf("results %+v, want one for N=50", results)
			}
			for name, s := range map[string]sideResult{"edgeflow": results[0].Edgeflow, "bare": results[0].Bare} {
				if len(s.Rounds) != 2 || len(s.PerStream) != 100 {
					t.Errorf("%s: %d rounds, %d stream arrivals; want 2 and 100", name, len(s.Rounds), len(s.PerStream))
				}
				for i := range s.Awaited {
					if s.Awaited[i] != 50 || s.Responses[i] != 1 {
						t.Errorf("%s round %d: %d of 50 streams changed, %.2f responses per stream; want 50 and 1",
							name, i+1, s.Awaited[i], s.Responses[i])
					}
				}
				if s.RSSAfter <= 0 || s.RSSBefore <= 0 {
					t.Errorf("%s: RSS %d → %d", name, s.RSSBefore, s.RSSAfter)
				}
				// 50 streams hold at least their goroutines' stacks.
				if delta && !(s.RetainedBefore > 0 && s.RetainedAfter > s.RetainedBefore) {
					t.Errorf("%s: retained memory %d → %d with 50 streams", name, s.RetainedBefore, s.RetainedAfter)
				}
			}
			if delta {
				for _, f := range []string{"edgeflow-heap-connected.pb.gz", "bare-heap-connected.txt", "edgeflow-cpu-round2.pb.gz", "bare-mutex-after.pb.gz"} {
					if _, err := os.Stat(filepath.Join(cfg.ProfileDir, "50", f)); err != nil {
						t.Errorf("profile: %v", err)
					}
				}
				if !strings.Contains(out.String(), "- N=50 retained after a forced GC") {
					t.Error("report lacks the retained memory")
				}
			}
			for _, want := range []string{
				"| streams | edgeflow median | bare median | ratio | edgeflow p50/p99 per stream | bare p50/p99 | RSS/stream edgeflow | bare |",
				"\n| 50 | ",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("report lacks %q", want)
				}
			}
		})
	}
}

// buildServers builds edgeflow and pushbench-bare into the cache folder (EDGEFLOW_CACHE, else
// ~/.cache/edgeflow), where go build does not relink binaries that are up to date.
func buildServers(t *testing.T) (edgeflow, bare string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	cache := os.Getenv("EDGEFLOW_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(home, ".cache", "edgeflow")
	}
	dir := filepath.Join(cache, "pushbench")
	var flags []string
	if raceEnabled {
		dir += "-race"
		flags = append(flags, "-race")
	}
	edgeflow, bare = filepath.Join(dir, "edgeflow"), filepath.Join(dir, "pushbench-bare")
	for bin, pkg := range map[string]string{edgeflow: "./cmd/edgeflow", bare: "./e2e/pushbench/bare"} {
		cmd := exec.Command("go", append(append([]string{"build"}, flags...), "-o", bin, pkg)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
		}
	}
	return edgeflow, bare
}

// garbage holds TestRetainedBytes's allocations until it drops them.
var garbage [][]byte

// TestRetainedBytes reads this process's own heap profile through net/http/pprof: the figure
// is HeapAlloc + StackInuse right after the forced GC, so it lies between this process's
// figures read just before (with garbage) and the stacks alone.
func TestRetainedBytes(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for range 1000 {
		garbage = append(garbage, make([]byte, 64<<10)) // 64 MiB, dropped below: freed by the forced GC
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	garbage = nil
	got, err := retainedBytes(context.Background(), srv.URL+"/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	if hi := int64(before.HeapAlloc + before.StackInuse); got <= int64(before.StackInuse) || got >= hi-32<<20 {
		t.Fatalf("retained %d bytes; want above the stacks (%d) and at least 32 MiB below the heap with its garbage (%d)", got, before.StackInuse, hi)
	}
	if _, err := parseRetained("# HeapAlloc = 12\n"); err == nil {
		t.Error("a profile without its stack line parsed")
	}
}

// TestRunRejectsBadConfig: a bad setting is refused before anything starts, naming its flag.
func TestRunRejectsBadConfig(t *testing.T) {
	good := Config{Sizes: []int{10}, Rounds: 1, Edgeflow: "/nonexistent", Bare: "/nonexistent"}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Sizes = nil }, "-sizes"},
		{func(c *Config) { c.Rounds = 0 }, "-rounds 0"},
		{func(c *Config) { c.Warmup = -1 }, "-warmup -1"},
		{func(c *Config) { c.StreamsPerConn = -2 }, "-streams-per-conn -2"},
	} {
		cfg := good
		tc.edit(&cfg)
		var out, progress bytes.Buffer
		if _, err := run(context.Background(), cfg, &out, &progress); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run: %v, want an error naming %q", err, tc.want)
		}
		if out.Len() != 0 {
			t.Errorf("run printed a report for a bad config: %q", out.String())
		}
	}
}
