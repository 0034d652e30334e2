// Package redistest starts the Redis servers of internal/localredis for a
// test, failing it when they do not start and stopping them at its end. It
// is imported by tests only, so the binary never links package testing.
package redistest

import (
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
)

// Start starts a server for the test tb, calls tb.Fatal if localredis.Start fails, and
// registers Stop with tb.Cleanup, reporting a failed Stop with tb.Error.
func Start(tb testing.TB, opts localredis.Options) *localredis.Server {
	tb.Helper()
	s, err := localredis.Start(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// StartCluster starts a cluster for the test tb, calls tb.Fatal if
// StartCluster fails, and registers Stop with tb.Cleanup, reporting a failed
// Stop with tb.Error. Like Start it does not skip when redis-server is
// missing: the failure to start is reported.
func StartCluster(tb testing.TB, opts localredis.ClusterOptions) *localredis.Cluster {
	tb.Helper()
	c, err := localredis.StartCluster(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return c
}
