package main

import (
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/xds/istio"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

// The endpoints of the long-running commands (serve, rebalance): their HTTP servers and
// handlers, the xDS gRPC server's stop, and what may be exposed beyond loopback.

// stopGRPC stops the xDS server: Run has ended the xDS streams, so the gRPC server drains
// quickly; a hard stop follows after a grace period.
func stopGRPC(g *grpc.Server) {
	const grace = 5 * time.Second
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		g.Stop()
		<-done
	}
}

// HTTP server timeouts: a client gets 10 s to send its headers and 30 s for its whole request,
// an idle keep-alive connection is closed after 2 minutes, and a response must be written
// within write (a scrape of /metrics: one minute).
const (
	httpReadHeaderTimeout = 10 * time.Second
	httpReadTimeout       = 30 * time.Second
	httpIdleTimeout       = 2 * time.Minute
)

// newHTTPServer returns an HTTP server with read, write and idle timeouts.
func newHTTPServer(h http.Handler, write time.Duration) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: httpReadHeaderTimeout, ReadTimeout: httpReadTimeout,
		WriteTimeout: write, IdleTimeout: httpIdleTimeout}
}

// metricsMux serves /metrics from reg and /healthz; callers add /readyz where they have one.
func metricsMux(reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return mux
}

// serveMux serves /metrics, /healthz and /readyz (watcher.ReadyHandler).
// With Istio DestinationRules, /readyz also says at which granularity they plan; with the Istio
// writer elected (il non-nil), whether this replica leads (writes) or follows.
func serveMux(reg *prometheus.Registry, srv *xdsserver.Server, cluster *watcher.Live, rules *istio.RulesReconciler, il *istioLeader) *http.ServeMux {
	mux := metricsMux(reg)
	var checks func() []watcher.Check
	if cluster != nil {
		checks = func() []watcher.Check {
			cs := cluster.Checks()
			if rules != nil {
				c := watcher.Check{Name: "istio-destinationrules", OK: true, Message: "planned per " + rules.Granularity()}
				if rules.Granularity() == "" {
					c.Message = "no plan yet"
					if il != nil && !il.Leading() {
						c.Message = "not planned here: the leader plans and writes"
					}
				}
				cs = append(cs, c)
			}
			if il != nil {
				cs = append(cs, il.check())
			}
			return cs
		}
	}
	mux.Handle("/readyz", watcher.ReadyHandler(srv.Published, checks))
	return mux
}

// pprofMux serves /debug/pprof/.
func pprofMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// checkSecurity refuses what would expose the xDS port or the profiles beyond loopback
// without protection, saying why and which flag relaxes it.
func (f *serveFlags) checkSecurity() error {
	tls := f.tls.CertFile != "" || f.tls.KeyFile != ""
	if f.xdsAddress != "" && !tls && !f.insecureXDS && !isLoopback(f.xdsAddress) {
		return badInput("--xds-address %s is not a loopback address and xDS would be plaintext and unauthenticated: "+
			"anyone who reaches it could read every service's pods, addresses and weights and claim any pod's weights. "+
			"Serve TLS (--xds-tls-cert, --xds-tls-key; with --xds-tls-client-ca, mutual TLS and the pod identity check), "+
			"or accept the exposure with --insecure-xds", f.xdsAddress)
	}
	if f.profilingAddr != "" && !isLoopback(f.profilingAddr) {
		return badInput("--profiling-address %s is not a loopback address: profiles (and the command line) are served "+
			"without authentication, so only on loopback (reach it with kubectl port-forward)", f.profilingAddr)
	}
	if f.uiAddress != "" && !isLoopback(f.uiAddress) {
		return badInput("--ui-address %s is not a loopback address: the web view shows every pod, node, latency and weight "+
			"without authentication, so only on loopback (reach it with kubectl port-forward)", f.uiAddress)
	}
	if f.limits.RequestBurst < 0 {
		return badInput("--xds-request-burst %d: need 0 or more", f.limits.RequestBurst)
	}
	return nil
}

// isLoopback reports whether a HOST:PORT listens on loopback only: a loopback IP or
// "localhost". An empty host, an unspecified address or any other name is not.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
