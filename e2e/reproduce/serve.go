package reproduce

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// serveListens matches the lines where serve names the addresses it bound.
var (
	serveXDS = regexp.MustCompile(`edgeflow serve: xDS on (\S+), metrics http://(\S+)/metrics`)
	serveUI  = regexp.MustCompile(`edgeflow serve: web view on http://(\S+)/`)
)

// Serve starts `edgeflow serve` on the live inputs with the policy and the call graph at rate,
// and waits until it has published a plan on measured RTTs (onMeasuredLatency) and every
// caller pod's xDS client is connected to it. Its listeners are on ports the kernel picks as
// serve binds them (127.0.0.1:0), read from the lines where it names them: no port is picked
// here and bound later by another process. flags are further flags of serve. The forwarder sends the pods' xDS connections to
// this serve until it stops.
func (h *Harness) Serve(a App, p Policy, rate float64, flags ...string) *proc {
	args := []string{"serve", "--kubeconfig", h.cluster.Kubeconfig, "--prometheus-url", h.promURL,
		"--calls", h.callGraph(a, rate), "--namespaces", ns, "--xds-address", "127.0.0.1:0", "--metrics-address", "127.0.0.1:0",
		"--ui-address", "127.0.0.1:0", "--policy", p.Allocation, "--lb-policy", p.LB, "--prometheus-interval", "2s", "--log-level", "warn"}
	s := h.start("serve", append(args, flags...)...)
	var xdsAddr, metricsAddr string
	h.eventually(60*time.Second, "serve naming its listeners", func() bool {
		if s.exited() {
			h.t.Fatalf("edgeflow serve exited:\n%s", s.tail())
		}
		text := s.text()
		m, u := serveXDS.FindStringSubmatch(text), serveUI.FindStringSubmatch(text)
		if m == nil || u == nil {
			return false
		}
		xdsAddr, metricsAddr, s.ui, s.metrics = m[1], m[2], u[1], m[2]
		return true
	})
	h.setUpstream(xdsAddr)
	s.stopped = func() { h.clearUpstream(xdsAddr) }

	pods, streams := callers(a)
	what := fmt.Sprintf("serve publishing a plan on measured RTTs and %d caller pods connected with %d streams", pods, streams)
	var last map[string]float64
	latency := "not read"
	defer func() {
		if last != nil && h.t.Failed() { // the wait timed out: say how far it got
			fmt.Fprintf(h.log, "serve: at the timeout %g publications, %g caller pods, %g streams; latency: %s\n",
				last["edgeflow_xds_publications_total"], last["edgeflow_xds_nodes"], last["edgeflow_xds_connected_clients"], latency)
			var keys []string
			for k := range last {
				if strings.HasPrefix(k, "edgeflow_prometheus_") || strings.HasPrefix(k, "edgeflow_watcher_") || strings.HasPrefix(k, "edgeflow_latency_") {
					keys = append(keys, fmt.Sprintf("%s %g", k, last[k]))
				}
			}
			slices.Sort(keys)
			fmt.Fprintf(h.log, "serve: its Prometheus source's metrics:\n  %s\n", strings.Join(keys, "\n  "))
			fmt.Fprintf(h.log, "serve: its log's tail:\n%s\nserve: its goroutines in edgeflow's code (SIGQUIT):\n%s\n", s.tail(), s.goroutines())
		}
	}()
	h.eventually(90*time.Second, what, func() bool {
		if s.exited() {
			h.t.Fatalf("edgeflow serve exited:\n%s", s.tail())
		}
		m, err := metrics(metricsAddr)
		if err != nil {
			return false
		}
		last = m
		if !(m["edgeflow_xds_publications_total"] > 0 && m["edgeflow_xds_nodes"] >= float64(pods) &&
			m["edgeflow_xds_connected_clients"] >= float64(streams)) {
			return false
		}
		snap, err := snapshot(s.ui)
		if err != nil {
			latency = err.Error()
			return false
		}
		latency = onMeasuredLatency(snap, Nodes, h.rtt)
		return latency == ""
	})
	return s
}
