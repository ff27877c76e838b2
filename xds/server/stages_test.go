package server

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// TestPushStagesLogged: a publication's log lines give the push's stages from the server's
// clock, as e2e/pushbench reads them — the change's wall time on the published line, and on
// the converged line the first and last response to a node it waited for and its last answer,
// in that order.
func TestPushStagesLogged(t *testing.T) {
	t.Parallel()
	var logs testkit.LogBuffer
	h := startServer(t, Config{Policy: optimizer.Localization, DebounceQuiet: -1,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	c := dialADS(t, h.addr, "x-0")
	h.srv.Update(two(5))
	subscribeAll(t, c, xds.EncodingLocality)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.srv.WaitConverged(ctx, 1); err != nil {
		t.Fatal(err)
	}
	h.srv.Update(two(15)) // x-0 now prefers y-1: one EDS response
	c.ack(c.next())
	if err := h.srv.WaitConverged(ctx, 2); err != nil {
		t.Fatal(err)
	}
	fields := func(msg string) map[string]string {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `msg="`+msg+`"`) && strings.Contains(line, " publication=2 ") {
				out := map[string]string{}
				for _, f := range strings.Fields(line) {
					if k, v, ok := strings.Cut(f, "="); ok {
						out[k] = v
					}
				}
				return out
			}
		}
		t.Fatalf("no %q line of publication 2 in:\n%s", msg, logs.String())
		return nil
	}
	pub, conv := fields("xds: published"), fields("xds: converged")
	if _, err := time.Parse(time.RFC3339Nano, pub["change_at"]); err != nil {
		t.Errorf("published line: change_at %q: %v", pub["change_at"], err)
	}
	var stages []time.Duration
	for _, k := range []string{"first_response", "last_response", "since_change"} {
		d, err := time.ParseDuration(conv[k])
		if err != nil {
			t.Fatalf("converged line: %s %q: %v", k, conv[k], err)
		}
		stages = append(stages, d)
	}
	if !(0 <= stages[0] && stages[0] <= stages[1] && stages[1] <= stages[2]) {
		t.Errorf("converged line: first_response %v, last_response %v, since_change %v: want them in that order", stages[0], stages[1], stages[2])
	}
}
