package latest_test

import (
	"fmt"

	"github.com/edgeflow/edgeflow/internal/latest"
)

// A writer that must not block hands topologies to a reader that acts on the newest: three
// Updates before the reader looks wake it once, with the last.
func ExampleValue() {
	var topology latest.Value[string]
	for _, t := range []string{"v1", "v2", "v3"} {
		topology.Set(t) // never blocks
	}
	<-topology.C()
	fmt.Println(topology.Get())
	select {
	case <-topology.C():
		fmt.Println("woken again")
	default:
		fmt.Println("nothing pending")
	}
	// Output:
	// v3
	// nothing pending
}
