package localredis_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/tlstest"
)

// TestStartTLS: a server with TLS serves its TLS port to a client with a
// certificate of the CA, refuses one without, and keeps the port across
// Restart; the plain port stays.
func TestStartTLS(t *testing.T) {
	requireRedisServer(t)
	ca := tlstest.NewCA(t, "redis")
	cert := ca.Issue(t, "redis", "127.0.0.1")
	s := redistest.Start(t, localredis.Options{TLS: &localredis.TLSOptions{
		CertFile: cert.CertFile, KeyFile: cert.KeyFile, CAFile: ca.CertFile, AuthClients: true,
	}})
	if s.TLSAddr() == "" || s.TLSAddr() == s.Addr() {
		t.Fatalf("TLSAddr %q, Addr %q", s.TLSAddr(), s.Addr())
	}
	ping := func(conf *tls.Config) error {
		c := redis.NewClient(&redis.Options{Addr: s.TLSAddr(), Protocol: 2, TLSConfig: conf, MaxRetries: -1, DialTimeout: 2 * time.Second})
		defer c.Close()
		return c.Ping(context.Background()).Err()
	}
	withCert := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Issue(t, "client", "client").TLS}}
	if err := ping(withCert); err != nil {
		t.Errorf("PING over TLS with a client certificate: %v", err)
	}
	if err := ping(&tls.Config{RootCAs: ca.Pool()}); err == nil {
		t.Error("PING over TLS without a client certificate succeeded; tls-auth-clients yes should refuse it")
	}
	if got, err := rawPing(s.Addr()); err != nil || got != "+PONG" {
		t.Errorf("plain PING = %q, %v", got, err)
	}
	before := s.TLSAddr()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.TLSAddr() != before {
		t.Errorf("TLSAddr %s after Restart, was %s", s.TLSAddr(), before)
	}
	if err := ping(withCert); err != nil {
		t.Errorf("PING over TLS after Restart: %v", err)
	}
	if _, err := localredis.Start(localredis.Options{Embedded: true, TLS: &localredis.TLSOptions{}}); err == nil || !strings.Contains(err.Error(), "no TLS") {
		t.Errorf("embedded with TLS: %v", err)
	}
}

// TestClusterTLS: a TLS cluster forms (its nodes talk TLS to each other),
// and a TLS client is told the TLS ports in CLUSTER SLOTS, a plain one
// the plain ports, as Redis 7.0 does with tls-cluster yes.
func TestClusterTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "redis")
	cert := ca.Issue(t, "redis", "127.0.0.1")
	c := startCluster(t, localredis.ClusterOptions{Masters: 3, Replicas: 1, TLS: &localredis.TLSOptions{
		CertFile: cert.CertFile, KeyFile: cert.KeyFile, CAFile: ca.CertFile,
	}})
	tlsSeeds, seeds := c.TLSSeeds(), c.Seeds()
	if len(tlsSeeds) != 3 {
		t.Fatalf("TLSSeeds = %v", tlsSeeds)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		addr string
		conf *tls.Config
		want []string
	}{
		{"over TLS", tlsSeeds[0], &tls.Config{RootCAs: ca.Pool()}, tlsSeeds},
		{"plain", seeds[0], nil, seeds},
	} {
		cl := redis.NewClient(&redis.Options{Addr: tc.addr, Protocol: 2, TLSConfig: tc.conf, MaxRetries: -1})
		slots, err := cl.ClusterSlots(ctx).Result()
		cl.Close()
		if err != nil {
			t.Fatalf("%s: CLUSTER SLOTS: %v", tc.name, err)
		}
		var masters []string
		for _, s := range slots {
			masters = append(masters, s.Nodes[0].Addr)
		}
		if strings.Join(masters, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: CLUSTER SLOTS masters %v, want %v", tc.name, masters, tc.want)
		}
	}
	for _, m := range mustMasters(t, c) {
		r := mustReplicaOf(t, c, m)
		if r == m {
			t.Errorf("%s is its own replica", m.Addr())
		}
	}
}
