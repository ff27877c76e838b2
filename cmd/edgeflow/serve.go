package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/edgeflow/edgeflow/internal/leader"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/xds"
	"github.com/edgeflow/edgeflow/xds/istio"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

func init() { subcommands = append(subcommands, newServeCommand) }

// The xDS server is what the file watcher feeds.
var _ watcher.Listener = (*xdsserver.Server)(nil)

type serveFlags struct {
	topologyFlags
	xdsAddress     string
	metricsAddress string
	policy         string
	encoding       string
	lbPolicy       string
	debounceQuiet  time.Duration
	debounceMax    time.Duration
	removalGrace   time.Duration
	damping        float64
	pollInterval   time.Duration
	tls            xdsserver.TLSFiles
	insecureXDS    bool
	trustDomain    string
	limits         xdsserver.Limits
	profilingAddr  string
	uiAddress      string
	rebalance      bool
	rebalancer     rebalanceFlags
	istioLeader    istioLeaderFlags
}

func newServeCommand() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve -f FILE --xds-address HOST:PORT [--policy P] [--encoding E] [--metrics-address HOST:PORT]",
		Short: "Serve a topology file's traffic weights over xDS and follow the file",
		Long: "serve computes the allocation of a topology file and serves it over xDS (ADS, LDS, RDS, CDS, EDS), one\n" +
			"snapshot per caller pod: a proxyless gRPC client with node id POD dials xds:///SERVICE; an Istio sidecar\n" +
			"id sidecar~IP~POD.NS~… is matched by pod name, else IP; any other id gets round-robin weights.\n" +
			"Istio sidecars get EDS only, under Istio's cluster names; nodes with user_agent_name envoy get socket\n" +
			"listeners on 127.0.0.1:PORT per service port, RDS, CDS and EDS (both need the services' ports).\n" +
			"Every pod of a called service needs an address (IP:PORT) in the file.\n\n" +
			"The file is polled for changes and re-read on SIGHUP; each change is solved and pushed (debounced) to\n" +
			"the clients whose weights changed. A changed file that is invalid is logged and the last good topology\n" +
			"stays. /metrics, /healthz and /readyz (ready after the first publication) are served on\n" +
			"--metrics-address. SIGINT or SIGTERM shut down gracefully.",
		Example: "  edgeflow serve -f topology.yaml --xds-address 127.0.0.1:18000 --metrics-address 127.0.0.1:9090",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runServe(cmd.Context(), cmd, &f)
		},
	}
	f.register(cmd)
	f.istio.register(cmd, true)
	fl := cmd.Flags()
	fl.StringVar(&f.xdsAddress, "xds-address", "", "HOST:PORT the xDS server listens on (port 0 picks one; the address is logged)")
	fl.StringVar(&f.metricsAddress, "metrics-address", "", "HOST:PORT for /metrics, /healthz and /readyz (empty: not served)")
	fl.StringVar(&f.policy, "policy", string(optimizer.LATA), "allocation policy: round-robin, localization, opttraffic, lata, lata-q")
	fl.StringVar(&f.encoding, "encoding", string(xds.EncodingLocality), "wire encoding of the weights: locality (EDS locality weights) or weighted-clusters")
	fl.StringVar(&f.lbPolicy, "lb-policy", string(xds.LBRoundRobin), "how clients balance within the weights: round-robin, or least-request (LEAST_REQUEST over each callee's pods, power of two choices; locality encoding only)")
	fl.DurationVar(&f.debounceQuiet, "debounce-quiet", xdsserver.DefaultDebounceQuiet, "push after the topology has been quiet this long (negative: push every change at once)")
	fl.DurationVar(&f.debounceMax, "debounce-max", xdsserver.DefaultDebounceMax, "push at the latest this long after the first change of a burst")
	fl.DurationVar(&f.removalGrace, "removal-grace", xdsserver.DefaultRemovalGrace, "keep a removed pod's cluster and endpoints this long after the routes that named it are acknowledged (0: none)")
	fl.Float64Var(&f.damping, "damping", optimizer.DefaultDamping, "flap damping: a recompute that moves less than this fraction of the traffic (pods, services and calls unchanged) is not pushed; negative pushes every recompute")
	fl.DurationVar(&f.pollInterval, "poll-interval", watcher.DefaultPollInterval, "how often the topology file is checked for changes")
	fl.StringVar(&f.profilingAddr, "profiling-address", "", "loopback HOST:PORT for /debug/pprof/ on its own listener, with mutex and block profiling on (empty: not served)")
	fl.StringVar(&f.uiAddress, "ui-address", "", "loopback HOST:PORT for the live web view, read-only, on its own listener (empty: not served)")
	fl.StringVar(&f.tls.CertFile, "xds-tls-cert", "", "serve xDS over TLS with this certificate (PEM; reloaded when the file changes)")
	fl.StringVar(&f.tls.KeyFile, "xds-tls-key", "", "the key of --xds-tls-cert (PEM)")
	fl.StringVar(&f.tls.ClientCAFile, "xds-tls-client-ca", "", "mutual TLS: clients need a certificate from these CAs, and a node may claim only a pod whose service account its certificate names (spiffe://TRUST-DOMAIN/ns/NS/sa/SA)")
	fl.StringVar(&f.trustDomain, "trust-domain", xdsserver.DefaultTrustDomain, "with --xds-tls-client-ca: the SPIFFE trust domain client certificates must be in")
	fl.BoolVar(&f.insecureXDS, "insecure-xds", false, "allow plaintext, unauthenticated xDS on a non-loopback --xds-address (anyone who reaches the port can read every service's endpoints and weights and claim any pod)")
	fl.IntVar(&f.limits.MaxMessageBytes, "xds-max-message-size", xdsserver.DefaultMaxMessageBytes, "largest xDS request message in bytes (negative: gRPC's limit is lifted)")
	fl.IntVar(&f.limits.MaxConnections, "xds-max-connections", xdsserver.DefaultMaxConnections, "open xDS client connections at most; more are closed at once (negative: no bound)")
	fl.IntVar(&f.limits.MaxStreams, "xds-max-streams", xdsserver.DefaultMaxStreams, "open xDS streams at most, in all (negative: no bound)")
	fl.IntVar(&f.limits.MaxStreamsPerConnection, "xds-max-streams-per-connection", xdsserver.DefaultMaxStreamsPerConnection, "open xDS streams at most on one connection (negative: no bound)")
	fl.IntVar(&f.limits.MaxResourceNames, "xds-max-resource-names", xdsserver.DefaultMaxResourceNames, "resource names one xDS request may carry (delta: subscribe, unsubscribe and initial versions together; negative: no bound)")
	fl.Float64Var(&f.limits.RequestsPerSecond, "xds-requests-per-second", xdsserver.DefaultRequestsPerSecond, "xDS requests per second one stream may send on average; a faster stream is closed (negative: no bound)")
	fl.IntVar(&f.limits.RequestBurst, "xds-request-burst", xdsserver.DefaultRequestBurst, "xDS requests one stream may send at once above --xds-requests-per-second")
	fl.DurationVar(&f.limits.MaxConnectionAge, "xds-max-connection-age", xdsserver.DefaultMaxConnectionAge, "ask a client connection to go away after this long (±10 %), so clients spread over replicas again (negative: never)")
	fl.BoolVar(&f.rebalance, "rebalance", false, "also run the LARP rebalancer (see edgeflow rebalance; its flags here are prefixed rebalance-, and it is dry-run unless --rebalance-dry-run=false)")
	f.rebalancer.register(cmd, "rebalance-")
	f.istioLeader.register(cmd)
	_ = cmd.MarkFlagRequired("xds-address")
	return cmd
}

func runServe(ctx context.Context, cmd *cobra.Command, f *serveFlags) error {
	policy, err := optimizer.ParsePolicy(f.policy)
	if err != nil {
		return usageError{err}
	}
	enc, err := xds.ParseEncoding(f.encoding)
	if err != nil {
		return usageError{err}
	}
	lb, err := xds.ParseLBPolicy(f.lbPolicy)
	if err != nil {
		return usageError{err}
	}
	if f.file == "-" {
		return badInput("serve follows a file; it cannot read the topology from standard input")
	}
	if f.rebalance && f.file != "" {
		return badInput("--rebalance needs the cluster flags (--kubeconfig or in-cluster), not -f")
	}
	if f.rebalance {
		if err := f.rebalancer.check(); err != nil {
			return err
		}
	}
	if err := f.checkSecurity(); err != nil {
		return err
	}
	if f.removalGrace < 0 {
		return badInput("--removal-grace must not be negative, got %v", f.removalGrace)
	}
	if f.debounceQuiet == 0 || f.debounceMax <= 0 || f.pollInterval <= 0 {
		return badInput("--debounce-quiet must be non-zero, --debounce-max and --poll-interval positive")
	}
	logger := newLogger(cmd, slog.LevelInfo)
	opts := f.options(cmd)
	if err := f.istio.checkMode(); err != nil {
		return err
	}
	if f.istio.mode != istioModeOff && f.file != "" {
		return badInput("--istio-mode=%s needs the cluster flags (--kubeconfig or in-cluster), not -f", f.istio.mode)
	}
	var istioLease leader.Config
	if f.istio.mode != istioModeOff && f.istioLeader.elect {
		if err := f.istioLeader.check(); err != nil {
			return err
		}
		istioLease = f.istioLeader.timings
		istioLease.Namespace, istioLease.Name = f.rebalancer.lease().Namespace, f.istioLeader.leaseName
		if istioLease.Namespace == "" {
			return badInput("--istio-mode=%s: the replicas elect the one that writes on a Lease, and outside a pod "+
				"--rebalance-lease-namespace is required to say where (a laptop run and the in-cluster replicas must share it); "+
				"or --istio-leader-elect=false to write from every replica", f.istio.mode)
		}
		if f.istioLeader.leaseName == "" || (f.rebalance && !f.rebalancer.dryRun && f.istioLeader.leaseName == f.rebalancer.leaseName) {
			return badInput("--istio-lease-name must be set, and differ from --rebalance-lease-name")
		}
	}

	if err := f.source(); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var source topologySource
	var cluster *watcher.Live
	var inf *kube.Informers // the process's one set of informers (with a cluster source)
	if f.file != "" {
		file, err := watcher.NewFile(f.file, watcher.FileConfig{Options: opts, Check: xds.CheckTopology,
			Interval: f.pollInterval, Logger: logger, Registerer: reg})
		if err != nil {
			return err
		}
		// Bad input at startup is the user's to fix: exit 2 before anything listens.
		if _, err := file.Load(); err != nil {
			return usageError{err}
		}
		source = file
	} else {
		if inf, err = f.informers(f.rebalance, logger); err != nil {
			return err
		}
		if cluster, err = f.cluster(inf, opts, xds.CheckTopology, logger, reg); err != nil {
			return err
		}
		source = cluster
	}
	var istioRun interface {
		watcher.Listener
		Run(context.Context) error
	}
	var rules *istio.RulesReconciler
	switch f.istio.mode {
	case istioModeEnvoyFilter:
		f.istio.xdsTLS = f.tls.CertFile != ""
		if istioRun, err = f.envoyFilterReconciler(f.istio.config(), logger); err != nil {
			return err
		}
	case istioModeDestinationRule:
		ic, err := f.istioClient()
		if err != nil {
			return err
		}
		cfg := istio.RulesReconcilerConfig{Rules: f.istio.rulesConfig(), Policy: policy, Options: opts,
			Damping: f.damping, Client: ic, Logger: logger, Registerer: reg}
		if f.istio.labelNodes {
			if cfg.Nodes, err = f.clientset(); err != nil {
				return err
			}
		}
		if rules, err = istio.NewRulesReconciler(cfg); err != nil {
			return usageError{err}
		}
		istioRun = rules
	}
	var istioLeader *istioLeader
	if istioRun != nil && f.istioLeader.elect {
		if istioLeader, err = newIstioLeader(istioRun.Run, inf.Client().CoordinationV1(), istioLease, processIdentity(), logger, reg); err != nil {
			return err
		}
	}
	var rb *rebalancer.Controller
	if f.rebalance {
		if rb, err = f.rebalancer.controller(inf, &f.clusterFlags, cluster, opts.DefaultLatencyMS, logger, reg); err != nil {
			return err
		}
	}
	srv, err := xdsserver.New(xdsserver.Config{Policy: policy, Encoding: enc, LBPolicy: lb, Options: opts, ClusterDomain: f.istio.clusterDomain,
		DebounceQuiet: f.debounceQuiet, DebounceMax: f.debounceMax, RemovalGrace: f.removalGrace, Damping: f.damping, Logger: logger, Registerer: reg,
		Limits: f.limits, RequireIdentity: f.tls.ClientCAFile != "", TrustDomain: f.trustDomain})
	if err != nil {
		return err
	}

	xdsLis, err := net.Listen("tcp", f.xdsAddress)
	if err != nil {
		return fmt.Errorf("xDS listener: %w", err)
	}
	// Sidecars hold one long-lived stream each; keepalives notice dead peers. The server's
	// options bound what a client may make it do (xdsserver.Limits).
	gopts := srv.ServerOptions()
	if f.tls.CertFile != "" || f.tls.KeyFile != "" || f.tls.ClientCAFile != "" {
		tlsCfg, err := xdsserver.NewTLSConfig(f.tls, logger)
		if err != nil {
			xdsLis.Close()
			return usageError{err}
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	gs := grpc.NewServer(gopts...)
	srv.Register(gs)
	var httpSrv, profSrv *http.Server
	var metricsLis, profLis net.Listener
	if f.metricsAddress != "" {
		if metricsLis, err = net.Listen("tcp", f.metricsAddress); err != nil {
			xdsLis.Close()
			return fmt.Errorf("metrics listener: %w", err)
		}
		httpSrv = newHTTPServer(serveMux(reg, srv, cluster, rules, istioLeader), time.Minute)
	}
	if f.profilingAddr != "" {
		if profLis, err = net.Listen("tcp", f.profilingAddr); err != nil {
			xdsLis.Close()
			if metricsLis != nil {
				metricsLis.Close()
			}
			return fmt.Errorf("profiling listener: %w", err)
		}
		runtime.SetMutexProfileFraction(10)
		runtime.SetBlockProfileRate(int(time.Millisecond))
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		profSrv = newHTTPServer(mux, 10*time.Minute) // a CPU profile or trace writes for its whole duration
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	// Every goroutine below is owned by the group: it ends when ctx is cancelled (signal, or
	// the first component failing) and is waited for before runServe returns.
	g, ctx := newRunGroup(ctx)
	defer g.Stop()
	start := g.Go
	if inf != nil {
		inf.Start(ctx) // stopped below, once every reader has ended
	}
	start("xDS push loop", func() error { return srv.Run(ctx) })
	var listener watcher.Listener = srv
	if istioRun != nil {
		// Fed on every replica; it writes only while it runs: on the Istio Lease's holder.
		listener = fanout{srv, istioRun}
		if istioLeader != nil {
			start("Istio "+f.istio.mode+" leader election", func() error { return istioLeader.Run(ctx) })
		} else {
			start("Istio "+f.istio.mode, func() error { return istioRun.Run(ctx) })
		}
	}
	follower, uiSrv, uiLis, err := f.startWebView(srv, reg, policy, opts, cluster, logger)
	if err != nil {
		g.Fail(err)
	} else {
		listener = fanout{listener, follower}
		start("publication follower", func() error { return follower.Run(ctx) })
		if uiSrv != nil {
			g.ServeHTTP("web view", uiSrv, uiLis)
		}
	}
	start("topology source", func() error { return source.Run(ctx, listener) })
	if rb != nil {
		if err := f.rebalancer.start(ctx, rb, start); err != nil {
			g.Fail(err)
		}
	}
	start("xDS server", func() error {
		if err := gs.Serve(srv.Listener(xdsLis)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	if httpSrv != nil {
		g.ServeHTTP("metrics server", httpSrv, metricsLis)
	}
	if profSrv != nil {
		g.ServeHTTP("profiling server", profSrv, profLis)
	}
	start("SIGHUP", func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-hup:
				if file, ok := source.(*watcher.File); ok {
					logger.Info("SIGHUP: reloading the topology file")
					file.Reload()
				}
			}
		}
	})
	metricsAt := "not served"
	if metricsLis != nil {
		metricsAt = "http://" + metricsLis.Addr().String() + "/metrics"
	}
	from := "file " + f.file
	if cluster != nil {
		from = "the cluster"
		if f.prometheusURL != "" {
			from += " and Prometheus " + redactURL(f.prometheusURL)
		}
	}
	announce(cmd, "edgeflow serve: xDS on %s, metrics %s, policy %s, encoding %s, topology from %s",
		xdsLis.Addr(), metricsAt, policy, enc, from)
	if profLis != nil {
		announce(cmd, "edgeflow serve: profiling on http://%s/debug/pprof/", profLis.Addr())
	}
	if uiLis != nil {
		announce(cmd, "edgeflow serve: web view on http://%s/", uiLis.Addr())
	}

	<-ctx.Done()
	logger.Info("edgeflow serve: shutting down", "reason", context.Cause(ctx))
	stopGRPC(gs)
	err = g.Wait() // run maps bad input to exit 2
	if inf != nil {
		inf.Stop()
	}
	return err
}

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

// fanout hands every topology to several listeners.
type fanout []watcher.Listener

func (f fanout) Update(t *optimizer.Topology) { f.UpdateCompiled(t, nil) }

// UpdateCompiled hands the compiled model on to the listeners that plan.
func (f fanout) UpdateCompiled(t *optimizer.Topology, cm *optimizer.Compiled) {
	for _, l := range f {
		watcher.Deliver(l, t, cm)
	}
}

// topologySource is what serve follows: the file or the cluster.
type topologySource interface {
	Run(context.Context, watcher.Listener) error
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
