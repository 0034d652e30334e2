package e2e

// Bounded waits on the upstream: a stopped (SIGSTOP) Redis under load, in
// both modes; a script that keeps Redis busy while other clients go on;
// the timeouts of a client's own connection. Each test logs what it
// measured.

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
)

// The proxy's waits in these tests: short, so the tests are, and such
// that a call never takes callBound (the client's own hang bound).
const (
	stopReadTimeout = time.Second
	stopDialTimeout = 500 * time.Millisecond
	// stopErrorBound is how long a call may take while the node is
	// stopped: the read timeout, or the probe that follows it (a dial and
	// a PING within the dial timeout each), and a margin.
	stopErrorBound = stopReadTimeout + 2*stopDialTimeout + 500*time.Millisecond
)

func stopTimeouts(c *config.Config) {
	c.Upstream.ReadTimeout = config.Duration(stopReadTimeout)
	c.Upstream.DialTimeout = config.Duration(stopDialTimeout)
}

// sigstop stops the process pid until the returned func (also run when the
// test ends) continues it.
func sigstop(t *testing.T, pid int) (cont func()) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	cont = func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(cont)
	return cont
}

// stopAWhile stops the process pid from t0 to t1, three read timeouts:
// long enough for timeouts, the probe and the node found down.
func stopAWhile(t *testing.T, pid int) (t0, t1 time.Time) {
	t.Helper()
	cont := sigstop(t, pid)
	t0 = time.Now()
	time.Sleep(3 * stopReadTimeout)
	t1 = time.Now()
	cont()
	return t0, t1
}

// checkStopped checks what the clients of a stopped node saw from t0 to
// t1: every client an error within stopErrorBound of t0, no call longer
// than that, and only the proxy's timeout and node-down errors.
func checkStopped(t *testing.T, l *incrLoad, t0, t1 time.Time) {
	t.Helper()
	s := l.stats(t0, t1, 0)
	t.Logf("while stopped: %v", s)
	if s.maxLatency > stopErrorBound {
		t.Errorf("a call took %v (%s), want at most %v", s.maxLatency, s.slowest, stopErrorBound)
	}
	for kind := range s.kinds {
		if !strings.HasPrefix(kind, "ERR upstream timeout: no reply from ") &&
			!strings.HasPrefix(kind, "ERR upstream unavailable: node ") {
			t.Errorf("error %q, want the proxy's timeout or node-down error", kind)
		}
	}
	for _, c := range l.clients {
		c.mu.Lock()
		var first time.Time
		for _, ev := range c.events {
			if ev.err != "" && !ev.end.Before(t0) {
				first = ev.end
				break
			}
		}
		c.mu.Unlock()
		switch {
		case first.IsZero():
			t.Errorf("client %d got no error while its node was stopped", c.id)
		case first.Sub(t0) > stopErrorBound:
			t.Errorf("client %d got its first error %v after the stop, want within %v", c.id, first.Sub(t0), stopErrorBound)
		}
	}
}

// checkNoFailures reports the clients whose connection to the proxy failed
// or hung.
func checkNoFailures(t *testing.T, l *incrLoad) {
	t.Helper()
	for _, c := range l.clients {
		if c.fail != "" {
			t.Errorf("client %d: %s", c.id, c.fail)
		}
	}
}

// TestStoppedUpstream: Redis stops (SIGSTOP: connections accepted,
// nothing answered) under 20 clients. Each gets an error within the read
// timeout and a margin, none hangs; once Redis continues each succeeds
// again on the connection it has.
func TestStoppedUpstream(t *testing.T) {
	e := startEnv(t, stopTimeouts)
	load := startIncrLoad(t, e.ProxyAddr(), 20, "stopped", []int{0})
	load.waitAllOK(t, time.Now(), 10*time.Second)

	t0, t1 := stopAWhile(t, e.Redis.Pid())
	back := load.waitAllOK(t, t1, 10*time.Second)
	t.Logf("every client served again %v after SIGCONT", back.Sub(t1).Round(time.Millisecond))
	load.stop()
	checkStopped(t, load, t0, t1)
	checkNoFailures(t, load)
}

// TestClusterMasterStopped: one master of three stops under 20 clients of
// its keys while 6 clients use the other masters' keys. The stopped
// master's clients get errors within the read timeout and a margin, none
// hangs, and succeed again once it continues; the others see no error
// and no slow call meanwhile. The node timeout is long, so the cluster
// neither fails the master over nor stops serving.
func TestClusterMasterStopped(t *testing.T) {
	cl := redistest.StartCluster(t, localredis.ClusterOptions{Masters: 3, NodeTimeout: time.Minute})
	cfg := testConfig(t, config.ModeCluster, cl.Seeds(), stopTimeouts)
	addr := startProxy(t, cfg).Addr().String()
	stopped := startIncrLoad(t, addr, 20, "stopped", []int{0})
	others := startIncrLoad(t, addr, 6, "others", []int{1, 2})
	stopped.waitAllOK(t, time.Now(), 10*time.Second)
	others.waitAllOK(t, time.Now(), 10*time.Second)

	t0, t1 := stopAWhile(t, cl.Nodes()[0].Pid()) // master 0 serves range 0
	back := stopped.waitAllOK(t, t1, 10*time.Second)
	t.Logf("every client of the stopped master served again %v after SIGCONT", back.Sub(t1).Round(time.Millisecond))
	stopped.stop()
	others.stop()
	checkStopped(t, stopped, t0, t1)
	checkNoFailures(t, stopped)
	for _, r := range []int{1, 2} {
		s := others.stats(t0, t1, r)
		t.Logf("range %d while master 0 was stopped: %v", r, s)
		if s.errs > 0 || s.maxLatency > stopReadTimeout/2 {
			t.Errorf("range %d while master 0 was stopped: %d errors, slowest call %v (%s)", r, s.errs, s.maxLatency, s.slowest)
		}
	}
	checkNoFailures(t, others)
}

// TestBusyScript: a script loops forever on one client while 20 others,
// connected and served before it began (so some share its upstream
// connection), send a command of their own: each gets Redis's -BUSY at
// once, none waits behind the script, and SCRIPT KILL from one of them
// ends it. Redis answers BUSY once the script has run for
// busy-reply-threshold, lowered here to 100 ms. In cluster mode PING is
// answered by the proxy, so the clients GET a key of the script's node.
func TestBusyScript(t *testing.T) {
	const clients = 20
	const atOnce = 2 * time.Second // well under the read timeout, 20s
	run := func(t *testing.T, addr string, nodes []string, eval, probe []string) {
		for _, n := range nodes {
			if got := nodeDo(t, n, "CONFIG", "SET", "busy-reply-threshold", "100"); got != "+OK\r\n" {
				t.Fatalf("CONFIG SET busy-reply-threshold on %s: %q", n, got)
			}
		}
		cs := make([]*faultClient, clients)
		for i := range cs {
			c, err := dialFault(addr, callBound)
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			if _, err := c.do(probe...); err != nil {
				t.Fatalf("client %d before the script: %v", i, err)
			}
			cs[i] = c
		}
		busy := dialRaw(t, addr)
		busy.send([]byte(corpusCmd(eval...)))
		for _, n := range nodes[:1] {
			waitFor(t, func() bool { return strings.HasPrefix(nodeDo(t, n, probe...), "-BUSY") })
		}
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Go(func() {
				start := time.Now()
				got, err := c.do(probe...)
				switch took := time.Since(start); {
				case err != nil:
					t.Errorf("client %d: %v after %v", i, err, took)
				case !strings.HasPrefix(got, "-BUSY "):
					t.Errorf("client %d: %q, want Redis's -BUSY", i, got)
				case took > atOnce:
					t.Errorf("client %d waited %v for -BUSY", i, took)
				}
			})
		}
		wg.Wait()
		if got, err := cs[clients/2].do("SCRIPT", "KILL"); err != nil || got != "+OK\r\n" {
			t.Errorf("SCRIPT KILL: %q, %v", got, err)
		}
		if got := busy.readReplies(1); !strings.Contains(got, "Script killed by user") {
			t.Errorf("the script's reply: %q", got)
		}
		for i, c := range cs {
			if got, err := c.do(probe...); err != nil || strings.HasPrefix(got, "-") {
				t.Errorf("client %d after the kill: %q, %v", i, got, err)
			}
		}
	}
	for _, conns := range []int{1, 2} {
		t.Run(fmt.Sprintf("standalone conns_per_node=%d", conns), func(t *testing.T) {
			e := startEnv(t, func(c *config.Config) {
				c.Upstream.ConnsPerNode = conns
				c.Upstream.ReadTimeout = config.Duration(20 * time.Second)
			})
			run(t, e.ProxyAddr(), []string{e.Redis.Addr()}, []string{"EVAL", "while true do end", "0"}, []string{"PING"})
		})
	}
	t.Run("cluster", func(t *testing.T) {
		e := startClusterEnv(t, func(c *config.Config) { c.Upstream.ReadTimeout = config.Duration(20 * time.Second) })
		k := keyInRange("busy:", 0)
		run(t, e.ProxyAddr(), e.Cluster.Seeds(), []string{"EVAL", "while true do end", "1", k}, []string{"GET", k})
	})
}

// TestBusyScriptOtherDB: SCRIPT KILL, FUNCTION KILL and FUNCTION STATS
// from a client of db 9 reach a Redis that a script keeps busy, and every
// reply is the one
// Redis gives directly: a busy Redis refuses the SELECT that a new
// connection to db 9 begins with, so these must not need one (Redis's
// test suite runs in db 9). One shared connection per db, so the other
// client's is the script's. A script and a function, killed each by the
// wrong command first (Redis's -BUSY) and then by its own.
func TestBusyScriptOtherDB(t *testing.T) {
	e := startEnv(t, func(c *config.Config) {
		c.Upstream.ConnsPerNode = 1
		c.Upstream.ReadTimeout = config.Duration(20 * time.Second)
	})
	redisAddr := e.Redis.Addr()
	if got := nodeDo(t, redisAddr, "CONFIG", "SET", "busy-reply-threshold", "100"); got != "+OK\r\n" {
		t.Fatalf("CONFIG SET busy-reply-threshold: %q", got)
	}
	lib := "#!lua name=busylib\nredis.register_function('busy', function() while true do end end)"
	if got := nodeDo(t, redisAddr, "FUNCTION", "LOAD", "REPLACE", lib); got != "$7\r\nbusylib\r\n" {
		t.Fatalf("FUNCTION LOAD: %q", got)
	}
	// transcript runs the script on one client of db 9 and the kills on
	// another, at addr; it returns every reply, in order.
	transcript := func(t *testing.T, addr string, script []string, wrongKill, kill string) []string {
		c, err := dialFault(addr, callBound)
		if err != nil {
			t.Fatal(err)
		}
		defer c.close()
		var got []string
		do := func(args ...string) {
			r, err := c.do(args...)
			if err != nil {
				t.Fatalf("%q: %v", args, err)
			}
			got = append(got, r)
		}
		do("SELECT", "9")
		do("PING") // served before the script, on a connection of db 9
		busy := dialRaw(t, addr)
		got = append(got, busy.do("SELECT", "9"))
		busy.send([]byte(corpusCmd(script...)))
		waitFor(t, func() bool { return strings.HasPrefix(nodeDo(t, redisAddr, "PING"), "-BUSY") })
		do("PING")
		// FUNCTION STATS names the running function and for how long,
		// which differs run to run: cut there.
		do("FUNCTION", "STATS")
		got[len(got)-1], _, _ = strings.Cut(got[len(got)-1], "duration_ms")
		do(strings.Fields(wrongKill)...)
		do(strings.Fields(kill)...)
		got = append(got, busy.readReplies(1))
		do("PING")
		return got
	}
	for _, tc := range []struct {
		name            string
		script          []string
		wrongKill, kill string
	}{
		{"eval", []string{"EVAL", "while true do end", "0"}, "FUNCTION KILL", "SCRIPT KILL"},
		{"fcall", []string{"FCALL", "busy", "0"}, "SCRIPT KILL", "FUNCTION KILL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script := func(addr string) []string {
				return transcript(t, addr, tc.script, tc.wrongKill, tc.kill)
			}
			want, got := script(redisAddr), script(e.ProxyAddr())
			if !slices.Equal(got, want) {
				t.Errorf("through the proxy:\n%q\nRedis directly:\n%q", got, want)
			}
		})
	}
}

// TestBusyScriptBehind: requests another client wrote on a shared
// connection just before a script there turned busy (one connection per
// db, so they share it) get Redis's -BUSY, as on a connection of their
// own, not the read timeout; the script's own pipelined PING still waits
// for the script and gets +PONG after its "killed by user". Redis's
// suite does this in db 9 ("Timedout script does not cause a false dead
// client"), where the connection a rerun needs is refused its SELECT by
// the busy Redis; db 0 needs none.
func TestBusyScriptBehind(t *testing.T) {
	e := startEnv(t, func(c *config.Config) {
		c.Upstream.ConnsPerNode = 1
		c.Upstream.ReadTimeout = config.Duration(20 * time.Second)
	})
	if got := nodeDo(t, e.Redis.Addr(), "CONFIG", "SET", "busy-reply-threshold", "10"); got != "+OK\r\n" {
		t.Fatalf("CONFIG SET busy-reply-threshold: %q", got)
	}
	for _, db := range []string{"0", "9"} {
		t.Run("db"+db, func(t *testing.T) {
			other, err := dialFault(e.ProxyAddr(), callBound)
			if err != nil {
				t.Fatal(err)
			}
			defer other.close()
			if got, err := other.do("SELECT", db); err != nil || got != "+OK\r\n" {
				t.Fatalf("SELECT: %q, %v", got, err)
			}
			busy := dialRaw(t, e.ProxyAddr())
			if got := busy.do("SELECT", db); got != "+OK\r\n" {
				t.Fatalf("SELECT: %q", got)
			}
			busy.send([]byte(corpusCmd("EVAL", "while 1 do redis.call('ping') end", "0") + corpusCmd("PING")))
			// As the suite does: PING until an error comes, which must
			// be Redis's BUSY, not a timeout.
			var got string
			for range 50 {
				if got, err = other.do("PING"); err != nil || got != "+PONG\r\n" {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil || !strings.HasPrefix(got, "-BUSY ") {
				t.Fatalf("PING beside the busy script: %q, %v; want Redis's -BUSY", got, err)
			}
			if got, err := other.do("SCRIPT", "KILL"); err != nil || got != "+OK\r\n" {
				t.Fatalf("SCRIPT KILL: %q, %v", got, err)
			}
			if got := busy.readReplies(2); !strings.Contains(got, "Script killed by user") || !strings.HasSuffix(got, "\r\n+PONG\r\n") {
				t.Errorf("the script's client: %q, want the kill's error, then +PONG", got)
			}
			if got, err := other.do("PING"); err != nil || got != "+PONG\r\n" {
				t.Errorf("PING after the kill: %q, %v", got, err)
			}
		})
	}
}

// TestOwnConnTimeouts: on a client's own connection a request is timed by
// the read timeout, a blocking command by its own timeout on top of it
// (none for 0), a subscription not at all; on a timeout the client gets
// the error and is closed, as when its connection fails.
func TestOwnConnTimeouts(t *testing.T) {
	const readTimeout = 500 * time.Millisecond
	e := startEnv(t, func(c *config.Config) { c.Upstream.ReadTimeout = config.Duration(readTimeout) })
	direct := dialRaw(t, e.Redis.Addr())
	t.Run("BLPOP 0 waits past the read timeout", func(t *testing.T) {
		c := dialRaw(t, e.ProxyAddr())
		c.send([]byte(corpusCmd("BLPOP", "own:q", "0")))
		time.Sleep(3 * readTimeout)
		direct.do("RPUSH", "own:q", "x")
		if got := c.readReplies(1); got != "*2\r\n$5\r\nown:q\r\n$1\r\nx\r\n" {
			t.Errorf("BLPOP: %q", got)
		}
	})
	t.Run("a subscription is not timed", func(t *testing.T) {
		c := dialRaw(t, e.ProxyAddr())
		c.send([]byte(corpusCmd("SUBSCRIBE", "own:ch")))
		c.readReplies(1)
		time.Sleep(3 * readTimeout)
		direct.do("PUBLISH", "own:ch", "m")
		if got := c.readReplies(1); got != "*3\r\n$7\r\nmessage\r\n$6\r\nown:ch\r\n$1\r\nm\r\n" {
			t.Errorf("message: %q", got)
		}
	})
	// The rest stop Redis: each waits until the proxy serves again first.
	servesAgain := func(t *testing.T) {
		t.Helper()
		waitFor(t, func() bool { return dialRaw(t, e.ProxyAddr()).do("PING") == "+PONG\r\n" })
	}
	t.Run("EXEC on a stopped Redis", func(t *testing.T) {
		servesAgain(t)
		c := dialRaw(t, e.ProxyAddr())
		c.send([]byte(corpusCmd("MULTI")))
		c.send([]byte(corpusCmd("SET", "own:k", "v")))
		if got := c.readReplies(2); got != "+OK\r\n+QUEUED\r\n" {
			t.Fatalf("MULTI, SET: %q", got)
		}
		cont := sigstop(t, e.Redis.Pid())
		defer cont()
		start := time.Now()
		got := c.do("EXEC")
		took := time.Since(start)
		if want := "-ERR upstream timeout: no reply from " + e.Redis.Addr() + " within 500ms; the command may have run\r\n"; got != want {
			t.Errorf("EXEC: %q, want %q", got, want)
		}
		if took < readTimeout || took > readTimeout+time.Second {
			t.Errorf("EXEC answered after %v, want the read timeout, %v", took, readTimeout)
		}
		if rest := c.readUntilClose(); rest != "" {
			t.Errorf("after the timeout: %q, want the connection closed", rest)
		}
	})
	t.Run("BLPOP 1 on a stopped Redis gets its second", func(t *testing.T) {
		servesAgain(t)
		c := dialRaw(t, e.ProxyAddr())
		c.do("PING") // served, so the BLPOP alone meets the stop
		cont := sigstop(t, e.Redis.Pid())
		defer cont()
		start := time.Now()
		got := c.do("BLPOP", "own:q", "1")
		took := time.Since(start)
		if want := "-ERR upstream timeout: no reply from " + e.Redis.Addr() + " within 1.5s; the command may have run\r\n"; got != want {
			t.Errorf("BLPOP: %q, want %q", got, want)
		}
		if took < time.Second+readTimeout || took > time.Second+readTimeout+time.Second {
			t.Errorf("BLPOP answered after %v, want its timeout and the read timeout, %v", took, time.Second+readTimeout)
		}
		if rest := c.readUntilClose(); rest != "" {
			t.Errorf("after the timeout: %q, want the connection closed", rest)
		}
	})
	servesAgain(t)
}
