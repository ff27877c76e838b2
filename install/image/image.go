// Command image builds edgeflow's container image without a container runtime (make image): the
// static edgeflow binary on an otherwise empty root (distroless-static-like: /etc/passwd and
// /etc/group naming the non-root user 65532, /tmp, /home/nonroot, optionally a CA bundle), user
// 65532:65532, entrypoint /edgeflow. It writes an OCI image layout directory (crane push
// --index, skopeo copy oci:DIR, or any registry tool) and a tarball that docker load and crane
// push take. It is its own module so that go-containerregistry stays out of the product's go.mod.
//
// The image is reproducible: its creation time is the commit time stamped in the binary (or
// SOURCE_DATE_EPOCH), every file in the layer has that time and root or 65532 as owner, so
// one binary gives one digest.
package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's user, as in install/Dockerfile (distroless's nonroot) and the chart's
// securityContext (runAsUser/runAsGroup): numeric, so that runAsNonRoot can check it.
const (
	nonrootUID = 65532
	user       = "65532:65532"
	entrypoint = "/edgeflow"
	// refNameAnnotation names an image in an OCI layout's index (the tag it was built as).
	refNameAnnotation = "org.opencontainers.image.ref.name"
)

// errBinary is returned when the binary cannot go into the image as it is.
var errBinary = errors.New("image: binary")

// Config is what Build puts into the image.
type Config struct {
	// Binary is the edgeflow binary: a Go binary built for linux with CGO_ENABLED=0 (the image
	// has no libc). The image's architecture is the binary's GOARCH.
	Binary string
	// CACerts, if set, is a PEM bundle installed as /etc/ssl/certs/ca-certificates.crt (for a
	// Prometheus behind a publicly signed certificate; in-cluster CAs come from mounts).
	CACerts string
	// Created overrides the creation time (SOURCE_DATE_EPOCH); zero: the binary's vcs.time.
	Created time.Time
}

// Build returns the image of c.Binary. It reads the binary's build information to refuse a
// binary that needs cgo or is not for linux, and to label the image with its version and commit.
func Build(c Config) (v1.Image, error) {
	bin, err := os.ReadFile(c.Binary)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBinary, err)
	}
	bi, err := buildinfo.ReadFile(c.Binary)
	if err != nil {
		return nil, fmt.Errorf("%w %s: not a Go binary: %w", errBinary, c.Binary, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if settings["GOOS"] != "linux" {
		return nil, fmt.Errorf("%w %s: built for GOOS=%q, want linux", errBinary, c.Binary, settings["GOOS"])
	}
	if settings["CGO_ENABLED"] != "0" {
		return nil, fmt.Errorf("%w %s: built with CGO_ENABLED=%q, want 0 (the image has no libc)", errBinary, c.Binary, settings["CGO_ENABLED"])
	}
	created := c.Created
	if created.IsZero() && settings["vcs.time"] != "" {
		if created, err = time.Parse(time.RFC3339, settings["vcs.time"]); err != nil {
			return nil, fmt.Errorf("%w %s: vcs.time: %w", errBinary, c.Binary, err)
		}
	}
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()

	var caCerts []byte
	if c.CACerts != "" {
		if caCerts, err = os.ReadFile(c.CACerts); err != nil {
			return nil, fmt.Errorf("image: CA bundle: %w", err)
		}
	}
	rootfs, err := rootFS(bin, caCerts, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(rootfs)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}

	labels := map[string]string{
		"org.opencontainers.image.title":   "edgeflow",
		"org.opencontainers.image.source":  "https://github.com/edgeflow/edgeflow",
		"org.opencontainers.image.version": bi.Main.Version,
	}
	if rev := settings["vcs.revision"]; rev != "" {
		labels["org.opencontainers.image.revision"] = rev
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: settings["GOARCH"],
		OS:           "linux",
		Created:      v1.Time{Time: created},
		Config: v1.Config{
			Entrypoint: []string{entrypoint},
			User:       user,
			WorkingDir: "/",
			Labels:     labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "make image (install/image)", Comment: "the static edgeflow binary"},
	})
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	return img, nil
}

// rootFS is the image's one layer, as an uncompressed tar.
func rootFS(bin, caCerts []byte, mtime time.Time) ([]byte, error) {
	type entry struct {
		name     string
		mode     int64
		uid      int
		dir      bool
		contents []byte
	}
	entries := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, contents: []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
			"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, contents: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: nonrootUID, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
	}
	if caCerts != nil {
		entries = append(entries,
			entry{name: "etc/ssl/", mode: 0o755, dir: true},
			entry{name: "etc/ssl/certs/", mode: 0o755, dir: true},
			entry{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, contents: caCerts})
	}
	entries = append(entries, entry{name: entrypoint[1:], mode: 0o755, contents: bin})

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: mtime, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.contents))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("image: layer %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.contents); err != nil {
			return nil, fmt.Errorf("image: layer %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteLayout writes img into a fresh OCI image layout at dir, named tag in its index. An
// existing dir must be an OCI layout (it is replaced) or empty.
func WriteLayout(dir string, img v1.Image, tag name.Tag) error {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
			return fmt.Errorf("image: %s exists and is not an OCI layout; not replacing it", dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("image: %w", err)
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("image: layout %s: %w", dir, err)
	}
	if err := p.AppendImage(img,
		layout.WithAnnotations(map[string]string{refNameAnnotation: tag.String()}),
		layout.WithPlatform(v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture})); err != nil {
		return fmt.Errorf("image: layout %s: %w", dir, err)
	}
	return nil
}

// WriteTarball writes img as a tarball that docker load and crane push take, tagged tag.
func WriteTarball(file string, img v1.Image, tag name.Tag) error {
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		return fmt.Errorf("image: tarball %s: %w", file, err)
	}
	return nil
}

func main() {
	var c Config
	flag.StringVar(&c.Binary, "binary", "", "the static edgeflow binary (CGO_ENABLED=0 GOOS=linux go build ./cmd/edgeflow)")
	flag.StringVar(&c.CACerts, "ca-certs", "", "a PEM bundle to install as /etc/ssl/certs/ca-certificates.crt (optional)")
	tagFlag := flag.String("tag", "ghcr.io/edgeflow/edgeflow:latest", "the image's name, in the tarball and the layout's index")
	layoutDir := flag.String("layout", "", "write an OCI image layout into this directory")
	tarFile := flag.String("tarball", "", "write a tarball for docker load / crane push to this file")
	flag.Parse()
	if err := run(c, *tagFlag, *layoutDir, *tarFile); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(c Config, tagName, layoutDir, tarFile string) error {
	if c.Binary == "" || (layoutDir == "" && tarFile == "") {
		return errors.New("image: -binary and one of -layout, -tarball are required")
	}
	tag, err := name.NewTag(tagName)
	if err != nil {
		return fmt.Errorf("image: -tag: %w", err)
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("image: SOURCE_DATE_EPOCH=%q: %w", s, err)
		}
		c.Created = time.Unix(sec, 0)
	}
	img, err := Build(c)
	if err != nil {
		return err
	}
	if layoutDir != "" {
		if err := WriteLayout(layoutDir, img, tag); err != nil {
			return err
		}
	}
	if tarFile != "" {
		if err := WriteTarball(tarFile, img, tag); err != nil {
			return err
		}
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	size, err := imageSize(img)
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s (%.1f MB compressed)", tag, digest, float64(size)/1e6)
	for _, out := range []string{layoutDir, tarFile} {
		if out != "" {
			fmt.Printf(" -> %s", out)
		}
	}
	fmt.Println()
	return nil
}

// imageSize is what a registry stores for img: its manifest, config and compressed layers.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, fmt.Errorf("image: %w", err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, fmt.Errorf("image: %w", err)
	}
	size := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	return size, nil
}
