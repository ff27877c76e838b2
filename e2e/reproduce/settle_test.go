package reproduce

import (
	"testing"
	"time"
)

// TestSettler runs the settle rule on traces of serve's counts, read every settlePoll.
func TestSettler(t *testing.T) {
	t.Parallel()
	const least, most = 17 * time.Second, 57 * time.Second
	type event struct {
		at                time.Duration
		pubs, held, taken float64
	}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	cases := []struct {
		name    string
		events  []event // the counts from at on (the first at 0)
		wantAt  time.Duration
		settled bool
	}{
		{
			// bookinfo/B, closed-loop, 200 req/s (4673825's serve log, windows as the hold-down
			// has them): the first window held (serve's first plan replaced the previous row's),
			// the second put in force at 24.5 s, then the half-steps at 24.6, 26.6, 28.6; the
			// third held (the plan changed in it), the fourth in force at 44.5.
			name: "the plan moves after the first window in force",
			events: []event{{0, 1, 0, 0}, {ms(10500), 1, 1, 0}, {ms(24500), 1, 1, 1}, {ms(24600), 2, 1, 1},
				{ms(26600), 3, 1, 1}, {ms(28600), 4, 1, 1}, {ms(34500), 4, 2, 1}, {ms(44500), 4, 2, 2}},
			wantAt: ms(48500), settled: true, // the first poll ≥ 44.5 + SettleQuiet
		},
		{
			name:   "lata-q (no hold): the third window, then quiet",
			events: []event{{0, 1, 0, 0}, {ms(5000), 1, 0, 1}, {ms(15000), 1, 0, 2}, {ms(25000), 1, 0, 3}, {ms(25200), 2, 0, 3}},
			wantAt: ms(29500), settled: true,
		},
		{
			name:   "the history's plan stands: the least warm-up",
			events: []event{{0, 1, 0, 0}, {ms(4000), 1, 0, 1}, {ms(8000), 1, 0, 2}, {ms(12000), 1, 0, 3}},
			wantAt: least, settled: true,
		},
		{
			name:   "a window put in force before the third does not settle it",
			events: []event{{0, 1, 0, 0}, {ms(10000), 1, 1, 0}, {ms(20000), 1, 1, 1}},
			wantAt: most, settled: false,
		},
		{
			name:   "no window taken: unsettled at the bound",
			events: []event{{0, 1, 0, 0}},
			wantAt: most, settled: false,
		},
		{
			name:   "held windows only (the plan changes in every one): unsettled",
			events: []event{{0, 1, 0, 0}, {ms(10000), 2, 1, 0}, {ms(20000), 3, 2, 0}, {ms(30000), 4, 3, 0}, {ms(40000), 5, 4, 0}},
			wantAt: most, settled: false,
		},
		{
			name: "a push every 3 s after the third window: unsettled",
			events: func() []event {
				e := []event{{0, 1, 0, 0}, {ms(5000), 1, 0, 1}, {ms(10000), 1, 0, 2}, {ms(15000), 1, 0, 3}}
				for i := 1; i <= 20; i++ {
					e = append(e, event{ms(15000 + 3000*i), float64(1 + i), 0, 3})
				}
				return e
			}(),
			wantAt: most, settled: false,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := settler{least: least, most: most, quiet: SettleQuiet}
			for at := time.Duration(0); at <= 2*most; at += settlePoll {
				var now event
				for _, e := range c.events {
					if e.at <= at {
						now = e
					}
				}
				over, settled := st.observe(at, now.pubs, now.held, now.taken)
				if !over {
					continue
				}
				if at != c.wantAt || settled != c.settled {
					t.Errorf("over at %v, settled %v; want at %v, settled %v", at, settled, c.wantAt, c.settled)
				}
				return
			}
			t.Errorf("never over within %v", 2*most)
		})
	}
}

// TestDescribeWarmups reads the warm-ups of the rows on measured pods only, and counts the
// unsettled ones.
func TestDescribeWarmups(t *testing.T) {
	t.Parallel()
	o := &Outcome{Preset: Presets["paper"]}
	if got := describeWarmups(o); got != "" {
		t.Errorf("no warm-ups recorded: %q, want none", got)
	}
	o.Cells = []*Runs{
		{Cell: Cell{Policy: "closed-loop"}, WarmupSeconds: []float64{23.1, 36.5, 60}, Settled: []bool{true, true, false}},
		{Cell: Cell{Policy: "lata-q"}, WarmupSeconds: []float64{27}, Settled: []bool{true}},
		{Cell: Cell{Policy: "lata-only"}, WarmupSeconds: []float64{3, 3}, Settled: []bool{true, true}},
	}
	want := ": in this run 23.1–60.0 s (median 36.5 s) over 4 slices, 1 of them measured unsettled at the bound"
	if got := describeWarmups(o); got != want {
		t.Errorf("describeWarmups = %q\nwant %q", got, want)
	}
}
