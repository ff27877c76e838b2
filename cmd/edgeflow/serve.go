package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/xds"
	"github.com/edgeflow/edgeflow/xds/istio"
)

func init() { subcommands = append(subcommands, newServeCommand) }

// The xDS server is what the file watcher feeds.
var _ watcher.Listener = (*xds.Server)(nil)

type serveFlags struct {
	topologyFlags
	xdsAddress     string
	metricsAddress string
	policy         string
	encoding       string
	debounceQuiet  time.Duration
	debounceMax    time.Duration
	damping        float64
	pollInterval   time.Duration
	logLevel       string
	tls            xds.TLSFiles
	profiling      bool
	rebalance      bool
	rebalancer     rebalanceFlags
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
	fl.DurationVar(&f.debounceQuiet, "debounce-quiet", xds.DefaultDebounceQuiet, "push after the topology has been quiet this long (negative: push every change at once)")
	fl.DurationVar(&f.debounceMax, "debounce-max", xds.DefaultDebounceMax, "push at the latest this long after the first change of a burst")
	fl.Float64Var(&f.damping, "damping", optimizer.DefaultDamping, "flap damping: a recompute that moves less than this fraction of the traffic (pods, services and calls unchanged) is not pushed; negative pushes every recompute")
	fl.DurationVar(&f.pollInterval, "poll-interval", watcher.DefaultPollInterval, "how often the topology file is checked for changes")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fl.BoolVar(&f.profiling, "profiling", false, "serve /debug/pprof/ on --metrics-address, with mutex and block profiling on")
	fl.StringVar(&f.tls.CertFile, "xds-tls-cert", "", "serve xDS over TLS with this certificate (PEM; reloaded when the file changes)")
	fl.StringVar(&f.tls.KeyFile, "xds-tls-key", "", "the key of --xds-tls-cert (PEM)")
	fl.StringVar(&f.tls.ClientCAFile, "xds-tls-client-ca", "", "mutual TLS: clients need a certificate from these CAs, and a node may claim only a pod whose service account its certificate names (spiffe://…/ns/NS/sa/SA)")
	fl.BoolVar(&f.rebalance, "rebalance", false, "also run the LARP rebalancer (see edgeflow rebalance; its flags here are prefixed rebalance-, and it is dry-run unless --rebalance-dry-run=false)")
	f.rebalancer.register(cmd, "rebalance-")
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
	if f.debounceQuiet == 0 || f.debounceMax <= 0 || f.pollInterval <= 0 {
		return badInput("--debounce-quiet must be non-zero, --debounce-max and --poll-interval positive")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return badInput("--log-level: %v", err)
	}
	logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
	opts := f.options(cmd)

	if err := f.source(); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var source topologySource
	var cluster *watcher.Cluster
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
		if cluster, err = f.cluster(opts.DefaultLatencyMS, xds.CheckTopology, logger, reg); err != nil {
			return err
		}
		source = cluster
	}
	var reconciler *istio.Reconciler
	if f.istio.xdsAddress != "" {
		if cluster == nil {
			return badInput("--istio-xds-address needs the cluster flags (--kubeconfig or in-cluster), not -f")
		}
		ic, err := f.istioClient()
		if err != nil {
			return err
		}
		if reconciler, err = istio.NewReconciler(istio.ReconcilerConfig{Filters: f.istio.config(), Client: ic, Logger: logger}); err != nil {
			return usageError{err}
		}
	}
	var rb *rebalancer.Controller
	if f.rebalance {
		cs, err := f.clientset()
		if err != nil {
			return err
		}
		if rb, err = f.rebalancer.controller(cs, &f.clusterFlags, cluster, opts.DefaultLatencyMS, logger, reg); err != nil {
			return err
		}
	}
	srv, err := xds.NewServer(xds.Config{Policy: policy, Encoding: enc, Options: opts,
		DebounceQuiet: f.debounceQuiet, DebounceMax: f.debounceMax, Damping: f.damping, Logger: logger, Registerer: reg})
	if err != nil {
		return err
	}

	xdsLis, err := net.Listen("tcp", f.xdsAddress)
	if err != nil {
		return fmt.Errorf("xDS listener: %w", err)
	}
	// Sidecars hold one long-lived stream each; keepalives notice dead peers.
	gopts := []grpc.ServerOption{
		grpc.MaxConcurrentStreams(1 << 20),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if f.tls.CertFile != "" || f.tls.KeyFile != "" || f.tls.ClientCAFile != "" {
		tlsCfg, err := xds.NewTLSConfig(f.tls, logger)
		if err != nil {
			xdsLis.Close()
			return usageError{err}
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tlsCfg)))
		if f.tls.ClientCAFile != "" {
			gopts = append(gopts, grpc.StreamInterceptor(srv.IdentityCheck()))
		}
	}
	g := grpc.NewServer(gopts...)
	srv.Register(g)
	var httpSrv *http.Server
	var metricsLis net.Listener
	if f.metricsAddress != "" {
		if metricsLis, err = net.Listen("tcp", f.metricsAddress); err != nil {
			xdsLis.Close()
			return fmt.Errorf("metrics listener: %w", err)
		}
		mux := serveMux(reg, srv, cluster)
		if f.profiling {
			runtime.SetMutexProfileFraction(10)
			runtime.SetBlockProfileRate(int(time.Millisecond))
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	// Every goroutine below is owned by this function: it ends when ctx is cancelled (signal,
	// or the first component failing) and is waited for before runServe returns.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	start := func(name string, fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(); err != nil {
				cancel(fmt.Errorf("%s: %w", name, err))
			}
		}()
	}
	start("xDS push loop", func() error { return srv.Run(ctx) })
	var listener watcher.Listener = srv
	if reconciler != nil {
		listener = fanout{srv, reconciler}
		start("Istio EnvoyFilters", func() error { return reconciler.Run(ctx) })
	}
	start("topology source", func() error { return source.Run(ctx, listener) })
	if rb != nil {
		if err := f.rebalancer.start(ctx, rb, start); err != nil {
			cancel(err)
		}
	}
	start("xDS server", func() error {
		if err := g.Serve(xdsLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	if httpSrv != nil {
		start("metrics server", func() error {
			if err := httpSrv.Serve(metricsLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
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
	fmt.Fprintf(cmd.ErrOrStderr(), "edgeflow serve: xDS on %s, metrics %s, policy %s, encoding %s, topology from %s\n",
		xdsLis.Addr(), metricsAt, policy, enc, from)

	<-ctx.Done()
	logger.Info("edgeflow serve: shutting down", "reason", context.Cause(ctx))
	shutdown(g, httpSrv, logger)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err // run maps bad input to exit 2
	}
	return nil
}

// shutdown stops the servers: Run has ended the xDS streams, so the gRPC server drains
// quickly; a hard stop follows after a grace period.
func shutdown(g *grpc.Server, httpSrv *http.Server, logger *slog.Logger) {
	const grace = 5 * time.Second
	if httpSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		if err := httpSrv.Shutdown(ctx); err != nil {
			logger.Warn("metrics server shutdown", "error", err)
		}
		cancel()
	}
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		g.Stop()
		<-done
	}
}

// fanout hands every topology to several listeners.
type fanout []watcher.Listener

func (f fanout) Update(t *optimizer.Topology) {
	for _, l := range f {
		l.Update(t)
	}
}

// topologySource is what serve follows: the file or the cluster.
type topologySource interface {
	Run(context.Context, watcher.Listener) error
}

// serveMux serves /metrics, /healthz and /readyz (watcher.ReadyHandler).
func serveMux(reg *prometheus.Registry, srv *xds.Server, cluster *watcher.Cluster) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	var checks func() []watcher.Check
	if cluster != nil {
		checks = cluster.Checks
	}
	mux.Handle("/readyz", watcher.ReadyHandler(srv.Published, checks))
	return mux
}
