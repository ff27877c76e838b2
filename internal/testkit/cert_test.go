package testkit

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"slices"
	"testing"
)

// TestSelfSigned: the pair loads as a TLS key pair, and the certificate verifies as its own root
// for each host it names (an IP and a DNS name), and for no other.
func TestSelfSigned(t *testing.T) {
	certPEM, keyPEM := SelfSigned(t, "edgeflow-webhook", "127.0.0.1", "edgeflow-webhook.edgeflow.svc")
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "edgeflow-webhook" || !cert.IsCA {
		t.Errorf("CN %q, CA %v; want edgeflow-webhook, a CA", cert.Subject.CommonName, cert.IsCA)
	}
	if !slices.ContainsFunc(cert.IPAddresses, func(ip net.IP) bool { return ip.Equal(net.IPv4(127, 0, 0, 1)) }) {
		t.Errorf("IP SANs %v, want 127.0.0.1", cert.IPAddresses)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	for host, ok := range map[string]bool{"127.0.0.1": true, "edgeflow-webhook.edgeflow.svc": true, "other.svc": false} {
		_, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: host})
		if (err == nil) != ok {
			t.Errorf("verify for %s: %v, want ok=%v", host, err, ok)
		}
	}
}
