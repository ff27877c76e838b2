// Command pod is one pod of the reproduction's applications, run by its fake kubelet as a
// process in its node's network namespace: a simulated microservice (internal/demo/app: a
// fixed number of workers, exponential service time, sleeping, not spinning) serving gRPC on
// its pod IP, calling its downstream services through grpc-go's xDS client (target
// xds:///SERVICE.NAMESPACE). The xDS bootstrap comes from GRPC_XDS_BOOTSTRAP_CONFIG (node id
// POD.NAMESPACE), as for any proxyless gRPC pod.
//
// Usage:
//
//	pod --name NAME --node NODE --listen IP:PORT [--workers N] [--service-time D] [--service-fixed D] [--seed S]
//	    [--slow FACTOR] [--workload W] [--namespace NS] [--cpu-request CORES] [--cpu-limit CORES]
//	    [--metrics-addr HOST:PORT] [--node-cpu SOCKET] [--call SERVICE.NAMESPACE[=RATE]]…
//
// --service-fixed is the part of the mean service time every request takes, the rest being
// exponential (app.Shifted; 0: purely exponential). --cpu-limit is the container's CPU limit,
// enforced per 100 ms period as the kernel's CFS quota does (app.Config.CPULimit: work past a
// period's budget waits, throttled, for the next). --slow multiplies every service time (a pod slower than its peers, unseen by edgeflow).
// --metrics-addr serves the pod's /metrics (app.Pod.Metrics: Istio's request metrics, the busy
// time as cAdvisor's CPU usage, the CPU request as kube-state-metrics has it), and grpc-go's own
// client metrics from its OpenTelemetry plugin (google.golang.org/grpc/stats/opentelemetry)
// through OpenTelemetry's Prometheus exporter, with the optional label grpc.lb.locality on:
// grpc_client_attempt_duration_seconds{grpc_target, grpc_lb_locality, …} is what the real xDS
// balancer picked, timed by grpc-go — the closed loop's latency correction reads it. --node-cpu is the
// Unix socket of its node's cores (app.ServeNodeCPU, run by the harness): a request then holds
// one of them for its service time (divided by the node's speed), so the pods of a node contend
// for it as in edgeflow demo (app.NodeCPU); without it each pod is bound by its own workers only.
//
// It logs "pod NAME: serving on IP:PORT" once it listens, and stops on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats/opentelemetry"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and its balancers

	"github.com/edgeflow/edgeflow/internal/demo/app"
)

type calls []string

func (c *calls) String() string     { return strings.Join(*c, ",") }
func (c *calls) Set(v string) error { *c = append(*c, v); return nil }

// options are the pod's flags.
type options struct {
	name, node, listen, metricsAddr string
	nodeCPU                         string
	workload, namespace             string
	workers                         int
	service, serviceFixed           time.Duration
	seed                            uint64
	slow, cpuRequest, cpuLimit      float64
	downstream                      calls
}

func main() {
	var o options
	flag.StringVar(&o.name, "name", "", "the pod's name (required)")
	flag.StringVar(&o.node, "node", "", "the pod's node (sent to callees)")
	flag.StringVar(&o.listen, "listen", "", "IP:PORT to serve on (required)")
	flag.StringVar(&o.metricsAddr, "metrics-addr", "", "HOST:PORT to serve /metrics on (none if empty)")
	flag.StringVar(&o.nodeCPU, "node-cpu", "", "the Unix socket of the node's cores, shared with its other pods (none if empty: the pod's workers only)")
	flag.StringVar(&o.workload, "workload", "", "the pod's workload, for its metrics and its callees' (default: --name)")
	flag.StringVar(&o.namespace, "namespace", "default", "the pod's namespace, for its metrics and its callees'")
	flag.IntVar(&o.workers, "workers", 1, "requests worked on at once")
	flag.DurationVar(&o.service, "service-time", 6*time.Millisecond, "mean of the service time")
	flag.DurationVar(&o.serviceFixed, "service-fixed", 0, "the part of the service time every request takes (0 ≤ it ≤ --service-time), the rest exponential")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the service-time draws")
	flag.Float64Var(&o.slow, "slow", 1, "multiply every service time by this factor (> 0; a slow pod)")
	flag.Float64Var(&o.cpuRequest, "cpu-request", 0, "the pod's CPU request in cores, exported as kube-state-metrics does (0: none)")
	flag.Float64Var(&o.cpuLimit, "cpu-limit", 0, "the pod's CPU limit in cores, enforced per 100 ms period as CFS quota (0: none)")
	flag.Var(&o.downstream, "call", "SERVICE.NAMESPACE[=RATE]: a downstream call per request served (repeatable; in order)")
	flag.Parse()
	err := fmt.Errorf("no arguments, got %q", flag.Args())
	if flag.NArg() == 0 {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = run(ctx, o)
		stop()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pod %s: %v\n", o.name, err)
		os.Exit(1)
	}
}

// run serves the pod until ctx is done.
func run(ctx context.Context, o options) error {
	if o.name == "" || o.listen == "" {
		return errors.New("--name and --listen are required")
	}
	if !(o.slow > 0) || math.IsInf(o.slow, 0) {
		return fmt.Errorf("--slow %v: want a positive factor", o.slow)
	}
	if o.serviceFixed < 0 || o.serviceFixed > o.service {
		return fmt.Errorf("--service-fixed %v: want 0 ≤ it ≤ --service-time %v", o.serviceFixed, o.service)
	}
	var service app.ServiceTime = app.NewExponential(o.service, o.seed)
	if o.serviceFixed > 0 {
		service = app.NewShifted(o.service, o.serviceFixed, o.seed)
	}
	cfg := app.Config{Name: o.name, Node: o.node, Workload: o.workload, Namespace: o.namespace, Workers: o.workers,
		ServiceTime: service, Slowdown: o.slow, CPURequest: o.cpuRequest, CPULimit: o.cpuLimit}
	if o.nodeCPU != "" {
		cpu, err := app.DialNodeCPU(o.node, o.nodeCPU)
		if err != nil {
			return fmt.Errorf("--node-cpu: %w", err)
		}
		defer cpu.Close()
		cfg.NodeCPU = cpu
	}
	grpcMetrics, grpcReg, stopMetrics, err := grpcClientMetrics()
	if err != nil {
		return err
	}
	defer stopMetrics(context.Background())
	for _, d := range o.downstream {
		svc, rateText, hasRate := strings.Cut(d, "=")
		rate := 1.0
		if hasRate {
			var err error
			if rate, err = strconv.ParseFloat(rateText, 64); err != nil {
				return fmt.Errorf("--call %s: bad rate: %v", d, err)
			}
		}
		conn, err := grpc.NewClient("xds:///"+svc, grpc.WithTransportCredentials(insecure.NewCredentials()), grpcMetrics)
		if err != nil {
			return fmt.Errorf("--call %s: %w", d, err)
		}
		defer conn.Close()
		conn.Connect() // open the xDS stream now, not at the first request
		name, namespace := svc, "default"
		if i := strings.LastIndex(svc, "."); i > 0 {
			name, namespace = svc[:i], svc[i+1:]
		}
		cfg.Downstream = append(cfg.Downstream, app.Downstream{Service: name, Namespace: namespace, Rate: rate, Conn: conn})
	}
	p, err := app.NewPod(cfg)
	if err != nil {
		return err
	}
	gatherers := prometheus.Gatherers{p.Gatherer(), grpcReg}
	lis, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	if o.metricsAddr != "" {
		if err := serveMetrics(ctx, o.metricsAddr, p, gatherers); err != nil {
			lis.Close()
			return err
		}
	}
	log.Printf("pod %s: serving on %s", o.name, lis.Addr())
	return p.Serve(ctx, lis)
}

// grpcClientMetrics returns the dial option that makes grpc-go record its client metrics
// (stats/opentelemetry's defaults, grpc.client.attempt.duration among them) with the optional
// label grpc.lb.locality, into a Prometheus registry through OpenTelemetry's exporter, and that
// registry; stop shuts the meter provider down.
func grpcClientMetrics() (opt grpc.DialOption, reg *prometheus.Registry, stop func(context.Context) error, err error) {
	reg = prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutTargetInfo(), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("grpc metrics: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	opt = opentelemetry.DialOption(opentelemetry.Options{MetricsOptions: opentelemetry.MetricsOptions{
		MeterProvider: mp, Metrics: opentelemetry.DefaultMetrics(), OptionalLabels: []string{"grpc.lb.locality"}}})
	return opt, reg, mp.Shutdown, nil
}

// serveMetrics serves the pod's /metrics on addr until ctx is done: its own telemetry and
// grpc-go's (gatherers).
func serveMetrics(ctx context.Context, addr string, p *app.Pod, gatherers prometheus.Gatherers) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{}))
	mux.HandleFunc("/slowdown", func(w http.ResponseWriter, r *http.Request) { setSlowdown(w, r, p) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { // ends when ctx is done
		<-ctx.Done()
		srv.Close()
	}()
	go func() { // ends when the server is closed
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			log.Printf("pod %s: metrics: %v", p.Name(), err)
		}
	}()
	log.Printf("pod %s: metrics on http://%s/metrics", p.Name(), lis.Addr())
	return nil
}

// setSlowdown serves PUT /slowdown: the body is the new slowdown factor (positive, finite).
func setSlowdown(w http.ResponseWriter, r *http.Request, p *app.Pod) {
	if r.Method != http.MethodPut {
		w.Header().Set("Allow", http.MethodPut)
		http.Error(w, "PUT a factor", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(string(body)), 64)
	if err == nil && !(f > 0) {
		err = fmt.Errorf("want a positive factor, got %v", f)
	}
	if err == nil {
		err = p.SetSlowdown(f)
	}
	if err != nil {
		http.Error(w, fmt.Sprintf("slowdown %q: %v", body, err), http.StatusBadRequest)
		return
	}
	log.Printf("pod %s: slowdown %v from the next request", p.Name(), f)
}
