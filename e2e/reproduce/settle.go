package reproduce

import (
	"context"
	"errors"
	"time"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
)

// MaxEstimatorWarmup bounds the warm-up of a slice of a row that plans on measured pods: a loop
// that has not settled by then (settler) is measured anyway, and the slice says so
// (Runs.Settled).
const MaxEstimatorWarmup = 60 * time.Second

// SettleQuiet is how long serve must publish nothing and put no window in force, once its
// estimates rest on the slice's own load (SettleWindows), for its loop to count as settled: two of its
// recomputes (--prometheus-interval 2s), so that a plan moving a half-step a recompute
// (optimizer's damping) has stopped.
const SettleQuiet = 4 * time.Second

// settlePoll is how often the warm-up reads serve's metrics.
const settlePoll = 500 * time.Millisecond

// SettleWindows is how many live windows serve's loop must have taken before its estimates rest
// on the slice's own load only: the wait scale's memory (estimate.WaitScaleConfig.Windows'
// default, 3), which starts full of Prometheus's history, the previous row's load.
const SettleWindows = 3

// settler decides when a slice of a row on measured pods may start measuring. Serve starts from
// Prometheus's history, which the slice before it made under another row's plan, and plans on it
// until its windows of this slice's own load replace the history (the wait scale remembers
// SettleWindows; a window in which the plan in force changed is held, its estimates not put in
// force), then moves its plan a half-step a recompute. A fixed 20 s warm-up measured that move
// in some slices (paper preset, `4673825`, 2026-12-07): in bookinfo/B at 200 req/s a closed-loop
// serve first put a window in force 24.5 s after it started and pushed at 24.6, 26.6 and 28.6 s
// (network cost 743 → 372 → 185 → 0 ms·req/s), inside the measured 10 s; in bookinfo/A at 200
// req/s a lata-q serve pushed 759 → 448 at 33 s, after its third live window, though it had
// taken its first at 5 s. So measuring starts once (a) the warm-up has lasted least, (b) serve
// has put in force a window taken when it had taken SettleWindows or more
// (edgeflow_closed_loop_windows_total by held) and (c) serve has published nothing and put no
// window in force for SettleQuiet; or once it has lasted most, unsettled. A change of the plan
// after that is the loop's own steady state on the slice's load, and is measured.
type settler struct {
	least, most, quiet time.Duration

	pubs, taken float64       // serve's publications and windows put in force at the last change
	changed     time.Duration // when either last changed, from the warm-up's start
	ready       bool          // (b)
	started     bool
}

// observe takes serve's counts (edgeflow_xds_publications_total, and its windows held and put
// in force) at elapsed into the warm-up, and says whether the warm-up is over and, if so,
// whether the loop settled.
func (s *settler) observe(elapsed time.Duration, pubs, held, taken float64) (over, settled bool) {
	if !s.started || pubs != s.pubs || taken != s.taken {
		if s.started {
			s.changed = elapsed
		}
		if taken > s.taken && held+taken >= SettleWindows {
			s.ready = true
		}
		s.pubs, s.taken, s.started = pubs, taken, true
	}
	if elapsed >= s.least && s.ready && elapsed-s.changed >= s.quiet {
		return true, true
	}
	return elapsed >= s.most, false
}

// warmUntilSettled sends a's load at rate, unmeasured, until serve s's loop has settled (settler), at
// least least and at most most, and returns how long it ran and whether the loop settled. A
// failed read of serve's metrics counts as no change. The load's own failures are not errors
// here (nothing of it is measured); the run's end is (the context's cause).
func (h *Harness) warmUntilSettled(a App, p Preset, rate float64, s *proc, least, most time.Duration) (time.Duration, bool, error) {
	ctx, stop := context.WithCancel(h.ctx)
	defer stop()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := h.load(ctx, a, loadgen.Config{Rate: rate, Duration: most, Timeout: p.Timeout, Poisson: p.Poisson, Seed: p.Seed<<32 + h.nextLoad()})
		done <- err
	}()
	st := settler{least: least, most: most, quiet: SettleQuiet}
	settled := false
	tick := time.NewTicker(settlePoll)
	defer tick.Stop()
	for {
		select {
		case err := <-done: // the load ended before the rule did: at most, or the run's end
			if h.ctx.Err() != nil {
				return time.Since(start), false, context.Cause(h.ctx)
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				return time.Since(start), false, err
			}
			return time.Since(start), settled, nil
		case <-tick.C:
		}
		m, err := metrics(s.metrics)
		if err != nil {
			continue
		}
		var over bool
		if over, settled = st.observe(time.Since(start), m["edgeflow_xds_publications_total"],
			m[`edgeflow_closed_loop_windows_total{held="true"}`], m[`edgeflow_closed_loop_windows_total{held="false"}`]); over {
			stop()
			<-done // the canceled load's error: nothing of it is measured
			if h.ctx.Err() != nil {
				return time.Since(start), false, context.Cause(h.ctx)
			}
			return time.Since(start), settled, nil
		}
	}
}
