package reproduce

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodTargets: the targets discoverPods writes carry the meta labels Prometheus's Kubernetes
// discovery gives a pod (one target per container port, names sanitised), none for a pod
// without an IP or terminating; and the job that reads them is a configuration Prometheus's
// promtool accepts (when it is installed: it is with Debian's prometheus).
func TestPodTargets(t *testing.T) {
	yes := true
	pod := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "back-1", Namespace: "repro", UID: "u1",
			Labels:          map[string]string{"app": "back", "pod-template-hash": "h"},
			Annotations:     map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "15020"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "back-h", Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: "n2", Containers: []corev1.Container{{Name: "app",
			Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: 9000, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{PodIP: "198.18.0.41", HostIP: "198.18.0.2", Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	noIP := *pod.DeepCopy()
	noIP.Name, noIP.Status.PodIP = "back-2", ""
	gone := *pod.DeepCopy()
	gone.Name, gone.DeletionTimestamp = "back-3", &metav1.Time{}
	got := podTargets([]corev1.Pod{pod, noIP, gone})
	want := []targetGroup{{Targets: []string{"198.18.0.41:9000"}, Labels: map[string]string{
		"__meta_kubernetes_namespace":                                  "repro",
		"__meta_kubernetes_pod_name":                                   "back-1",
		"__meta_kubernetes_pod_ip":                                     "198.18.0.41",
		"__meta_kubernetes_pod_ready":                                  "true",
		"__meta_kubernetes_pod_phase":                                  "Running",
		"__meta_kubernetes_pod_node_name":                              "n2",
		"__meta_kubernetes_pod_host_ip":                                "198.18.0.2",
		"__meta_kubernetes_pod_uid":                                    "u1",
		"__meta_kubernetes_pod_label_app":                              "back",
		"__meta_kubernetes_pod_labelpresent_app":                       "true",
		"__meta_kubernetes_pod_label_pod_template_hash":                "h",
		"__meta_kubernetes_pod_labelpresent_pod_template_hash":         "true",
		"__meta_kubernetes_pod_annotation_prometheus_io_scrape":        "true",
		"__meta_kubernetes_pod_annotationpresent_prometheus_io_scrape": "true",
		"__meta_kubernetes_pod_annotation_prometheus_io_port":          "15020",
		"__meta_kubernetes_pod_annotationpresent_prometheus_io_port":   "true",
		"__meta_kubernetes_pod_controller_kind":                        "ReplicaSet",
		"__meta_kubernetes_pod_controller_name":                        "back-h",
		"__meta_kubernetes_pod_container_name":                         "app",
		"__meta_kubernetes_pod_container_init":                         "false",
		"__meta_kubernetes_pod_container_port_number":                  "9000",
		"__meta_kubernetes_pod_container_port_name":                    "grpc",
		"__meta_kubernetes_pod_container_port_protocol":                "TCP",
	}}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("podTargets (-want +got):\n%s", d)
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Logf("no promtool (%v): the job's configuration is not checked", err)
		return
	}
	dir := t.TempDir()
	targets := filepath.Join(dir, "targets.json")
	config := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(targets, []byte("[]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, []byte("scrape_configs:\n"+podScrapeJob(targets, podScrapeInterval)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", config).CombinedOutput(); err != nil {
		t.Errorf("promtool check config: %v\n%s", err, out)
	}
}
