package watcher

import (
	"fmt"
	"net/http"
	"strings"
)

// ReadyHandler serves /readyz for a control plane fed by these sources. It answers 200 once a
// publication is served (published() > 0), listing each input's check (nil checks: none) as
// "[+]name: …" or "[-]name: …", and 503 before the first publication.
//
// A failing input (e.g. Prometheus unreachable) is reported but keeps the answer 200, marked
// "degraded": the last good weights are still served, and an unready control plane would only
// cut new sidecars off from them.
func ReadyHandler(published func() uint64, checks func() []Check) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var body strings.Builder
		degraded := false
		if checks != nil {
			for _, c := range checks() {
				mark := "+"
				if !c.OK {
					mark, degraded = "-", true
				}
				fmt.Fprintf(&body, "[%s]%s: %s\n", mark, c.Name, c.Message)
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		n := published()
		switch {
		case n == 0:
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "%snot ready: no topology published yet\n", body.String())
		case degraded:
			fmt.Fprintf(w, "%sok (degraded): publication %d, the last good weights are served\n", body.String(), n)
		default:
			fmt.Fprintf(w, "%sok: publication %d\n", body.String(), n)
		}
	})
}
