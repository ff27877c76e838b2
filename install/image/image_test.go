package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

const testTag = "ghcr.io/edgeflow/edgeflow:test"

// builtImage is the image under test: what make image wrote (make test-image sets
// EDGEFLOW_IMAGE_LAYOUT, EDGEFLOW_IMAGE_TARBALL and EDGEFLOW_IMAGE_TAG), or, with go test alone,
// an image this test builds the same way from a static build of ../../cmd/edgeflow.
func builtImage(t *testing.T) (layoutDir, tarFile, tag string) {
	layoutDir, tarFile, tag = os.Getenv("EDGEFLOW_IMAGE_LAYOUT"), os.Getenv("EDGEFLOW_IMAGE_TARBALL"), os.Getenv("EDGEFLOW_IMAGE_TAG")
	if layoutDir != "" && tarFile != "" && tag != "" {
		t.Logf("the image make image built: %s, %s (%s)", layoutDir, tarFile, tag)
		return layoutDir, tarFile, tag
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "edgeflow")
	build := exec.Command("go", "build", "-C", "../..", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/edgeflow")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/edgeflow: %v\n%s", err, out)
	}
	layoutDir, tarFile, tag = filepath.Join(dir, "layout"), filepath.Join(dir, "edgeflow.tar"), testTag
	if err := run(Config{Binary: bin}, tag, layoutDir, tarFile); err != nil {
		t.Fatal(err)
	}
	return layoutDir, tarFile, tag
}

// TestImage reads the image back from the OCI layout and from the tarball with
// go-containerregistry, checks its config against what the chart's Deployment expects, and runs
// the binary extracted from its layer: edgeflow version.
func TestImage(t *testing.T) {
	layoutDir, tarFile, tagName := builtImage(t)
	tag, err := name.NewTag(tagName)
	if err != nil {
		t.Fatal(err)
	}
	fromLayout := func(t *testing.T) v1.Image {
		p, err := layout.FromPath(layoutDir)
		if err != nil {
			t.Fatal(err)
		}
		idx, err := p.ImageIndex()
		if err != nil {
			t.Fatal(err)
		}
		m, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Manifests) != 1 {
			t.Fatalf("layout index: %d manifests, want 1", len(m.Manifests))
		}
		d := m.Manifests[0]
		if got := d.Annotations[refNameAnnotation]; got != tag.String() {
			t.Errorf("layout index: %s = %q, want %q", refNameAnnotation, got, tag)
		}
		if d.Platform == nil || d.Platform.OS != "linux" || d.Platform.Architecture != runtime.GOARCH {
			t.Errorf("layout index: platform %+v, want linux/%s", d.Platform, runtime.GOARCH)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	fromTarball := func(t *testing.T) v1.Image {
		img, err := tarball.ImageFromPath(tarFile, &tag)
		if err != nil {
			t.Fatalf("tarball %s has no image %s: %v", tarFile, tag, err)
		}
		return img
	}

	digests := map[string]v1.Hash{}
	for _, tc := range []struct {
		name string
		read func(*testing.T) v1.Image
	}{{"layout", fromLayout}, {"tarball", fromTarball}} {
		t.Run(tc.name, func(t *testing.T) {
			img := tc.read(t)
			checkConfig(t, img)
			files := extract(t, img)
			checkUser(t, files)
			runVersion(t, files["edgeflow"])
			size, err := imageSize(img)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("image %.1f MB compressed, binary %.1f MB", float64(size)/1e6, float64(len(files["edgeflow"].contents))/1e6)
			// the tarball keeps the layer's bytes and the config, not the manifest: compare layers
			layers, err := img.Layers()
			if err != nil || len(layers) != 1 {
				t.Fatalf("layers: %d, %v; want 1", len(layers), err)
			}
			if digests[tc.name], err = layers[0].Digest(); err != nil {
				t.Fatal(err)
			}
		})
	}
	if digests["layout"] != digests["tarball"] {
		t.Errorf("the layout's layer %s differs from the tarball's %s", digests["layout"], digests["tarball"])
	}
}

func checkConfig(t *testing.T, img v1.Image) {
	t.Helper()
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	if got := cfg.Config.Entrypoint; len(got) != 1 || got[0] != "/edgeflow" {
		t.Errorf("entrypoint %q, want [/edgeflow]", got)
	}
	if len(cfg.Config.Cmd) != 0 {
		t.Errorf("cmd %q, want none (the chart gives the arguments)", cfg.Config.Cmd)
	}
	// Kubernetes's runAsNonRoot accepts only a numeric non-zero user; the chart runs 65532:65532.
	uid, gid, ok := strings.Cut(cfg.Config.User, ":")
	if u, err := strconv.Atoi(uid); !ok || err != nil || u == 0 {
		t.Errorf("user %q, want a numeric non-root UID:GID", cfg.Config.User)
	}
	chart, err := os.ReadFile("../helm/edgeflow/templates/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"runAsUser": uid, "runAsGroup": gid} {
		m := regexp.MustCompile(key + `: (\d+)`).FindSubmatch(chart)
		if m == nil || string(m[1]) != want {
			t.Errorf("the chart's %s is %q, the image's %s", key, m, want)
		}
	}
}

type file struct {
	mode     int64
	uid      int
	contents []byte
}

// extract reads the image's filesystem (its layers flattened) into memory.
func extract(t *testing.T, img v1.Image) map[string]file {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]file{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(h.Name, "/")] = file{mode: h.Mode, uid: h.Uid, contents: b}
	}
	if _, ok := files["edgeflow"]; !ok {
		t.Fatalf("no /edgeflow in the image's layer")
	}
	return files
}

// checkUser: /etc/passwd names the image's user (tools that map the UID to a name, and $HOME).
func checkUser(t *testing.T, files map[string]file) {
	t.Helper()
	if !bytes.Contains(files["etc/passwd"].contents, []byte(":65532:65532:")) {
		t.Errorf("/etc/passwd has no user 65532:\n%s", files["etc/passwd"].contents)
	}
	if f, ok := files["tmp"]; !ok || f.mode&0o1777 != 0o1777 {
		t.Errorf("/tmp: %+v, want mode 1777", f.mode)
	}
}

// runVersion runs the binary from the layer: edgeflow version, and reads its build information
// (static: CGO_ENABLED=0).
func runVersion(t *testing.T, f file) {
	t.Helper()
	if f.mode&0o111 == 0 {
		t.Errorf("/edgeflow mode %o is not executable", f.mode)
	}
	bin := filepath.Join(t.TempDir(), "edgeflow")
	if err := os.WriteFile(bin, f.contents, 0o755); err != nil {
		t.Fatal(err)
	}
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if bi.Path != "github.com/edgeflow/edgeflow/cmd/edgeflow" {
		t.Errorf("/edgeflow is %s, want github.com/edgeflow/edgeflow/cmd/edgeflow", bi.Path)
	}
	for _, s := range bi.Settings {
		if s.Key == "CGO_ENABLED" && s.Value != "0" {
			t.Errorf("/edgeflow built with CGO_ENABLED=%s, want 0", s.Value)
		}
	}
	if runtime.GOOS != "linux" {
		t.Skipf("a linux binary does not run on %s", runtime.GOOS)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("edgeflow version: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`^edgeflow \S+ \(commit .+, go1\.\d+`).Match(out) {
		t.Errorf("edgeflow version printed %q", out)
	}
	t.Logf("edgeflow version: %s", bytes.TrimSpace(out))
}

// TestBuildRefuses: a file that is not a static linux Go binary does not become the image.
func TestBuildRefuses(t *testing.T) {
	notGo := filepath.Join(t.TempDir(), "edgeflow")
	if err := os.WriteFile(notGo, []byte("#!/bin/sh\necho edgeflow\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, binary, want string }{
		{"missing", filepath.Join(t.TempDir(), "nothing"), "no such file"},
		{"not Go", notGo, "not a Go binary"},
	}
	// the test binary itself: refused when it needs cgo or is not for linux
	if bi, err := buildinfo.ReadFile(os.Args[0]); err == nil {
		for _, s := range bi.Settings {
			if s.Key == "CGO_ENABLED" && s.Value == "1" && runtime.GOOS == "linux" {
				cases = append(cases, struct{ name, binary, want string }{"cgo", os.Args[0], "CGO_ENABLED"})
			}
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(Config{Binary: tc.binary})
			if !errors.Is(err, errBinary) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Build(%s) = %v, want %v naming %q", tc.binary, err, errBinary, tc.want)
			}
		})
	}
}
