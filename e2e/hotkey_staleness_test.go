package e2e

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// hotkeys.read_staleness, on two proxies over one Redis: proxy B sells one
// unit at a time while proxy A, which may answer GET from memory, is read
// and sells too. Every GET on A must show every unit B sold longer than
// the bound before the GET began, and every unit A sold before it; it can
// never show a sale not yet made. With 0, a GET shows every sale made.
func TestReadStaleness(t *testing.T) {
	const stock, bound = 100000, 150 * time.Millisecond
	for _, staleness := range []time.Duration{0, bound} {
		t.Run(staleness.String(), func(t *testing.T) {
			e := startEnv(t, func(c *config.Config) {
				c.Hotkeys.Keys = hkRules()
				c.Scripts = hkScripts(t)
				c.Hotkeys.ReadStaleness = config.Duration(staleness)
			})
			cfgB := *e.Cfg
			cfgB.Hotkeys.ReadStaleness = 0
			a, b := dialRaw(t, e.ProxyAddr()), dialRaw(t, startProxy(t, &cfgB).Addr().String())
			const key = "stock:stale"
			if r := a.do("SET", key, strconv.Itoa(stock)); r != "+OK\r\n" {
				t.Fatalf("SET: %q", r)
			}
			// done[i] is when B's i-th sale was answered; started counts the
			// ones sent.
			var mu sync.Mutex
			var done []time.Time
			started := 0
			stop := make(chan struct{})
			sold := make(chan struct{})
			go func() {
				defer close(sold)
				for {
					select {
					case <-stop:
						return
					default:
					}
					mu.Lock()
					started++
					mu.Unlock()
					if r := b.do("DECR", key); !strings.HasPrefix(r, ":") {
						t.Errorf("DECR on B: %q", r)
						return
					}
					mu.Lock()
					done = append(done, time.Now())
					mu.Unlock()
				}
			}()
			soldA := 0
			deadline := time.Now().Add(4 * bound)
			for i := 0; time.Now().Before(deadline); i++ {
				// Seldom: each of A's deducts refreshes what it knows of
				// one bucket, and B's sales there.
				if i%100 == 0 {
					a.do("DECR", key)
					soldA++
				}
				begin := time.Now()
				mu.Lock()
				seen := 0 // B's sales the GET must show
				for _, at := range done {
					if staleness == 0 || at.Before(begin.Add(-staleness)) {
						seen++
					}
				}
				mu.Unlock()
				r := a.do("GET", key)
				mu.Lock()
				made := started
				mu.Unlock()
				v, err := strconv.Atoi(strings.Split(r, "\r\n")[1])
				if err != nil {
					t.Fatalf("GET: %q", r)
				}
				if v > stock-soldA-seen {
					t.Fatalf("GET %d: shows %d, but A sold %d and B %d more than %v before", i, v, soldA, seen, staleness)
				}
				if v < stock-soldA-made {
					t.Fatalf("GET %d: shows %d, but only %d sales were made", i, v, soldA+made)
				}
				time.Sleep(time.Millisecond)
			}
			close(stop)
			<-sold
			if len(done) == 0 {
				t.Fatal("B sold nothing")
			}
		})
	}
}
