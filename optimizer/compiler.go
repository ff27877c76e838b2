package optimizer

import (
	"maps"
	"weak"
)

// Compiler compiles a stream of topologies, each from the previous one where it can (the
// incremental compile: see incremental.go), so that a change to one latency pair, rate or
// service's pods compiles only what it touches. Its results are what Compile gives. A Compiler
// is not safe for concurrent use.
type Compiler struct {
	// Options as for Compile.
	Options Options

	st compileState
}

// Compiled is one topology compiled by a Compiler: immutable, shared by every reader.
type Compiled struct {
	// Model is the compiled topology (Model.Topology is the topology).
	Model *Model
	// Options are the options it was compiled with.
	Options Options
	// Changed says whether the topology differs in anything from the one compiled before it
	// (always true for the first, and after a compile in full).
	Changed bool

	base           weak.Pointer[Topology] // the topology recompiled from (zero: in full)
	podsChanged    []int                  // the services whose pods differ from base's
	latencyChanged bool                   // a latency differs from base's
}

// Compile compiles t, from the previous topology when only numbers and some services' pods
// differ; an error is Compile's (and the previous topology stays the base of the next).
func (c *Compiler) Compile(t *Topology) (*Compiled, error) {
	if c.st.top != nil && sameOptions(c.st.opts, c.Options) {
		if same, podsChanged := sameStructure(c.st.top, t); same {
			if m, latencyChanged, ok := c.st.recompile(t, podsChanged, c.Options); ok {
				cm := &Compiled{Model: m, Options: c.Options, base: weak.Make(c.st.top), podsChanged: podsChanged, latencyChanged: latencyChanged,
					Changed: len(podsChanged) > 0 || latencyChanged || !sameNumbers(c.st.top, t) || !sameExtras(c.st.top, t)}
				c.st.remember(t, m, false, podsChanged)
				c.st.opts = c.Options
				return cm, nil
			}
		}
	}
	m, err := Compile(t, c.Options)
	if err != nil {
		return nil, err
	}
	c.st.remember(t, m, true, nil)
	c.st.opts = c.Options
	return &Compiled{Model: m, Options: c.Options, Changed: true}, nil
}

// sameNumbers says whether two topologies of the same structure (sameStructure) have the same
// call rates and ingress rates (the latencies and pods are compared by the recompile).
func sameNumbers(a, b *Topology) bool {
	for i := range a.Calls {
		if !sameFloat(a.Calls[i].Rate, b.Calls[i].Rate) {
			return false
		}
	}
	for i := range a.Ingress {
		if a.Ingress[i].RPS != b.Ingress[i].RPS {
			return false
		}
	}
	return true
}

// sameExtras says whether two topologies of the same structure agree in what the model does
// not hold: the services' selectors and the pods' sidecar flags.
func sameExtras(a, b *Topology) bool {
	for i := range a.Services {
		x, y := &a.Services[i], &b.Services[i]
		if !maps.Equal(x.Selector, y.Selector) || (x.Selector == nil) != (y.Selector == nil) || len(x.Pods) != len(y.Pods) {
			return false
		}
		for j := range x.Pods {
			p, q := x.Pods[j].Sidecar, y.Pods[j].Sidecar
			if (p == nil) != (q == nil) || p != nil && *p != *q {
				return false
			}
		}
	}
	return true
}

func sameOptions(a, b Options) bool {
	return a.Unplaced == b.Unplaced && a.UtilizationCap == b.UtilizationCap && sameFloat(a.DefaultLatencyMS, b.DefaultLatencyMS)
}
