package reproduce

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podScrapeInterval is how often Prometheus scrapes the pods' /metrics: 5 s, a third of
// Istio's sample Prometheus (15 s, samples/addons/prometheus.yaml) and as short as a user's
// scrape is commonly set. The probes keep the testbed's 1 s (the latency loop's own).
const podScrapeInterval = 5 * time.Second

// podMetricsPort is where a pod serves /metrics when its Workload says so (Workload.Metrics),
// on its own IP: Istio's merged Prometheus port (the sidecar's 15020, which serves the
// application's metrics merged with Envoy's).
const podMetricsPort = 15020

// podDiscoveryPeriod is how often discoverPods reads the pods from the API server.
const podDiscoveryPeriod = time.Second

// podScrapeJob is the testbed Prometheus's job for the pods: job kubernetes-pods of Istio's
// sample Prometheus (istio/istio samples/addons/prometheus.yaml, the chart's
// server.scrape_configs), its relabelling verbatim: a pod is kept when annotated
// prometheus.io/scrape=true, scraped at its IP and prometheus.io/port and /path, labelled with
// its Kubernetes labels, namespace, pod and node; honor_labels as Istio's (the pods' own pod
// and namespace labels, cAdvisor's and kube-state-metrics' stand-ins, have the same values).
//
// Debian's Prometheus (2.42.0+ds) is built without Kubernetes service discovery, so the
// targets come from a file (file_sd_configs, re-read when it changes) that discoverPods writes
// from the API server's pods with the meta labels Prometheus's Kubernetes discovery gives a pod
// (podTargets): the relabelling cannot tell them apart.
func podScrapeJob(targetsFile string, interval time.Duration) string {
	return fmt.Sprintf(`  - job_name: kubernetes-pods
    honor_labels: true
    scrape_interval: %ds
    file_sd_configs:
      - files: [%q]
    relabel_configs:
      - action: keep
        regex: true
        source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
      - action: drop
        regex: true
        source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape_slow]
      - action: replace
        regex: (https?)
        source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scheme]
        target_label: __scheme__
      - action: replace
        regex: (.+)
        source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_path]
        target_label: __metrics_path__
      - action: replace
        regex: (\d+);(([A-Fa-f0-9]{1,4}::?){1,7}[A-Fa-f0-9]{1,4})
        replacement: '[$2]:$1'
        source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_port, __meta_kubernetes_pod_ip]
        target_label: __address__
      - action: replace
        regex: (\d+);((([0-9]+?)(\.|$)){4})
        replacement: $2:$1
        source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_port, __meta_kubernetes_pod_ip]
        target_label: __address__
      - action: labelmap
        regex: __meta_kubernetes_pod_annotation_prometheus_io_param_(.+)
        replacement: __param_$1
      - action: labelmap
        regex: __meta_kubernetes_pod_label_(.+)
      - action: replace
        source_labels: [__meta_kubernetes_namespace]
        target_label: namespace
      - action: replace
        source_labels: [__meta_kubernetes_pod_name]
        target_label: pod
      - action: drop
        regex: Pending|Succeeded|Failed|Completed
        source_labels: [__meta_kubernetes_pod_phase]
      - action: replace
        source_labels: [__meta_kubernetes_pod_node_name]
        target_label: node
`, int(interval/time.Second), targetsFile)
}

// targetGroup is one entry of a file_sd file.
type targetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// invalidLabelChars are what Prometheus's Kubernetes discovery replaces with '_' in a label or
// annotation name (strutil.SanitizeLabelName).
var invalidLabelChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// podTargets returns the targets Prometheus's Kubernetes discovery (role pod) gives the pods,
// with its meta labels (prometheus discovery/kubernetes/pod.go, buildPod and podLabels): one
// target per container port (the container alone, at the pod's IP, for a container without
// ports), a pod without an IP none. The controller's, namespace's and node's metadata, which
// the discovery adds only when configured to, are left out; the container id and image are
// left out (no relabelling here reads them).
func podTargets(pods []corev1.Pod) []targetGroup {
	out := []targetGroup{}
	for _, p := range pods {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
			continue
		}
		ready := "false"
		if podReady(&p) {
			ready = "true"
		}
		pod := map[string]string{
			"__meta_kubernetes_namespace":     p.Namespace,
			"__meta_kubernetes_pod_name":      p.Name,
			"__meta_kubernetes_pod_ip":        p.Status.PodIP,
			"__meta_kubernetes_pod_ready":     ready,
			"__meta_kubernetes_pod_phase":     string(p.Status.Phase),
			"__meta_kubernetes_pod_node_name": p.Spec.NodeName,
			"__meta_kubernetes_pod_host_ip":   p.Status.HostIP,
			"__meta_kubernetes_pod_uid":       string(p.UID),
		}
		for k, v := range p.Labels {
			name := invalidLabelChars.ReplaceAllString(k, "_")
			pod["__meta_kubernetes_pod_label_"+name] = v
			pod["__meta_kubernetes_pod_labelpresent_"+name] = "true"
		}
		for k, v := range p.Annotations {
			name := invalidLabelChars.ReplaceAllString(k, "_")
			pod["__meta_kubernetes_pod_annotation_"+name] = v
			pod["__meta_kubernetes_pod_annotationpresent_"+name] = "true"
		}
		if c := metav1.GetControllerOf(&p); c != nil {
			pod["__meta_kubernetes_pod_controller_kind"] = c.Kind
			pod["__meta_kubernetes_pod_controller_name"] = c.Name
		}
		for _, c := range p.Spec.Containers {
			target := func(addr string, port *corev1.ContainerPort) {
				labels := map[string]string{"__meta_kubernetes_pod_container_name": c.Name, "__meta_kubernetes_pod_container_init": "false"}
				if port != nil {
					labels["__meta_kubernetes_pod_container_port_number"] = strconv.Itoa(int(port.ContainerPort))
					labels["__meta_kubernetes_pod_container_port_name"] = port.Name
					labels["__meta_kubernetes_pod_container_port_protocol"] = string(port.Protocol)
				}
				for k, v := range pod {
					labels[k] = v
				}
				out = append(out, targetGroup{Targets: []string{addr}, Labels: labels})
			}
			if len(c.Ports) == 0 {
				target(p.Status.PodIP, nil)
			}
			for i := range c.Ports {
				target(net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(c.Ports[i].ContainerPort))), &c.Ports[i])
			}
		}
	}
	return out
}

// discoverPods plays Prometheus's Kubernetes discovery for the testbed's Prometheus: every
// podDiscoveryPeriod it reads the pods of the applications' namespace from the API server and,
// when their targets changed, writes them to path (atomically; file_sd re-reads it on the
// change). It runs until the test's cleanup.
func (h *Harness) discoverPods(path string) {
	write := func(b []byte) error {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, path)
	}
	if err := write([]byte("[]\n")); err != nil {
		h.t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // owned by the harness: ends in cleanup
		defer close(done)
		var last []byte
		tick := time.NewTicker(podDiscoveryPeriod)
		defer tick.Stop()
		for {
			if l, err := h.cs.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{}); err == nil {
				b, err := json.MarshalIndent(podTargets(l.Items), "", " ")
				if err == nil && !bytes.Equal(b, last) {
					if err := write(b); err != nil {
						fmt.Fprintf(h.log, "pod discovery: %v\n", err)
					} else {
						last = b
					}
				}
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	h.t.Cleanup(func() { close(stop); <-done })
}
