package reproduce

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
)

// Health is what a slice's surroundings did while its load ran (warm-up included), measured
// around it: the machine's CPU, the delay emulator, the load generator and the network's RTT.
// A slice outside HealthBounds is re-run (Preset.Reruns); the report shows every cell's.
type Health struct {
	// CPUIdle and CPUSteal are the machine's idle and stolen (hypervisor) share of its CPU time
	// over the load (/proc/stat; idle includes iowait).
	CPUIdle  float64 `json:"cpu_idle"`
	CPUSteal float64 `json:"cpu_steal"`
	// ReleaseLagMeanUS is how late nqdelay released the node pairs' packets after their due
	// time, on average over the packets of the load; ReleaseLagP99US the worst pair's 99th
	// percentile over its last 4,096 packets when the load ended.
	ReleaseLagMeanUS float64 `json:"release_lag_mean_us"`
	ReleaseLagP99US  float64 `json:"release_lag_p99_us"`
	// SendLagMaxMS is the load generator's largest lag behind a request's intended send time.
	SendLagMaxMS float64 `json:"send_lag_max_ms"`
	// PingPair's RTT during the load (PingMedianMS, PingMinMS over Pings echoes, 5 a second)
	// against its configured PingWantMS: the pair of the largest configured RTT.
	PingPair     string  `json:"ping_pair,omitempty"`
	PingMedianMS float64 `json:"ping_median_ms"`
	PingMinMS    float64 `json:"ping_min_ms"`
	PingWantMS   float64 `json:"ping_configured_ms"`
	Pings        int     `json:"pings"`
	// Problems name the bounds missed (HealthBounds); none: a healthy slice.
	Problems []string `json:"problems,omitempty"`
}

// HealthBounds are the limits of a healthy slice. The delay's and the ping's are the testbed's
// own accuracy on an idle machine (e2e/testbed: within ~0.1–0.3 ms, a 5-ping minimum within
// 1.8 ms in a busy CI run); the CPU's leaves the emulator and the pods a core's tenth.
var HealthBounds = struct {
	MinCPUIdle                    float64
	MaxReleaseLagMeanUS           float64
	MaxReleaseLagP99US            float64
	MaxSendLagMS                  float64
	MaxPingExcessMS, MaxPingShort float64 // median − want ≤ max(MaxPingExcessMS, 10 % of want); min ≥ want − MaxPingShort
}{MinCPUIdle: 0.05, MaxReleaseLagMeanUS: 500, MaxReleaseLagP99US: 5000, MaxSendLagMS: 50, MaxPingExcessMS: 1, MaxPingShort: 0.5}

// check fills h.Problems from the bounds.
func (h *Health) check() {
	b := HealthBounds
	h.Problems = nil
	add := func(format string, args ...any) { h.Problems = append(h.Problems, fmt.Sprintf(format, args...)) }
	if h.CPUIdle < b.MinCPUIdle {
		add("CPU idle %.0f %% < %.0f %%", 100*h.CPUIdle, 100*b.MinCPUIdle)
	}
	if h.ReleaseLagMeanUS > b.MaxReleaseLagMeanUS {
		add("delay release lag mean %.0f µs > %.0f µs", h.ReleaseLagMeanUS, b.MaxReleaseLagMeanUS)
	}
	if h.ReleaseLagP99US > b.MaxReleaseLagP99US {
		add("delay release lag p99 %.0f µs > %.0f µs", h.ReleaseLagP99US, b.MaxReleaseLagP99US)
	}
	if h.SendLagMaxMS > b.MaxSendLagMS {
		add("send lag %.1f ms > %.0f ms", h.SendLagMaxMS, b.MaxSendLagMS)
	}
	switch {
	case h.Pings == 0 && h.PingPair != "":
		add("no ping %s answered", h.PingPair)
	case h.Pings > 0 && h.PingMedianMS-h.PingWantMS > max(b.MaxPingExcessMS, 0.1*h.PingWantMS):
		add("ping %s median %.2f ms, configured %.0f ms", h.PingPair, h.PingMedianMS, h.PingWantMS)
	case h.Pings > 0 && h.PingMinMS < h.PingWantMS-b.MaxPingShort:
		add("ping %s min %.2f ms < configured %.0f ms", h.PingPair, h.PingMinMS, h.PingWantMS)
	}
}

func (h Health) String() string {
	s := fmt.Sprintf("CPU idle %.0f %% (steal %.1f %%), release lag mean %.0f µs p99 %.0f µs, send lag ≤ %.1f ms",
		100*h.CPUIdle, 100*h.CPUSteal, h.ReleaseLagMeanUS, h.ReleaseLagP99US, h.SendLagMaxMS)
	if h.PingPair != "" {
		s += fmt.Sprintf(", ping %s median %.2f min %.2f ms (configured %g, %d echoes)", h.PingPair, h.PingMedianMS, h.PingMinMS, h.PingWantMS, h.Pings)
	}
	if len(h.Problems) > 0 {
		s += "; UNHEALTHY: " + strings.Join(h.Problems, "; ")
	}
	return s
}

// cpuTimes are /proc/stat's first line: the machine's CPU time by kind, in clock ticks.
type cpuTimes struct{ idle, steal, total float64 }

func readCPU() (cpuTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuTimes{}, fmt.Errorf("/proc/stat: empty")
	}
	return parseCPU(sc.Text())
}

// parseCPU reads "cpu user nice system idle iowait irq softirq steal guest guest_nice" (guest
// time is in user's already, so it is not added again).
func parseCPU(line string) (cpuTimes, error) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var v [8]float64
	for i := range v {
		x, err := strconv.ParseFloat(f[i+1], 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("/proc/stat: %q: %w", line, err)
		}
		v[i] = x
	}
	t := cpuTimes{idle: v[3] + v[4], steal: v[7]}
	for _, x := range v {
		t.total += x
	}
	return t, nil
}

// healthProbe measures a slice's health while its load runs: start before the load, end after.
type healthProbe struct {
	h     *Harness
	cpu   cpuTimes
	delay map[[2]string]float64 // pair → lateness sum, µs
	count map[[2]string]int64
	pair  [2]string
	pings chan []float64
	stop  context.CancelFunc
	err   []string
}

// startHealth reads the counters and starts pinging the pair of the largest configured RTT for
// up to d.
func (h *Harness) startHealth(d time.Duration) *healthProbe {
	p := &healthProbe{h: h, delay: map[[2]string]float64{}, count: map[[2]string]int64{}, pings: make(chan []float64, 1)}
	var err error
	if p.cpu, err = readCPU(); err != nil {
		p.err = append(p.err, err.Error())
	}
	if st, err := h.tb.DelayStats(); err != nil {
		p.err = append(p.err, err.Error())
	} else {
		for k, s := range st {
			p.delay[k], p.count[k] = s.LateSumUS, s.Packets
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(h.rtt), func(a, b [2]string) int { return cmp.Compare(a[0]+a[1], b[0]+b[1]) }) {
		if p.pair == ([2]string{}) || h.rtt[k] > h.rtt[p.pair] {
			p.pair = k
		}
	}
	ctx, cancel := context.WithCancel(h.ctx)
	p.stop = cancel
	go func() { // ends when ping ends: after its count (about d), or killed when ctx is done
		var rtts []float64
		defer func() { p.pings <- rtts }()
		if p.pair == ([2]string{}) {
			return
		}
		count := max(1, int(d/(200*time.Millisecond)))
		cmd := h.tb.Exec(p.pair[0], "ping", "-n", "-c", strconv.Itoa(count), "-i", "0.2", "-W", "2", h.tb.NodeIP(p.pair[1]))
		var out strings.Builder
		cmd.Stdout = &out
		if cmd.Err != nil || cmd.Start() != nil {
			return
		}
		kill := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
		_ = cmd.Wait() // killed: the echoes so far still count
		kill()
		for _, m := range pingTime.FindAllStringSubmatch(out.String(), -1) {
			v, _ := strconv.ParseFloat(m[1], 64)
			rtts = append(rtts, v)
		}
	}()
	return p
}

// end reads the counters again, waits for the pings, and returns the slice's health.
func (p *healthProbe) end(res *loadgen.Result) Health {
	defer p.stop()
	var hl Health
	if res != nil {
		hl.SendLagMaxMS = ms(res.MaxSendLag)
	}
	if cpu, err := readCPU(); err == nil && cpu.total > p.cpu.total && len(p.err) == 0 {
		d := cpu.total - p.cpu.total
		hl.CPUIdle, hl.CPUSteal = (cpu.idle-p.cpu.idle)/d, (cpu.steal-p.cpu.steal)/d
	} else if err != nil {
		p.err = append(p.err, err.Error())
	}
	if st, err := p.h.tb.DelayStats(); err != nil {
		p.err = append(p.err, err.Error())
	} else {
		var sum float64
		var n int64
		for k, s := range st {
			sum += s.LateSumUS - p.delay[k]
			n += s.Packets - p.count[k]
			hl.ReleaseLagP99US = max(hl.ReleaseLagP99US, s.LastP99US)
		}
		if n > 0 {
			hl.ReleaseLagMeanUS = sum / float64(n)
		}
	}
	rtts := <-p.pings
	if p.pair != ([2]string{}) {
		hl.PingPair, hl.PingWantMS = p.pair[0]+"–"+p.pair[1], p.h.rtt[p.pair]
		if len(rtts) > 0 {
			slices.Sort(rtts)
			hl.PingMedianMS, hl.PingMinMS, hl.Pings = rtts[len(rtts)/2], rtts[0], len(rtts)
		}
	}
	hl.check()
	for _, e := range p.err {
		hl.Problems = append(hl.Problems, "not measured: "+e)
	}
	return hl
}

// writeHealth is the report's table of the slices' health, a row per cell: how many of its runs
// were kept unhealthy (every re-run failed too) and how many re-runs it took, and the worst of
// each measure over its runs. Nothing when no slice's health was measured.
func writeHealth(b *strings.Builder, o *Outcome) {
	if !slices.ContainsFunc(o.Cells, func(r *Runs) bool { return len(r.Health) > 0 }) {
		return
	}
	bd := HealthBounds
	fmt.Fprintf(b, "\n## Slice health\n\nMeasured while each slice's load ran (health.go): the machine's CPU idle (bound ≥ %.0f %%), the delay's "+
		"release lag (mean ≤ %.0f µs, the worst pair's p99 ≤ %.0f µs), the load generator's send lag (≤ %.0f ms), and pings across the pair of the "+
		"largest RTT (median within max(%.0f ms, 10 %%) above the configured RTT, none %.1f ms below it). An unhealthy slice is run again, "+
		"up to %d times (the preset's re-runs); \"unhealthy kept\" counts runs whose every try missed a bound. Worst over the runs:\n\n",
		100*bd.MinCPUIdle, bd.MaxReleaseLagMeanUS, bd.MaxReleaseLagP99US, bd.MaxSendLagMS, bd.MaxPingExcessMS, bd.MaxPingShort, o.Preset.reruns())
	b.WriteString("| app | scenario | policy | req/s | runs | unhealthy kept | re-runs | CPU idle min | steal max | release lag mean max µs | p99 max µs | send lag max ms | ping median max − configured ms | problems |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range o.Cells {
		if len(r.Health) == 0 {
			continue
		}
		idle, steal, lag, p99, send, ping := math.Inf(1), 0.0, 0.0, 0.0, 0.0, math.Inf(-1)
		unhealthy, reruns := 0, 0
		problems := map[string]bool{}
		for i, h := range r.Health {
			idle, steal = min(idle, h.CPUIdle), max(steal, h.CPUSteal)
			lag, p99, send = max(lag, h.ReleaseLagMeanUS), max(p99, h.ReleaseLagP99US), max(send, h.SendLagMaxMS)
			if h.Pings > 0 {
				ping = max(ping, h.PingMedianMS-h.PingWantMS)
			}
			if len(h.Problems) > 0 {
				unhealthy++
				for _, p := range h.Problems { // by what missed its bound: its first two words
					f := strings.Fields(p)
					problems[strings.Join(f[:min(2, len(f))], " ")] = true
				}
			}
			if i < len(r.Attempts) {
				reruns += r.Attempts[i] - 1
			}
		}
		pingText := "–"
		if !math.IsInf(ping, -1) {
			pingText = fmt.Sprintf("%+.2f", ping)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %g | %d | %d | %d | %.0f %% | %.1f %% | %.0f | %.0f | %.1f | %s | %s |\n", r.App, r.Scenario, r.Policy, r.RPS,
			len(r.Health), unhealthy, reruns, 100*idle, 100*steal, lag, p99, send, pingText, strings.Join(slices.Sorted(maps.Keys(problems)), ", "))
	}
}
