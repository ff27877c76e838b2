package reproduce

import (
	"fmt"
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
)

// policyColors: one per policy, in Policies order.
var policyColors = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0x7f, 0x7f, 0x7f, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0xff, 0x7f, 0x0e, 0xff},
	{0x2c, 0xa0, 0x2c, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
}

// writePlots draws one latency CDF per application × scenario at the middle rate, every policy
// on one figure (log latency axis), as PNG files in dir; it returns their names.
func writePlots(o *Outcome, dir string) ([]string, error) {
	var names []string
	mid := o.middle()
	for _, st := range o.Setups {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s, scenario %s, %g req/s: latency CDF", st.App, st.Scenario, mid)
		p.X.Label.Text = "latency (ms, log scale)"
		p.Y.Label.Text = "fraction of requests"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Legend.Top, p.Legend.Left = false, false
		p.Legend.XOffs, p.Legend.YOffs = -vg.Points(5), vg.Points(5)
		p.Add(plotter.NewGrid())
		drawn := 0
		for i, pol := range Policies {
			r := o.Find(Cell{App: st.App, Scenario: st.Scenario, Policy: pol.Name, RPS: mid})
			if r == nil {
				continue
			}
			pts := cdf(loadgen.Merge(r.Results...).Latency, 400)
			if len(pts) == 0 {
				continue
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return nil, err
			}
			l.Color = policyColors[i%len(policyColors)]
			l.Width = vg.Points(1.5)
			if pol.LARP {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(2)}
			}
			p.Add(l)
			p.Legend.Add(pol.Name, l)
			drawn++
		}
		if drawn == 0 {
			continue
		}
		p.Legend.Top = false
		p.Legend.YPosition = draw.PosBottom
		name := fmt.Sprintf("reproduction-%s-%s.png", st.App, st.Scenario)
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, name)); err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return names, nil
}

// cdf returns about n points of the empirical CDF of sorted samples (in ms), always including
// the tail's last samples.
func cdf(s loadgen.Samples, n int) plotter.XYs {
	if len(s) == 0 {
		return nil
	}
	var pts plotter.XYs
	step := max(len(s)/n, 1)
	for i := 0; i < len(s); i += step {
		pts = append(pts, plotter.XY{X: max(ms(s[i]), 0.01), Y: float64(i+1) / float64(len(s))})
	}
	for i := max(len(s)-20, 0); i < len(s); i++ {
		pts = append(pts, plotter.XY{X: max(ms(s[i]), 0.01), Y: float64(i+1) / float64(len(s))})
	}
	return pts
}
