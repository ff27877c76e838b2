package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

// commandPaths lists every command a user can run, as its words after "edgeflow".
func commandPaths(c *cobra.Command, prefix []string, out *[][]string) {
	*out = append(*out, prefix)
	for _, sub := range c.Commands() {
		if sub.Hidden {
			continue
		}
		commandPaths(sub, append(append([]string(nil), prefix...), sub.Name()), out)
	}
}

// TestEveryCommandHasAnExample: every command's --help shows an Examples section, cobra's own
// (help, completion and its shells) included.
func TestEveryCommandHasAnExample(t *testing.T) {
	t.Parallel()
	var paths [][]string
	commandPaths(newRootCommand(), nil, &paths)
	if len(paths) < 15 {
		t.Fatalf("only %d commands found: %v", len(paths), paths)
	}
	for _, p := range paths {
		name := strings.TrimSpace("edgeflow " + strings.Join(p, " "))
		code, out, errOut := runCLI(t, "", append(p, "--help")...)
		if code != 0 {
			t.Errorf("%s --help: exit %d: %s", name, code, errOut)
			continue
		}
		i := strings.Index(out, "\nExamples:\n")
		if i < 0 {
			t.Errorf("%s --help has no Examples section (set the command's Example):\n%s", name, out)
			continue
		}
		if first := strings.SplitN(out[i+len("\nExamples:\n"):], "\n", 2)[0]; !strings.HasPrefix(strings.TrimSpace(first), "edgeflow ") &&
			!strings.HasPrefix(strings.TrimSpace(first), "source <(edgeflow") {
			t.Errorf("%s: the first example %q does not run edgeflow", name, first)
		}
	}
}

var versionLine = regexp.MustCompile(`^edgeflow \S+ \(commit (\S+?)(, modified)?, (go1\.\d+(\.\d+)?\S*)\)\n$`)

func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "", "version")
	m := versionLine.FindStringSubmatch(out)
	if code != 0 || m == nil || m[3] != runtime.Version() {
		t.Fatalf("version: exit %d, %q (stderr %q); want edgeflow VERSION (commit X, %s)", code, out, errOut, runtime.Version())
	}
	code, out, _ = runCLI(t, "", "version", "-o", "json")
	var v buildVersion
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.GoVersion != runtime.Version() || v.Version == "" {
		t.Fatalf("version -o json: exit %d, %v: %s", code, err, out)
	}
	if code, out, _ = runCLI(t, "", "version", "-o", "yaml"); code != 0 || !strings.Contains(out, "go_version: "+runtime.Version()+"\n") {
		t.Errorf("version -o yaml: exit %d, %q; want the keys of -o json", code, out)
	}
	if code, out, errOut := runCLI(t, "", "version", "-o", "xml"); code != exitBadInput || out != "" || !strings.Contains(errOut, `-o: unknown output format "xml" (want text, json or yaml)`) {
		t.Errorf("version -o xml: exit %d, stdout %q, stderr %q; want exit 2 naming it", code, out, errOut)
	}
}

// TestBinaryVersionAndBashCompletion builds the binary as make build does and checks that it
// names the commit it was built from, and that bash completes its commands, flags and flag
// values through the script `edgeflow completion bash` prints.
func TestBinaryVersionAndBashCompletion(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	bin := testkit.Binary(t)
	out, err := exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var v buildVersion
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("version -o json: %v: %s", err, out)
	}
	text, _ := exec.Command(bin, "version").Output()
	head, gitErr := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	switch {
	case v.Commit != "":
		if gitErr == nil && v.Commit != strings.TrimSpace(string(head)) {
			t.Errorf("version names commit %s, the checkout is at %s", v.Commit, head)
		}
		if !strings.Contains(string(text), "(commit "+v.Commit) {
			t.Errorf("version %q does not name commit %s", text, v.Commit)
		}
	default:
		// No VCS stamp: not a git checkout the go command can read (a git worktree, a tarball).
		if !strings.Contains(string(text), "(commit unknown, ") {
			t.Errorf("version %q: want commit unknown without a VCS stamp", text)
		}
		t.Logf("the build has no VCS stamp (git: %v); version says %q", gitErr, strings.TrimSpace(string(text)))
	}
	t.Logf("edgeflow version: %s", strings.TrimSpace(string(text)))

	// bash, with Debian's bash-completion (cobra's bash script uses its _get_comp_words_by_ref).
	const bashCompletion = "/usr/share/bash-completion/bash_completion"
	bash, err := exec.LookPath("bash")
	if _, serr := os.Stat(bashCompletion); err != nil || serr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("bash or %s missing (apt-get install bash-completion); CI must run this test", bashCompletion)
		}
		t.Skipf("bash or %s missing (apt-get install bash-completion)", bashCompletion)
	}
	complete := func(line string) []string {
		script := `source ` + bashCompletion + `; source <("$EDGEFLOW" completion bash)
COMP_LINE="$LINE"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<< "$LINE"
[[ "$LINE" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
__start_edgeflow 2>/dev/null
printf '%s\n' "${COMPREPLY[@]}"`
		cmd := exec.Command(bash, "--norc", "-c", script)
		cmd.Env = append(os.Environ(), "EDGEFLOW="+bin, "LINE="+line, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("bash completion of %q: %v", line, err)
		}
		return strings.Fields(string(out))
	}
	for _, tc := range []struct {
		line string
		want []string
	}{
		{"edgeflow se", []string{"serve"}},
		{"edgeflow ver", []string{"version"}},
		{"edgeflow serve --ui", []string{"--ui-address"}},
		{"edgeflow plan --policy la", []string{"lata", "lata-q"}},
		{"edgeflow place --policy ", []string{"k8s-spread", "larp-greedy", "larp"}},
		{"edgeflow version --log-format ", []string{"text", "json"}},
		{"edgeflow plan --node-match ", []string{"name", "internal-ip"}},
		{"edgeflow serve --probe-pins ", []string{"targets", "off"}},
		{"edgeflow uninstall --dry-run=", []string{"none", "client"}},
	} {
		got := complete(tc.line)
		for _, w := range tc.want {
			if !strings.Contains(" "+strings.Join(got, " ")+" ", " "+w+" ") {
				t.Errorf("bash completes %q to %v, want %q among them", tc.line, got, w)
			}
		}
	}
}

// TestEveryExampleRuns runs every Example line of every command that uses a file under
// examples/, as a user would paste it from --help (from the repository's root): each edgeflow
// stage of a pipe reads the previous one's output; a final `kubectl apply -f -` gets non-empty
// output; serve runs until it announces its listeners (fixed ports become port 0).
func TestEveryExampleRuns(t *testing.T) {
	t.Parallel()
	var paths [][]string
	commandPaths(newRootCommand(), nil, &paths)
	ran := 0
	for _, p := range paths {
		cmd, _, err := newRootCommand().Find(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(cmd.Example, "\n") {
			line = strings.TrimSpace(strings.SplitN(line, "#", 2)[0])
			if !strings.Contains(line, "examples/") {
				continue
			}
			ran++
			t.Run(line, func(t *testing.T) { runExample(t, line) })
		}
	}
	if ran < 5 {
		t.Errorf("only %d examples use a file under examples/", ran)
	}
}

var fixedPort = regexp.MustCompile(`^(127\.0\.0\.1|localhost):\d+$`)

func runExample(t *testing.T, line string) {
	stdin := ""
	for i, stage := range strings.Split(line, "|") {
		args := strings.Fields(stage)
		if strings.ContainsAny(stage, `"'$`) {
			t.Fatalf("stage %q: quoting or variables; the test splits on spaces only", stage)
		}
		if args[0] == "kubectl" && strings.Join(args, " ") == "kubectl apply -f -" && i > 0 {
			if strings.TrimSpace(stdin) == "" {
				t.Errorf("nothing for kubectl apply")
			}
			return
		}
		if args[0] != "edgeflow" {
			t.Fatalf("stage %q: the test runs only edgeflow (and a final kubectl apply -f -)", stage)
		}
		args = args[1:]
		for j, a := range args {
			if strings.HasPrefix(a, "examples/") {
				args[j] = filepath.Join("..", "..", a)
			}
			if fixedPort.MatchString(a) {
				args[j] = a[:strings.LastIndex(a, ":")] + ":0"
			}
		}
		if args[0] == "serve" {
			s := startServeProcess(t, args...)
			testkit.Eventually(t, 15*time.Second, "serve's listening line", func() bool {
				return strings.Contains(s.stderr.String(), "edgeflow serve: xDS on ")
			})
			if err := s.stop(); err != nil {
				t.Errorf("serve: %v\n%s", err, s.stderr.String())
			}
			return
		}
		code, out, errOut := runCLI(t, stdin, args...)
		if code != 0 || out == "" {
			t.Fatalf("stage %q: exit %d, stdout %d bytes: %s", stage, code, len(out), errOut)
		}
		stdin = out
	}
}

// TestServeHelpGroupsFlags: serve --help lists its flags by section, each flag once, in the
// section that says what it is for; a command without sections keeps cobra's one Flags list.
func TestServeHelpGroupsFlags(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "", "serve", "--help")
	if code != 0 {
		t.Fatalf("serve --help: exit %d: %s", code, errOut)
	}
	titles := []string{"Flags:", "xDS flags:", "HTTP flags (metrics, profiling, web view):", "Cluster flags (without -f: Kubernetes and Prometheus):",
		"Istio flags (--istio-mode):", "Rebalancer flags (--rebalance):", "Global Flags:"}
	section := map[string]string{} // flag → its section
	current := ""
	for _, line := range strings.Split(out, "\n") {
		if slices.Contains(titles, line) {
			current = line
			continue
		}
		if m := regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)`).FindStringSubmatch(line); m != nil && current != "" {
			if prev, ok := section[m[1]]; ok {
				t.Errorf("--%s listed twice: under %q and %q", m[1], prev, current)
			}
			section[m[1]] = current
		}
	}
	last := -1
	for _, title := range titles {
		i := strings.Index(out, "\n"+title+"\n")
		if i < 0 || i < last {
			t.Errorf("section %q missing or out of order", title)
		}
		last = i
	}
	newServeCommand().Flags().VisitAll(func(f *pflag.Flag) {
		if _, ok := section[f.Name]; !ok && !f.Hidden {
			t.Errorf("--%s is not in serve --help", f.Name)
		}
	})
	for flag, want := range map[string]string{"filename": "Flags:", "xds-tls-cert": "xDS flags:", "ui-address": titles[2], "kubeconfig": titles[3],
		"context": titles[3], "prometheus-url": titles[3], "istio-mode": titles[4], "cluster-domain": titles[4], "rebalance-period": titles[5],
		"webhook-address": titles[5], "log-level": "Global Flags:"} {
		if section[flag] != want {
			t.Errorf("--%s is under %q, want %q", flag, section[flag], want)
		}
	}
	_, plan, _ := runCLI(t, "", "plan", "--help")
	if strings.Contains(plan, "Cluster flags") || !strings.Contains(plan, "\nFlags:\n") {
		t.Errorf("plan --help: want cobra's one Flags list:\n%s", plan)
	}
}
