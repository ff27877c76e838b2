package testkit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// fatalRecorder is a testing.TB whose Fatalf records the message instead of ending the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
}

func TestEventually(t *testing.T) {
	start := time.Now()
	calls := 0
	Eventually(t, time.Second, "the third call", func() bool { calls++; return calls == 3 })
	if calls != 3 {
		t.Errorf("cond called %d times, want 3", calls)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("three quick checks took %v", d)
	}

	r := &fatalRecorder{TB: t}
	start = time.Now()
	Eventually(r, 120*time.Millisecond, "never", func() bool { return false })
	if d := time.Since(start); d < 120*time.Millisecond || d > time.Second {
		t.Errorf("a condition that never holds gave up after %v, want 120 ms", d)
	}
	if !strings.Contains(r.msg, "never") {
		t.Errorf("failure %q does not name what it waited for", r.msg)
	}

	r = &fatalRecorder{TB: t}
	EventuallyNoError(r, 20*time.Millisecond, "the answer", func() error { return errors.New("no answer yet") })
	if !strings.Contains(r.msg, "the answer") || !strings.Contains(r.msg, "no answer yet") {
		t.Errorf("failure %q does not give what and the last error", r.msg)
	}
}

func TestWaitContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err := WaitContext(ctx, func() (bool, error) { return false, errors.New("not ready") })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("WaitContext = %v, want the deadline and the last error", err)
	}
	n := 0
	if err := WaitContext(context.Background(), func() (bool, error) { n++; return n == 2, nil }); err != nil {
		t.Errorf("WaitContext = %v, want nil", err)
	}
}

func TestEchoes(t *testing.T) {
	echoes := StartEchoes(t, "e-0", "e-1")
	for pod, e := range echoes {
		cc, err := grpc.NewClient(e.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		resp, err := testgrpc.NewTestServiceClient(cc).UnaryCall(context.Background(), &testgrpc.SimpleRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetServerId() != pod || resp.GetUsername() != pod {
			t.Errorf("%s answered %q/%q", pod, resp.GetServerId(), resp.GetUsername())
		}
		if e.Calls.Load() != 1 || e.Accepts.Load() != 1 {
			t.Errorf("%s counted %d calls, %d accepts; want 1, 1", pod, e.Calls.Load(), e.Accepts.Load())
		}
	}
}
