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
