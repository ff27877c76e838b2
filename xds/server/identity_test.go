package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/edgeflow/edgeflow/internal/certfile"
	"github.com/edgeflow/edgeflow/internal/testkit"
	"github.com/edgeflow/edgeflow/optimizer"
	"github.com/edgeflow/edgeflow/xds"
)

// testCA issues certificates for the mutual-TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

var serial struct {
	sync.Mutex
	n int64
}

// issue writes a certificate and key signed by ca into dir as NAME.crt and NAME.key; a
// server certificate is for 127.0.0.1, a client one carries the SPIFFE id as URI SAN.
func (ca *testCA) issue(t *testing.T, dir, name, spiffe string) (certFile, keyFile string) {
	t.Helper()
	serial.Lock()
	serial.n++
	sn := serial.n + 100
	serial.Unlock()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(sn), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature}
	if spiffe == "" {
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	} else {
		u, _ := url.Parse(spiffe)
		tmpl.URIs = []*url.URL{u}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writeTestFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeTestFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	return certFile, keyFile
}

func writeTestFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// identityTopology: web-0 (namespace shop, service account web) calls api-0 (account api).
func identityTopology() *optimizer.Topology {
	return &optimizer.Topology{
		Nodes: []optimizer.Node{{Name: "n1"}},
		Services: []optimizer.Service{
			{Name: "web", Namespace: "shop", Pods: []optimizer.Pod{{Name: "web-0", Node: "n1", Address: "127.0.0.1:9001", ServiceAccount: "web"}}},
			{Name: "api", Namespace: "shop", Pods: []optimizer.Pod{{Name: "api-0", Node: "n1", Address: "127.0.0.1:9002", ServiceAccount: "api"}}},
		},
		Calls: []optimizer.Call{{From: "web.shop", To: "api.shop"}},
	}
}

// startTLSServer runs a Server behind mutual TLS with the identity check.
func startTLSServer(t *testing.T, files TLSFiles) (*Server, string) {
	t.Helper()
	srv, err := New(Config{Logger: testLogger(t), DebounceQuiet: -1, RequireIdentity: true})
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := NewTLSConfig(files, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(append(srv.ServerOptions(), grpc.Creds(credentials.NewTLS(tlsCfg)))...)
	srv.Register(g)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = g.Serve(srv.Listener(lis)) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); g.Stop(); wg.Wait() })
	srv.Update(identityTopology())
	if err := srv.WaitPublished(ctx, 1); err != nil {
		t.Fatal(err)
	}
	return srv, lis.Addr().String()
}

// askListeners opens an ADS stream over TLS as nodeID and asks for the listener api.shop (an
// Istio sidecar: its assignment). It returns the response or the stream's error.
func askListeners(t *testing.T, addr string, cfg *tls.Config, nodeID string) (*discovery.DiscoveryResponse, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	typ := typeURLs[xds.ListenerSet]
	if strings.HasPrefix(nodeID, "sidecar~") {
		typ = typeURLs[xds.EndpointSet] // an Istio sidecar takes only EDS from edgeflow
	}
	if err := st.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: nodeID}, TypeUrl: typ, ResourceNames: []string{"api.shop"}}); err != nil {
		return nil, err
	}
	return st.Recv()
}

func clientTLS(t *testing.T, ca *testCA, certFile, keyFile string) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.pem)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg
}

// With mutual TLS, a node may claim only a pod identity its certificate proves.
func TestMutualTLSIdentity(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newTestCA(t, "mesh-ca")
	other := newTestCA(t, "other-ca")
	serverCert, serverKey := ca.issue(t, dir, "server", "")
	caFile := filepath.Join(dir, "ca.crt")
	writeTestFile(t, caFile, ca.pem)
	_, addr := startTLSServer(t, TLSFiles{CertFile: serverCert, KeyFile: serverKey, ClientCAFile: caFile})

	webCert, webKey := ca.issue(t, dir, "web", "spiffe://cluster.local/ns/shop/sa/web")
	apiCert, apiKey := ca.issue(t, dir, "api", "spiffe://cluster.local/ns/shop/sa/api")
	strayCert, strayKey := other.issue(t, dir, "stray", "spiffe://cluster.local/ns/shop/sa/web")
	web, api := clientTLS(t, ca, webCert, webKey), clientTLS(t, ca, apiCert, apiKey)

	cases := []struct {
		name, node string
		cfg        *tls.Config
		want       codes.Code // OK: a response
	}{
		{"own pod, proxyless id", "web-0.shop", web, codes.OK},
		{"own pod, sidecar id", "sidecar~127.0.0.1~web-0.shop~shop.svc.cluster.local", web, codes.OK},
		{"another account's pod", "web-0.shop", api, codes.PermissionDenied},
		{"another account's pod, sidecar id", "sidecar~127.0.0.1~web-0.shop~shop.svc.cluster.local", api, codes.PermissionDenied},
		{"no pod claimed: round-robin", "some-tool", api, codes.OK},
		{"no client certificate", "web-0.shop", clientTLS(t, ca, "", ""), codes.Unavailable},
		{"certificate of another CA", "web-0.shop", clientTLS(t, ca, strayCert, strayKey), codes.Unavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := askListeners(t, addr, tc.cfg, tc.node)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("%s: code %v (%v), want %v", tc.node, got, err, tc.want)
			}
			if tc.want == codes.OK && len(resp.GetResources()) != 1 {
				t.Errorf("%s: %d resources, want the one asked for", tc.node, len(resp.GetResources()))
			}
			if tc.want == codes.PermissionDenied && !strings.Contains(err.Error(), "/ns/shop/sa/web") {
				t.Errorf("refusal %q does not name the identity the pod runs as", err)
			}
		})
	}
}

// A rotated server certificate is served on new connections without a restart.
func TestTLSCertificateReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newTestCA(t, "mesh-ca")
	certFile, keyFile := ca.issue(t, dir, "server", "")
	cfg, err := NewTLSConfig(TLSFiles{CertFile: certFile, KeyFile: keyFile}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	defer wg.Wait()
	defer lis.Close()
	served := func() *big.Int {
		c, err := tls.Dial("tcp", lis.Addr().String(), clientTLS(t, ca, "", ""))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber
	}
	first := served()
	time.Sleep(10 * time.Millisecond) // a distinct modification time
	ca.issue(t, dir, "server", "")
	testkit.Eventually(t, 5*time.Second, "the rotated certificate", func() bool { return served().Cmp(first) != 0 })

	// A broken rotation keeps the last good certificate.
	now := served()
	writeTestFile(t, certFile, []byte("not a certificate"))
	time.Sleep(certfile.CheckEvery + 50*time.Millisecond)
	if got := served(); got.Cmp(now) != 0 {
		t.Errorf("after a broken rotation the served certificate changed: %v → %v", now, got)
	}
}

func TestTLSConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		files TLSFiles
		want  string
	}{
		{TLSFiles{CertFile: filepath.Join(dir, "absent.crt"), KeyFile: filepath.Join(dir, "absent.key")}, "absent.crt"},
		{TLSFiles{CertFile: "x"}, "both a certificate and a key"},
	} {
		if _, err := NewTLSConfig(tc.files, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewTLSConfig(%+v) = %v, want an error naming %q", tc.files, err, tc.want)
		}
	}
	_ = fmt.Sprint
}
