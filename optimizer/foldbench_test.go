package optimizer

import "testing"

// BenchmarkPlanLATAQFold: lata-q on the mesh of BenchmarkPlanMesh with every service at half
// its capacity, without the thin-band fold (share 0) and with the commands' default: what the
// fold's scan and, where it folds, its two evaluations add to a plan.
func BenchmarkPlanLATAQFold(b *testing.B) {
	top := meshTopology(1, 100, 200, 10, 2)
	m, err := Compile(top, Options{})
	if err != nil {
		b.Fatal(err)
	}
	for i := range top.Services {
		if i == 0 || !(m.Services[i].Load > 0) {
			continue
		}
		mu := 2 * m.Services[i].Load / m.Services[i].TotalWeight()
		top.Services[i].CapacityRPS = &mu
	}
	for _, c := range []struct {
		name  string
		share float64
	}{{"share=0", 0}, {"share=0.05", DefaultMinBandShare}} {
		m, err := Compile(top, Options{MinBandShare: c.share})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Plan(m, LATAQ); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
