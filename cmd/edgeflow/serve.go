package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/probesd"
	"github.com/edgeflow/edgeflow/xds"
	xdsserver "github.com/edgeflow/edgeflow/xds/server"
)

func init() { subcommands = append(subcommands, newServeCommand) }

// The xDS server is what the file watcher feeds.
var _ watcher.Listener = (*xdsserver.Server)(nil)

type serveFlags struct {
	topologyFlags
	xdsAddress     string
	metricsAddress string
	policy         optimizer.Policy
	encoding       xds.Encoding
	lbPolicy       xds.LBPolicy
	egressOffset   int
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
	probes         probesd.Config // the latency probes served as HTTP service discovery (with a cluster)
	probeNodes     string         // --probe-node-selector, parsed into probes.Nodes
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
			"listeners on 127.0.0.1:PORT per service port (PORT+--egress-port-offset), RDS, CDS and EDS (both need the services' ports).\n" +
			"Every pod of a called service needs an address in the file: address: IP:PORT, or ip: IP with a port on the service.\n\n" +
			"The file is polled for changes and re-read on SIGHUP; each change is solved and pushed (debounced) to\n" +
			"the clients whose weights changed. A changed file that is invalid is logged and the last good topology\n" +
			"stays. /metrics, /healthz and /readyz (ready after the first publication) are served on\n" +
			"--metrics-address. SIGINT or SIGTERM shut down gracefully.",
		Example: "  edgeflow serve -f examples/bookinfo.yaml --xds-address 127.0.0.1:18000 --metrics-address 127.0.0.1:9090\n" +
			"  edgeflow serve -f examples/bookinfo.yaml --xds-address 127.0.0.1:18000 --ui-address 127.0.0.1:8080   # the web view",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			app, err := newServeApp(cmd, &f)
			if err != nil {
				return err
			}
			return app.run(cmd.Context())
		},
	}
	f.register(cmd)
	f.istio.register(cmd, true)
	fl := cmd.Flags()
	fl.StringVar(&f.xdsAddress, "xds-address", "", "HOST:PORT the xDS server listens on (port 0 picks one; the address is logged)")
	fl.StringVar(&f.metricsAddress, "metrics-address", "", "HOST:PORT for /metrics, /healthz and /readyz (empty: not served); with a cluster also "+probesd.Path+", the latency probes' targets as Prometheus HTTP service discovery")
	fl.IntVar(&f.probes.Port, "probe-exporter-port", 9115, "with a cluster: the blackbox-exporter's port on every node's address, in "+probesd.Path)
	enumVar(cmd, fl, &enumFlag[corev1.NodeAddressType]{p: &f.probes.AddressType, values: []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP}, typ: "address-type"},
		"probe-address-type", "", corev1.NodeInternalIP, "with a cluster: the node address "+probesd.Path+" probes and reaches the node's exporter at: InternalIP or ExternalIP")
	fl.StringVar(&f.probes.RepresentativeLabel, "probe-representative-label", probesd.DefaultRepresentativeLabel, "with a cluster, per zone (--latency-granularity): the node label (value \"true\") that marks a zone's probing representative in "+probesd.Path+" (no node labelled: each region/zone's first node by name)")
	fl.StringVar(&f.probeNodes, "probe-node-selector", "", "with a cluster: label selector of the nodes that run an exporter (e.g. \"!node-role.kubernetes.io/control-plane\"); the others are neither probed nor probing in "+probesd.Path+" (default: every node)")
	f.only = append(f.only, "probe-exporter-port", "probe-address-type", "probe-representative-label", "probe-node-selector") // they read the Nodes
	fl.IntVar(&f.capacityHistory, "capacity-history-windows", estimate.DefaultWindows, "with the pod-load queries: the windows (--prometheus-window) of pod load read from Prometheus's history at start and fed to the capacity estimator before the first live one, so that after a restart or failover lata-q and closed-loop plan with estimated capacities at once instead of about 4 windows later; the default is the number of windows the estimator sums; 0: none")
	f.only = append(f.only, "capacity-history-windows") // read from Prometheus
	policyVar(cmd, &f.policy)
	enumVar(cmd, fl, &enumFlag[xds.Encoding]{p: &f.encoding, values: []xds.Encoding{xds.EncodingLocality, xds.EncodingWeightedClusters},
		parse: xds.ParseEncoding, typ: "encoding", noun: "encoding"},
		"encoding", "", xds.EncodingLocality, "wire encoding of the weights: locality (EDS locality weights) or weighted-clusters")
	enumVar(cmd, fl, &enumFlag[xds.LBPolicy]{p: &f.lbPolicy, values: []xds.LBPolicy{xds.LBRoundRobin, xds.LBLeastRequest, xds.LBBands},
		parse: xds.ParseLBPolicy, typ: "lb-policy", noun: "lb policy"},
		"lb-policy", "", xds.LBRoundRobin, "how clients balance within the weights (--policy closed-loop: bands unless set): round-robin; least-request (LEAST_REQUEST over each callee's pods, power of two choices, no plan); "+
			"or bands (the plan weights each node's callee pods as one locality, least-request picks inside it: gRPC WrrLocality{LeastRequest}, Envoy LEAST_REQUEST, Istio rules simple LEAST_REQUEST); locality encoding only")
	fl.IntVar(&f.egressOffset, "egress-port-offset", 0, "plain Envoy nodes' outbound listener for service port P binds 127.0.0.1:P+OFFSET instead of 127.0.0.1:P, "+
		"so an app in the pod that itself serves on P keeps its port; the app then dials NAME:P+OFFSET (0: P itself; at most 65534)")
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
	fl.BoolVar(&f.rebalance, "rebalance", false, "also run the LARP rebalancer (see edgeflow rebalance; its flags here are prefixed rebalance-, and it is dry-run unless --rebalance-dry-run=none)")
	f.rebalancer.register(cmd, "rebalance-")
	f.istioLeader.register(cmd)
	_ = cmd.MarkFlagRequired("xds-address")
	groupServeFlags(cmd, f.only)
	return cmd
}

// groupServeFlags lists serve's flags in sections (flaggroups.go); cluster are the flags that
// read a cluster (clusterFlags.only).
func groupServeFlags(cmd *cobra.Command, cluster []string) {
	in := func(names ...string) func(string) bool {
		return func(n string) bool { return slices.Contains(names, n) }
	}
	prefixed := func(prefixes ...string) func(string) bool {
		return func(n string) bool {
			return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(n, p) })
		}
	}
	groupFlags(cmd, []flagSectionRule{
		{"xDS flags", func(n string) bool {
			return prefixed("xds-", "debounce-")(n) || in("insecure-xds", "trust-domain", "encoding", "lb-policy", "egress-port-offset", "removal-grace", "damping")(n)
		}},
		{"HTTP flags (metrics, profiling, web view)", in("metrics-address", "profiling-address", "ui-address")},
		{"Cluster flags (without -f: Kubernetes and Prometheus)", in(cluster...)},
		{"Istio flags (--istio-mode)", func(n string) bool { return prefixed("istio-")(n) || n == "cluster-domain" }},
		{"Rebalancer flags (--rebalance)", prefixed("rebalance", "webhook-")},
	})
}

// serveApp is serve validated and wired: newServeApp checks the flags and builds every
// component, starting nothing; run listens, starts them in one run group and waits.
type serveApp struct {
	cmd    *cobra.Command // the announcement lines go to its standard error
	f      *serveFlags
	logger *slog.Logger
	reg    *prometheus.Registry

	source  topologySource
	cluster *watcher.Live          // with a cluster source
	inf     *kube.Informers        // the process's one set of informers (with a cluster source)
	istio   istioRunner            // with --istio-mode
	leader  *istioLeader           // with --istio-mode and --istio-leader-elect
	rb      *rebalancer.Controller // with --rebalance

	srv      *xdsserver.Server
	gs       *grpc.Server
	follower *publicationFollower
	httpSrv  *http.Server // with --metrics-address
	profSrv  *http.Server // with --profiling-address
	uiSrv    *http.Server // with --ui-address

	xdsLis, metricsLis, profLis, uiLis net.Listener // opened by run
}

// newServeApp validates the flags and builds serve's components; nothing listens or runs yet.
// Bad input is a usage error (exit 2), reported before anything is built.
func newServeApp(cmd *cobra.Command, f *serveFlags) (*serveApp, error) {
	a := &serveApp{cmd: cmd, f: f}
	if f.policy == optimizer.ClosedLoop && !cmd.Flags().Changed("lb-policy") {
		f.lbPolicy = xds.LBBands // the closed loop's delivery: least-request inside the planned bands
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	if f.egressOffset < 0 || f.egressOffset > xds.MaxEgressPortOffset {
		return nil, badInput("--egress-port-offset %d: want 0 to %d", f.egressOffset, xds.MaxEgressPortOffset)
	}
	istioLease, err := f.checkIstio()
	if err != nil {
		return nil, err
	}
	if err := f.source(cmd); err != nil {
		return nil, err
	}
	a.logger = newLogger(cmd, slog.LevelInfo)
	opts := f.options(cmd)
	a.reg = prometheus.NewRegistry()
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := a.buildSource(opts); err != nil {
		return nil, err
	}
	rules, err := a.buildIstio(opts, istioLease)
	if err != nil {
		return nil, err
	}
	if f.rebalance {
		if a.rb, err = f.rebalancer.controller(a.inf, &f.clusterFlags, a.cluster, opts.DefaultLatencyMS, a.logger, a.reg); err != nil {
			return nil, err
		}
	}
	if a.srv, err = xdsserver.New(xdsserver.Config{Policy: f.policy, Encoding: f.encoding, LBPolicy: f.lbPolicy, Options: opts, ClusterDomain: f.istio.clusterDomain,
		EgressPortOffset: f.egressOffset, DebounceQuiet: f.debounceQuiet, DebounceMax: f.debounceMax, RemovalGrace: f.removalGrace, Damping: f.damping, Logger: a.logger, Registerer: a.reg,
		Limits: f.limits, RequireIdentity: f.tls.ClientCAFile != "", TrustDomain: f.trustDomain}); err != nil {
		return nil, err
	}
	// Sidecars hold one long-lived stream each; keepalives notice dead peers. The server's
	// options bound what a client may make it do (xdsserver.Limits).
	gopts := a.srv.ServerOptions()
	if f.tls.CertFile != "" || f.tls.KeyFile != "" || f.tls.ClientCAFile != "" {
		tlsCfg, err := xdsserver.NewTLSConfig(f.tls, a.logger)
		if err != nil {
			return nil, usageError{err}
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	a.gs = grpc.NewServer(gopts...)
	a.srv.Register(a.gs)
	if f.metricsAddress != "" {
		mux := serveMux(a.reg, a.srv, a.cluster, rules, a.leader)
		if a.inf != nil {
			mux.Handle(probesd.Path, f.probesHandler(a.inf))
		}
		a.httpSrv = newHTTPServer(mux, time.Minute)
	}
	if f.profilingAddr != "" {
		a.profSrv = newHTTPServer(pprofMux(), 10*time.Minute) // a CPU profile or trace writes for its whole duration
	}
	if a.follower, a.uiSrv, err = f.webView(a.srv, a.reg, f.policy, opts, a.cluster, a.logger); err != nil {
		return nil, err
	}
	return a, nil
}

// check validates the flags of serving (checkIstio those of Istio's, source the topology's),
// in the order their errors are reported.
func (f *serveFlags) check() error {
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
	return nil
}

// buildSource builds what serve follows: the topology file, loaded once (bad input at startup
// is the user's to fix: exit 2 before anything listens), or the cluster on the process's
// informers.
func (a *serveApp) buildSource(opts optimizer.Options) error {
	f := a.f
	if f.file != "" {
		file, err := watcher.NewFile(f.file, watcher.FileConfig{Options: opts, Check: xds.CheckTopology,
			Interval: f.pollInterval, Logger: a.logger, Registerer: a.reg})
		if err != nil {
			return err
		}
		if _, err := file.Load(); err != nil {
			return usageError{err}
		}
		a.source = file
		return nil
	}
	if f.capacityHistory < 0 {
		return badInput("--capacity-history-windows %d: want 0 (none) or a number of windows", f.capacityHistory)
	}
	if f.probes.Port < 1 || f.probes.Port > 65535 {
		return badInput("--probe-exporter-port %d: want a port, 1 to 65535", f.probes.Port)
	}
	if f.probeNodes != "" {
		sel, err := labels.Parse(f.probeNodes)
		if err != nil {
			return badInput("--probe-node-selector %q: %v", f.probeNodes, err)
		}
		f.probes.Nodes = sel
	}
	var err error
	if a.inf, err = f.informers(f.rebalance, a.logger); err != nil {
		return err
	}
	var plan func() (*optimizer.Topology, *optimizer.Allocation)
	if f.policy == optimizer.LATAQ || f.policy == optimizer.ClosedLoop {
		// The plans made with estimated capacities are the model-error breaker's to judge.
		// a.srv is built after the source and before anything runs (newServeApp).
		plan = func() (*optimizer.Topology, *optimizer.Allocation) {
			_, t, alloc := a.srv.Publication()
			return t, alloc
		}
	}
	f.correctLatency = f.policy == optimizer.ClosedLoop
	if a.cluster, err = f.cluster(a.inf, opts, xds.CheckTopology, plan, a.logger, a.reg); err != nil {
		return err
	}
	a.source = a.cluster
	return nil
}

// listen opens serve's listeners; on an error none stays open.
func (a *serveApp) listen() error {
	var err error
	if a.xdsLis, err = net.Listen("tcp", a.f.xdsAddress); err != nil {
		return fmt.Errorf("xDS listener: %w", err)
	}
	for _, l := range []struct {
		what string
		srv  *http.Server
		addr string
		lis  *net.Listener
	}{
		{"metrics", a.httpSrv, a.f.metricsAddress, &a.metricsLis},
		{"profiling", a.profSrv, a.f.profilingAddr, &a.profLis},
		{"web view", a.uiSrv, a.f.uiAddress, &a.uiLis},
	} {
		if l.srv == nil {
			continue
		}
		if *l.lis, err = net.Listen("tcp", l.addr); err != nil {
			a.closeListeners()
			return fmt.Errorf("%s listener: %w", l.what, err)
		}
	}
	return nil
}

func (a *serveApp) closeListeners() {
	for _, l := range []net.Listener{a.xdsLis, a.metricsLis, a.profLis, a.uiLis} {
		if l != nil {
			l.Close()
		}
	}
}

// run listens, runs every component until ctx ends, SIGINT or SIGTERM comes or one fails, and
// returns after every one has returned: nil after a clean stop, else the first failure.
func (a *serveApp) run(ctx context.Context) error {
	if err := a.listen(); err != nil {
		return err
	}
	if a.profSrv != nil {
		runtime.SetMutexProfileFraction(10)
		runtime.SetBlockProfileRate(int(time.Millisecond))
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	// Every goroutine below is owned by the group: it ends when ctx is cancelled (signal, or
	// the first component failing) and is waited for before run returns.
	g, ctx := newRunGroup(ctx)
	defer g.Stop()
	start := g.Go
	if a.inf != nil {
		a.inf.Start(ctx) // stopped below, once every reader has ended
	}
	start("xDS push loop", func() error { return a.srv.Run(ctx) })
	var listener watcher.Listener = a.srv
	if a.istio != nil {
		// Fed on every replica; it writes only while it runs: on the Istio Lease's holder.
		listener = fanout{a.srv, a.istio}
		if a.leader != nil {
			start("Istio "+a.f.istio.mode+" leader election", func() error { return a.leader.Run(ctx) })
		} else {
			start("Istio "+a.f.istio.mode, func() error { return a.istio.Run(ctx) })
		}
	}
	listener = fanout{listener, a.follower}
	start("publication follower", func() error { return a.follower.Run(ctx) })
	if a.uiSrv != nil {
		g.ServeHTTP("web view", a.uiSrv, a.uiLis)
	}
	start("topology source", func() error { return a.source.Run(ctx, listener) })
	if a.rb != nil {
		if err := a.f.rebalancer.start(ctx, a.rb, start); err != nil {
			g.Fail(err)
		}
	}
	start("xDS server", func() error {
		if err := a.gs.Serve(a.srv.Listener(a.xdsLis)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	if a.httpSrv != nil {
		g.ServeHTTP("metrics server", a.httpSrv, a.metricsLis)
	}
	if a.profSrv != nil {
		g.ServeHTTP("profiling server", a.profSrv, a.profLis)
	}
	start("SIGHUP", func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-hup:
				if file, ok := a.source.(*watcher.File); ok {
					a.logger.Info("SIGHUP: reloading the topology file")
					file.Reload()
				}
			}
		}
	})
	a.announce()

	<-ctx.Done()
	a.logger.Info("edgeflow serve: shutting down", "reason", context.Cause(ctx))
	stopGRPC(a.gs)
	err := g.Wait() // run maps bad input to exit 2
	if a.inf != nil {
		a.inf.Stop()
	}
	return err
}

// announce writes the lines a person or script waits for: where serve listens, and on what.
func (a *serveApp) announce() {
	f := a.f
	metricsAt := "not served"
	if a.metricsLis != nil {
		metricsAt = "http://" + a.metricsLis.Addr().String() + "/metrics"
	}
	from := "file " + f.file
	if a.cluster != nil {
		from = "the cluster"
		if f.prometheusURL != "" {
			from += " and Prometheus " + redactURL(f.prometheusURL)
		}
	}
	announce(a.cmd, "edgeflow serve: xDS on %s, metrics %s, policy %s, encoding %s, topology from %s",
		a.xdsLis.Addr(), metricsAt, f.policy, f.encoding, from)
	if a.profLis != nil {
		announce(a.cmd, "edgeflow serve: profiling on http://%s/debug/pprof/", a.profLis.Addr())
	}
	if a.uiLis != nil {
		announce(a.cmd, "edgeflow serve: web view on http://%s/", a.uiLis.Addr())
	}
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

// probesHandler serves the latency probes' targets (probesd) from the Node informer's cache,
// at the granularity latency is planned at.
func (f *serveFlags) probesHandler(inf *kube.Informers) http.Handler {
	cfg := f.probes
	cfg.Granularity, cfg.MaxNodePairs = f.granularity, f.maxNodePairs
	return probesd.Handler(probesd.InformerNodes(inf.Nodes), cfg)
}
