package optimizer

import "time"

// DefaultPlaceBudget is the wall-time budget of Place (see PlaceOptions.Budget).
const DefaultPlaceBudget = 10 * time.Second

// PlaceOptions are the knobs of PlaceWithOptions. The zero value searches without limit.
type PlaceOptions struct {
	// Budget bounds the wall time of the larp policy's search (0: no limit). Building starts
	// may take the first half of it, local search the rest. It is checked before each start
	// is built and every few exact step evaluations of the local search (see
	// budgetCheckEvery); when it runs out, the search stops and the best placement found so
	// far is returned, with Placement.Truncated set. Work already under way when it runs
	// out finishes (one start per worker, one step evaluation per search), and costing the
	// result comes after, so a call can overrun it by that much. A run that was cut short
	// depends on the machine and its load; only one that was not is deterministic. The k8s
	// spread start is always built, so a truncated larp is never worse than k8s-spread.
	Budget time.Duration
	// Steps bounds the exact step evaluations (pod moves, swaps, node exchanges tried) of each
	// of larp's local searches (0: no limit). Unlike Budget it is a count, so a run cut by
	// Steps alone is deterministic: use it where the result must be reproducible. It does not
	// bound the starts, whose work is fixed by the input (at most maxStarts greedy runs).
	Steps int
}

// PlacementCut says how much of larp's search ran when a budget cut it short.
type PlacementCut struct {
	// Starts is the number of starts (greedy runs and the k8s spread) planned; StartsBuilt
	// how many were built before the budget ran out.
	Starts      int `json:"starts" yaml:"starts"`
	StartsBuilt int `json:"starts_built" yaml:"starts_built"`
	// Searches is the number of local searches planned (the best distinct starts);
	// SearchesFinished how many ran until no step improved (or their pass limit).
	Searches         int `json:"searches" yaml:"searches"`
	SearchesFinished int `json:"searches_finished" yaml:"searches_finished"`
	// Passes is the number of local-search passes run, over all searches.
	Passes int `json:"passes" yaml:"passes"`
}

// budgetCheckEvery is how many exact step evaluations a local search makes between two looks
// at the clock: an evaluation re-solves a few transports (microseconds to milliseconds), a
// look at the clock costs tens of nanoseconds.
const budgetCheckEvery = 8

// larpBudget stops larp's search: at a wall-clock deadline (zero: none) or after steps exact
// step evaluations per local search (0: no limit).
// Building starts may take the first half of the wall time (startsBy), so that the local
// search, which is what improves on them, always has the second half.
type larpBudget struct {
	startsBy, deadline time.Time
	steps              int
}

func newLarpBudget(opts PlaceOptions) larpBudget {
	b := larpBudget{steps: opts.Steps}
	if opts.Budget > 0 {
		now := time.Now()
		b.startsBy, b.deadline = now.Add(opts.Budget/2), now.Add(opts.Budget)
	}
	return b
}

// expired says the deadline has passed.
func (b larpBudget) expired() bool { return !b.deadline.IsZero() && time.Now().After(b.deadline) }

// startsExpired says the time for building starts has passed.
func (b larpBudget) startsExpired() bool { return !b.startsBy.IsZero() && time.Now().After(b.startsBy) }

// stepsLeft counts one local search's step evaluations against the budget.
type stepsLeft struct {
	b     larpBudget
	evals int
	cut   bool
}

// spend counts one step evaluation and says whether the search must stop; once it says so,
// it keeps saying so.
func (s *stepsLeft) spend() bool {
	if s.cut {
		return true
	}
	s.evals++
	if s.b.steps > 0 && s.evals > s.b.steps || s.evals%budgetCheckEvery == 0 && s.b.expired() {
		s.cut = true
	}
	return s.cut
}
