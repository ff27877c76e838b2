package mcf

import (
	"fmt"
	"testing"
)

// BenchmarkDense times Solve on the lemon_tp.cc instances (seed 1, maxcost
// 1000) with a reused, warmed-up Solver, the way benchsolver compares it
// with LEMON. The instance is generated outside the timer.
func BenchmarkDense(b *testing.B) {
	for _, mode := range []string{"rand", "uniform"} {
		for _, n := range []int{5, 50, 200, 500, 1000, 2000} {
			b.Run(fmt.Sprintf("%s/n=%d", mode, n), func(b *testing.B) {
				p := denseInstance(mode, n, 1)
				s := NewSolver()
				dst, _, err := s.Solve(p, nil)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					dst, _, _ = s.Solve(p, dst)
				}
				b.StopTimer()
				b.ReportMetric(float64(s.ns.pivots), "pivots/op")
				b.ReportMetric(float64(s.ns.workspaceBytes()), "workspace-B")
			})
		}
	}
}
