package seckill

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/redis/go-redis/v9"
	"github.com/tidwall/redcon"
)

func TestRealRedisSellOut(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{})
	tests := []struct {
		name      string
		mode      Mode
		amount    int64
		wantSold  int64
		wantFinal int64
	}{
		{"script", ModeScript, 1, 5000, 0},
		{"decr", ModeDecr, 1, 5000, 0},
		{"script amount 3", ModeScript, 3, 4998, 2},
		{"decr amount 3", ModeDecr, 3, 4998, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Run(t.Context(), Options{
				Addr: rs.Addr(), Key: "stock:test", Stock: 5000, Clients: 50,
				Mode: tc.mode, Amount: tc.amount, Duration: time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
			checkClean(t, res)
			if res.Stopped != StopSoldOut {
				t.Errorf("stopped %q, want %q", res.Stopped, StopSoldOut)
			}
			if res.Sold != tc.wantSold || res.OK != tc.wantSold/tc.amount {
				t.Errorf("sold %d in %d deducts, want %d", res.Sold, res.OK, tc.wantSold)
			}
			if res.Start != 5000 || res.Final != tc.wantFinal || res.Unaccounted != 0 {
				t.Errorf("start %d final %d unaccounted %d, want 5000 %d 0", res.Start, res.Final, res.Unaccounted, tc.wantFinal)
			}
			// Every client stops only once it has been told sold out.
			if res.SoldOut < 50 {
				t.Errorf("sold-out replies %d, want >= 50", res.SoldOut)
			}
			wantGiveBacks := int64(0)
			if tc.mode == ModeDecr {
				wantGiveBacks = res.SoldOut
			}
			if res.GiveBacks != wantGiveBacks {
				t.Errorf("give-backs %d, want %d", res.GiveBacks, wantGiveBacks)
			}
			if res.Requests != res.OK+res.SoldOut || res.Latency.All.Count != res.Requests {
				t.Errorf("requests %d, latency count %d, want %d", res.Requests, res.Latency.All.Count, res.OK+res.SoldOut)
			}
			if res.SoldOutAt <= 0 || res.LastSaleAt <= 0 || res.LastSaleAt > res.Elapsed || res.UnitsPerSec <= 0 {
				t.Errorf("sold out at %v, last sale at %v, elapsed %v, units/s %v", res.SoldOutAt, res.LastSaleAt, res.Elapsed, res.UnitsPerSec)
			}
			if l := res.Latency.OK; l.P50 <= 0 || l.P50 > l.P99 || l.P99 > l.P999 || l.P999 > l.Max {
				t.Errorf("latency quantiles out of order: %+v", l)
			}
		})
	}
}

// checkClean fails t unless res reports a correct sale without errors.
func checkClean(t *testing.T, res Result) {
	t.Helper()
	if res.Errors != 0 || res.Oversell != 0 || res.FalseSoldOuts != 0 || res.FinalErr != "" {
		t.Errorf("errors %d %q, oversell %d, false sold-outs %d, final error %q",
			res.Errors, res.ErrorSamples, res.Oversell, res.FalseSoldOuts, res.FinalErr)
	}
	if v := res.Violations(); len(v) > 0 {
		t.Errorf("violations %q", v)
	}
	if s := res.String(); !strings.Contains(s, "ok: no oversell") {
		t.Errorf("table does not say ok:\n%s", s)
	}
}

func TestRealRedisNoSetupKeepsValue(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{})
	// Stock says 10 but the key holds 7: three units can never be sold.
	if _, err := Run(t.Context(), Options{Addr: rs.Addr(), Key: "k", Stock: 7, Clients: 1, Requests: 1}); err != nil {
		t.Fatal(err)
	}
	res, err := Run(t.Context(), Options{Addr: rs.Addr(), Key: "k", Stock: 10, Clients: 4, NoSetup: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Start != 6 || res.Sold != 6 || res.Final != 0 || res.Oversell != 0 {
		t.Errorf("start %d sold %d final %d oversell %d, want 6 6 0 0", res.Start, res.Sold, res.Final, res.Oversell)
	}
}

func TestRealRedisStops(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{})
	big := int64(1) << 40
	t.Run("requests", func(t *testing.T) {
		res, err := Run(t.Context(), Options{Addr: rs.Addr(), Key: "k", Stock: big, Clients: 8, Requests: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stopped != StopRequests || res.Requests != 1000 || res.Sold != 1000 || res.Final != big-1000 {
			t.Errorf("stopped %q after %d requests, sold %d, final %d", res.Stopped, res.Requests, res.Sold, res.Final)
		}
	})
	t.Run("duration", func(t *testing.T) {
		res, err := Run(t.Context(), Options{Addr: rs.Addr(), Key: "k", Stock: big, Clients: 8, Duration: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stopped != StopDuration || res.Elapsed < 200*time.Millisecond || res.Unaccounted != 0 {
			t.Errorf("stopped %q after %v, unaccounted %d", res.Stopped, res.Elapsed, res.Unaccounted)
		}
		// Not sold out, so the stock left is no violation.
		if v := res.Violations(); len(v) > 0 {
			t.Errorf("violations %q", v)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(100*time.Millisecond, cancel)
		res, err := Run(ctx, Options{Addr: rs.Addr(), Key: "k", Stock: big, Clients: 8, Mode: ModeDecr})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stopped != StopCanceled || res.FinalErr != "" || res.Unaccounted != 0 {
			t.Errorf("stopped %q, final error %q, unaccounted %d", res.Stopped, res.FinalErr, res.Unaccounted)
		}
	})
}

func TestSetupErrors(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{Password: "secret"})
	dead := freeAddr(t)
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"negative stock", Options{Stock: -1}, "invalid stock"},
		{"negative clients", Options{Clients: -1}, "invalid clients"},
		{"bad mode", Options{Mode: "incr"}, `invalid mode "incr"`},
		{"negative amount", Options{Amount: -2}, "invalid amount"},
		{"negative requests", Options{Requests: -1}, "invalid requests"},
		{"nothing listening", Options{Addr: dead, Stock: 1}, "SET stock:sku:1001 at " + dead},
		{"wrong password", Options{Addr: rs.Addr(), Password: "wrong", Stock: 1}, "setup"},
		{"no setup, not a number", Options{Addr: rs.Addr(), Password: "secret", Key: "word", NoSetup: true}, `"abc" is not an integer`},
	}
	c := rdbFor(t, rs.Addr(), "secret")
	if err := c.Set(t.Context(), "word", "abc", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(t.Context(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "seckill: ") {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	t.Run("password", func(t *testing.T) {
		res, err := Run(t.Context(), Options{Addr: rs.Addr(), Password: "secret", Key: "k", Stock: 100, Clients: 4})
		if err != nil {
			t.Fatal(err)
		}
		checkClean(t, res)
	})
}

func TestScriptsMatchProxyYAML(t *testing.T) {
	cfg, err := config.Load("../../proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string]config.Script{}
	for _, s := range cfg.Scripts {
		bodies[s.Body] = s
	}
	for _, body := range []string{DeductOneScript, DeductNScript} {
		s, ok := bodies[body]
		if !ok {
			t.Errorf("proxy.yaml declares no script %q", body)
			continue
		}
		if s.Soldout != ScriptSoldOut {
			t.Errorf("script %s: soldout %d in proxy.yaml, want %d", s.Name, s.Soldout, ScriptSoldOut)
		}
	}
}

// Fake servers answer the deducts as a broken server would, to prove each
// check catches what it claims to.

func TestOversellDetected(t *testing.T) {
	var calls atomic.Int64
	f := startFake(t, func(int) reply {
		if n := calls.Add(1); n <= 130 {
			return reply{n: 130 - n}
		}
		return reply{n: ScriptSoldOut}
	})
	res, err := Run(t.Context(), Options{Addr: f.addr(), Stock: 100, Clients: 8})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sold != 130 || res.Oversell != 30 || res.FalseSoldOuts != 0 || res.Errors != 0 {
		t.Errorf("sold %d oversell %d false sold-outs %d errors %d, want 130 30 0 0", res.Sold, res.Oversell, res.FalseSoldOuts, res.Errors)
	}
	wantViolation(t, res, "oversell: 30 units sold beyond the stock of 100")
}

func TestFalseSoldOutDetected(t *testing.T) {
	const (
		stock   = 200
		before  = 100 // successes before the false sold-out
		clients = 4
	)
	// After the false sold-out on connection gate, the fake holds every
	// other deduct until gate sends its next one, which it starts after it
	// saw the sold-out reply. So only the deducts other clients had already
	// sent (clients-1 at most) may start before that reply ended.
	var (
		mu        sync.Mutex
		cond      = sync.NewCond(&mu)
		calls     int
		successes int64
		gate      = -1
		open      bool
	)
	f := startFake(t, func(conn int) reply {
		mu.Lock()
		defer mu.Unlock()
		if gate >= 0 && !open {
			if conn == gate {
				open = true
				cond.Broadcast()
			}
			for !open {
				cond.Wait()
			}
		}
		calls++
		switch {
		case calls == before+1:
			gate = conn
			return reply{n: ScriptSoldOut}
		case successes < stock:
			successes++
			return reply{n: stock - successes}
		default:
			return reply{n: ScriptSoldOut}
		}
	})
	res, err := Run(t.Context(), Options{Addr: f.addr(), Stock: stock, Clients: clients})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sold != stock || res.Oversell != 0 || res.Errors != 0 {
		t.Errorf("sold %d oversell %d errors %d, want %d 0 0", res.Sold, res.Oversell, res.Errors, stock)
	}
	if lo, hi := int64(stock-before-(clients-1)), int64(stock-before); res.FalseSoldOuts < lo || res.FalseSoldOuts > hi {
		t.Errorf("false sold-outs %d, want %d..%d", res.FalseSoldOuts, lo, hi)
	}
	wantViolation(t, res, "false sold-out")
}

func TestStockLeftDetected(t *testing.T) {
	f := startFake(t, func(int) reply { return reply{n: ScriptSoldOut} })
	res, err := Run(t.Context(), Options{Addr: f.addr(), Stock: 50, Clients: 4})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stopped != StopSoldOut || res.Sold != 0 || res.StockLeft() != 50 {
		t.Errorf("stopped %q sold %d stock left %d, want sold out 0 50", res.Stopped, res.Sold, res.StockLeft())
	}
	wantViolation(t, res, "stock left: every client was told sold out while 50 units remained")
}

func TestErrorsCounted(t *testing.T) {
	t.Run("error replies", func(t *testing.T) {
		var calls atomic.Int64
		f := startFake(t, func(int) reply {
			switch n := calls.Add(1); {
			case n <= 3:
				return reply{err: "ERR boom " + strconv.FormatInt(n, 10)}
			case n <= 23:
				return reply{n: 23 - n}
			default:
				return reply{n: ScriptSoldOut}
			}
		})
		res, err := Run(t.Context(), Options{Addr: f.addr(), Stock: 20, Clients: 2})
		if err != nil {
			t.Fatal(err)
		}
		if res.Errors != 3 || len(res.ErrorSamples) != 3 || res.Sold != 20 || res.Requests != res.OK+res.SoldOut+3 {
			t.Errorf("errors %d %q, sold %d, requests %d", res.Errors, res.ErrorSamples, res.Sold, res.Requests)
		}
		for _, s := range res.ErrorSamples {
			if !strings.Contains(s, "ERR boom") {
				t.Errorf("error sample %q", s)
			}
		}
		if s := res.String(); !strings.Contains(s, "first errors:\n  client ") {
			t.Errorf("table lists no errors:\n%s", s)
		}
	})
	t.Run("unexpected reply", func(t *testing.T) {
		f := startFake(t, func(int) reply { return reply{n: -7} })
		res, err := Run(t.Context(), Options{Addr: f.addr(), Stock: 1, Clients: 1, Requests: 10})
		if err != nil {
			t.Fatal(err)
		}
		if res.Errors != 10 || len(res.ErrorSamples) != maxErrorSamples || !strings.Contains(res.ErrorSamples[0], "replied -7") {
			t.Errorf("errors %d %q", res.Errors, res.ErrorSamples)
		}
	})
	t.Run("dropped connection", func(t *testing.T) {
		// The server drops the connection instead of answering the 5th
		// deduct; the client must reconnect and finish the sale.
		var calls, sold atomic.Int64
		f := startFake(t, func(int) reply {
			if calls.Add(1) == 5 {
				return reply{drop: true}
			}
			if n := sold.Add(1); n <= 20 {
				return reply{n: 20 - n}
			}
			return reply{n: ScriptSoldOut}
		})
		res, err := Run(t.Context(), Options{Addr: f.addr(), Stock: 20, Clients: 2})
		if err != nil {
			t.Fatal(err)
		}
		if res.Errors != 1 || res.Sold != 20 || res.Stopped != StopSoldOut || res.Unaccounted != 0 {
			t.Errorf("errors %d %q, sold %d, stopped %q, unaccounted %d", res.Errors, res.ErrorSamples, res.Sold, res.Stopped, res.Unaccounted)
		}
	})
}

func wantViolation(t *testing.T, res Result, want string) {
	t.Helper()
	v := res.Violations()
	if len(v) != 1 || !strings.HasPrefix(v[0], want) {
		t.Errorf("violations %q, want one starting %q", v, want)
	}
	if s := res.String(); !strings.Contains(s, "FAIL "+want) || strings.Contains(s, "ok: no oversell") {
		t.Errorf("table does not report %q:\n%s", want, s)
	}
}

// reply is the fake's answer to one deduct: an integer, an error reply
// when err is set, or no answer and a closed connection when drop is set.
type reply struct {
	n    int64
	err  string
	drop bool
}

// fakeServer is a minimal RESP server: PING, SET and GET on one value, and
// EVAL/EVALSHA answered by deduct (called with a connection number, from
// that connection's goroutine). A successful deduct lowers the value by 1,
// so GET shows what the fake claims to have sold.
type fakeServer struct {
	ln     net.Listener
	deduct func(conn int) reply
	wg     sync.WaitGroup

	mu    sync.Mutex // guards value and conns
	value int64
	conns map[net.Conn]bool
}

func startFake(t *testing.T, deduct func(conn int) reply) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{ln: ln, deduct: deduct, conns: map[net.Conn]bool{}}
	f.wg.Go(f.accept)
	t.Cleanup(f.close)
	return f
}

func (f *fakeServer) addr() string { return f.ln.Addr().String() }

func (f *fakeServer) accept() {
	for id := 0; ; id++ {
		nc, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns[nc] = true
		f.mu.Unlock()
		f.wg.Go(func() { f.serve(id, nc) })
	}
}

func (f *fakeServer) serve(id int, nc net.Conn) {
	defer nc.Close()
	rd := resp.NewCommandReader(nc, 1<<20, 1<<20)
	var out []byte
	for {
		cmds, err := rd.ReadCommands()
		out = out[:0]
		for _, c := range cmds {
			var ok bool
			if out, ok = f.answer(out, id, c.Args); !ok {
				return
			}
		}
		if _, werr := nc.Write(out); werr != nil || err != nil {
			return
		}
	}
}

// answer appends the reply to args, or reports false to drop the connection.
func (f *fakeServer) answer(b []byte, id int, args [][]byte) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch name := strings.ToUpper(string(args[0])); {
	case name == "PING":
		return redcon.AppendString(b, "PONG"), true
	case name == "SET" && len(args) == 3:
		n, err := strconv.ParseInt(string(args[2]), 10, 64)
		if err != nil {
			return redcon.AppendError(b, "ERR fake: not an integer"), true
		}
		f.value = n
		return redcon.AppendString(b, "OK"), true
	case name == "GET":
		return redcon.AppendBulk(b, strconv.AppendInt(nil, f.value, 10)), true
	case name == "EVAL" || name == "EVALSHA":
		f.mu.Unlock() // deduct may block until another connection deducts
		r := f.deduct(id)
		f.mu.Lock()
		switch {
		case r.drop:
			return b, false
		case r.err != "":
			return redcon.AppendError(b, r.err), true
		}
		if r.n >= 0 {
			f.value--
		}
		return redcon.AppendInt(b, r.n), true
	default:
		return redcon.AppendError(b, "ERR unknown command '"+name+"'"), true
	}
}

func (f *fakeServer) close() {
	f.ln.Close()
	f.mu.Lock()
	for nc := range f.conns {
		nc.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func rdbFor(t *testing.T, addr, password string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Password: password, Protocol: 2})
	t.Cleanup(func() { c.Close() })
	return c
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
