package reproduce

import (
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// TestServeMetricsRead: what the slice log reads from serve's /metrics (metrics, then
// pooledServices, queueScales and podCapacities) comes out of the text exposition client_golang
// writes: labels sorted, one series a line, a gauge of 0 not a pooled service.
func TestServeMetricsRead(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, strings.Join([]string{
			"# HELP edgeflow_xds_service_pooled 1 for each callee service the plan in force pools.",
			"# TYPE edgeflow_xds_service_pooled gauge",
			`edgeflow_xds_service_pooled{service="reviews.repro"} 1`,
			`edgeflow_xds_service_pooled{service="details.repro"} 1`,
			`edgeflow_xds_service_pooled{service="ratings.repro"} 0`,
			`edgeflow_closed_loop_queue_scale{service="details.repro"} 0.05`,
			`edgeflow_closed_loop_pod_capacity_rps{bound="estimate",namespace="repro",pod="d-1"} 91`,
			`edgeflow_closed_loop_pod_capacity_rps{bound="lower",namespace="repro",pod="d-1"} 87.5`,
			"edgeflow_xds_publications_total 3",
		}, "\n")+"\n")
	}))
	defer srv.Close()
	m, err := metrics(strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pooledServices(m), []string{"details.repro", "reviews.repro"}; !slices.Equal(got, want) {
		t.Errorf("pooled %v, want %v", got, want)
	}
	if got, want := queueScales(m), map[string]float64{"details.repro": 0.05}; !maps.Equal(got, want) {
		t.Errorf("queue scales %v, want %v", got, want)
	}
	est, lower := podCapacities(m)
	if est["d-1"] != 91 || lower["d-1"] != 87.5 || len(est) != 1 || len(lower) != 1 {
		t.Errorf("capacities: estimate %v, lower %v", est, lower)
	}
	if m["edgeflow_xds_publications_total"] != 3 {
		t.Errorf("publications %v, want 3", m["edgeflow_xds_publications_total"])
	}
}
