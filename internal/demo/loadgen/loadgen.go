// Package loadgen is an open-loop load generator in the manner of wrk2. Request i is due at
// start + i/rate (constant rate; or at Poisson arrival times of that rate, Config.Poisson)
// whether or not earlier requests have finished, and its latency is
// measured from that intended send time, not from when it was actually sent, so a server that
// stalls cannot hide the stall by slowing the generator down (no coordinated omission).
// Latencies are kept as exact samples; percentiles are nearest-rank over the sorted samples.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"time"
)

// Request sends request number seq and returns when its response (or error) is in. It is called
// concurrently from many goroutines. ctx carries the per-request timeout.
type Request func(ctx context.Context, seq int) error

// Config describes one run.
type Config struct {
	// Rate is the constant request rate, per second (> 0).
	Rate float64
	// Warmup is sent at the same rate before the measured period and not recorded.
	Warmup time.Duration
	// Duration is the measured period (> 0): requests due in [Warmup, Warmup+Duration) are
	// recorded.
	Duration time.Duration
	// Timeout bounds each request (from its intended send time); a request that times out
	// counts as an error and in Result.Timeouts. 0 means none.
	Timeout time.Duration
	// Poisson sends at the arrival times of a Poisson process of rate Rate (independent
	// exponential gaps, drawn from Seed) instead of every 1/Rate: the arrivals of many
	// independent clients, which a constant rate is not. A pod throttled by a CPU quota or a
	// single queue pays for the bursts a constant rate never sends.
	Poisson bool
	// Seed seeds the Poisson gaps: the same seed sends the same schedule.
	Seed uint64
}

// Schedule is the send schedule: request i is due at offset At(i) from the start. The zero
// Poisson is the constant rate; a Poisson schedule is drawn as it is read, so one Schedule is
// for one goroutine.
type Schedule struct {
	// Rate is in requests per second.
	Rate float64
	// Poisson draws exponential gaps of mean 1/Rate from Seed (Config.Poisson).
	Poisson bool
	Seed    uint64

	rng *rand.Rand
	at  []time.Duration // Poisson: the offsets drawn so far
	sum float64         // Poisson: the last offset drawn, in seconds (unrounded)
}

// At returns the intended send offset of request i: i/Rate seconds, exactly (no drift
// accumulates however many requests are sent); under Poisson the sum of i+1 exponential gaps
// (the first request is due after one gap, as a Poisson process's first arrival).
func (s *Schedule) At(i int) time.Duration {
	if !s.Poisson {
		return time.Duration(math.Round(float64(i) * float64(time.Second) / s.Rate))
	}
	if s.rng == nil {
		s.rng = rand.New(rand.NewPCG(s.Seed, 0x10ad))
	}
	for len(s.at) <= i {
		s.sum += s.rng.ExpFloat64() / s.Rate
		s.at = append(s.at, time.Duration(math.Round(s.sum*float64(time.Second))))
	}
	return s.at[i]
}

// Count returns the number of requests due in [0, d): ⌈d·Rate⌉ (up to rounding of At) at a
// constant rate; under Poisson, as many as the drawn arrivals before d.
func (s *Schedule) Count(d time.Duration) int {
	n := int(math.Ceil(d.Seconds() * s.Rate))
	for n > 0 && s.At(n-1) >= d {
		n--
	}
	for s.At(n) < d {
		n++
	}
	return n
}

// Result is the outcome of the measured period of a run.
type Result struct {
	// Sent is the number of requests due in the measured period; OK + Errors == Sent.
	Sent, OK, Errors int
	// Timeouts counts the errors of requests that failed once their own deadline (intended
	// send time + Config.Timeout) had passed, whatever error the request returned (a gRPC call
	// returns a status, not context.DeadlineExceeded): their latency is at least the timeout.
	// Timeouts ≤ Errors. Results recorded before the field existed have 0 here, and their
	// timeouts only under ErrorKinds.
	Timeouts int
	// ErrorKinds counts errors by message (the first 10 distinct ones; the rest under "other");
	// a timeout counts as "timeout".
	ErrorKinds map[string]int
	// Latency holds the successful requests' latencies, from intended send time to response.
	Latency Samples
	// Elapsed runs from the intended send time of the first measured request until the last
	// measured request finished.
	Elapsed time.Duration
	// MaxSendLag is the largest delay between a request's intended and actual send time — how
	// far the generator itself fell behind (it does not change the measured latencies).
	MaxSendLag time.Duration
}

// Achieved returns the rate of successful responses over Elapsed, per second.
func (r *Result) Achieved() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.OK) / r.Elapsed.Seconds()
}

// Run sends requests at cfg.Rate for cfg.Warmup+cfg.Duration and returns the measured period's
// result once every request has finished. Each request runs in its own goroutine, owned by Run,
// under a context derived from ctx. If ctx is done early, Run stops sending, waits for the
// requests in flight (which see the cancellation) and returns ctx's error with no result.
func Run(ctx context.Context, cfg Config, do Request) (*Result, error) {
	if !(cfg.Rate > 0) || math.IsInf(cfg.Rate, 0) {
		return nil, fmt.Errorf("loadgen: rate must be positive, got %v", cfg.Rate)
	}
	if cfg.Duration <= 0 || cfg.Warmup < 0 || cfg.Timeout < 0 {
		return nil, fmt.Errorf("loadgen: bad durations (warmup %v, duration %v, timeout %v)", cfg.Warmup, cfg.Duration, cfg.Timeout)
	}
	sched := &Schedule{Rate: cfg.Rate, Poisson: cfg.Poisson, Seed: cfg.Seed}
	first := sched.Count(cfg.Warmup)
	end := sched.Count(cfg.Warmup + cfg.Duration)

	rec := &recorder{lat: make([]time.Duration, 0, end-first), kinds: map[string]int{}}
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	start := time.Now()
	var maxLag time.Duration
	for i := 0; i < end; i++ {
		due := start.Add(sched.At(i))
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		if i >= first {
			maxLag = max(maxLag, time.Since(due))
		}
		wg.Add(1)
		go func(i int, due time.Time) {
			defer wg.Done()
			rctx, cancel := ctx, context.CancelFunc(func() {})
			if cfg.Timeout > 0 {
				rctx, cancel = context.WithDeadline(ctx, due.Add(cfg.Timeout))
			}
			err := do(rctx, i)
			done := time.Now()
			timedOut := err != nil && cfg.Timeout > 0 && errors.Is(rctx.Err(), context.DeadlineExceeded)
			cancel()
			if i >= first {
				rec.add(done.Sub(due), done, err, timedOut)
			}
		}(i, due)
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res := rec.result()
	res.Sent = end - first
	res.MaxSendLag = maxLag
	if res.Sent > 0 {
		res.Elapsed = rec.last.Sub(start.Add(sched.At(first)))
	}
	return res, nil
}

type recorder struct {
	mu    sync.Mutex
	lat   []time.Duration
	errs  int
	tos   int
	kinds map[string]int
	last  time.Time
}

// add records one measured request; timedOut says it failed past its own deadline.
func (r *recorder) add(lat time.Duration, done time.Time, err error, timedOut bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if done.After(r.last) {
		r.last = done
	}
	if err == nil {
		r.lat = append(r.lat, lat)
		return
	}
	r.errs++
	msg := err.Error()
	if timedOut {
		r.tos++
	}
	if timedOut || errors.Is(err, context.DeadlineExceeded) {
		msg = "timeout"
	}
	if _, ok := r.kinds[msg]; !ok && len(r.kinds) >= 10 {
		msg = "other"
	}
	r.kinds[msg]++
}

func (r *recorder) result() *Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return &Result{OK: len(r.lat), Errors: r.errs, Timeouts: r.tos, ErrorKinds: r.kinds, Latency: NewSamples(r.lat)}
}

// Samples are latencies sorted in increasing order.
type Samples []time.Duration

// NewSamples sorts a copy of d.
func NewSamples(d []time.Duration) Samples {
	s := append(Samples(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}

// Quantile returns the nearest-rank q-quantile (0 < q ≤ 1): the smallest sample such that at
// least a fraction q of the samples are ≤ it; q ≤ 0 gives the minimum. It returns 0 when there
// are no samples. Exact, no interpolation; O(1).
func (s Samples) Quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	// The epsilon keeps q·n that should be an integer (0.07·100) from rounding up past it.
	rank := int(math.Ceil(q*float64(len(s)) - 1e-9))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// Mean returns the arithmetic mean, or 0 without samples.
func (s Samples) Mean() time.Duration {
	if len(s) == 0 {
		return 0
	}
	var sum float64
	for _, d := range s {
		sum += float64(d)
	}
	return time.Duration(sum / float64(len(s)))
}

// Max returns the largest sample, or 0.
func (s Samples) Max() time.Duration {
	if len(s) == 0 {
		return 0
	}
	return s[len(s)-1]
}

// Merge combines the results of several runs (e.g. interleaved slices of one experiment) into
// one: counts and Elapsed add up, the latency samples are pooled, MaxSendLag is the largest.
// Nil results are skipped.
func Merge(results ...*Result) *Result {
	out := &Result{ErrorKinds: map[string]int{}}
	var lat []time.Duration
	for _, r := range results {
		if r == nil {
			continue
		}
		out.Sent += r.Sent
		out.OK += r.OK
		out.Errors += r.Errors
		out.Timeouts += r.Timeouts
		out.Elapsed += r.Elapsed
		out.MaxSendLag = max(out.MaxSendLag, r.MaxSendLag)
		for k, n := range r.ErrorKinds {
			out.ErrorKinds[k] += n
		}
		lat = append(lat, r.Latency...)
	}
	out.Latency = NewSamples(lat)
	return out
}
