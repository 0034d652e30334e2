// Package tlstest makes the certificates TLS tests need, in Go (crypto/x509),
// so that no test runs openssl: a CA and the certificates it issues, each
// written as PEM files in a temp dir of the test. It is imported by tests
// only.
//
// Keys are ECDSA P-256, which Go and Redis's OpenSSL both accept. Every
// issued certificate is good for both ends of a connection (server and
// client auth), since a Redis Cluster node presents the same one on its
// client port and to its peers on the cluster bus.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// serial numbers the certificates of one test binary apart.
var serial atomic.Int64

// CA is a certificate authority of a test.
type CA struct {
	// CertFile is the CA certificate's PEM file, for ca_file,
	// client_ca_file, --tls-ca-cert-file and redis-cli --cacert.
	CertFile string

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

// Cert is a certificate and its key, as PEM files and loaded.
type Cert struct {
	CertFile, KeyFile string
	TLS               tls.Certificate
}

// NewCA makes a CA named name ("NAME test CA") whose files live in a temp
// dir of tb, removed when the test ends.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: name + " test CA"}, // never a leaf's: OpenSSL takes a leaf named as its issuer for self-signed
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	ca := &CA{cert: cert, key: key, dir: tb.TempDir()}
	ca.CertFile = writePEM(tb, ca.dir, name+"-ca.crt", "CERTIFICATE", der)
	return ca
}

// Pool is a cert pool holding the CA alone, for a client's RootCAs or a
// server's ClientCAs.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Issue makes a certificate for the given names, each an IP address or a
// DNS name, signed by ca; file is the base name of its two files (FILE.crt,
// FILE.key) in ca's dir, so issuing again under one name replaces them, as
// an operator rotating a certificate does.
func (ca *CA) Issue(tb testing.TB, file string, names ...string) *Cert {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: file},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cert{
		CertFile: writePEM(tb, ca.dir, file+".crt", "CERTIFICATE", der),
		KeyFile:  writePEM(tb, ca.dir, file+".key", "PRIVATE KEY", keyDER),
	}
	if c.TLS, err = tls.LoadX509KeyPair(c.CertFile, c.KeyFile); err != nil {
		tb.Fatal(err)
	}
	return c
}

// Leaf is the certificate as parsed, for comparing with what a peer
// presented.
func (c *Cert) Leaf() *x509.Certificate { return c.TLS.Leaf }

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return key
}

// writePEM writes one PEM block to dir/name, by a rename so that a reader
// never sees half a file, and returns the path.
func writePEM(tb testing.TB, dir, name, kind string, der []byte) string {
	tb.Helper()
	path := filepath.Join(dir, name)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		tb.Fatal(err)
	}
	return path
}
