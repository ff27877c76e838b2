package mcf_test

import (
	"fmt"

	"github.com/edgeflow/edgeflow/optimizer/mcf"
)

// Two caller pods with 30 and 70 requests/s, three callee pods that must
// each receive their share; costs are path latencies in ms.
func ExampleSolver_Solve() {
	p := &mcf.Transport{
		Sources: 2, Sinks: 3,
		Cost: []int64{
			1, 10, 20, // caller 0 is next to callee 0
			20, 10, 1, // caller 1 is next to callee 2
		},
		Supply: []int64{30, 70},
		Demand: []int64{40, 30, 30},
	}
	s := mcf.NewSolver()
	flows, cost, err := s.Solve(p, nil)
	if err != nil {
		panic(err)
	}
	for _, f := range flows {
		fmt.Printf("caller %d -> callee %d: %d\n", f.Source, f.Sink, f.Amount)
	}
	fmt.Println("cost", cost)
	// Output:
	// caller 0 -> callee 0: 30
	// caller 1 -> callee 0: 10
	// caller 1 -> callee 1: 30
	// caller 1 -> callee 2: 30
	// cost 560
}
