// Package testkit is what edgeflow's tests share: polling with a deadline, loopback listeners
// bound on port 0 and handed over, gRPC echo backends, the edgeflow binary built once, and a
// FakeClock (k8s.io/utils/clock/testing's) that reports the timers armed on it.
//
// Test-only: it is imported by _test.go files and by the harnesses under e2e/, never by the
// product. Every server it starts is stopped, and every file it writes removed, when the test
// that asked for it ends.
package testkit

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// maxPollInterval bounds how long Eventually sleeps between two checks.
const maxPollInterval = 50 * time.Millisecond

// Eventually checks cond until it holds, failing t (Fatalf, naming what) when within has passed
// first. The first checks come 1 ms apart, then the interval doubles up to 50 ms: a condition
// that holds at once costs a millisecond, and one that takes seconds (an apiserver, a scrape)
// is not asked a thousand times a second.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !WaitUntil(within, cond) {
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}

// EventuallyNoError is Eventually for a check that says why it does not hold yet: it fails t
// with the last error cond returned.
func EventuallyNoError(t testing.TB, within time.Duration, what string, cond func() error) {
	t.Helper()
	var last error
	if !WaitUntil(within, func() bool { last = cond(); return last == nil }) {
		t.Fatalf("timed out after %v waiting for %s: %v", within, what, last)
	}
}

// WaitUntil checks cond as Eventually does and reports whether it held within the time (false
// when the time passed first). For a test that goes on either way.
func WaitUntil(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	interval := time.Millisecond
	for !cond() {
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(min(interval, time.Until(deadline)+time.Millisecond))
		interval = min(2*interval, maxPollInterval)
	}
	return true
}

// WaitContext checks cond as Eventually does until it holds (nil) or ctx ends (ctx's error,
// with the last error cond returned).
func WaitContext(ctx context.Context, cond func() (bool, error)) error {
	interval := time.Millisecond
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
			}
			return ctx.Err()
		case <-time.After(interval):
		}
		interval = min(2*interval, maxPollInterval)
	}
}

// Listen returns a TCP listener on 127.0.0.1 at a port the kernel chose, closed when the test
// ends. Hand the listener itself to the server under test: a port picked, closed and bound
// again later can be taken by someone else in between.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// Echo is a gRPC TestService backend that answers every UnaryCall with its pod's name (in
// SimpleResponse's ServerId and Username) and counts what it served.
type Echo struct {
	// Pod is the name the backend answers with; Addr is where it listens.
	Pod, Addr string
	// Calls counts UnaryCalls answered; Accepts counts connections accepted.
	Calls, Accepts atomic.Int64
}

// ServeEcho serves an Echo for pod on lis until the test ends (the server is stopped and its
// goroutine waited for at cleanup).
func ServeEcho(t testing.TB, lis net.Listener, pod string) *Echo {
	t.Helper()
	return ServeSlowEcho(t, lis, pod, 0)
}

// ServeSlowEcho is ServeEcho answering each call delay late (or when the call is cancelled).
func ServeSlowEcho(t testing.TB, lis net.Listener, pod string, delay time.Duration) *Echo {
	t.Helper()
	e := &Echo{Pod: pod, Addr: lis.Addr().String()}
	g := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(g, echoService{e: e, delay: delay})
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(countingListener{lis, e}) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return e
}

// StartEchoes serves one Echo per pod, each on its own loopback port; stopped when the test ends.
func StartEchoes(t testing.TB, pods ...string) map[string]*Echo {
	t.Helper()
	out := make(map[string]*Echo, len(pods))
	for _, p := range pods {
		out[p] = ServeEcho(t, Listen(t), p)
	}
	return out
}

type echoService struct {
	testgrpc.UnimplementedTestServiceServer
	e     *Echo
	delay time.Duration
}

func (s echoService) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.e.Calls.Add(1)
	return &testgrpc.SimpleResponse{ServerId: s.e.Pod, Username: s.e.Pod}, nil
}

type countingListener struct {
	net.Listener
	e *Echo
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.e.Accepts.Add(1)
	}
	return c, err
}

// BinaryEnv names the environment variable that gives the edgeflow binary the tests run as a
// process; make test builds it once (with -race) and sets it.
const BinaryEnv = "EDGEFLOW_BIN"

var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// Binary returns the edgeflow binary for tests that run the product as a process: $EDGEFLOW_BIN
// when set (make test builds it once, with the race detector), else one built on first use in
// this test process (as make build does) into a temporary folder that is removed when the
// process exits through RemoveBuilt. Fails t when the build fails.
func Binary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv(BinaryEnv); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("%s=%s: %v", BinaryEnv, bin, err)
		}
		return bin
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "edgeflow-bin-")
		if err != nil {
			buildErr = err
			return
		}
		built = filepath.Join(dir, "edgeflow")
		cmd := exec.Command("go", "build", "-buildvcs=auto", "-o", built, "./cmd/edgeflow")
		cmd.Dir = RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/edgeflow: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// RemoveBuilt removes the binary Binary built, if it built one; a TestMain calls it after
// m.Run.
func RemoveBuilt() {
	if built != "" {
		os.RemoveAll(filepath.Dir(built))
	}
}

// RepoRoot is the edgeflow repository's top folder (the product's module).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
