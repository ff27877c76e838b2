package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// profiler collects, for -profile, a CPU profile of every measured round of each server that
// serves net/http/pprof (both do when profiling: edgeflow serve on --profiling-address), and the mutex, block and allocation profiles before and after the measured rounds
// (compare with `go tool pprof -base …-before.pb.gz …-after.pb.gz`), and the heap profile with
// every stream connected (when the RSS per stream is measured).
type profiler struct {
	dir      string
	progress io.Writer
	client   *http.Client
}

// profileKinds are the profiles saved before and after the measured rounds: contention, and
// allocations (`go tool pprof -sample_index=alloc_space -base …`: what the rounds allocated).
var profileKinds = []string{"mutex", "block", "allocs"}

func newProfiler(dir string, progress io.Writer) *profiler {
	return &profiler{dir: dir, progress: progress, client: &http.Client{}}
}

// begin checks which servers serve /debug/pprof/ (clearing side.pprof for those that do not)
// and saves their mutex, block and allocation profiles before the measured rounds.
func (p *profiler) begin(ctx context.Context, sides ...*side) error {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return err
	}
	for _, s := range sides {
		if s.pprof == "" {
			fmt.Fprintf(p.progress, "pushbench: profile: %s has no HTTP address to ask for /debug/pprof/; no profiles\n", s.name)
			continue
		}
		status, err := p.status(ctx, s.pprof)
		if err != nil {
			return err
		}
		if status != http.StatusOK {
			fmt.Fprintf(p.progress, "pushbench: profile: %s answers %s with HTTP %d: it serves no net/http/pprof there, no profiles "+
				"(edgeflow serve serves /debug/pprof/ on --profiling-address, which also sets runtime.SetMutexProfileFraction "+
				"and SetBlockProfileRate)\n", s.name, s.pprof, status)
			s.pprof = ""
			continue
		}
		for _, kind := range profileKinds {
			if err := p.save(ctx, s.pprof+kind, filepath.Join(p.dir, s.name+"-"+kind+"-before.pb.gz")); err != nil {
				return err
			}
		}
		// The heap as the RSS per stream was measured: every stream connected, before any round.
		// In text too: its footer is runtime.MemStats (heap, stacks, released to the OS).
		if err := p.save(ctx, s.pprof+"heap", filepath.Join(p.dir, s.name+"-heap-connected.pb.gz")); err != nil {
			return err
		}
		if err := p.save(ctx, s.pprof+"heap?debug=1", filepath.Join(p.dir, s.name+"-heap-connected.txt")); err != nil {
			return err
		}
	}
	return nil
}

// cpu starts a CPU profile of s for round r, long enough for a round three times as long as
// the warm-up round; the returned function waits for it and saves it. nil when s has no pprof.
func (p *profiler) cpu(ctx context.Context, s *side, r int, warm time.Duration) func() error {
	if s.pprof == "" {
		return nil
	}
	seconds := max(1, int(math.Ceil((3*warm + 500*time.Millisecond).Seconds())))
	url := fmt.Sprintf("%sprofile?seconds=%d", s.pprof, seconds)
	file := filepath.Join(p.dir, fmt.Sprintf("%s-cpu-round%d.pb.gz", s.name, r))
	done := make(chan error, 1)
	go func() { done <- p.save(ctx, url, file) }()
	return func() error { return <-done }
}

// end saves the mutex, block and allocation profiles after the measured rounds.
func (p *profiler) end(ctx context.Context, sides ...*side) error {
	for _, s := range sides {
		if s.pprof == "" {
			continue
		}
		for _, kind := range profileKinds {
			if err := p.save(ctx, s.pprof+kind, filepath.Join(p.dir, s.name+"-"+kind+"-after.pb.gz")); err != nil {
				return err
			}
		}
		fmt.Fprintf(p.progress, "pushbench: profile: %s: go tool pprof %s; go tool pprof -base %s %s\n", s.name,
			filepath.Join(p.dir, s.name+"-cpu-round*.pb.gz"),
			filepath.Join(p.dir, s.name+"-mutex-before.pb.gz"), filepath.Join(p.dir, s.name+"-mutex-after.pb.gz"))
	}
	return nil
}

// get GETs url; the caller closes the body.
func get(ctx context.Context, client *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("pushbench: profile: %w", err)
	}
	return resp, nil
}

// getOK is get failing, with the start of the body, on any answer but 200 OK.
func getOK(ctx context.Context, client *http.Client, url string) (*http.Response, error) {
	resp, err := get(ctx, client, url)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("pushbench: profile: GET %s: HTTP %d: %s", url, resp.StatusCode, msg)
	}
	return resp, nil
}

func (p *profiler) status(ctx context.Context, url string) (int, error) {
	resp, err := get(ctx, p.client, url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func (p *profiler) save(ctx context.Context, url, file string) error {
	resp, err := getOK(ctx, p.client, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// retainedBytes forces a GC in the server behind pprof (a /debug/pprof/ base URL) and returns
// its live heap plus goroutine stacks then: runtime.MemStats HeapAlloc + StackInuse, from the
// footer of /debug/pprof/heap?gc=1&debug=1. It is what the server's memory comes down to,
// without the garbage a Go heap holds between collections (up to GOGC % of the live heap and
// stacks), which VmRSS includes at whatever point of its cycle the heap happens to be.
func retainedBytes(ctx context.Context, pprof string) (int64, error) {
	resp, err := getOK(ctx, http.DefaultClient, pprof+"heap?gc=1&debug=1")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("pushbench: retained memory: %w", err)
	}
	return parseRetained(string(body))
}

// parseRetained reads HeapAlloc and the in-use stack bytes from a debug=1 heap profile's
// runtime.MemStats footer ("# HeapAlloc = N", "# Stack = INUSE / SYS").
func parseRetained(profile string) (int64, error) {
	var heap, stack int64 = -1, -1
	for _, line := range strings.Split(profile, "\n") {
		if v, ok := strings.CutPrefix(line, "# HeapAlloc = "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("pushbench: retained memory: %q: %w", line, err)
			}
			heap = n
		}
		if v, ok := strings.CutPrefix(line, "# Stack = "); ok {
			inuse, _, _ := strings.Cut(v, "/")
			n, err := strconv.ParseInt(strings.TrimSpace(inuse), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("pushbench: retained memory: %q: %w", line, err)
			}
			stack = n
		}
	}
	if heap < 0 || stack < 0 {
		return 0, errors.New("pushbench: retained memory: no \"# HeapAlloc\" and \"# Stack\" in the heap profile")
	}
	return heap + stack, nil
}
