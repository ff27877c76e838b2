package main

import "fmt"

// metricNamespace starts the name of every metric: edgeflow_.
const metricNamespace = "edgeflow"

// labelAllocation is the label name of edgeflow_plan_latency_cost_seconds.
const labelAllocation = "allocation"

// registered turns a panic of promauto registering a metric of who (a name registered twice,
// say) into an error; other panics go on. Call it as defer func() { err = registered(who,
// recover()) }().
func registered(who string, r any) error {
	if r == nil {
		return nil
	}
	e, ok := r.(error)
	if !ok {
		panic(r)
	}
	return fmt.Errorf("%s: registering metrics: %w", who, e)
}
