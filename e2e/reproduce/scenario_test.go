package reproduce

import (
	"strings"
	"testing"
	"time"
)

func TestOverrideReplicas(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	p, err := Override(Presets["full"], env(map[string]string{"REPRODUCE_REPLICAS": "details=2,reviews=2,b=5"}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := replicaCounts(p.Apps[0]), "productpage 3, details 2, reviews 2, ratings 2"; got != want {
		t.Errorf("bookinfo: %q, want %q", got, want)
	}
	if got, want := replicaCounts(p.Apps[1]), "a 3, b 5, c 3, d 2, e 3"; got != want {
		t.Errorf("dag: %q, want %q", got, want)
	}
	if !strings.HasSuffix(p.Name, "+replicas") {
		t.Errorf("preset name %q does not say the replicas were changed", p.Name)
	}
	if got := replicaCounts(Bookinfo); got != "productpage 3, details 2, reviews 3, ratings 2" {
		t.Errorf("the override changed the package's Bookinfo: %q", got)
	}
	p, err = Override(Presets["full"], env(map[string]string{"REPRODUCE_REPLICAS": "neutral"}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := replicaCounts(p.Apps[0])+"; "+replicaCounts(p.Apps[1]), "productpage 3, details 3, reviews 4, ratings 3; a 3, b 4, c 3, d 3, e 3"; got != want {
		t.Errorf("neutral: %q, want %q", got, want)
	}
	for _, bad := range []string{"details=0", "details", "nosuch=2", "details=x", "neutral,details=2", "" + ","} {
		_, err := Override(Presets["quick"], env(map[string]string{"REPRODUCE_REPLICAS": bad}))
		if err == nil || !strings.Contains(err.Error(), "REPRODUCE_REPLICAS") {
			t.Errorf("REPRODUCE_REPLICAS=%s: error %v, want one naming the variable", bad, err)
		}
	}
	p, err = Override(Presets["full"], env(map[string]string{"REPRODUCE_WARMUP": "3s", "REPRODUCE_DURATION": "7s"}))
	if err != nil || p.Warmup != 3*time.Second || p.Duration != 7*time.Second {
		t.Errorf("REPRODUCE_WARMUP=3s REPRODUCE_DURATION=7s: warm-up %v, duration %v, error %v", p.Warmup, p.Duration, err)
	}
	if _, err := Override(Presets["full"], env(map[string]string{"REPRODUCE_WARMUP": "-1s"})); err == nil {
		t.Error("REPRODUCE_WARMUP=-1s accepted")
	}
}
