// Command pushbench-bare is the bare go-control-plane peer that e2e/pushbench measures
// `edgeflow serve` against: one SnapshotCache (ads=false, IDHash), go-control-plane's own
// server, the gRPC server options of edgeflow serve, and none of edgeflow's server code.
//
// It serves what edgeflow's translator makes of a topology file. At start and on every SIGHUP
// it reads the file, solves and translates it exactly as edgeflow serve does (ParseTopology,
// optimizer.Compile, optimizer.Plan with LATA, xds.Translate with the locality encoding), then
// sets one snapshot per pod of the topology holding the pod's four resource sets with their
// per-type content-hash versions. Reading, solving and translating are part of every reload,
// as they are in edgeflow serve; each reload's phases are logged on stderr:
//
//	pushbench-bare: published load=2 nodes=1050 read=… parse=… solve=… translate=… set=… total=… at=…
//
// (at: when the reload began, the wall clock in RFC 3339, for the harness's stage breakdown.)
//
// A reload that fails is logged and the previous snapshots stay. SIGINT or SIGTERM stop it.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// slots are the snapshot slots of xds.ListenerSet … xds.EndpointSet.
var slots = [...]types.ResponseType{
	xds.ListenerSet: types.Listener, xds.RouteSet: types.Route, xds.ClusterSet: types.Cluster, xds.EndpointSet: types.Endpoint,
}

func main() {
	file := flag.String("f", "", "topology file (re-read on SIGHUP)")
	xdsAddress := flag.String("xds-address", "127.0.0.1:0", "HOST:PORT of the ADS server")
	pprofAddress := flag.String("pprof-address", "", "HOST:PORT for /debug/pprof/ (empty: not served); also turns on mutex and block profiling")
	flag.Parse()
	if *file == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: pushbench-bare -f FILE [-xds-address HOST:PORT] [-pprof-address HOST:PORT]")
		os.Exit(2)
	}
	if err := run(*file, *xdsAddress, *pprofAddress); err != nil {
		fmt.Fprintln(os.Stderr, "pushbench-bare:", err)
		os.Exit(1)
	}
}

func run(file, xdsAddress, pprofAddress string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	snapshots := cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	if err := load(ctx, snapshots, file, 1); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", xdsAddress)
	if err != nil {
		return err
	}
	// The options of edgeflow serve (cmd/edgeflow/serve.go).
	g := grpc.NewServer(
		grpc.MaxConcurrentStreams(1<<20),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	discovery.RegisterAggregatedDiscoveryServiceServer(g, server.NewServer(ctx, snapshots, nil))
	served := make(chan error, 2)
	go func() { served <- g.Serve(lis) }()
	pprofAt := ""
	var httpSrv *http.Server
	if pprofAddress != "" {
		plis, err := net.Listen("tcp", pprofAddress)
		if err != nil {
			g.Stop()
			return err
		}
		runtime.SetMutexProfileFraction(5)
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := httpSrv.Serve(plis); !errors.Is(err, http.ErrServerClosed) {
				served <- err
			}
		}()
		pprofAt = ", pprof http://" + plis.Addr().String() + "/debug/pprof/"
	}
	fmt.Fprintf(os.Stderr, "pushbench-bare: xDS on %s%s, topology from file %s\n", lis.Addr(), pprofAt, file)

	for n := 2; ; n++ {
		select {
		case <-ctx.Done():
			if httpSrv != nil {
				_ = httpSrv.Close()
			}
			g.Stop() // the streams never end by themselves
			return nil
		case err := <-served:
			g.Stop()
			return err
		case <-hup:
			if err := load(ctx, snapshots, file, n); err != nil {
				fmt.Fprintf(os.Stderr, "pushbench-bare: reload %d failed, the previous snapshots stay: %v\n", n, err)
			}
		}
	}
}

// load reads, solves and translates the file and sets every pod's snapshot.
func load(ctx context.Context, snapshots cache.SnapshotCache, file string, n int) error {
	t0 := time.Now()
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	t1 := time.Now()
	top, err := optimizer.ParseTopology(bytes.NewReader(data), file)
	if err != nil {
		return err
	}
	t2 := time.Now()
	m, err := optimizer.Compile(top, optimizer.Options{})
	if err != nil {
		return err
	}
	alloc, err := optimizer.Plan(m, optimizer.LATA)
	if err != nil {
		return err
	}
	t3 := time.Now()
	tr, err := xds.Translate(top, alloc, xds.EncodingLocality)
	if err != nil {
		return err
	}
	t4 := time.Now()
	for pod, res := range tr.Pods {
		snap := &cache.Snapshot{}
		for i, set := range res.Sets {
			snap.Resources[slots[i]] = cache.NewResources(set.Version, set.Items)
		}
		if err := snapshots.SetSnapshot(ctx, pod, snap); err != nil {
			return fmt.Errorf("snapshot of %s: %w", pod, err)
		}
	}
	t5 := time.Now()
	fmt.Fprintf(os.Stderr, "pushbench-bare: published load=%d nodes=%d read=%v parse=%v solve=%v translate=%v set=%v total=%v at=%s\n",
		n, len(tr.Pods), t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3), t5.Sub(t4), t5.Sub(t0), t0.UTC().Format(time.RFC3339Nano))
	return nil
}
