package reproduce

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
)

// The report's statistics, kept so that every figure can be recomputed from reproduction.json
// alone (Recompute):
//
//   - Latencies are kept at a resolution of Tick (10 µs, the JSON's 0.01 ms), each run's
//     successful requests' latencies in reproduction.json (encodeTicks); every figure is
//     computed from those, never from the finer samples the run measured.
//   - A request that timed out (loadgen.Result.Timeouts: failed past its deadline, the preset's
//     Timeout after its intended send time) is a sample at least the timeout: it enters every
//     quantile's count, and a quantile whose rank falls among the timeouts is reported as
//     "≥ timeout" (AtLeast). So a cell with more than 1 % of its samples timed out reports its
//     P99 as "≥ timeout"; with 1 % or fewer, its P99 is a measured latency. The mean counts a
//     timeout as the timeout, a lower bound. Errors other than timeouts are no sample: they are
//     counted apart (Stats.Errors).
//   - A cell's quantiles are nearest-rank over the samples pooled over its runs; MinPooled is the
//     pooled count below which the report flags a P99 as resting on too few samples.

// Tick is the resolution at which the report keeps and computes latencies.
const Tick = 10 * time.Microsecond

// MinPooled is the least number of samples (successful requests and timeouts) pooled over a
// cell's runs for its P99 to rest on at least 100 samples above it; the report flags cells
// under it.
const MinPooled = 10_000

// CollapseP99 and CollapseTimeouts define a collapse cell: one whose pooled P99 is at least
// CollapseP99, or with more than CollapseTimeouts of its samples timed out. Such a cell's
// latency measures how long its queue grew (the length of the run), not the routing: a
// comparison that involves one is listed cell by cell but enters no average.
const (
	CollapseP99      = time.Second
	CollapseTimeouts = 0.01
)

// runData is one run of one cell as the report computes from it.
type runData struct {
	lat      []int64 // successful requests' latencies in ticks, sorted
	timeouts int     // requests that timed out: samples ≥ the timeout
	errors   int     // other errors: no sample
	sum      int64   // Σ lat
}

func (d runData) n() int { return len(d.lat) + d.timeouts }

// toTicks is d at the report's resolution (rounded down).
func toTicks(d time.Duration) int64 { return int64(d / Tick) }

// timeoutsOf is res's timeouts: Result.Timeouts, or, for results recorded before loadgen counted
// them, the errors filed as "timeout" or as a gRPC DeadlineExceeded status.
func timeoutsOf(res *loadgen.Result) int {
	if res.Timeouts > 0 {
		return res.Timeouts
	}
	n := 0
	for k, c := range res.ErrorKinds {
		if k == "timeout" || strings.Contains(k, "DeadlineExceeded") {
			n += c
		}
	}
	return min(n, res.Errors)
}

func dataOf(res *loadgen.Result) runData {
	d := runData{lat: make([]int64, len(res.Latency)), timeouts: timeoutsOf(res)}
	d.errors = res.Errors - d.timeouts
	for i, l := range res.Latency {
		d.lat[i] = toTicks(l)
		d.sum += d.lat[i]
	}
	if !slices.IsSorted(d.lat) {
		slices.Sort(d.lat)
	}
	return d
}

// rankOf is the nearest-rank position (1-based) of quantile q among n samples, as
// loadgen.Samples.Quantile.
func rankOf(q float64, n int) int {
	return min(max(int(math.Ceil(q*float64(n)-1e-9)), 1), n)
}

// quantile is the nearest-rank q-quantile of the runs taken with multiplicity mult (nil: once
// each), in ticks, and whether it falls among the timeouts (then the value is timeout, a
// lower bound). 0, false without samples. O(R·log(n)·log(range)).
func quantile(runs []runData, mult []int, q float64, timeout int64) (int64, bool) {
	m := func(i int) int {
		if mult == nil {
			return 1
		}
		return mult[i]
	}
	n, ok := 0, 0
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for i, r := range runs {
		if m(i) == 0 {
			continue
		}
		n += m(i) * r.n()
		ok += m(i) * len(r.lat)
		if len(r.lat) > 0 {
			lo, hi = min(lo, r.lat[0]), max(hi, r.lat[len(r.lat)-1])
		}
	}
	if n == 0 {
		return 0, false
	}
	rank := rankOf(q, n)
	if rank > ok {
		return timeout, true
	}
	// The smallest value v with at least rank samples ≤ v.
	for lo < hi {
		mid := lo + (hi-lo)/2
		c := 0
		for i, r := range runs {
			if m(i) > 0 {
				k, _ := slices.BinarySearch(r.lat, mid+1)
				c += m(i) * k
			}
		}
		if c >= rank {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, false
}

// meanOf is the mean of the runs (with multiplicity mult; nil: once each) in ticks, a timeout
// counted as timeout; at least says it is a lower bound (some timed out). 0 without samples.
func meanOf(runs []runData, mult []int, timeout int64) (float64, bool) {
	var sum float64
	n, tos := 0, 0
	for i, r := range runs {
		k := 1
		if mult != nil {
			k = mult[i]
		}
		sum += float64(k) * (float64(r.sum) + float64(r.timeouts)*float64(timeout))
		n += k * r.n()
		tos += k * r.timeouts
	}
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), tos > 0
}

// tickMS is t ticks in ms.
func tickMS(t int64) float64 { return ticksMS(float64(t)) }

// ticksMS is t ticks in ms.
func ticksMS(t float64) float64 { return t * float64(Tick) / float64(time.Millisecond) }

// encodeTicks is a run's sorted latencies (ticks) as reproduction.json keeps them:
// base64(deflate(uvarint of each difference from the one before, the first from 0))).
func encodeTicks(lat []int64) string {
	var raw []byte
	prev := int64(0)
	for _, v := range lat {
		raw = binary.AppendUvarint(raw, uint64(v-prev))
		prev = v
	}
	var b bytes.Buffer
	w, _ := flate.NewWriter(&b, flate.BestCompression)
	w.Write(raw)
	w.Close()
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

// decodeTicks reverses encodeTicks; n is the number of latencies expected.
func decodeTicks(s string, n int) ([]int64, error) {
	z, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(flate.NewReader(bytes.NewReader(z)))
	if err != nil {
		return nil, err
	}
	out := make([]int64, 0, n)
	prev := int64(0)
	for len(raw) > 0 {
		d, k := binary.Uvarint(raw)
		if k <= 0 {
			return nil, fmt.Errorf("latencies: bad varint at %d", len(out))
		}
		prev += int64(d)
		out = append(out, prev)
		raw = raw[k:]
	}
	if len(out) != n {
		return nil, fmt.Errorf("latencies: %d decoded, want %d", len(out), n)
	}
	return out, nil
}
