package loadgen

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestScheduleAt(t *testing.T) {
	tests := []struct {
		rate float64
		i    int
		want time.Duration
	}{
		{rate: 100, i: 0, want: 0},
		{rate: 100, i: 1, want: 10 * time.Millisecond},
		{rate: 3, i: 1, want: 333333333},
		{rate: 3, i: 2, want: 666666667},
		{rate: 3, i: 3, want: time.Second},
		{rate: 7, i: 7_000_000, want: 1_000_000 * time.Second}, // no drift accumulates
		{rate: 0.5, i: 3, want: 6 * time.Second},
	}
	for _, tc := range tests {
		if got := (&Schedule{Rate: tc.rate}).At(tc.i); got != tc.want {
			t.Errorf("Schedule{%v}.At(%d) = %v, want %v", tc.rate, tc.i, got, tc.want)
		}
	}
}

func TestScheduleCount(t *testing.T) {
	tests := []struct {
		rate float64
		d    time.Duration
		want int
	}{
		{rate: 100, d: 0, want: 0},
		{rate: 100, d: time.Second, want: 100},
		{rate: 100, d: 2500 * time.Millisecond, want: 250},
		{rate: 100, d: 10*time.Millisecond + 1, want: 2}, // due at 0 and 10ms
		{rate: 3, d: time.Second, want: 3},
		{rate: 3, d: time.Second + 1, want: 4},
		{rate: 300, d: 10 * time.Second, want: 3000},
	}
	for _, tc := range tests {
		s := &Schedule{Rate: tc.rate}
		got := s.Count(tc.d)
		if got != tc.want {
			t.Errorf("Schedule{%v}.Count(%v) = %d, want %d", tc.rate, tc.d, got, tc.want)
		}
		// Definition: exactly the requests due before d.
		if got > 0 && s.At(got-1) >= tc.d || s.At(got) < tc.d {
			t.Errorf("Schedule{%v}.Count(%v) = %d is not the number of requests due before it", tc.rate, tc.d, got)
		}
	}
}

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestQuantile(t *testing.T) {
	var hundred []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		hundred = append(hundred, time.Duration(i)*time.Millisecond)
	}
	tests := []struct {
		name    string
		samples []time.Duration
		q       float64
		want    time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"single p50", ms(7), 0.5, 7 * time.Millisecond},
		{"single p99", ms(7), 0.99, 7 * time.Millisecond},
		{"1..100 p50", hundred, 0.5, 50 * time.Millisecond},
		{"1..100 p99", hundred, 0.99, 99 * time.Millisecond},
		{"1..100 p07 (q·n must not round up)", hundred, 0.07, 7 * time.Millisecond},
		{"1..100 p999", hundred, 0.999, 100 * time.Millisecond},
		{"1..100 max", hundred, 1, 100 * time.Millisecond},
		{"1..100 min", hundred, 0, 1 * time.Millisecond},
		{"four p50 is the 2nd", ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{"four p51 is the 3rd", ms(4, 1, 3, 2), 0.51, 3 * time.Millisecond},
		{"ten p99 is the max", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 0.99, 10 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := NewSamples(tc.samples).Quantile(tc.q); got != tc.want {
				t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}

func TestSamplesMeanMax(t *testing.T) {
	s := NewSamples(ms(3, 1, 2, 6))
	if got, want := s.Mean(), 3*time.Millisecond; got != want {
		t.Errorf("Mean = %v, want %v", got, want)
	}
	if got, want := s.Max(), 6*time.Millisecond; got != want {
		t.Errorf("Max = %v, want %v", got, want)
	}
	if (Samples{}).Mean() != 0 || (Samples{}).Max() != 0 {
		t.Error("empty samples: want zero mean and max")
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Rate: 0, Duration: time.Second},
		{Rate: -1, Duration: time.Second},
		{Rate: 10, Duration: 0},
		{Rate: 10, Duration: time.Second, Warmup: -1},
	} {
		if _, err := Run(context.Background(), cfg, func(context.Context, int) error { return nil }); err == nil {
			t.Errorf("Run(%+v): want an error", cfg)
		}
	}
}

// TestRunOpenLoop: requests go out on schedule even while earlier ones are stuck, and a stall
// shows in the latencies, measured from the intended send time.
func TestRunOpenLoop(t *testing.T) {
	const rate = 200
	cfg := Config{Rate: rate, Warmup: 100 * time.Millisecond, Duration: 400 * time.Millisecond, Timeout: 5 * time.Second}
	stall := make(chan struct{})
	var calls, inFlightMax, inFlight atomic.Int64
	var seqs sync.Map
	res, err := Run(context.Background(), cfg, func(ctx context.Context, seq int) error {
		if _, dup := seqs.LoadOrStore(seq, true); dup {
			t.Errorf("sequence number %d sent twice", seq)
		}
		calls.Add(1)
		cur := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			old := inFlightMax.Load()
			if cur <= old || inFlightMax.CompareAndSwap(old, cur) {
				break
			}
		}
		// Request 40 (at 200 ms, inside the measured period) holds every request up to
		// request 60 until the generator has sent request 60, as a server stall would.
		if seq == 60 {
			close(stall)
		}
		if seq >= 40 && seq <= 60 {
			select {
			case <-stall:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantAll := (&Schedule{Rate: rate}).Count(cfg.Warmup + cfg.Duration)
	if got := int(calls.Load()); got != wantAll {
		t.Errorf("sent %d requests, want %d", got, wantAll)
	}
	if want := (&Schedule{Rate: rate}).Count(cfg.Duration); res.Sent != want || res.OK != want || res.Errors != 0 {
		t.Errorf("Sent/OK/Errors = %d/%d/%d, want %d/%d/0", res.Sent, res.OK, res.Errors, want, want)
	}
	if inFlightMax.Load() < 10 {
		t.Errorf("at most %d requests in flight during a 100 ms stall at 200/s: the generator waited for responses", inFlightMax.Load())
	}
	// Request 40 waited for request 60, due 100 ms later: its latency from the intended
	// send time is ≥ 100 ms, though it was "served" the moment the stall ended.
	if got := res.Latency.Max(); got < 95*time.Millisecond {
		t.Errorf("max latency %v, want ≥ ~100 ms (latency must be measured from the intended send time)", got)
	}
	if res.Achieved() < rate*0.8 || res.Achieved() > rate*1.05 {
		t.Errorf("achieved %.1f/s, want about %d/s", res.Achieved(), rate)
	}
}

func TestRunTimeoutsAndErrors(t *testing.T) {
	boom := errors.New("boom")
	cfg := Config{Rate: 100, Duration: 200 * time.Millisecond, Timeout: 20 * time.Millisecond}
	wrapped := errors.New("rpc error: code = DeadlineExceeded") // as a gRPC status reads: not context.DeadlineExceeded
	res, err := Run(context.Background(), cfg, func(ctx context.Context, seq int) error {
		switch seq % 5 {
		case 0:
			<-ctx.Done() // never answers: times out
			return ctx.Err()
		case 1:
			<-ctx.Done() // times out, and says so in its own words
			return wrapped
		case 2:
			return boom
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 20 || res.OK != 8 || res.Errors != 12 || res.Timeouts != 8 {
		t.Errorf("Sent/OK/Errors/Timeouts = %d/%d/%d/%d, want 20/8/12/8", res.Sent, res.OK, res.Errors, res.Timeouts)
	}
	if res.ErrorKinds["timeout"] != 8 || res.ErrorKinds["boom"] != 4 {
		t.Errorf("ErrorKinds = %v, want 8 timeout and 4 boom", res.ErrorKinds)
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := Run(ctx, Config{Rate: 100, Duration: time.Hour}, func(ctx context.Context, _ int) error {
			if calls.Add(1) == 5 {
				cancel()
			}
			<-ctx.Done() // requests in flight must see the cancellation
			return ctx.Err()
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run after cancel: err = %v, want context.Canceled", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}

func TestMerge(t *testing.T) {
	a := &Result{Sent: 3, OK: 2, Errors: 1, Timeouts: 1, ErrorKinds: map[string]int{"timeout": 1}, Latency: NewSamples(ms(5, 1)),
		Elapsed: time.Second, MaxSendLag: 2 * time.Millisecond}
	b := &Result{Sent: 2, OK: 1, Errors: 1, ErrorKinds: map[string]int{"timeout": 1}, Latency: NewSamples(ms(3)),
		Elapsed: 2 * time.Second, MaxSendLag: time.Millisecond}
	got := Merge(a, nil, b)
	if got.Sent != 5 || got.OK != 3 || got.Errors != 2 || got.Timeouts != 1 || got.ErrorKinds["timeout"] != 2 {
		t.Errorf("counts %+v", got)
	}
	if got.Elapsed != 3*time.Second || got.MaxSendLag != 2*time.Millisecond || got.Achieved() != 1 {
		t.Errorf("elapsed %v lag %v achieved %v", got.Elapsed, got.MaxSendLag, got.Achieved())
	}
	if want := NewSamples(ms(1, 3, 5)); len(got.Latency) != 3 || got.Latency[0] != want[0] || got.Latency[2] != want[2] {
		t.Errorf("latencies %v, want %v (sorted)", got.Latency, want)
	}
}

// TestPoissonSchedule: a Poisson schedule's gaps are exponential of mean 1/rate (mean within
// 2 %, squared coefficient of variation within 5 % of 1, and P(gap > mean) near e⁻¹, over
// 100,000 arrivals), the same seed draws the same schedule and another seed another, offsets
// never decrease, and Count agrees with At as for the constant rate.
func TestPoissonSchedule(t *testing.T) {
	const rate, n = 200.0, 100_000
	s := &Schedule{Rate: rate, Poisson: true, Seed: 3}
	var sum, sumSq float64
	over := 0
	prev := time.Duration(0)
	for i := range n {
		at := s.At(i)
		if at < prev {
			t.Fatalf("At(%d) = %v before At(%d) = %v", i, at, i-1, prev)
		}
		gap := (at - prev).Seconds()
		sum += gap
		sumSq += gap * gap
		if gap > 1/rate {
			over++
		}
		prev = at
	}
	mean := sum / n
	scv := (sumSq/n - mean*mean) / (mean * mean)
	t.Logf("gaps: mean %.4g s (1/rate %.4g), squared CV %.3f, P(gap > 1/rate) %.3f (e⁻¹ %.3f)", mean, 1/rate, scv, float64(over)/n, math.Exp(-1))
	if math.Abs(mean*rate-1) > 0.02 || math.Abs(scv-1) > 0.05 || math.Abs(float64(over)/n-math.Exp(-1)) > 0.01 {
		t.Errorf("the gaps are not exponential of mean 1/rate")
	}
	same, other := &Schedule{Rate: rate, Poisson: true, Seed: 3}, &Schedule{Rate: rate, Poisson: true, Seed: 4}
	if same.At(999) != s.At(999) || other.At(999) == s.At(999) {
		t.Errorf("seed 3 twice: %v, %v; seed 4: %v: want the same schedule for the same seed only", s.At(999), same.At(999), other.At(999))
	}
	for _, d := range []time.Duration{0, time.Millisecond, time.Second, 7 * time.Second} {
		c := s.Count(d)
		if c > 0 && s.At(c-1) >= d || s.At(c) < d {
			t.Errorf("Count(%v) = %d: At(%d) = %v, At(%d) = %v", d, c, c-1, s.At(max(c-1, 0)), c, s.At(c))
		}
	}
}
