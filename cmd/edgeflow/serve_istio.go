package main

import (
	"context"

	"github.com/edgeflow/edgeflow/internal/leader"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/watcher"
	"github.com/edgeflow/edgeflow/xds/istio"
)

// serve's Istio integration (--istio-mode): the reconciler of the mode and the election of the
// replica that writes (istioleader.go).

// istioRunner is an Istio reconciler: fed every topology, it writes only from Run.
type istioRunner interface {
	watcher.Listener
	Run(context.Context) error
}

// checkIstio validates --istio-mode and the election of the Istio writer, and returns the
// writer's Lease (zero when no writer is elected).
func (f *serveFlags) checkIstio() (leader.Config, error) {
	var lease leader.Config
	if err := f.istio.checkMode(); err != nil {
		return lease, err
	}
	if f.istio.mode != istioModeOff && f.file != "" {
		return lease, badInput("--istio-mode=%s needs the cluster flags (--kubeconfig or in-cluster), not -f", f.istio.mode)
	}
	if err := f.checkIstioNamespaces(); err != nil {
		return lease, err
	}
	if f.istio.mode == istioModeEnvoyFilter {
		if err := checkXDSServerSANs(f.istio.xdsServerSANs, f.tls.CertFile != "", "--istio-mode="+istioModeEnvoyFilter+" with --xds-tls-cert"); err != nil {
			return lease, err
		}
	}
	if f.istio.mode == istioModeOff || !f.istioLeader.elect {
		return lease, nil
	}
	if err := f.istioLeader.check(); err != nil {
		return lease, err
	}
	lease = f.istioLeader.timings
	lease.Namespace, lease.Name = f.rebalancer.lease().Namespace, f.istioLeader.leaseName
	if lease.Namespace == "" {
		return lease, badInput("--istio-mode=%s: the replicas elect the one that writes on a Lease, and outside a pod "+
			"--rebalance-lease-namespace is required to say where (a laptop run and the in-cluster replicas must share it); "+
			"or --istio-leader-elect=false to write from every replica", f.istio.mode)
	}
	if f.istioLeader.leaseName == "" || (f.rebalance && !f.rebalancer.dryRun && f.istioLeader.leaseName == f.rebalancer.leaseName) {
		return lease, badInput("--istio-lease-name must be set, and differ from --rebalance-lease-name")
	}
	return lease, nil
}

// buildIstio builds the reconciler of --istio-mode and, when the replicas elect its writer, the
// election on lease; it returns the DestinationRules reconciler (nil in other modes), whose
// granularity /readyz reports.
func (a *serveApp) buildIstio(opts optimizer.Options, lease leader.Config) (*istio.RulesReconciler, error) {
	f := a.f
	var rules *istio.RulesReconciler
	var err error
	switch f.istio.mode {
	case istioModeEnvoyFilter:
		f.istio.xdsTLS = f.tls.CertFile != ""
		if a.istio, err = f.envoyFilterReconciler(f.istio.config(), a.logger, a.reg); err != nil {
			return nil, err
		}
	case istioModeDestinationRule:
		ic, err := f.istioClient()
		if err != nil {
			return nil, err
		}
		rc := f.istio.rulesConfig()
		rc.LBPolicy = f.lbPolicy // bands: simple LEAST_REQUEST inside the localities
		cfg := istio.RulesReconcilerConfig{Rules: rc, Policy: f.policy, Options: opts,
			Damping: f.damping, Client: ic, Logger: a.logger, Registerer: a.reg}
		if f.istio.labelNodes {
			if cfg.Nodes, err = f.clientset(); err != nil {
				return nil, err
			}
		}
		if rules, err = istio.NewRulesReconciler(cfg); err != nil {
			return nil, usageError{err}
		}
		a.istio = rules
	}
	if a.istio != nil && f.istioLeader.elect {
		if a.leader, err = newIstioLeader(a.istio.Run, a.inf.Client().CoordinationV1(), lease, processIdentity(), a.logger, a.reg); err != nil {
			return nil, err
		}
	}
	return rules, nil
}
