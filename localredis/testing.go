package localredis

import "testing"

// StartT starts a server for the test tb, calls tb.Fatal if Start fails, and
// registers Stop with tb.Cleanup, reporting a failed Stop with tb.Error.
func StartT(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s, err := Start(opts)
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

// StartClusterT starts a cluster for the test tb, calls tb.Fatal if
// StartCluster fails, and registers Stop with tb.Cleanup, reporting a failed
// Stop with tb.Error. Like StartT it does not skip when redis-server is
// missing: the failure to start is reported.
func StartClusterT(tb testing.TB, opts ClusterOptions) *Cluster {
	tb.Helper()
	c, err := StartCluster(opts)
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
