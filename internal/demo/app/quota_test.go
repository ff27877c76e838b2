package app

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/optimizer"
)

func newQuota(t *testing.T, limit float64, period time.Duration) *cpuQuota {
	t.Helper()
	q, err := newCPUQuota(limit, period)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestCPUQuotaRun: work within a period's budget runs at once; work past it waits for the next
// period, throttled, and goes on there; two requests of one period share its budget.
func TestCPUQuotaRun(t *testing.T) {
	t0 := time.Unix(1000, 0) // a period's start (100 ms periods)
	ms := time.Millisecond
	for _, c := range []struct {
		name          string
		runs          [][2]time.Duration // start offset, work
		finish, throt time.Duration      // of the last run
	}{
		{"within the budget", [][2]time.Duration{{0, 8 * ms}}, 8 * ms, 0},
		{"the budget to the last nanosecond", [][2]time.Duration{{50 * ms, 10 * ms}}, 60 * ms, 0},
		// 10 ms a period: 10 in the first, throttled 90, 10 in the second, throttled 90, 5.
		{"throttled twice", [][2]time.Duration{{0, 25 * ms}}, 205 * ms, 180 * ms},
		// The first takes 8 of the 10 ms; the second runs 2, waits to 100 ms, runs 6.
		{"two share a period", [][2]time.Duration{{0, 8 * ms}, {1 * ms, 8 * ms}}, 106 * ms, 97 * ms},
		// Work that starts near a period's end runs on into the next at once: its wall time,
		// not the budget, ended the first part.
		{"across a period's end", [][2]time.Duration{{95 * ms, 8 * ms}}, 103 * ms, 0},
		// A request in a later period has that period's whole budget.
		{"a later period", [][2]time.Duration{{0, 10 * ms}, {130 * ms, 10 * ms}}, 140 * ms, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := newQuota(t, 0.1, 100*ms)
			var finish time.Time
			var throttled time.Duration
			for _, r := range c.runs {
				finish, throttled = q.run(t0.Add(r[0]), r[1])
			}
			if got := finish.Sub(t0); got != c.finish || throttled != c.throt {
				t.Errorf("last run finished at +%v, throttled %v; want +%v, %v", got, throttled, c.finish, c.throt)
			}
		})
	}
}

// TestCPUQuotaCapsThroughput: a pod of 4 workers, 5 ms a request, limited to 0.5 cores serves
// at most 100 req/s however many arrive (200 req/s offered: the queue grows by 100 a second),
// and a load under the limit (50 req/s, evenly spaced) is never throttled: every request
// takes its 5 ms.
func TestCPUQuotaCapsThroughput(t *testing.T) {
	t0 := time.Unix(2000, 0)
	const service = 5 * time.Millisecond
	for _, c := range []struct {
		rate          float64
		wantPerSecond float64 // completions a second, over the run's 10 s
		wantMaxWait   time.Duration
	}{{200, 100, -1}, {50, 50, 0}} {
		q := newWorkerQueue(4)
		quota := newQuota(t, 0.5, DefaultCPUPeriod)
		gap := time.Duration(float64(time.Second) / c.rate)
		end := t0.Add(10 * time.Second)
		done := 0
		var maxWait time.Duration
		for i := 0; ; i++ {
			arrival := t0.Add(time.Duration(i) * gap)
			if !arrival.Before(end) {
				break
			}
			_, finish, cpu := admitLimited(q, nil, quota, arrival, service)
			if cpu != service {
				t.Fatalf("rate %v: request %d charged %v of CPU; want its service time %v", c.rate, i, cpu, service)
			}
			if finish.Before(end) {
				done++
			}
			maxWait = max(maxWait, finish.Sub(arrival)-service)
		}
		perSecond := float64(done) / 10
		if math.Abs(perSecond-c.wantPerSecond) > 0.02*c.wantPerSecond {
			t.Errorf("rate %v req/s: %v completions a second; want %v ± 2 %%", c.rate, perSecond, c.wantPerSecond)
		}
		if c.wantMaxWait >= 0 && maxWait > c.wantMaxWait {
			t.Errorf("rate %v req/s, under the limit: a request waited %v beyond its service time; want none", c.rate, maxWait)
		}
	}
}

// TestPodRejectsBadCPULimit: a CPU limit that is negative, NaN or infinite, or a negative
// period, is refused by name.
func TestPodRejectsBadCPULimit(t *testing.T) {
	for _, c := range []struct {
		limit  float64
		period time.Duration
		want   string
	}{
		{-1, 0, "CPU limit must be positive and finite, got -1"},
		{math.NaN(), 0, "got NaN"},
		{math.Inf(1), 0, "got +Inf"},
		{0.5, -time.Millisecond, "CPU period must be positive, got -1ms"},
	} {
		_, err := NewPod(Config{Name: "p", Workers: 1, CPULimit: c.limit, CPUPeriod: c.period})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "pod p") {
			t.Errorf("limit %v, period %v: error %v; want one naming pod p and %q", c.limit, c.period, err, c.want)
		}
	}
}

// TestQuotaModelBoundsTheQuota: lata-q's model of a CPU-limited pod (optimizer's podQueue: the
// request's CPU s = limit/μ, then Erlang C's wait over c = ⌊μ·100 ms⌋ slots of μ/c) is at or
// above the mean sojourn of this package's quota (cpuQuota, in virtual time: no sleeping) at
// every load from 10 to 90 % of μ, for the paper preset's called pod (100m, 0.8 ms fixed + 0.3
// ms exponential of work a request, 2 workers) under Poisson arrivals, 60,000 requests a load.
// This is the simulation optimizer/quota.go cites.
func TestQuotaModelBoundsTheQuota(t *testing.T) {
	const (
		limit   = 0.1
		fixed   = 800 * time.Microsecond
		mean    = 1100 * time.Microsecond
		workers = 2
		n       = 60_000
	)
	mu := limit / mean.Seconds()
	for _, rho := range []float64{0.1, 0.2, 0.36, 0.5, 0.6, 0.74, 0.83, 0.9} {
		q, err := newCPUQuota(limit, DefaultCPUPeriod)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, uint64(rho*100)))
		lambda := rho * mu
		free := make([]time.Time, workers)
		at := time.Unix(1_800_000_000, 0)
		for i := range free {
			free[i] = at
		}
		var sum time.Duration
		for range n {
			at = at.Add(time.Duration(rng.ExpFloat64() / lambda * float64(time.Second)))
			work := fixed + time.Duration(rng.ExpFloat64()*float64(mean-fixed))
			k := 0
			for i := range free {
				if free[i].Before(free[k]) {
					k = i
				}
			}
			start := at
			if free[k].After(start) {
				start = free[k]
			}
			done, _ := q.run(start, work)
			free[k] = done
			sum += done.Sub(at)
		}
		sim := (sum / n).Seconds() * 1000
		model := 1000 * optimizer.QuotaSojourn(lambda, mu, 1000*limit)
		mm1 := 1000 / (mu - lambda)
		t.Logf("ρ %.2f: quota simulated %.2f ms, the model %.2f ms, M/M/1 %.2f ms", rho, sim, model, mm1)
		if model < sim-0.02 {
			t.Errorf("ρ %.2f: the model's %.2f ms is under the simulated quota's %.2f ms", rho, model, sim)
		}
	}
}
