package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/kube"
)

func init() { subcommands = append(subcommands, newRebalanceCommand) }

// rebalanceFlags configure the rebalancer (edgeflow rebalance; edgeflow serve --rebalance,
// where every flag is prefixed rebalance-).
type rebalanceFlags struct {
	dryRun                                  bool
	allowSingleReplica                      bool
	period                                  time.Duration
	placementTimeout                        time.Duration
	threshold, maxUtil, rateChange          float64
	maxMoves, maxPerNode, maxPerNS          int
	minAge, cooldown, gateTimeout, budget   time.Duration
	leaseNamespace, leaseName               string
	webhookAddress, webhookCert, webhookKey string
}

func (f *rebalanceFlags) register(cmd *cobra.Command, prefix string) {
	fl := cmd.Flags()
	dryRunVar(cmd, &f.dryRun, prefix+"dry-run", true, "client (the default, also the bare flag): plan and report only; none: act, evicting pods and gating their replacements (true and false: client and none)")
	fl.DurationVar(&f.period, prefix+"period", rebalancer.DefaultPeriod, "time between runs (SIGUSR1 runs at once)")
	fl.Float64Var(&f.threshold, prefix+"threshold", rebalancer.DefaultThreshold, "act only when the predicted cost (network + queueing) falls by at least this fraction")
	fl.Float64Var(&f.maxUtil, prefix+"max-node-utilization", optimizer.DefaultMaxNodeUtilization, "highest planned utilisation of a node's cores the plan gives a node, in (0, 1] (0: no limit)")
	fl.Float64Var(&f.rateChange, prefix+"rate-change", rebalancer.DefaultRateChange, "plan again, before the period is up, when the offered rate moves by more than this fraction from the last plan's (0: only every period)")
	fl.IntVar(&f.maxMoves, prefix+"max-moves", rebalancer.DefaultMaxMoves, "most pods evicted per run")
	fl.IntVar(&f.maxPerNode, prefix+"max-moves-per-node", rebalancer.DefaultMaxMovesPerNode, "most moves per run leaving or entering one node")
	fl.IntVar(&f.maxPerNS, prefix+"max-moves-per-namespace", rebalancer.DefaultMaxMovesPerNamespace, "most moves per run in one namespace")
	fl.DurationVar(&f.minAge, prefix+"min-age", rebalancer.DefaultMinAge, "never move a pod younger than this")
	fl.DurationVar(&f.cooldown, prefix+"cooldown", rebalancer.DefaultCooldown, "a pod placed by a move is not moved again, and its service does not move back, within this")
	fl.DurationVar(&f.gateTimeout, prefix+"gate-timeout", rebalancer.DefaultGateTimeout, "a gated pod not placed within this is released without affinity, by any replica")
	fl.DurationVar(&f.placementTimeout, prefix+"placement-timeout", rebalancer.DefaultPlacementTimeout, "a replacement required on its planned node and not scheduled within this is deleted once (its controller recreates it without a node)")
	fl.BoolVar(&f.allowSingleReplica, prefix+"allow-single-replica", false, "also move the only pod of a service (an outage while it restarts, wherever no PodDisruptionBudget forbids it)")
	fl.DurationVar(&f.budget, prefix+"budget", optimizer.DefaultPlaceBudget, "bound on the planning search (0: none); a plan cut short says so")
	fl.StringVar(&f.leaseNamespace, prefix+"lease-namespace", "", "namespace of the leader-election Lease and of the rebalancer's state ConfigMap (default: the pod's namespace; required outside a pod when acting); in serve also of the Istio writer's Lease (--istio-lease-name)")
	fl.StringVar(&f.leaseName, prefix+"lease-name", rebalancer.DefaultLeaseName, "name of the leader-election Lease")
	fl.StringVar(&f.webhookAddress, "webhook-address", "", "HOST:PORT to serve the placement webhook on (HTTPS, path "+rebalancer.WebhookPath+"); empty: not served")
	fl.StringVar(&f.webhookCert, "webhook-tls-cert", "", "the webhook's certificate (PEM; read again when the file changes)")
	fl.StringVar(&f.webhookKey, "webhook-tls-key", "", "the key of --webhook-tls-cert (PEM)")
	cmd.MarkFlagsRequiredTogether("webhook-tls-cert", "webhook-tls-key")
}

func (f *rebalanceFlags) check() error {
	switch {
	case f.threshold >= 1:
		return badInput("the threshold is a fraction below 1, not %v", f.threshold)
	case !(f.rateChange >= 0) || math.IsInf(f.rateChange, 1):
		return badInput("the rate change is a fraction >= 0 (0: only every period), not %v", f.rateChange)
	case !(f.maxUtil >= 0 && f.maxUtil <= 1):
		return badInput("the max node utilization is in (0, 1], or 0 for no limit, not %v", f.maxUtil)
	case f.maxMoves < 1 || f.maxPerNode < 1 || f.maxPerNS < 1:
		return badInput("the move limits must be at least 1")
	case f.budget < 0:
		return badInput("the planning budget must not be negative (0: no limit)")
	case f.period <= 0 || f.gateTimeout <= 0 || f.placementTimeout <= 0:
		return badInput("the period, the gate timeout and the placement timeout must be positive")
	case !f.dryRun && f.lease().Namespace == "":
		return badInput("--lease-namespace is required outside a pod: replicas elect their leader on a Lease there (a laptop run and the in-cluster replicas must share it)")
	case f.webhookAddress != "" && f.webhookCert == "":
		return badInput("--webhook-address needs --webhook-tls-cert and --webhook-tls-key (the API server calls webhooks over HTTPS)")
	}
	return nil
}

func (f *rebalanceFlags) lease() rebalancer.LeaderConfig {
	ns := f.leaseNamespace
	if ns == "" {
		if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
			ns = string(bytes.TrimSpace(b))
		}
	}
	return rebalancer.LeaderConfig{Namespace: ns, Name: f.leaseName}
}

// controller builds the rebalancer on the cluster source. Acting with a webhook, a replica that
// does not lead forwards the reviews it gets to the leader's pod (leaderWebhook).
func (f *rebalanceFlags) controller(inf *kube.Informers, cf *clusterFlags, cluster *watcher.Live, defaultLatency *float64, logger *slog.Logger, reg prometheus.Registerer) (*rebalancer.Controller, error) {
	var c *rebalancer.Controller
	var forward func(context.Context, string) (string, error)
	if f.webhookAddress != "" && !f.dryRun {
		forward = f.leaderWebhook(func(ns, name string) (string, error) { return c.PodIP(ns, name) })
	}
	c, err := rebalancer.New(rebalancer.Config{LeaderWebhook: forward, Client: inf.Client(), Informers: inf, Topology: cluster.Measured, Namespaces: cf.namespaces,
		Selector: cf.selector, DefaultLatencyMS: defaultLatency, DryRun: f.dryRun, Period: f.period,
		Threshold: f.threshold, MaxNodeUtilization: utilizationOrNone(f.maxUtil), RateChange: utilizationOrNone(f.rateChange), MaxMoves: f.maxMoves, MaxMovesPerNode: f.maxPerNode, MaxMovesPerNamespace: f.maxPerNS,
		MinAge: f.minAge, Cooldown: f.cooldown, GateTimeout: f.gateTimeout, PlacementTimeout: f.placementTimeout,
		AllowSingleReplica: f.allowSingleReplica, Budget: budgetOrNone(f.budget), Identity: processIdentity(),
		Logger: logger, Registerer: reg})
	if err != nil {
		return nil, usageError{err}
	}
	return c, nil
}

// leaderWebhook resolves the Lease holder's identity (leader.Identity: the pod's name, "_", a
// random suffix) to its pod's IP (podIP: from the rebalancer's pod cache, so no API call and no
// further grant) in the Lease's namespace — the replicas run in one namespace — and this
// replica's webhook port: every replica serves the webhook on the same --webhook-address.
func (f *rebalanceFlags) leaderWebhook(podIP func(ns, name string) (string, error)) func(context.Context, string) (string, error) {
	_, port, _ := net.SplitHostPort(f.webhookAddress)
	ns := f.lease().Namespace
	return func(_ context.Context, identity string) (string, error) {
		i := strings.LastIndex(identity, "_")
		if i <= 0 {
			return "", fmt.Errorf("the Lease holder %q is not POD-NAME_SUFFIX (an edgeflow replica's identity)", identity)
		}
		ip, err := podIP(ns, identity[:i])
		if err != nil {
			return "", err
		}
		return net.JoinHostPort(ip, port), nil
	}
}

// start runs the controller and, if asked, the webhook, with start (serve's goroutine owner).
func (f *rebalanceFlags) start(ctx context.Context, c *rebalancer.Controller, start func(string, func() error)) error {
	var lis net.Listener
	if f.webhookAddress != "" {
		var err error
		if lis, err = net.Listen("tcp", f.webhookAddress); err != nil {
			return fmt.Errorf("webhook listener: %w", err)
		}
	}
	start("rebalancer", func() error { return c.Run(ctx, f.lease()) })
	if lis != nil {
		start("placement webhook", func() error {
			// The webhook reads the controller's caches: wait for them (Run starts them).
			if err := c.WaitSynced(ctx); err != nil {
				lis.Close()
				return nil
			}
			return c.ServeWebhook(ctx, lis, f.webhookCert, f.webhookKey)
		})
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	start("SIGUSR1", func() error {
		defer signal.Stop(usr1)
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-usr1:
				c.Trigger()
			}
		}
	})
	return nil
}

func newRebalanceCommand() *cobra.Command {
	var (
		cf             clusterFlags
		rf             rebalanceFlags
		output         string
		defLat         float64
		metricsAddress string
	)
	cmd := &cobra.Command{
		Use:   "rebalance [--kubeconfig FILE] [--context NAME] [--dry-run=none] [-o table|json|yaml]",
		Short: "Move running pods toward a LARP placement, safely (dry-run by default)",
		Long: "rebalance reads the live topology (as serve does), computes a LARP placement reachable from where the\n" +
			"pods run now in the fewest moves, and picks the moves with the most gain. It acts only when the predicted\n" +
			"cost (network + queueing) falls by at least --threshold, and moves at most --max-moves pods per run (and per node, per\n" +
			"namespace), never a bare or DaemonSet pod, a pod younger than --min-age, one placed by a move within\n" +
			"--cooldown, or one whose service has a pod that is not ready. The target keeps every node's planned\n" +
			"utilisation (the cpu its pods use at their planned load over its cores) within --max-node-utilization\n" +
			"(default 0.7, 0: no limit), and no move crosses it; the plan shows the network and queueing parts of\n" +
			"the cost and every node's planned utilisation, now and at the target.\n\n" +
			"--dry-run (the default) prints the plan once — its predicted gain and each move, with the reason a move\n" +
			"would be skipped — and exits. With --dry-run=none (or =false) it runs as a controller: only the holder of the Lease\n" +
			"acts; every --period (and on SIGUSR1) it evicts through the Eviction API (PodDisruptionBudgets hold) and\n" +
			"lifts the edgeflow.io/placement scheduling gate of each replacement with a required node affinity to\n" +
			"its planned node. --webhook-address serves the mutating webhook that adds that gate, to the replacements\n" +
			"of the leader's moves only (with no leader, nothing is gated); a replica that does not lead forwards\n" +
			"each review to the leader's pod (the Lease holder, same webhook port). Any replica lifts a gate older than\n" +
			"--gate-timeout; a replacement not scheduled within --placement-timeout is deleted once and recreated\n" +
			"ungated. The leader keeps its moves, cool-downs and back-offs in the ConfigMap LEASE-NAME-state, which\n" +
			"the next leader reads before it acts; it moves nothing in its first period.",
		Example: "  edgeflow rebalance --calls calls.yaml --default-latency 10\n" +
			"  edgeflow rebalance --prometheus-url http://prometheus:9090 -o json\n" +
			"  edgeflow rebalance --dry-run=none --webhook-address :8443 --webhook-tls-cert tls.crt --webhook-tls-key tls.key",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := rf.check(); err != nil {
				return err
			}
			var defaultLatency *float64
			if cmd.Flags().Changed("default-latency") {
				defaultLatency = &defLat
			}
			return runRebalance(cmd, &cf, &rf, output, metricsAddress, defaultLatency)
		},
	}
	cf.register(cmd)
	rf.register(cmd, "")
	latencyVar(cmd, &defLat, "default-latency", 0, "latency of node pairs never measured, a duration (20ms) or a number of ms (default: the largest measured)")
	cmd.Flags().Lookup("default-latency").DefValue = "0" // not set: the usage text says what happens
	outputVar(cmd, &output, "dry-run output format: table, json, yaml (the keys of json)", "table", "json", "yaml")
	cmd.Flags().StringVar(&metricsAddress, "metrics-address", "", "HOST:PORT for /metrics and /healthz (controller mode)")
	return cmd
}

func runRebalance(cmd *cobra.Command, cf *clusterFlags, rf *rebalanceFlags, output, metricsAddress string, defaultLatency *float64) error {
	level := slog.LevelInfo
	if rf.dryRun {
		level = slog.LevelWarn
	}
	logger := newLogger(cmd, level)
	inf, err := cf.informers(true, logger)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	cluster, err := cf.cluster(inf, optimizer.Options{DefaultLatencyMS: defaultLatency}, nil, nil, logger, reg)
	if err != nil {
		return err
	}
	c, err := rf.controller(inf, cf, cluster, defaultLatency, logger, reg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Every goroutine below is owned by the group: it ends when ctx is cancelled (signal, or
	// the first component failing) and is waited for before runRebalance returns; the shared
	// informers stop after that, once every reader has ended.
	g, ctx := newRunGroup(ctx)
	defer inf.Stop()
	defer g.Wait() // the error paths below return their own error
	defer g.Stop() // first: end the group on every return
	inf.Start(ctx)
	start := g.Go
	start("topology source", func() error { return cluster.Run(ctx, ignore{}) })

	if rf.dryRun {
		r, err := planOnce(ctx, c, cluster, cf.waitTimeout)
		g.Stop()
		if err != nil {
			return err
		}
		switch output {
		case "json":
			return writeStructured(cmd.OutOrStdout(), "json", r)
		case "yaml":
			return writeStructured(cmd.OutOrStdout(), "yaml-json-keys", r)
		}
		return writeRebalanceTable(cmd.OutOrStdout(), r)
	}
	if err := rf.start(ctx, c, start); err != nil {
		g.Stop()
		return err
	}
	if metricsAddress != "" {
		lis, err := net.Listen("tcp", metricsAddress)
		if err != nil {
			g.Stop()
			return fmt.Errorf("metrics listener: %w", err)
		}
		g.ServeHTTP("metrics server", newHTTPServer(metricsMux(reg), time.Minute), lis)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "edgeflow rebalance: controller running (period %v, lease %s), webhook %s\n",
		rf.period, rf.lease().Namespace+"/"+rf.lease().Name, orNone(rf.webhookAddress))
	<-ctx.Done()
	return g.Wait()
}

// utilizationOrNone maps a flag's 0 ("no limit", "never") to the Config's negative.
func utilizationOrNone(u float64) float64 {
	if u == 0 {
		return -1
	}
	return u
}

// budgetOrNone maps the flag's 0 ("none") to the Config's negative.
func budgetOrNone(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// nodeUtilization shows a node's planned utilisation and cpu ("n/a" with unknown cores).
func nodeUtilization(u optimizer.NodeUse) string {
	if u.Cores == 0 {
		return fmt.Sprintf("n/a (%.0fm)", u.CPU)
	}
	return fmt.Sprintf("%.2f (%.0fm)", u.Utilization, u.CPU)
}

func orNone(s string) string {
	if s == "" {
		return "not served"
	}
	return s
}

// ignore is a Listener that drops topologies (the rebalancer reads Live.Current).
type ignore struct{}

func (ignore) Update(*optimizer.Topology) {}

// planOnce waits for the first topology and the controller's caches, and plans once.
func planOnce(ctx context.Context, c *rebalancer.Controller, cluster *watcher.Live, timeout time.Duration) (*rebalancer.Report, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer func() { cancel(); c.Stop() }() // the informers stop with ctx; Stop waits for them
	if err := c.Start(ctx); err != nil {
		return nil, fmt.Errorf("cluster caches: %w", err)
	}
	for cluster.Measured() == nil {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no complete topology from the cluster within %v (%s)", timeout, describeChecks(cluster.Checks()))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return c.Plan()
}

// writeRebalanceTable prints the plan: the predicted costs and gain, then each move.
func writeRebalanceTable(w io.Writer, r *rebalancer.Report) error {
	var buf bytes.Buffer
	mode := "dry-run: nothing is changed"
	if !r.DryRun {
		mode = "acting"
	}
	fmt.Fprintf(&buf, "Predicted LATA cost: %.1f now, %.1f at the target (gain %.1f%% of network + queueing, threshold %.1f%%; %s)\n",
		r.CostBefore, r.CostTarget, 100*r.Gain, 100*r.Threshold, mode)
	fmt.Fprintf(&buf, "Predicted cost split (ms·req/s): network %.1f → %.1f, queueing %.1f → %.1f, total %.1f → %.1f\n",
		r.CostBefore, r.CostTarget, r.QueueingBefore, r.QueueingTarget, r.CostBefore+r.QueueingBefore, r.CostTarget+r.QueueingTarget)
	if r.Truncated {
		fmt.Fprintln(&buf, "The planning budget cut the search short: the target is the best found in time (--budget).")
	}
	if len(r.UtilizationBefore) > 0 {
		limit := "none"
		if r.MaxNodeUtilization > 0 {
			limit = fmt.Sprintf("%.2f", r.MaxNodeUtilization)
		}
		fmt.Fprintf(&buf, "\nPlanned node utilisation (planned cpu / cores; limit %s):\n", limit)
		tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tCORES\tNOW\tTARGET\t")
		for v, before := range r.UtilizationBefore {
			target := "n/a"
			if v < len(r.UtilizationTarget) {
				target = nodeUtilization(r.UtilizationTarget[v])
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\n", before.Node, before.Cores, nodeUtilization(before), target)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(&buf)
	}
	if len(r.Moves) == 0 {
		fmt.Fprintln(&buf, "No moves: the pods already run where the plan wants them.")
		_, err := w.Write(buf.Bytes())
		return err
	}
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tSERVICE\tPOD\tFROM\tTO\tCOST AFTER\tACTION\tREASON\t")
	for _, m := range r.Moves {
		reason := m.Reason
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%s\t\n", m.Namespace, m.Service, m.Pod, m.From, m.To, m.CostAfter, m.Action, reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}
