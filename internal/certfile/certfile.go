// Package certfile serves a TLS certificate (and, for mutual TLS, a client CA) from PEM files
// that are read again when they change, so a rotated certificate — a renewed Kubernetes Secret
// mounted in the pod, cert-manager's — takes effect without a restart. Both of edgeflow's TLS
// listeners use it: the xDS port and the placement webhook.
//
// Rules:
//   - The files are read when the Source is made: an error names the file.
//   - On a handshake, the files' modification times are checked (at most once per
//     CheckEvery); when one changed they are read again. A rotation that does not load is
//     logged once and the previous certificate stays.
package certfile

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Files names the PEM files.
type Files struct {
	// CertFile and KeyFile are the server's certificate chain and key.
	CertFile, KeyFile string
	// ClientCAFile, when set, turns on mutual TLS: clients must present a certificate signed
	// by one of these CAs.
	ClientCAFile string
}

// CheckEvery bounds how often the files are checked for changes.
const CheckEvery = time.Second

// Source is the current certificate of a set of files. It is safe for concurrent use.
type Source struct {
	files Files
	what  string // who serves it, in errors and logs ("xds", "webhook")
	log   *slog.Logger

	mu      sync.Mutex
	current *tls.Config
	checked time.Time
	mtimes  [3]time.Time
}

// New reads the files. what names the listener in errors and logs.
func New(f Files, what string, logger *slog.Logger) (*Source, error) {
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, fmt.Errorf("%s: TLS needs both a certificate and a key file", what)
	}
	if logger == nil {
		logger = slog.Default()
	}
	s := &Source{files: f, what: what, log: logger}
	cfg, err := s.load()
	if err != nil {
		return nil, err
	}
	s.current, s.checked = cfg, time.Now()
	return s, nil
}

// ServerConfig is a server TLS configuration (TLS 1.2 or later, HTTP/2) that takes the
// current certificate, and client CA, on every handshake.
func (s *Source) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return s.get(), nil },
	}
}

// GetCertificate is tls.Config.GetCertificate for a listener without client certificates.
func (s *Source) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	cfg := s.get()
	if len(cfg.Certificates) == 0 {
		return nil, errors.New(s.what + ": no TLS certificate")
	}
	return &cfg.Certificates[0], nil
}

func (s *Source) mtimes3() ([3]time.Time, error) {
	var out [3]time.Time
	for i, p := range []string{s.files.CertFile, s.files.KeyFile, s.files.ClientCAFile} {
		if p == "" {
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return out, fmt.Errorf("%s: TLS file %s: %w", s.what, p, err)
		}
		out[i] = st.ModTime()
	}
	return out, nil
}

func (s *Source) load() (*tls.Config, error) {
	mt, err := s.mtimes3()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(s.files.CertFile, s.files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%s: TLS certificate %s / key %s: %w", s.what, s.files.CertFile, s.files.KeyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}
	if s.files.ClientCAFile != "" {
		pem, err := os.ReadFile(s.files.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("%s: client CA file: %w", s.what, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: client CA file %s: no PEM certificate", s.what, s.files.ClientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	s.mtimes = mt
	return cfg, nil
}

func (s *Source) get() *tls.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.checked) < CheckEvery {
		return s.current
	}
	s.checked = time.Now()
	mt, err := s.mtimes3()
	if err != nil || mt == s.mtimes {
		return s.current
	}
	cfg, err := s.load()
	if err != nil {
		s.log.Error(s.what+": reloading the TLS certificates failed; the previous ones stay", "error", err)
		s.mtimes = mt // report a bad rotation once
		return s.current
	}
	s.log.Info(s.what+": TLS certificates reloaded", "cert", s.files.CertFile)
	s.current = cfg
	return cfg
}
