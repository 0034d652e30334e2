package config

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/tlstest"
)

func TestTLSConfigs(t *testing.T) {
	ca := tlstest.NewCA(t, "test")
	server := ca.Issue(t, "proxy", "127.0.0.1")
	other := ca.Issue(t, "other", "127.0.0.1")
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600)

	c := mustParse(t, "listen: \"\"\ntls:\n  listen: 127.0.0.1:6390\n  cert_file: "+server.CertFile+
		"\n  key_file: "+server.KeyFile+"\n  client_ca_file: "+ca.CertFile+"\n  min_version: \"1.3\"\n"+
		"upstream:\n  tls:\n    enabled: true\n    ca_file: "+ca.CertFile+"\n    cert_file: "+other.CertFile+
		"\n    key_file: "+other.KeyFile+"\n    server_name: redis.internal\n")
	if c.Listen != "" || c.TLS.Listen != "127.0.0.1:6390" {
		t.Fatalf("listen %q, tls.listen %q", c.Listen, c.TLS.Listen)
	}
	sc, err := c.TLS.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if sc.MinVersion != tls.VersionTLS13 || sc.ClientAuth != tls.RequireAndVerifyClientCert || sc.ClientCAs == nil ||
		len(sc.Certificates) != 1 || !sc.Certificates[0].Leaf.Equal(server.Leaf()) {
		t.Errorf("server config: min %x, client auth %v, %d certificates", sc.MinVersion, sc.ClientAuth, len(sc.Certificates))
	}
	cc, err := c.Upstream.TLS.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cc.RootCAs == nil || len(cc.Certificates) != 1 || !cc.Certificates[0].Leaf.Equal(other.Leaf()) || cc.InsecureSkipVerify {
		t.Errorf("client config: roots %v, %d certificates, insecure %v", cc.RootCAs, len(cc.Certificates), cc.InsecureSkipVerify)
	}
	if cc, err := Default().Upstream.TLS.ClientConfig(); cc != nil || err != nil {
		t.Errorf("TLS off: ClientConfig = %v, %v; want nil, nil", cc, err)
	}
	if sc := mustParse(t, "tls:\n  listen: :6390\n  cert_file: "+server.CertFile+"\n  key_file: "+server.KeyFile+"\n"); sc.TLS.MinVersion != TLS12 {
		t.Errorf("min_version defaults to %q", sc.TLS.MinVersion)
	}

	// Errors that need files, each naming its key.
	for _, tc := range []struct{ name, yml, want string }{
		{"cert missing", "tls:\n  listen: :6390\n  cert_file: /nonexistent/proxy.crt\n  key_file: " + server.KeyFile,
			"line 3: tls.cert_file: cannot read: open /nonexistent/proxy.crt: no such file or directory"},
		{"key missing", "tls:\n  listen: :6390\n  cert_file: " + server.CertFile + "\n  key_file: /nonexistent/proxy.key",
			"line 4: tls.key_file: cannot read: open /nonexistent/proxy.key"},
		{"cert not PEM", "tls:\n  listen: :6390\n  cert_file: " + notPEM + "\n  key_file: " + server.KeyFile,
			"line 3: tls.cert_file: " + notPEM + " holds no PEM certificate"},
		{"pair mismatch", "tls:\n  listen: :6390\n  cert_file: " + server.CertFile + "\n  key_file: " + other.KeyFile,
			"line 4: tls.key_file: " + other.KeyFile + " does not load with tls.cert_file: tls: private key does not match public key"},
		{"client CA not PEM", "tls:\n  listen: :6390\n  cert_file: " + server.CertFile + "\n  key_file: " + server.KeyFile + "\n  client_ca_file: " + notPEM,
			"line 5: tls.client_ca_file: " + notPEM + " holds no PEM certificate"},
		{"same as metrics", "metrics:\n  listen: 127.0.0.1:9121\ntls:\n  listen: 127.0.0.1:9121\n  cert_file: " + server.CertFile + "\n  key_file: " + server.KeyFile,
			"line 4: tls.listen: must differ from metrics.listen (127.0.0.1:9121)"},
		{"upstream CA not PEM", "upstream:\n  tls:\n    enabled: true\n    ca_file: " + notPEM,
			"line 4: upstream.tls.ca_file: " + notPEM + " holds no PEM certificate"},
		{"upstream pair mismatch", "upstream:\n  tls:\n    enabled: true\n    cert_file: " + other.CertFile + "\n    key_file: " + server.KeyFile,
			"line 5: upstream.tls.key_file: " + server.KeyFile + " does not load with upstream.tls.cert_file"},
		{"upstream key without cert", "upstream:\n  tls:\n    enabled: true\n    key_file: " + server.KeyFile,
			"upstream.tls.cert_file: is required when upstream.tls.key_file is set"},
		{"insecure without enabled", "upstream:\n  tls:\n    insecure_skip_verify: true",
			"line 3: upstream.tls.insecure_skip_verify: is set, but upstream.tls.enabled is false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yml + "\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse error = %v\nwant it to contain %q", err, tc.want)
			}
		})
	}

	// ServerConfig reads the files as they are now: a certificate
	// replaced on disk loads, one replaced by junk is an error that
	// names the key.
	rotated := ca.Issue(t, "proxy", "127.0.0.1")
	if sc, err := c.TLS.ServerConfig(); err != nil || !sc.Certificates[0].Leaf.Equal(rotated.Leaf()) {
		t.Errorf("after rotation: %v, same certificate as before: %v", err, err == nil && sc.Certificates[0].Leaf.Equal(server.Leaf()))
	}
	os.WriteFile(server.CertFile, []byte("junk"), 0o600)
	if _, err := c.TLS.ServerConfig(); err == nil || !strings.Contains(err.Error(), "tls.cert_file: ") {
		t.Errorf("junk certificate: ServerConfig error = %v", err)
	}
}
