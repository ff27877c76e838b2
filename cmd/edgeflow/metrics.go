package main

// metricNamespace starts the name of every metric: edgeflow_.
const metricNamespace = "edgeflow"

// labelAllocation is the label name of edgeflow_plan_latency_cost_seconds.
const labelAllocation = "allocation"
