package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

// runServeUntil runs serve with the extra flags until stderr holds want, then stops it and
// returns its stderr.
func runServeUntil(t *testing.T, want string, extra ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "topology.yaml")
	writeFile(t, path, serveTopology(map[string]string{"e-0": "127.0.0.1:1", "e-1": "127.0.0.1:2"}, 5))
	serve := startServeProcess(t, append([]string{"serve", "-f", path, "--xds-address", "127.0.0.1:0", "--debounce-quiet", "5ms"}, extra...)...)
	testkit.Eventually(t, 15*time.Second, want, func() bool { return strings.Contains(serve.stderr.String(), want) })
	if err := serve.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	return serve.stderr.String()
}

func TestLogFormatJSON(t *testing.T) {
	t.Parallel()
	out := runServeUntil(t, "xds: published", "--log-format", "json", "--log-level", "debug")
	levels := map[string]int{}
	var announced bool
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("--log-format json: a line that is not a JSON object: %q (%v)", line, err)
		}
		lvl, _ := rec["level"].(string)
		msg, _ := rec["msg"].(string)
		if lvl == "" || msg == "" || rec["time"] == nil {
			t.Errorf("record without time, level or msg: %q", line)
		}
		levels[lvl]++
		if strings.HasPrefix(msg, "edgeflow serve: xDS on 127.0.0.1:") {
			announced = true
		}
		if msg == "xds: published" && rec["publication"] != float64(1) {
			t.Errorf("the publication record's attributes are not JSON fields: %q", line)
		}
	}
	if !announced {
		t.Errorf("no record announcing the xDS address:\n%s", out)
	}
	if levels["INFO"] == 0 {
		t.Errorf("no INFO record under --log-level debug:\n%s", out)
	}
	t.Logf("records by level: %v", levels)
}

func TestLogLevel(t *testing.T) {
	t.Parallel()
	// serve logs at info by default; --log-level warn leaves the announcement, not the records.
	out := runServeUntil(t, "edgeflow serve: xDS on", "--log-level", "warn")
	if strings.Contains(out, "level=INFO") {
		t.Errorf("--log-level warn wrote INFO records:\n%s", out)
	}
	out = runServeUntil(t, "xds: published")
	if !strings.Contains(out, `level=INFO msg="xds: published"`) {
		t.Errorf("serve's default level hides its INFO records:\n%s", out)
	}
}

func TestLogFlagsBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"plan", "-f", "../../examples/bookinfo.yaml", "--log-format", "xml"}, `--log-format "xml": want text or json`},
		{[]string{"place", "-f", "../../examples/bookinfo.yaml", "--log-level", "loud"}, `--log-level "loud": want debug, info, warn or error`},
		{[]string{"serve", "-f", "../../examples/bookinfo.yaml", "--xds-address", "127.0.0.1:0", "--log-level", "verbose"}, `--log-level "verbose"`},
	} {
		code, stdout, stderr := runCLI(t, "", tc.args...)
		if code != exitBadInput || stdout != "" || !strings.Contains(stderr, tc.msg) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 naming %q", tc.args, code, stdout, stderr, tc.msg)
		}
	}
}
