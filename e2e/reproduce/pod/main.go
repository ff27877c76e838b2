// Command pod is one pod of the reproduction's applications, run by its fake kubelet as a
// process in its node's network namespace: a simulated microservice (internal/demo/app: a
// fixed number of workers, exponential service time, sleeping, not spinning) serving gRPC on
// its pod IP, calling its downstream services through grpc-go's xDS client (target
// xds:///SERVICE.NAMESPACE). The xDS bootstrap comes from GRPC_XDS_BOOTSTRAP_CONFIG (node id
// POD.NAMESPACE), as for any proxyless gRPC pod.
//
// Usage:
//
//	pod --name NAME --node NODE --listen IP:PORT [--workers N] [--service-time D] [--seed S]
//	    [--call SERVICE.NAMESPACE[=RATE]]…
//
// It logs "pod NAME: serving on IP:PORT" once it listens, and stops on SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and its balancers

	"github.com/edgeflow/edgeflow/internal/demo/app"
)

type calls []string

func (c *calls) String() string     { return strings.Join(*c, ",") }
func (c *calls) Set(v string) error { *c = append(*c, v); return nil }

func main() {
	var (
		name, node, listen string
		workers            int
		service            time.Duration
		seed               uint64
		downstream         calls
	)
	flag.StringVar(&name, "name", "", "the pod's name (required)")
	flag.StringVar(&node, "node", "", "the pod's node (sent to callees)")
	flag.StringVar(&listen, "listen", "", "IP:PORT to serve on (required)")
	flag.IntVar(&workers, "workers", 1, "requests worked on at once")
	flag.DurationVar(&service, "service-time", 6*time.Millisecond, "mean of the exponential service time")
	flag.Uint64Var(&seed, "seed", 1, "seed of the service-time draws")
	flag.Var(&downstream, "call", "SERVICE.NAMESPACE[=RATE]: a downstream call per request served (repeatable; in order)")
	flag.Parse()
	if err := run(name, node, listen, workers, service, seed, downstream); err != nil {
		fmt.Fprintf(os.Stderr, "pod %s: %v\n", name, err)
		os.Exit(1)
	}
}

func run(name, node, listen string, workers int, service time.Duration, seed uint64, downstream calls) error {
	if name == "" || listen == "" || flag.NArg() != 0 {
		return fmt.Errorf("--name and --listen are required, and no arguments (got %q)", flag.Args())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := app.Config{Name: name, Node: node, Workers: workers, ServiceTime: app.NewExponential(service, seed)}
	for _, d := range downstream {
		svc, rateText, hasRate := strings.Cut(d, "=")
		rate := 1.0
		if hasRate {
			var err error
			if rate, err = strconv.ParseFloat(rateText, 64); err != nil {
				return fmt.Errorf("--call %s: bad rate: %v", d, err)
			}
		}
		conn, err := grpc.NewClient("xds:///"+svc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("--call %s: %w", d, err)
		}
		defer conn.Close()
		conn.Connect() // open the xDS stream now, not at the first request
		cfg.Downstream = append(cfg.Downstream, app.Downstream{Service: svc, Rate: rate, Conn: conn})
	}
	p, err := app.NewPod(cfg)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	log.Printf("pod %s: serving on %s", name, lis.Addr())
	return p.Serve(ctx, lis)
}
