package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
)

// recorder is a Listener that hands every topology to the test.
type recorder struct{ got chan *optimizer.Topology }

func (r recorder) Update(t *optimizer.Topology) { r.got <- t }

func (r recorder) next(t *testing.T) *optimizer.Topology {
	t.Helper()
	select {
	case top := <-r.got:
		return top
	case <-time.After(10 * time.Second):
		t.Fatal("no topology delivered within 10s")
		return nil
	}
}

func (r recorder) none(t *testing.T) {
	t.Helper()
	select {
	case top := <-r.got:
		t.Fatalf("unexpected delivery: %+v", top)
	default:
	}
}

func topologyYAML(latency string) string {
	return "nodes: [{name: n1}, {name: n2}]\nlatency: [{from: n1, to: n2, ms: " + latency + "}]\n" +
		"services: [{name: a, pods: [{name: a-0, node: n1}]}, {name: b, pods: [{name: b-0, node: n2}]}]\n" +
		"calls: [{from: a, to: b}]\ningress: [{service: a, rps: 1}]\n"
}

func write(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func waitCount(t *testing.T, c prometheus.Collector, want float64) {
	t.Helper()
	testkit.EventuallyNoError(t, 10*time.Second, fmt.Sprintf("the counter at %v", want), func() error {
		if got := testutil.ToFloat64(c); got != want {
			return fmt.Errorf("counter is %v, want %v", got, want)
		}
		return nil
	})
}

// startFile runs a File on path until the test ends.
func startFile(t *testing.T, path string, cfg FileConfig) (*File, recorder, <-chan error) {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	f, err := NewFile(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := recorder{got: make(chan *optimizer.Topology, 10)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); done <- f.Run(ctx, rec) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return f, rec, done
}

func TestFileFollowsChanges(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "t.yaml")
	write(t, path, topologyYAML("5"))
	f, rec, _ := startFile(t, path, FileConfig{Interval: 5 * time.Millisecond})
	if got := rec.next(t); got.Latency[0].MS != 5 {
		t.Fatalf("first delivery: %+v", got.Latency)
	}
	write(t, path, topologyYAML("7"))
	if got := rec.next(t); got.Latency[0].MS != 7 {
		t.Fatalf("after a change: %+v", got.Latency)
	}

	// Bad content: logged and counted once, nothing delivered, the last good one stays.
	write(t, path, strings.Replace(topologyYAML("7"), "node: n2", "node: n9", 1))
	waitCount(t, f.errors, 1)
	f.Reload() // a forced re-read of the same bad content reports it again
	waitCount(t, f.errors, 2)
	rec.none(t)
	if f.Current().Latency[0].MS != 7 {
		t.Error("the last good topology was replaced")
	}
	// An unreadable file is an error too, and the last good topology stays.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	waitCount(t, f.errors, 3)
	write(t, path, topologyYAML("9"))
	if got := rec.next(t); got.Latency[0].MS != 9 {
		t.Fatalf("after recovery: %+v", got.Latency)
	}
	if testutil.ToFloat64(f.updates) != 3 {
		t.Errorf("updates = %v, want 3", testutil.ToFloat64(f.updates))
	}
}

func TestFileReloadForcesDelivery(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "t.yaml")
	write(t, path, topologyYAML("5"))
	f, rec, _ := startFile(t, path, FileConfig{Interval: time.Hour}) // no polling in this test
	first := rec.next(t)
	f.Reload()
	again := rec.next(t)
	if again == first || again.Latency[0].MS != 5 {
		t.Error("Reload should deliver a freshly read topology")
	}
	write(t, path, topologyYAML("6"))
	f.Reload()
	if got := rec.next(t); got.Latency[0].MS != 6 {
		t.Errorf("Reload after a change: %+v", got.Latency)
	}
}

func TestFileCheckHook(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "t.yaml")
	write(t, path, topologyYAML("5"))
	errNo6 := errors.New("6 ms is not allowed")
	check := func(t *optimizer.Topology) error {
		if t.Latency[0].MS == 6 {
			return errNo6
		}
		return nil
	}
	f, rec, _ := startFile(t, path, FileConfig{Interval: 5 * time.Millisecond, Check: check})
	rec.next(t)
	write(t, path, topologyYAML("6"))
	waitCount(t, f.errors, 1)
	rec.none(t)
}

func TestFileBadAtStartup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	write(t, bad, strings.Replace(topologyYAML("5"), "node: n2", "node: n9", 1))
	_, _, done := startFile(t, bad, FileConfig{})
	err := <-done
	if !errors.Is(err, optimizer.ErrInvalidTopology) || !strings.Contains(err.Error(), `unknown node "n9"`) {
		t.Errorf("Run: %v", err)
	}
	_, _, done = startFile(t, filepath.Join(dir, "missing.yaml"), FileConfig{})
	if err := <-done; !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Run on a missing file: %v", err)
	}
}

func TestFileStopsWithContext(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "t.yaml")
	write(t, path, topologyYAML("5"))
	f, err := NewFile(path, FileConfig{Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rec := recorder{got: make(chan *optimizer.Topology, 1)}
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx, rec) }()
	rec.next(t)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestFileTooLargeNotRead: a topology file over optimizer.MaxTopologyBytes (here a sparse
// 1 GiB file) is refused naming it, having read no more than the cap — not read whole at
// every poll before the parser's cap refuses it.
func TestFileTooLargeNotRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.yaml")
	fd, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := fd.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	f, err := NewFile(path, FileConfig{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = f.Load()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, optimizer.ErrInvalidTopology) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("Load of a 1 GiB file: %v", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > optimizer.MaxTopologyBytes {
		t.Errorf("Load of a 1 GiB file allocated %d MiB; the cap is %d MiB", alloc>>20, optimizer.MaxTopologyBytes>>20)
	}
}
