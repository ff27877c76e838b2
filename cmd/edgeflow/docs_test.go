package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/edgeflow/edgeflow/internal/testkit"
)

// TestCLIDocsUpToDate: docs/reference/cli holds exactly the pages edgeflow docs writes, as it
// writes them (make docs).
func TestCLIDocsUpToDate(t *testing.T) {
	dir := filepath.Join(testkit.RepoRoot(), CLIDocsDir)
	want := cliPages(newRootCommand())
	have, err := filepath.Glob(filepath.Join(dir, "edgeflow*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var stale []string
	for _, f := range have {
		if _, ok := want[filepath.Base(f)]; !ok {
			stale = append(stale, filepath.Base(f)+" (no such command)")
		}
	}
	for name, page := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		switch {
		case err != nil:
			stale = append(stale, name+" (missing)")
		case !bytes.Equal(got, page):
			stale = append(stale, name+" (differs)")
		}
	}
	slices.Sort(stale)
	if len(stale) > 0 {
		t.Errorf("%s is stale: run make docs\n%s", CLIDocsDir, strings.Join(stale, "\n"))
	}
}

// TestCLIDocsCommand: edgeflow docs DIR writes every page and removes a page of a command that
// no longer exists; a page is the command's help (its usage line, example and flags).
func TestCLIDocsCommand(t *testing.T) {
	dir := t.TempDir()
	gone := filepath.Join(dir, "edgeflow_gone.md")
	if err := os.WriteFile(gone, []byte("# edgeflow gone\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"docs", dir}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("edgeflow docs: exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("the page of a command that does not exist is still there (%v)", err)
	}
	page, err := os.ReadFile(filepath.Join(dir, "edgeflow_plan.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# edgeflow plan\n", "edgeflow plan -f FILE", "## Examples", "--filename string", "## Flags of every command", "--log-level", "[edgeflow](edgeflow.md)"} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("edgeflow_plan.md lacks %q:\n%s", want, page)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "edgeflow_docs.md")); !os.IsNotExist(err) {
		t.Errorf("the hidden docs command has a page (%v)", err)
	}
}

// TestDocsLinks: every relative link of every Markdown file in the repository (README.md, the
// chart's, docs/) names a file that exists, and every #anchor a heading of its file.
func TestDocsLinks(t *testing.T) {
	root := testkit.RepoRoot()
	files := markdownFiles(t, root)
	if len(files) < 3 {
		t.Fatalf("found only %v: the walk is wrong", files)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		anchors[path] = headingAnchors(src)
		return anchors[path]
	}
	var bad []string
	links := 0
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, l := range markdownLinks(src) {
			links++
			target, anchor, _ := strings.Cut(l.target, "#")
			path := f
			if target != "" {
				path = filepath.Join(filepath.Dir(f), filepath.FromSlash(target))
				if _, err := os.Stat(path); err != nil {
					bad = append(bad, fmt.Sprintf("%s:%d: %s: no such file", rel, l.line, l.target))
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[anchor] {
				bad = append(bad, fmt.Sprintf("%s:%d: %s: no heading with anchor #%s", rel, l.line, l.target, anchor))
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d broken links of %d:\n%s", len(bad), links, strings.Join(bad, "\n"))
	}
	t.Logf("%d relative links in %d Markdown files", links, len(files))
}

// markdownFiles lists the repository's Markdown files, outside build and tool directories.
func markdownFiles(t *testing.T, root string) []string {
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "bin", "testdata", "vendor":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type mdLink struct {
	target string
	line   int
}

var (
	linkPattern = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeSpan    = regexp.MustCompile("`[^`]*`")
)

// markdownLinks returns the relative link targets of src, outside code blocks and code spans
// (external links, mailto and absolute paths are not checked).
func markdownLinks(src []byte) []mdLink {
	var out []mdLink
	fenced := false
	for i, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range linkPattern.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "/") {
				continue
			}
			out = append(out, mdLink{target: target, line: i + 1})
		}
	}
	return out
}

// headingAnchors returns the anchors GitHub gives src's headings: lower case, punctuation
// dropped, spaces as hyphens, a repeated one suffixed -1, -2, ….
func headingAnchors(src []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestHeadingAnchors pins the anchor rule on GitHub's own examples.
func TestHeadingAnchors(t *testing.T) {
	got := headingAnchors([]byte("# edgeflow\n## `edgeflow rebalance`: LARP on a live cluster\n## Measured (2-core machine, Go 1.26; medians)\n## Install\n## Install\n```\n# not a heading\n```\n"))
	want := map[string]bool{"edgeflow": true, "edgeflow-rebalance-larp-on-a-live-cluster": true, "measured-2-core-machine-go-126-medians": true, "install": true, "install-1": true}
	if !maps.Equal(got, want) {
		t.Errorf("anchors %v, want %v", got, want)
	}
}
