package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/config"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/edgeflow/edgeflow/internal/latest"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/rebalancer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/watcher/estimate"
	"github.com/edgeflow/edgeflow/watcher/kube"
	"github.com/edgeflow/edgeflow/watcher/prom"
	"github.com/edgeflow/edgeflow/xds/istio"
	"istio.io/client-go/pkg/clientset/versioned"
)

// clusterFlags are the flags that read the topology from a live cluster instead of a file.
type clusterFlags struct {
	kubeconfig    string
	context       string
	namespaces    []string
	selector      string
	prometheusURL string
	callsFile     string
	waitTimeout   time.Duration

	promInterval   time.Duration
	promWindow     time.Duration
	scrapeInterval time.Duration
	probeJob       string
	probePins      string
	latencyQuery   string
	successQuery   string
	sourceLabel    string
	targetLabel    string
	callsQuery     string
	hystRel        float64
	hystMS         float64
	hystRPS        float64
	hystCores      float64
	podRequests    string
	podInbound     string
	podDownstream  string
	podCPU         string
	attempts       string // --attempts-query
	attemptSeconds string // --attempt-seconds-query
	// correctLatency: the closed loop's latency correction (serve --policy closed-loop) reads
	// the call-attempt queries; without it they are not run.
	correctLatency bool
	maxProbeLoss   float64
	unreachableMS  float64
	nodeMatch      string
	granularity    string
	maxNodePairs   int
	ipFamily       string
	tokenFile      string
	caFile         string
	maxSeries      int
	maxBytes       int64
	kubeQPS        float32
	kubeBurst      int
	maxServices    int
	// capacityHistory is serve's --capacity-history-windows (0, none, for the commands that
	// do not register it).
	capacityHistory int

	istio istioFlags

	// only are the names of the flags register added: they read a cluster, so with -f they are
	// a usage error (topologyFlags.source).
	only []string
}

// istioFlags configure edgeflow's Istio integration (serve, plan -o istio, uninstall).
type istioFlags struct {
	mode          string
	xdsAddress    string
	namespace     string
	rootNamespace string
	clusterDomain string
	labelNodes    bool
	xdsTLS        bool
	xdsServerSANs []string
	// drExportTo is the mesh's defaultDestinationRuleExportTo (--istio-default-destination-rule-export-to).
	drExportTo []string
}

// Istio modes (--istio-mode).
const (
	istioModeOff             = "off"
	istioModeDestinationRule = "destinationrule"
	istioModeEnvoyFilter     = "envoyfilter"
)

func (f *istioFlags) register(cmd *cobra.Command, withAddress bool) {
	fl := cmd.Flags()
	if withAddress {
		enumVar(cmd, fl, &enumFlag[string]{p: &f.mode, values: []string{istioModeOff, istioModeDestinationRule, istioModeEnvoyFilter}, typ: "mode"},
			"istio-mode", "", istioModeOff, "Istio integration: off; destinationrule (stock Istio: the plan as DestinationRules with locality weights, per caller workload and callee host); envoyfilter (per-pod weights: the sidecars of pods labelled "+istio.EDSLabel+"="+istio.EDSLabelValue+" take the managed services' EDS from edgeflow; needs --istio-xds-address and the bootstrap override)")
		fl.StringVar(&f.xdsAddress, "istio-xds-address", "", "--istio-mode=envoyfilter: HOST:PORT at which sidecars reach edgeflow's xDS server (e.g. edgeflow.edgeflow.svc.cluster.local:18000); edgeflow manages the EnvoyFilters and bootstrap ConfigMaps")
		fl.StringSliceVar(&f.xdsServerSANs, "istio-xds-server-san", nil, "--istio-mode=envoyfilter with --xds-tls-cert, required: a subject alternative name edgeflow's certificate carries, checked by the sidecars: its SPIFFE id spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT; \""+anyXDSServer+"\": any certificate the mesh root signed (any mesh workload could pose as edgeflow)")
		fl.BoolVar(&f.labelNodes, "istio-label-nodes", false, "--istio-mode=destinationrule: give each node with a region and zone its own subzone (label "+istio.SubzoneLabel+"=NODE), so the mesh can weigh nodes apart (a write to Nodes)")
	}
	fl.StringVar(&f.namespace, "istio-namespace", istio.DefaultNamespace, "namespace of the EnvoyFilters (Istio's root namespace applies them in every namespace)")
	f.registerRules(cmd)
}

// registerRules registers the flags Istio's host names and DestinationRules depend on (serve,
// plan).
func (f *istioFlags) registerRules(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.rootNamespace, "istio-root-namespace", istio.DefaultRootNamespace, "Istio's root namespace, whose exported DestinationRules apply mesh-wide (a user's rule there is carried into edgeflow's)")
	fl.StringVar(&f.clusterDomain, "cluster-domain", optimizer.DefaultClusterDomain, "the Kubernetes cluster's DNS domain, in Istio's cluster names and service host names")
	fl.StringSliceVar(&f.drExportTo, "istio-default-destination-rule-export-to", nil, "the mesh's defaultDestinationRuleExportTo (MeshConfig, as istiod is given it): with \".\" a user's DestinationRule without exportTo is private to its namespace, so edgeflow carries it only into rules of that namespace's callers; empty or \"*\": exported everywhere (Istio honours only \".\" and \"*\" there)")
}

// checkMode validates the flags that go with --istio-mode (the flag validates its value).
func (f *istioFlags) checkMode() error {
	switch f.mode {
	case istioModeOff, istioModeDestinationRule:
		if f.xdsAddress != "" {
			return badInput("--istio-xds-address is for --istio-mode=%s (got --istio-mode=%s)", istioModeEnvoyFilter, f.mode)
		}
	case istioModeEnvoyFilter:
		if f.xdsAddress == "" {
			return badInput("--istio-mode=%s needs --istio-xds-address HOST:PORT", istioModeEnvoyFilter)
		}
	}
	if f.labelNodes && f.mode != istioModeDestinationRule {
		return badInput("--istio-label-nodes is for --istio-mode=%s", istioModeDestinationRule)
	}
	if len(f.xdsServerSANs) > 0 && f.mode != istioModeEnvoyFilter {
		return badInput("--istio-xds-server-san is for --istio-mode=%s", istioModeEnvoyFilter)
	}
	return nil
}

// config is the per-pod mode's configuration; xdsTLS is set by the caller when the xDS port
// serves TLS (serve: --xds-tls-cert), and checkXDSServerSANs has accepted xdsServerSANs.
func (f *istioFlags) config() istio.Config {
	cfg := istio.Config{Namespace: f.namespace, XDSAddress: f.xdsAddress, ClusterDomain: f.clusterDomain, TLS: f.xdsTLS}
	cfg.TLSServerSANs, cfg.TLSAnyServer = xdsServerSANs(f.xdsServerSANs)
	return cfg
}

// DefaultMaxManagedServices is --max-managed-services' default: a tenant who can label
// Services makes edgeflow plan, serve and write for at most this many.
const DefaultMaxManagedServices = 1000

// allNamespaces is the --namespaces value by which the operator has edgeflow manage the
// Services of every namespace explicitly (no namespace is named "*").
const allNamespaces = "*"

// checkNamespaces validates --namespaces and reads allNamespaces as every namespace (nil).
func (f *clusterFlags) checkNamespaces() error {
	if !slices.Contains(f.namespaces, allNamespaces) {
		return nil
	}
	if len(f.namespaces) > 1 {
		return badInput("--namespaces %q: %q is every namespace, so it goes alone", strings.Join(f.namespaces, ","), allNamespaces)
	}
	f.namespaces = nil
	return nil
}

// checkIstioNamespaces: an Istio mode writes for every managed Service (DestinationRules in its
// callers' namespaces, EnvoyFilters and bootstrap ConfigMaps), so anyone who can label a Service
// in a namespace edgeflow watches has it write there; the operator names those namespaces, or
// says allNamespaces.
func (f *clusterFlags) checkIstioNamespaces() error {
	if f.istio.mode == istioModeOff || len(f.namespaces) > 0 {
		return nil
	}
	return badInput("--istio-mode=%s needs --namespaces: the namespaces whose Services edgeflow manages and writes Istio's objects for "+
		"(anyone who can label a Service in a watched namespace has edgeflow write for it); --namespaces=%s watches every namespace", f.istio.mode, allNamespaces)
}

// anyXDSServer is the --istio-xds-server-san value by which the operator accepts any
// certificate the mesh root signed as edgeflow's.
const anyXDSServer = "any"

// checkXDSServerSANs validates --istio-xds-server-san for an edgeflow-xds cluster with TLS
// (tls, switched on by tlsFlag) or without: with TLS a SAN is required, so that the sidecars
// take only edgeflow's certificate for edgeflow's, unless the value is exactly anyXDSServer;
// without TLS there is nothing to check a SAN against.
func checkXDSServerSANs(values []string, tls bool, tlsFlag string) error {
	switch {
	case !tls && len(values) > 0:
		return badInput("--istio-xds-server-san without TLS (%s): the sidecars check no certificate", tlsFlag)
	case tls && len(values) == 0:
		return badInput("%s needs --istio-xds-server-san: the SAN the sidecars require of edgeflow's certificate, its SPIFFE id "+
			"spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT; --istio-xds-server-san=%s accepts any certificate the mesh root signed "+
			"(any workload of the mesh reachable at --istio-xds-address could then serve the sidecars their endpoints)", tlsFlag, anyXDSServer)
	case slices.Contains(values, anyXDSServer) && len(values) > 1:
		return badInput("--istio-xds-server-san %q: %q accepts any certificate the mesh root signed, so it goes alone", strings.Join(values, ","), anyXDSServer)
	case slices.Contains(values, ""):
		return badInput("--istio-xds-server-san %q: an empty SAN", strings.Join(values, ","))
	}
	return nil
}

// xdsServerSANs reads checked --istio-xds-server-san values: the SANs, or any.
func xdsServerSANs(values []string) (sans []string, anyServer bool) {
	if slices.Equal(values, []string{anyXDSServer}) {
		return nil, true
	}
	return values, false
}

// envoyFilterReconciler is the per-pod mode's reconciler (EnvoyFilters and bootstrap
// ConfigMaps) for the cluster of the flags; reg (nil: none) receives its metrics.
func (f *clusterFlags) envoyFilterReconciler(cfg istio.Config, logger *slog.Logger, reg prometheus.Registerer) (*istio.Reconciler, error) {
	ic, err := f.istioClient()
	if err != nil {
		return nil, err
	}
	kc, err := f.clientset()
	if err != nil {
		return nil, err
	}
	r, err := istio.NewReconciler(istio.ReconcilerConfig{Filters: cfg, Client: ic, Kube: kc, Logger: logger, Registerer: reg})
	if err != nil {
		return nil, usageError{err}
	}
	return r, nil
}

func (f *istioFlags) rulesConfig() istio.RulesConfig {
	return istio.RulesConfig{ClusterDomain: f.clusterDomain, RootNamespace: f.rootNamespace, DefaultExportTo: f.drExportTo}
}

// istioClient is the istio client-go clientset for the cluster of the flags.
func (f *clusterFlags) istioClient() (versioned.Interface, error) {
	cfg, err := f.restConfig()
	if err != nil {
		return nil, err
	}
	c, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, usageError{fmt.Errorf("kubeconfig: %w", err)}
	}
	return c, nil
}

func (f *clusterFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	before := map[string]bool{}
	fl.VisitAll(func(fl *pflag.Flag) { before[fl.Name] = true })
	defer fl.VisitAll(func(fl *pflag.Flag) {
		if !before[fl.Name] {
			f.only = append(f.only, fl.Name)
		}
	})
	f.registerKubeconfig(cmd, "read the topology from the cluster of this kubeconfig instead of -f (default: kubectl's: $KUBECONFIG, else ~/.kube/config, else in a pod the in-cluster config)")
	f.registerKubeLimits(cmd)
	fl.StringSliceVar(&f.namespaces, "namespaces", nil, "namespaces whose Services may be managed; \""+allNamespaces+"\": every namespace, explicitly (default: all, except with --istio-mode, which needs the list or \""+allNamespaces+"\")")
	fl.IntVar(&f.maxServices, "max-managed-services", DefaultMaxManagedServices, "the most managed Services: beyond it the others are refused (the first by namespace, then name, kept), logged, counted in edgeflow_kube_skipped{reason=\"over_cap\"} and listed in /readyz (0: no bound)")
	fl.StringVarP(&f.selector, "selector", "l", kube.DefaultSelector, "label selector of managed Services (\"\" selects every Service in --namespaces)")
	fl.StringVar(&f.prometheusURL, "prometheus-url", "", "Prometheus base URL: node-to-node latency (blackbox ICMP RTT) and the call graph (istio_requests_total)")
	fl.StringVar(&f.callsFile, "calls", "", "call graph file (calls and ingress, as in a topology file) instead of istio_requests_total")
	fl.DurationVar(&f.waitTimeout, "inputs-timeout", 60*time.Second, "plan/place: how long to wait for the cluster inputs' first complete topology")
	fl.DurationVar(&f.promInterval, "prometheus-interval", prom.DefaultInterval, "how often Prometheus is queried")
	fl.DurationVar(&f.scrapeInterval, "scrape-interval", 0, "the probe job's scrape interval (default: read from Prometheus's /api/v1/targets for --probe-job, else 15s)")
	fl.DurationVar(&f.promWindow, "prometheus-window", 0, "window of the queries ($window; default 4 × the scrape interval)")
	fl.StringVar(&f.probeJob, "probe-job", prom.DefaultProbeJob, "job label of the blackbox-exporter ICMP probe series ($job): the default queries read only this job")
	enumVar(cmd, fl, &enumFlag[string]{p: &f.probePins, values: []string{prom.PinTargets, prom.PinOff}, typ: "pins"}, "probe-pins", "", prom.PinTargets, "which probe series are trusted: targets (only those carrying every label of one of --probe-job's active targets in Prometheus's /api/v1/targets) or off (every series of the job; for an API without /api/v1/targets); a node pair with more than one series is contested either way")
	fl.StringVar(&f.latencyQuery, "latency-query", prom.DefaultLatencyQuery, "PromQL for node-to-node RTT in seconds over answered probes (NaN or no series when none was answered), one series per ordered node pair, each keeping its target's labels (job, instance: --probe-pins); placeholders $window, $scrape_interval, $job, $source_label, $target_label")
	fl.StringVar(&f.successQuery, "probe-success-query", prom.DefaultSuccessQuery, "PromQL for the share of answered probes per node pair (same placeholders; \"-\": none, every RTT counts as answered)")
	fl.StringVar(&f.sourceLabel, "latency-source-label", prom.DefaultSourceLabel, "label of the latency series naming the probing node ($source_label)")
	fl.StringVar(&f.targetLabel, "latency-target-label", prom.DefaultTargetLabel, "label of the latency series naming the probed node ($target_label)")
	fl.Float64Var(&f.maxProbeLoss, "max-probe-loss", prom.DefaultMaxProbeLoss, "a node pair that lost more than this share of its probes in the window is unreachable")
	latencyVar(cmd, &f.unreachableMS, "unreachable-latency", prom.DefaultUnreachableMS, "latency given to an unreachable node pair (a duration, or a number of ms)")
	enumVar(cmd, fl, &enumFlag[string]{p: &f.nodeMatch, values: []string{watcher.NodeMatchName, watcher.NodeMatchInternalIP}, typ: "match"}, "node-match", "", watcher.NodeMatchName, "how latency labels name nodes: name (the node's name) or internal-ip (an address, IP or IP:PORT like a probe's instance, matched to the node's InternalIP)")
	enumVar(cmd, fl, &enumFlag[string]{p: &f.granularity, values: []string{watcher.LatencyAuto, optimizer.LatencyPerNode, optimizer.LatencyPerZone}, typ: "granularity"},
		"latency-granularity", "", watcher.LatencyAuto, "what latency is measured and planned between: node (every node pair), zone (every pair of zones, a zone being a node's region/zone label or, without one, the node itself; the prober needs one representative node per zone: docs/tasks/live-cluster.md), or auto (node while nodes × (nodes − 1) ≤ --max-node-pairs, else zone)")
	fl.IntVar(&f.maxNodePairs, "max-node-pairs", watcher.DefaultMaxNodePairs, "--latency-granularity=auto: the most ordered node pairs planned per node (default 500 nodes: there one merge, compile and plan of every node pair took 0.12 s, allocated 42 MB and held 12 MiB, at 1,000 nodes 0.88 s, 163 MB and 47 MiB, growing with nodes²; per zone at 5,000 nodes 0.1–0.2 s and 8 MiB; docs/benchmarks/measured.md)")
	enumVar(cmd, fl, &enumFlag[string]{p: &f.ipFamily, values: []string{string(corev1.IPv4Protocol), string(corev1.IPv6Protocol)}, typ: "family",
		parse: func(s string) (string, error) { // "": each pod's primary IP's family
			if s == "" || s == string(corev1.IPv4Protocol) || s == string(corev1.IPv6Protocol) {
				return s, nil
			}
			return "", errors.New("unknown")
		}}, "ip-family", "", "", "address family of endpoints: IPv4 or IPv6 (default: each pod's primary IP's family)")
	fl.StringVar(&f.tokenFile, "prometheus-bearer-token-file", "", "file holding a bearer token for Prometheus (read at every request, so a rotated token is picked up)")
	fl.StringVar(&f.caFile, "prometheus-ca-file", "", "PEM file of the CA certificates that verify Prometheus's TLS certificate (default: the system's)")
	fl.IntVar(&f.maxSeries, "prometheus-max-series", prom.DefaultMaxSeries, "a query answering more series than this fails, naming the query")
	fl.Int64Var(&f.maxBytes, "prometheus-max-response-bytes", prom.DefaultMaxResponseBytes, "a query response larger than this fails, naming the query")
	fl.StringVar(&f.callsQuery, "calls-query", prom.DefaultCallsQuery, "PromQL for call rates by source/destination workload and namespace, optionally by reporter (source kept over destination for one pair); placeholder $window")
	fl.Float64Var(&f.hystRel, "hysteresis-relative", prom.DefaultHysteresisRelative, "a measured change smaller than this fraction of the old value causes no recompute")
	latencyVar(cmd, &f.hystMS, "hysteresis-latency", prom.DefaultHysteresisLatencyMS, "a latency change of at most this much causes no recompute (a duration, or a number of ms)")
	latencyVar(cmd, &f.hystMS, "hysteresis-latency-ms", prom.DefaultHysteresisLatencyMS, "the former name of --hysteresis-latency")
	_ = fl.MarkHidden("hysteresis-latency-ms") // still taken: the chart and existing command lines give it
	fl.Float64Var(&f.hystRPS, "hysteresis-rps", prom.DefaultHysteresisRPS, "a call-rate change of at most this many requests/s causes no recompute")
	fl.StringVar(&f.podRequests, "pod-requests-query", prom.DefaultPodRequestsQuery, "PromQL for the requests each pod completed in the window, by namespace and pod; placeholder $window (\"-\": no pod loads at all)")
	fl.StringVar(&f.podInbound, "pod-inbound-query", prom.DefaultPodInboundQuery, "PromQL for the summed duration in ms of the requests each pod completed in the window, by namespace and pod; placeholder $window (\"-\": none)")
	fl.StringVar(&f.podDownstream, "pod-downstream-query", prom.DefaultPodDownstreamQuery, "PromQL for the summed duration in ms of the calls each pod made in the window, by the calling pod's namespace and pod; placeholder $window (\"-\": none)")
	fl.StringVar(&f.podCPU, "pod-cpu-query", prom.DefaultPodCPUQuery, "PromQL for the CPU-seconds each pod's application containers used in the window, by namespace and pod; placeholder $window (\"-\": none)")
	fl.StringVar(&f.attempts, "attempts-query", prom.DefaultAttemptsQuery, "with --policy closed-loop: PromQL for the call attempts each proxyless gRPC caller pod completed in the window, by namespace, pod, grpc_target and grpc_lb_locality (grpc-go's OpenTelemetry grpc.client.attempt.duration); placeholder $window (\"-\": no latency correction)")
	fl.StringVar(&f.attemptSeconds, "attempt-seconds-query", prom.DefaultAttemptSecondsQuery, "with --policy closed-loop: PromQL for the summed duration in seconds of those attempts, labelled as --attempts-query's; placeholder $window")
	fl.Float64Var(&f.hystCores, "hysteresis-cores", prom.DefaultHysteresisCores, "a change of a pod's CPU use of at most this many cores causes no recompute")
}

// registerKubeLimits registers --kube-qps and --kube-burst, the rate limits of every
// Kubernetes client the command makes.
func (f *clusterFlags) registerKubeLimits(cmd *cobra.Command) {
	cmd.Flags().Float32Var(&f.kubeQPS, "kube-qps", rebalancer.DefaultKubeQPS, "requests per second each Kubernetes client may send (client-go's own default is 5)")
	cmd.Flags().IntVar(&f.kubeBurst, "kube-burst", rebalancer.DefaultKubeBurst, "burst above --kube-qps each Kubernetes client may send")
}

// registerKubeconfig registers --kubeconfig (its usage text given) and --context, which say
// which cluster every command that reads or writes one talks to.
func (f *clusterFlags) registerKubeconfig(cmd *cobra.Command, usage string) {
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", usage)
	cmd.Flags().StringVar(&f.context, "context", "", "the kubeconfig context to use (default: its current-context)")
}

// errNoCluster is restConfig's error when no kubeconfig is found and edgeflow is not in a pod.
var errNoCluster = errors.New("no cluster: give --kubeconfig, set $KUBECONFIG, write ~/.kube/config, or run in a pod")

// restConfig follows kubectl (client-go's default loading rules): --kubeconfig, else the files
// of $KUBECONFIG, else ~/.kube/config, else, in a pod, the in-cluster config; --context picks
// the context (default: the current-context).
func (f *clusterFlags) restConfig() (*rest.Config, error) {
	cfg, err := f.clientConfig().ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, usageError{errNoCluster}
	}
	if err != nil {
		return nil, usageError{fmt.Errorf("kubeconfig: %w", err)}
	}
	return f.limited(cfg)
}

// clientConfig is kubectl's client configuration for the flags (restConfig).
func (f *clusterFlags) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context})
}

// namespace is kubectl's default namespace for the flags' cluster: the context's, in a pod
// the pod's own, else "default".
func (f *clusterFlags) namespace() (string, error) {
	if _, err := f.restConfig(); err != nil { // its errors name a missing context or cluster
		return "", err
	}
	ns, _, err := f.clientConfig().Namespace()
	if err != nil {
		return "", usageError{fmt.Errorf("kubeconfig: %w", err)}
	}
	return ns, nil
}

// limited applies --kube-qps and --kube-burst (their defaults when not registered) and names
// edgeflow as the user agent (the API server's audit log and metrics show it).
func (f *clusterFlags) limited(cfg *rest.Config) (*rest.Config, error) {
	qps, burst := f.kubeQPS, f.kubeBurst
	if qps == 0 {
		qps = rebalancer.DefaultKubeQPS
	}
	if burst == 0 {
		burst = rebalancer.DefaultKubeBurst
	}
	if qps < 0 || burst < 1 {
		return nil, badInput("--kube-qps must be positive and --kube-burst at least 1, not %v and %d", qps, burst)
	}
	cfg.QPS, cfg.Burst = qps, burst
	if cfg.UserAgent == "" {
		cfg.UserAgent = "edgeflow"
	}
	return cfg, nil
}

// clientset is a Kubernetes clientset for the cluster of the flags.
func (f *clusterFlags) clientset() (kubernetes.Interface, error) {
	cfg, err := f.restConfig()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, usageError{fmt.Errorf("kubeconfig: %w", err)}
	}
	return cs, nil
}

// informers builds the process's one set of shared informers, read by the watcher and the
// rebalancer: the pods of every namespace when the rebalancer runs (it counts every pod on a
// node), else those of --namespaces. The caller starts them (Start) and stops them (Stop) once
// everything reading them has ended.
func (f *clusterFlags) informers(allPods bool, logger *slog.Logger) (*kube.Informers, error) {
	if err := f.checkNamespaces(); err != nil {
		return nil, err
	}
	cfg, err := f.restConfig()
	if err != nil {
		return nil, err
	}
	klog.SetSlogLogger(logger) // client-go logs in the same format as edgeflow's own
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, usageError{fmt.Errorf("kubeconfig: %w", err)}
	}
	return kube.NewInformers(kube.InformersConfig{Client: cs, Namespaces: f.namespaces, AllPods: allPods, EndpointSlices: true})
}

// cluster builds the merged cluster source on inf; it compiles every topology with opts (as
// its consumers do). With plan (the plan in force: serve's xDS server's last publication) and
// the pod loads, the closed loop's model-error breaker guards the estimated capacities
// (watcher.LiveConfig.Breaker). Bad flags or files are usage errors.
func (f *clusterFlags) cluster(inf *kube.Informers, opts optimizer.Options, check func(*optimizer.Topology) error, plan func() (*optimizer.Topology, *optimizer.Allocation),
	logger *slog.Logger, reg prometheus.Registerer) (*watcher.Live, error) {
	ks, err := kube.NewSource(kube.Config{Informers: inf, Namespaces: f.namespaces, Selector: f.selector, MaxServices: f.maxServices, IPFamily: corev1.IPFamily(f.ipFamily),
		Logger: logger, Registerer: reg})
	if err != nil {
		return nil, usageError{fmt.Errorf("--ip-family: %w", err)}
	}
	if f.maxNodePairs <= 0 {
		return nil, badInput("--max-node-pairs %d: want a positive number of ordered node pairs", f.maxNodePairs)
	}
	defaultLatency := opts.DefaultLatencyMS
	cc := watcher.LiveConfig{Kube: ks, DefaultLatencyMS: defaultLatency, Options: opts, Check: check, NodeMatch: f.nodeMatch,
		LatencyGranularity: f.granularity, MaxNodePairs: f.maxNodePairs, Logger: logger, Registerer: reg}
	if f.callsFile != "" {
		g, err := readCallGraph(f.callsFile)
		if err != nil {
			return nil, err
		}
		cc.CallGraph = g
	}
	if f.prometheusURL != "" {
		if f.unreachableMS <= 0 {
			return nil, badInput("--unreachable-latency %vms: want a positive latency", f.unreachableMS)
		}
		if f.maxSeries <= 0 || f.maxBytes <= 0 {
			return nil, badInput("--prometheus-max-series %d, --prometheus-max-response-bytes %d: want positive numbers", f.maxSeries, f.maxBytes)
		}
		pc := prom.Config{URL: f.prometheusURL, HTTP: f.httpConfig(), Interval: f.promInterval, ScrapeInterval: f.scrapeInterval, Window: f.promWindow,
			ProbeJob: f.probeJob, ProbePins: f.probePins, Namespaces: f.namespaces, LatencyQuery: f.latencyQuery, SuccessQuery: f.successQuery, SourceLabel: f.sourceLabel, TargetLabel: f.targetLabel,
			CallsQuery: f.callsQuery, MaxProbeLoss: f.maxProbeLoss, UnreachableMS: f.unreachableMS,
			HysteresisRelative: f.hystRel, HysteresisLatencyMS: f.hystMS, HysteresisRPS: f.hystRPS, HysteresisCores: f.hystCores,
			PodRequestsQuery: f.podRequests, PodInboundQuery: f.podInbound, PodDownstreamQuery: f.podDownstream, PodCPUQuery: f.podCPU,
			MaxSeries: f.maxSeries, MaxResponseBytes: f.maxBytes, Logger: logger, Registerer: reg}
		if cc.CallGraph != nil {
			pc.CallsQuery = prom.DisableCalls
		}
		// The latency correction reads the callees' inbound times from the pod loads.
		correct := f.correctLatency && f.podRequests != prom.DisableLoad && f.attempts != prom.DisableAttempts
		if correct {
			pc.AttemptsQuery, pc.AttemptSecondsQuery = f.attempts, f.attemptSeconds
		}
		if cc.Prom, err = prom.NewSource(pc); err != nil {
			return nil, usageError{err}
		}
		if f.podRequests != prom.DisableLoad {
			if cc.Estimator, err = estimate.New(estimate.Config{}); err != nil {
				return nil, err
			}
			cc.CapacityHistoryWindows = f.capacityHistory
			if plan != nil {
				// The breaker's sample floor is the estimator's: a window the estimator takes.
				if cc.Breaker, err = estimate.NewBreaker(estimate.BreakerConfig{MinRequests: estimate.DefaultMinRequests}); err != nil {
					return nil, err
				}
				cc.Plan = plan
			}
		}
		if correct {
			if cc.Latency, err = estimate.NewLatencyCorrector(estimate.LatencyConfig{}); err != nil {
				return nil, err
			}
		}
	} else if cc.CallGraph == nil {
		return nil, badInput("without --prometheus-url the call graph must be given with --calls FILE")
	}
	c, err := watcher.NewLive(cc)
	if err != nil {
		return nil, usageError{err}
	}
	return c, nil
}

// httpConfig is the Prometheus client's configuration, in Prometheus's own terms
// (prometheus/common/config, as in a scrape or remote-read config).
func (f *clusterFlags) httpConfig() config.HTTPClientConfig {
	c := config.DefaultHTTPClientConfig
	if f.tokenFile != "" {
		c.Authorization = &config.Authorization{Type: "Bearer", CredentialsFile: f.tokenFile}
	}
	c.TLSConfig.CAFile = f.caFile
	return c
}

// readCallGraph reads the calls and ingress of a topology-format file; other sections are
// not allowed (the cluster gives them).
func readCallGraph(path string) (*watcher.CallGraph, error) {
	t, err := readTopology(path, nil)
	if err != nil {
		return nil, err
	}
	if len(t.Nodes) > 0 || len(t.Services) > 0 || len(t.Latency) > 0 {
		return nil, badInput("--calls %s: only calls and ingress may be given (nodes, services and latency come from the cluster)", path)
	}
	return &watcher.CallGraph{Calls: t.Calls, Ingress: t.Ingress}, nil
}

// latestTopology is a Listener that keeps the last topology and signals each one (on C).
type latestTopology struct {
	latest.Value[*optimizer.Topology]
}

func (l *latestTopology) Update(t *optimizer.Topology) { l.Set(t) }

// clusterSnapshot runs the cluster sources until their first complete topology: one with
// usable latency when Prometheus is given. If none has arrived by --inputs-timeout, the
// capacity-weighted plan's topology (every node pair equal) is used, with a warning naming
// why; without any topology it is an error.
func (f *clusterFlags) clusterSnapshot(ctx context.Context, opts optimizer.Options, logger *slog.Logger) (*optimizer.Topology, error) {
	inf, err := f.informers(false, logger)
	if err != nil {
		return nil, err
	}
	c, err := f.cluster(inf, opts, nil, nil, logger, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, f.waitTimeout)
	defer inf.Stop() // after cancel (deferred calls run last first)
	defer cancel()
	inf.Start(ctx)
	got := &latestTopology{}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, got) }()
	for {
		select {
		case <-got.C():
			if c.LatencyUsable() {
				cancel()
				<-done
				return got.Get(), nil
			}
		case err := <-done:
			if err == nil {
				err = ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				if t := got.Get(); t != nil {
					logger.Warn("no usable latency within --inputs-timeout; planning on the capacity-weighted topology (every node pair equal)",
						"timeout", f.waitTimeout, "inputs", describeChecks(c.Checks()))
					return t, nil
				}
				err = fmt.Errorf("no complete topology from the cluster within %v (%s)", f.waitTimeout, describeChecks(c.Checks()))
			}
			return nil, err
		}
	}
}

func describeChecks(checks []watcher.Check) string {
	s := ""
	for i, c := range checks {
		if i > 0 {
			s += "; "
		}
		state := "ok"
		if !c.OK {
			state = "not ok"
		}
		s += fmt.Sprintf("%s %s: %s", c.Name, state, c.Message)
	}
	return s
}

// redactURL is a URL with its password replaced (url.URL.Redacted), for messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}
