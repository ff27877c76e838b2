package reproduce

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"sort"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/edgeflow/edgeflow/internal/demo/app"
	"github.com/edgeflow/edgeflow/internal/demo/loadgen"
)

// Load sends the open-loop load (internal/demo/loadgen: request i due at i/rate, or at Poisson
// arrival times of that rate under Preset.Poisson; latency from
// that intended send time, so no coordinated omission; every latency kept exactly) to the
// application's entry pods, from the monitor namespace (a client outside the cluster, no added
// delay), balanced round-robin over the ready entry pods as an ingress gateway does.
func (h *Harness) Load(a App, p Preset, rate float64) (*loadgen.Result, error) {
	return h.load(h.ctx, a, loadgen.Config{Rate: rate, Warmup: p.Warmup, Duration: p.Duration, Timeout: p.Timeout,
		Poisson: p.Poisson, Seed: p.Seed<<32 + h.nextLoad()})
}

// nextLoad counts a load: each its own Poisson schedule, the same in a rerun of the whole
// preset.
func (h *Harness) nextLoad() uint64 {
	h.loads++
	return h.loads
}

// load sends cfg's load as Load does, until ctx ends.
func (h *Harness) load(ctx context.Context, a App, cfg loadgen.Config) (*loadgen.Result, error) {
	eps := h.endpoints(a.Entry())
	if len(eps) == 0 {
		return nil, fmt.Errorf("no ready pod of %s", a.Entry())
	}
	r := manual.NewBuilderWithScheme("reproduce")
	var addrs []resolver.Address
	for _, e := range eps {
		addrs = append(addrs, resolver.Address{Addr: e})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	conn, err := grpc.NewClient("reproduce:///"+a.Entry(), grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return h.tb.DialMonitor(ctx, "tcp", addr) }))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.Connect()
	return loadgen.Run(ctx, cfg, func(ctx context.Context, _ int) error {
		_, err := app.Call(ctx, conn, "", "")
		return err
	})
}

var pingTime = regexp.MustCompile(`time=([0-9.]+) ms`)

// PairAccuracy is the measured RTT of one node pair against the configured one.
type PairAccuracy struct {
	Pair         string  `json:"pair"`
	ConfiguredMS float64 `json:"configured_ms"`
	MedianMS     float64 `json:"median_ms"`
	MinMS        float64 `json:"min_ms"`
	MaxMS        float64 `json:"max_ms"`
	Pings        int     `json:"pings"`
}

// MeasureRTT pings every node pair count times (node IP to node IP) and returns the RTTs seen.
func (h *Harness) MeasureRTT(count int) ([]PairAccuracy, error) {
	var out []PairAccuracy
	for i, a := range Nodes {
		for _, b := range Nodes[i+1:] {
			cmd := h.tb.Exec(a, "ping", "-n", "-c", strconv.Itoa(count), "-i", "0.05", "-W", "2", h.tb.NodeIP(b))
			b2, err := cmd.CombinedOutput()
			if err != nil {
				return nil, fmt.Errorf("ping %s→%s: %v: %s", a, b, err, b2)
			}
			var rtts []float64
			for _, m := range pingTime.FindAllStringSubmatch(string(b2), -1) {
				v, _ := strconv.ParseFloat(m[1], 64)
				rtts = append(rtts, v)
			}
			if len(rtts) == 0 {
				return nil, fmt.Errorf("ping %s→%s: no replies", a, b)
			}
			sort.Float64s(rtts)
			out = append(out, PairAccuracy{Pair: a + "–" + b, ConfiguredMS: h.rtt[[2]string{a, b}], MedianMS: rtts[len(rtts)/2],
				MinMS: rtts[0], MaxMS: rtts[len(rtts)-1], Pings: len(rtts)})
		}
	}
	return out, nil
}

// NetemAvailable says whether the kernel offers tc netem (tried on a node's loopback).
func (h *Harness) NetemAvailable() bool {
	err := h.tb.Exec(Nodes[0], "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms").Run()
	if err == nil {
		_ = h.tb.Exec(Nodes[0], "tc", "qdisc", "del", "dev", "lo", "root").Run()
		return true
	}
	return false
}
