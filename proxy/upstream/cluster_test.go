package upstream

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
)

// TestSlotMapFailureLoggedOnce: a seed that never answers CLUSTER SLOTS
// fails every refresh with a timeout whose text names a new local port
// each time; the failure is logged once, not once a refresh.
func TestSlotMapFailureLoggedOnce(t *testing.T) {
	be := redistest.StartBackend(t, stallOn("CLUSTER"))
	cfg := config.Default().Upstream
	cfg.Mode, cfg.Addrs = config.ModeCluster, []string{be.Addr()}
	cfg.DialTimeout = config.Duration(50 * time.Millisecond)
	var logs redistest.SyncBuffer
	c := newCluster(&cfg, nil, slog.New(slog.NewTextHandler(&logs, nil)), Metrics{}.orNowhere())
	t.Cleanup(c.close)
	eventually(t, "five refreshes", func() bool {
		c.Current() // no map yet: asks for a refresh now
		return be.Conns() >= 5
	})
	c.close()
	text := logs.String()
	if n := strings.Count(text, "cannot load the cluster slot map"); n != 1 {
		t.Fatalf("%d refreshes logged their failure %d times, want once:\n%s", be.Conns(), n, text)
	}
	if !strings.Contains(text, "i/o timeout") {
		t.Fatalf("the failure logged is not the timeout:\n%s", text)
	}
}
