package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"time"
)

// TLS versions min_version accepts.
const (
	TLS12 = "1.2"
	TLS13 = "1.3"
)

// TLS configures the client-facing TLS listener. It is off while Listen is
// empty (the default), and then every other field must be empty too.
type TLS struct {
	// Listen is the host:port of the TLS listener, beside the plain one
	// (listen), or alone when listen is "". Empty (the default): no TLS
	// listener. Must differ from listen and metrics.listen.
	Listen string `yaml:"listen"`
	// CertFile is the PEM file of the proxy's certificate, followed by
	// any intermediates. Required when Listen is set.
	CertFile string `yaml:"cert_file"`
	// KeyFile is the PEM file of CertFile's private key. Required when
	// Listen is set.
	KeyFile string `yaml:"key_file"`
	// ClientCAFile, when set, is a PEM file of the CAs that sign client
	// certificates: every client must then present one they signed
	// (mutual TLS), as Redis's tls-auth-clients yes. Empty (the default)
	// asks clients for no certificate.
	ClientCAFile string `yaml:"client_ca_file"`
	// MinVersion is the oldest TLS version served: "1.2" (the default) or
	// "1.3".
	MinVersion string `yaml:"min_version"`
	// HandshakeTimeout bounds a client's TLS handshake, from accept on: a
	// client that connects and sends nothing is closed then. Must be > 0;
	// default 10s.
	HandshakeTimeout Duration `yaml:"handshake_timeout"`
}

// UpstreamTLS configures TLS toward Redis. It is off unless Enabled is
// true; the other fields must then stay empty, so that a file naming a CA
// cannot leave TLS off by a missing line.
type UpstreamTLS struct {
	// Enabled makes every upstream connection TLS, to standalone Redis and
	// to each cluster node (their tls-port; a TLS cluster reports its TLS
	// ports to TLS clients in CLUSTER SLOTS and redirections, as Redis 7.0
	// does with tls-cluster yes). Default false.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM file of the CAs that sign Redis's certificates.
	// Empty (the default) trusts the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the PEM files of a client certificate and
	// its key, for a Redis with tls-auth-clients yes (its default). Both
	// or neither; default neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name every node's certificate is checked against.
	// Empty (the default): in standalone mode the host of
	// upstream.addrs[0]; in cluster mode the hostname a node announces in
	// CLUSTER SLOTS (Redis 7.0's cluster-announce-hostname), else the host
	// of its address.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any certificate Redis presents, with no
	// check of its CA or name, for tests only: anyone on the path can then
	// read and change the traffic. Default false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// defaultTLS is the tls section an empty proxy.yaml gives.
func defaultTLS() TLS {
	return TLS{MinVersion: TLS12, HandshakeTimeout: Duration(10 * time.Second)}
}

// ServerConfig loads the listener's certificate and client CAs as they are
// in the files now, for a TLS listener's handshakes. The error names the
// YAML key of the file that cannot be read or parsed (an *Error).
func (t *TLS) ServerConfig() (*tls.Config, error) {
	errs := t.check(nil)
	if len(errs) > 0 {
		return nil, joinErrors(errs)
	}
	return t.load()
}

// load builds the tls.Config of a checked TLS; errors are *Error.
func (t *TLS) load() (*tls.Config, error) {
	cert, err := loadPair("tls", t.CertFile, t.KeyFile)
	if err != nil {
		return nil, err
	}
	conf := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.MinVersion == TLS13 {
		conf.MinVersion = tls.VersionTLS13
	}
	if t.ClientCAFile != "" {
		if conf.ClientCAs, err = loadCAs("tls.client_ca_file", t.ClientCAFile); err != nil {
			return nil, err
		}
		conf.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return conf, nil
}

// check returns the problems with t's fields, without reading files.
func (t *TLS) check(errs []*Error) []*Error {
	v := validator{errs: errs}
	switch t.MinVersion {
	case TLS12, TLS13:
	default:
		v.errorf("tls.min_version", `must be "1.2" or "1.3", got %q`, t.MinVersion)
	}
	v.positive("tls.handshake_timeout", t.HandshakeTimeout)
	if t.Listen == "" {
		for _, f := range []struct{ key, value string }{
			{"tls.cert_file", t.CertFile}, {"tls.key_file", t.KeyFile}, {"tls.client_ca_file", t.ClientCAFile},
		} {
			if f.value != "" {
				v.errorf(f.key, "is set, but tls.listen is empty: set tls.listen to serve TLS, or remove %s", f.key)
			}
		}
		return v.errs
	}
	if !v.addr("tls.listen", t.Listen, true) {
		return v.errs
	}
	if t.CertFile == "" {
		v.errorf("tls.cert_file", "is required when tls.listen is set")
	}
	if t.KeyFile == "" {
		v.errorf("tls.key_file", "is required when tls.listen is set")
	}
	return v.errs
}

// validateListeners checks listen, tls and the listeners' addresses: at
// least one listener, none sharing an address. listen may be "" only when
// tls.listen is set.
func (v *validator) validateListeners(c *Config) {
	if c.Listen != "" || c.TLS.Listen == "" {
		v.addr("listen", c.Listen, true)
	}
	t := &c.TLS
	before := len(v.errs)
	v.errs = t.check(v.errs)
	if len(v.errs) > before || t.Listen == "" {
		return
	}
	if _, port, _ := net.SplitHostPort(t.Listen); port == "0" {
		// A free port each: they cannot clash.
	} else if t.Listen == c.Listen {
		v.errorf("tls.listen", "must differ from listen (%s)", c.Listen)
	} else if t.Listen == c.Metrics.Listen {
		v.errorf("tls.listen", "must differ from metrics.listen (%s)", c.Metrics.Listen)
	}
	if _, err := t.load(); err != nil {
		v.errs = append(v.errs, err.(*Error))
	}
}

// ClientConfig loads the CAs and client certificate as they are in the
// files now, for the upstream's handshakes; nil when TLS is off. The
// caller sets ServerName per node. The error names the YAML key of the
// file that cannot be read or parsed (an *Error).
func (u *UpstreamTLS) ClientConfig() (*tls.Config, error) {
	if !u.Enabled {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: u.InsecureSkipVerify}
	if u.CAFile != "" {
		var err error
		if conf.RootCAs, err = loadCAs("upstream.tls.ca_file", u.CAFile); err != nil {
			return nil, err
		}
	}
	if u.CertFile != "" {
		cert, err := loadPair("upstream.tls", u.CertFile, u.KeyFile)
		if err != nil {
			return nil, err
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}

// validateUpstreamTLS checks upstream.tls and loads its files.
func (v *validator) validateUpstreamTLS(u *UpstreamTLS) {
	if !u.Enabled {
		for _, f := range []struct {
			key string
			set bool
		}{
			{"upstream.tls.ca_file", u.CAFile != ""},
			{"upstream.tls.cert_file", u.CertFile != ""},
			{"upstream.tls.key_file", u.KeyFile != ""},
			{"upstream.tls.server_name", u.ServerName != ""},
			{"upstream.tls.insecure_skip_verify", u.InsecureSkipVerify},
		} {
			if f.set {
				v.errorf(f.key, "is set, but upstream.tls.enabled is false: set enabled: true, or remove %s", f.key)
			}
		}
		return
	}
	switch {
	case u.CertFile != "" && u.KeyFile == "":
		v.errorf("upstream.tls.key_file", "is required when upstream.tls.cert_file is set")
		return
	case u.CertFile == "" && u.KeyFile != "":
		v.errorf("upstream.tls.cert_file", "is required when upstream.tls.key_file is set")
		return
	}
	if _, err := u.ClientConfig(); err != nil {
		v.errs = append(v.errs, err.(*Error))
	}
}

// loadPair loads a certificate and its key; prefix is the YAML section
// whose cert_file and key_file they are.
func loadPair(prefix, certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, &Error{Path: prefix + ".cert_file", Msg: fmt.Sprintf("cannot read: %v", err)}
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, &Error{Path: prefix + ".key_file", Msg: fmt.Sprintf("cannot read: %v", err)}
	}
	if !x509.NewCertPool().AppendCertsFromPEM(certPEM) {
		return tls.Certificate{}, &Error{Path: prefix + ".cert_file", Msg: fmt.Sprintf("%s holds no PEM certificate", certFile)}
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, &Error{Path: prefix + ".key_file", Msg: fmt.Sprintf("%s does not load with %s.cert_file: %v", keyFile, prefix, err)}
	}
	return cert, nil
}

// loadCAs reads a PEM file of CA certificates into a pool.
func loadCAs(key, path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{Path: key, Msg: fmt.Sprintf("cannot read: %v", err)}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, &Error{Path: key, Msg: fmt.Sprintf("%s holds no PEM certificate", path)}
	}
	return pool, nil
}
