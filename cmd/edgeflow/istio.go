package main

import (
	"bytes"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/edgeflow/edgeflow/xds/istio"
)

func init() { subcommands = append(subcommands, newIstioCommand) }

func newIstioCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "istio",
		Short:   "Istio helpers",
		Example: "  edgeflow istio bootstrap --istio-xds-address edgeflow.edgeflow-system.svc:18000 -n shop | kubectl apply -f -",
		Args:    noArgs,
	}
	cmd.AddCommand(newIstioBootstrapCommand())
	return cmd
}

func newIstioBootstrapCommand() *cobra.Command {
	var (
		namespace      string
		cfg            istio.Config
		serverSANs     []string
		connectTimeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "bootstrap --istio-xds-address HOST:PORT [--namespace NS] [--xds-tls --istio-xds-server-san SAN|any]",
		Short: "Print the bootstrap ConfigMap and the pod annotation and label of the per-pod Istio mode",
		Long: "bootstrap prints, for namespace NS, the ConfigMap " + istio.BootstrapConfigMapName + " that serve --istio-xds-address\n" +
			"manages in every namespace holding a managed service (its " + istio.BootstrapOverrideKey + " defines the static\n" +
			"edgeflow-xds cluster Envoy needs for EDS from edgeflow), then, as YAML comments, the patch a caller\n" +
			"workload's pod template needs: the " + istio.BootstrapAnnotation + " annotation naming the ConfigMap and the\n" +
			istio.EDSLabel + "=" + istio.EDSLabelValue + " label the EnvoyFilters select. The output can be given to kubectl apply -f.",
		Example: "  edgeflow istio bootstrap --istio-xds-address edgeflow.edgeflow-system.svc:18000 -n shop | kubectl apply -f -\n" +
			"  edgeflow istio bootstrap --istio-xds-address edgeflow.edgeflow-system.svc:18000 -n shop --xds-tls --istio-xds-server-san spiffe://cluster.local/ns/edgeflow-system/sa/edgeflow",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
				return badInput("--namespace %q: %s", namespace, strings.Join(errs, "; "))
			}
			cfg.ConnectTimeout = connectTimeout
			if err := checkXDSServerSANs(serverSANs, cfg.TLS, "--xds-tls"); err != nil {
				return err
			}
			cfg.TLSServerSANs, cfg.TLSAnyServer = xdsServerSANs(serverSANs)
			cm, err := istio.BootstrapConfigMap(cfg, namespace)
			if err != nil {
				return badInput("%v", err)
			}
			b, err := yaml.Marshal(cm)
			if err != nil {
				return err
			}
			var out bytes.Buffer
			out.WriteString("# Managed by edgeflow serve --istio-xds-address in every namespace holding a managed service.\n")
			out.Write(bytes.Replace(b, []byte("  creationTimestamp: null\n"), nil, 1))
			out.WriteString("# Each caller workload whose sidecar takes the managed services' endpoints from edgeflow\n")
			out.WriteString("# needs in its pod template (kubectl patch deployment NAME -n " + namespace + " --patch-file FILE):\n")
			for _, line := range strings.SplitAfter(strings.TrimSuffix(string(istio.PodTemplatePatch()), "\n"), "\n") {
				out.WriteString("#   " + line)
			}
			out.WriteString("\n")
			_, err = cmd.OutOrStdout().Write(out.Bytes())
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&namespace, "namespace", "n", "default", "namespace of the ConfigMap (that of the caller pods)")
	fl.StringVar(&cfg.XDSAddress, "istio-xds-address", "", "HOST:PORT of edgeflow's xDS server as sidecars reach it (as given to serve)")
	fl.BoolVar(&cfg.TLS, "xds-tls", false, "the xDS port serves TLS (serve --xds-tls-cert): the sidecar presents its workload certificate and checks edgeflow's against the mesh root")
	fl.StringSliceVar(&serverSANs, "istio-xds-server-san", nil, "with --xds-tls, required: a subject alternative name edgeflow's certificate carries, checked by the sidecars: its SPIFFE id spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT; \""+anyXDSServer+"\": any certificate the mesh root signed (any mesh workload could pose as edgeflow)")
	fl.DurationVar(&connectTimeout, "connect-timeout", istio.DefaultConnectTimeout, "connect timeout of the edgeflow-xds cluster")
	_ = cmd.MarkFlagRequired("istio-xds-address")
	return cmd
}
