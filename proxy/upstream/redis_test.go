package upstream

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
)

// TestDoBlockingApart: Do's calls that hold a WAIT (rewrite.Request.Blocks)
// go on connections of their own, spread so that their WAITs block
// apart, while calls without one, on the shared connections, are
// answered meanwhile; in both modes.
func TestDoBlockingApart(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			be, release := holdOn(t, "WAIT")
			u := &Redis{}
			if mode == "standalone" {
				u.Pool = testPool(t, dialer{addr: be.Addr()}, 2, nil)
			} else {
				c := testCluster(t)
				c.serve(be.Addr())
				u.Cluster = c
				u.trips.New = func() any { r := NewRoundTrip(c, 0); return &r }
			}
			waits := func() int {
				n := 0
				for _, cmd := range be.Received() {
					if cmd[0] == "WAIT" {
						n++
					}
				}
				return n
			}

			const calls = 3
			replies := make(chan string, calls)
			for i := range calls {
				go func() {
					key := fmt.Appendf(nil, "k%d", i)
					got := u.Do([]rewrite.Request{
						{Key: key, Args: [][]byte{[]byte("SET"), key, []byte("v")}},
						{Key: key, Args: [][]byte{[]byte("WAIT"), []byte("1"), []byte("100")}, Follows: true, Blocks: true},
					})
					replies <- fmt.Sprintf("%q", got)
				}()
			}
			for deadline := time.Now().Add(10 * time.Second); waits() < calls; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d WAITs reached Redis at once: they block one another", waits(), calls)
				}
			}
			plain := u.Do([]rewrite.Request{{Key: []byte("p"), Args: [][]byte{[]byte("GET"), []byte("p")}}})
			if got := string(plain[0]); got != "$1\r\np\r\n" {
				t.Errorf("GET while the WAITs block: %q", got)
			}
			release()
			for range calls {
				if got := <-replies; !strings.Contains(got, `$3\r\n100\r\n`) || !strings.Contains(got, `$1\r\nv\r\n`) {
					t.Errorf("replies %s, want the SET's and the WAIT's", got)
				}
			}
		})
	}
}
