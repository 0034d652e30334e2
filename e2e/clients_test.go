package e2e

// Real clients, unchanged, through the proxy: go-redis in process, and
// redis-py, ioredis, redis-cli and redis-benchmark as child processes. Each
// runs a session an application would: connect, PING, SET/GET, pipelines,
// MULTI/EXEC (with WATCH where the client has it), SCRIPT LOAD + EVALSHA
// (and the client's EVALSHA -> EVAL fallback), pub/sub across two
// connections, SELECT, binary values, and a server error surfacing as the
// client's error type. The programs are installed by CI; a missing one is
// a failure, not a skip. ioredis comes from e2e/clients/node, installed with
// `npm ci --prefix e2e/clients/node`.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// clientTimeout bounds each client program and each go-redis session.
const clientTimeout = 60 * time.Second

// proxyPort is the port of the proxy at addr as a string, for command
// lines.
func proxyPort(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// lookTool finds an installed client program; CI installs them all, so a
// missing one fails the test with what to install.
func lookTool(t *testing.T, name, install string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is needed by this test: %v (install %s)", name, err, install)
	}
	return path
}

// clientCmd is a client program to run for at most clientTimeout.
type clientCmd struct {
	*exec.Cmd
	ctx context.Context
	out *redistest.SyncBuffer
}

func newClientCmd(t *testing.T, name string, args ...string) *clientCmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	t.Cleanup(cancel)
	c := &clientCmd{Cmd: exec.CommandContext(ctx, name, args...), ctx: ctx, out: &redistest.SyncBuffer{}}
	c.Stdout, c.Stderr = c.out, c.out
	c.WaitDelay = 5 * time.Second
	return c
}

// describe says how the program ended, for failure messages.
func (c *clientCmd) describe(err error) string {
	if c.ctx.Err() != nil {
		err = fmt.Errorf("%w (killed after %v)", err, clientTimeout)
	}
	return fmt.Sprintf("%s: %v\n----- output -----\n%s\n------------------", c.String(), err, c.out.String())
}

// run runs the program and returns its output, failing the test with the
// whole output if it does not exit 0.
func (c *clientCmd) run(t *testing.T) string {
	t.Helper()
	if err := c.Run(); err != nil {
		t.Fatal(c.describe(err))
	}
	return c.out.String()
}

// redisCLI runs redis-cli against the proxy with args and returns its output.
func redisCLI(t *testing.T, port string, stdin []byte, args ...string) string {
	t.Helper()
	c := newClientCmd(t, "redis-cli", append([]string{"-h", "127.0.0.1", "-p", port}, args...)...)
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	return c.run(t)
}

// cmdRecorder is a go-redis hook that records every command sent,
// connection set-up included, with its error.
type cmdRecorder struct {
	mu   sync.Mutex
	seen []string
}

// record notes cmd and err, its error: the error a hook's next returns,
// since go-redis clears the error of a failed HELLO on the command.
func (r *cmdRecorder) record(cmd redis.Cmder, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := strings.TrimSuffix(fmt.Sprintln(cmd.Args()...), "\n")
	if err != nil && err != redis.Nil {
		s += " -> " + err.Error()
	}
	r.seen = append(r.seen, s)
}

// find returns the recorded commands that start with prefix.
func (r *cmdRecorder) find(prefix string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, s := range r.seen {
		if strings.HasPrefix(strings.ToLower(s), prefix) {
			out = append(out, s)
		}
	}
	return out
}

func (r *cmdRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *cmdRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		r.record(cmd, err)
		return err
	}
}

func (r *cmdRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			r.record(cmd, cmd.Err())
		}
		return err
	}
}

// binaryValue holds every byte value and RESP framing characters.
func binaryValue() []byte {
	b := make([]byte, 0, 300)
	for i := range 256 {
		b = append(b, byte(i))
	}
	return append(b, "\r\n$3\r\n*1\r\n\x00"...)
}

// checkRedisError checks that err is a Redis error reply (redis.Error)
// whose text starts with prefix.
func checkRedisError(t *testing.T, what string, err error, prefix string) {
	t.Helper()
	var rerr redis.Error
	switch {
	case err == nil:
		t.Errorf("%s: no error, want %s", what, prefix)
	case !errors.As(err, &rerr):
		t.Errorf("%s: %T %v is not a redis.Error", what, err, err)
	case !strings.HasPrefix(err.Error(), prefix):
		t.Errorf("%s: error %q, want one starting with %q", what, err, prefix)
	}
}

// mustOK fails the test if err is not nil.
func mustOK(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// equal reports a mismatch, comparing got and want as %#v prints them.
func equal(t *testing.T, what string, got, want any) {
	t.Helper()
	if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", want) {
		t.Errorf("%s = %#v, want %#v", what, got, want)
	}
}

// goRedisSession runs the common session on rdb, a client of the proxy;
// direct reads the upstream: a client of the standalone Redis in rdb's db,
// or a cluster client of the Redis Cluster, where only db 0 exists.
func goRedisSession(t *testing.T, rdb *redis.Client, direct redis.UniversalClient) {
	t.Helper()
	_, cluster := direct.(*redis.ClusterClient)
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	t.Run("ping", func(t *testing.T) {
		pong, err := rdb.Ping(ctx).Result()
		mustOK(t, "PING", err)
		equal(t, "PING", pong, "PONG")
		echo, err := rdb.Echo(ctx, "hello").Result()
		mustOK(t, "ECHO", err)
		equal(t, "ECHO", echo, "hello")
	})

	t.Run("set-get", func(t *testing.T) {
		mustOK(t, "SET", rdb.Set(ctx, "go:str", "value", 0).Err())
		v, err := rdb.Get(ctx, "go:str").Result()
		mustOK(t, "GET", err)
		equal(t, "GET", v, "value")
		ok, err := rdb.SetNX(ctx, "go:str", "other", 0).Result()
		mustOK(t, "SETNX", err)
		equal(t, "SETNX on an existing key", ok, false)
		mustOK(t, "SET EX", rdb.Set(ctx, "go:ttl", "v", 100*time.Second).Err())
		ttl, err := rdb.TTL(ctx, "go:ttl").Result()
		mustOK(t, "TTL", err)
		if ttl <= 0 || ttl > 100*time.Second {
			t.Errorf("TTL = %v, want (0, 100s]", ttl)
		}
		if err := rdb.Get(ctx, "go:missing").Err(); err != redis.Nil {
			t.Errorf("GET of a missing key: err %v, want redis.Nil", err)
		}
		// The upstream holds what the client wrote, in the client's db.
		v, err = direct.Get(ctx, "go:str").Result()
		mustOK(t, "GET on the upstream", err)
		equal(t, "GET on the upstream", v, "value")
	})

	t.Run("binary", func(t *testing.T) {
		key, val := "go:bin:\x00\xff\r\n", string(binaryValue())
		mustOK(t, "SET", rdb.Set(ctx, key, val, 0).Err())
		got, err := rdb.Get(ctx, key).Bytes()
		mustOK(t, "GET", err)
		if string(got) != val {
			t.Errorf("GET binary = %q, want %q", got, val)
		}
		big := make([]byte, 1<<20)
		for i := range big {
			big[i] = byte(i % 251)
		}
		mustOK(t, "SET 1 MiB", rdb.Set(ctx, "go:big", big, 0).Err())
		got, err = rdb.Get(ctx, "go:big").Bytes()
		mustOK(t, "GET 1 MiB", err)
		if !bytes.Equal(got, big) {
			t.Errorf("GET of a 1 MiB value: got %d bytes, not the ones set", len(got))
		}
	})

	t.Run("pipeline", func(t *testing.T) {
		var gets []*redis.StringCmd
		var incr *redis.IntCmd
		var lpush *redis.IntCmd
		cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range 100 {
				p.Set(ctx, fmt.Sprintf("go:p:%d", i), i, 0)
			}
			for i := range 100 {
				gets = append(gets, p.Get(ctx, fmt.Sprintf("go:p:%d", i)))
			}
			incr = p.Incr(ctx, "go:p:counter")
			lpush = p.LPush(ctx, "go:p:0", "x") // WRONGTYPE, reported in place
			return nil
		})
		checkRedisError(t, "pipeline", err, "WRONGTYPE")
		equal(t, "pipeline length", len(cmds), 202)
		for i, cmd := range cmds[:100] {
			if cmd.Err() != nil {
				t.Errorf("pipeline SET %d: %v", i, cmd.Err())
			}
		}
		for i, g := range gets {
			equal(t, fmt.Sprintf("pipeline GET %d", i), g.Val(), strconv.Itoa(i))
		}
		equal(t, "pipeline INCR", incr.Val(), int64(1))
		checkRedisError(t, "pipeline LPUSH on a string", lpush.Err(), "WRONGTYPE")
	})

	t.Run("multi-exec", func(t *testing.T) {
		var incr *redis.IntCmd
		var get *redis.StringCmd
		_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "go:tx:a", "1", 0)
			incr = p.Incr(ctx, "go:tx:a")
			get = p.Get(ctx, "go:tx:a")
			return nil
		})
		mustOK(t, "MULTI/EXEC", err)
		equal(t, "INCR in MULTI", incr.Val(), int64(2))
		equal(t, "GET in MULTI", get.Val(), "2")

		// An error inside EXEC is the command's; the others still run.
		var set *redis.StatusCmd
		var lpush *redis.IntCmd
		_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			set = p.Set(ctx, "go:tx:b", "str", 0)
			lpush = p.LPush(ctx, "go:tx:b", "x")
			return nil
		})
		checkRedisError(t, "EXEC with a WRONGTYPE command", err, "WRONGTYPE")
		checkRedisError(t, "LPUSH in MULTI", lpush.Err(), "WRONGTYPE")
		equal(t, "SET in MULTI", set.Val(), "OK")
	})

	t.Run("watch", func(t *testing.T) {
		mustOK(t, "SET", rdb.Set(ctx, "go:w", "10", 0).Err())
		addOne := func(meddle bool) error {
			return rdb.Watch(ctx, func(tx *redis.Tx) error {
				n, err := tx.Get(ctx, "go:w").Int()
				if err != nil {
					return err
				}
				if meddle { // another connection writes the watched key
					if err := rdb.Set(ctx, "go:w", "100", 0).Err(); err != nil {
						return err
					}
				}
				_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
					p.Set(ctx, "go:w", n+1, 0)
					return nil
				})
				return err
			}, "go:w")
		}
		if err := addOne(true); err != redis.TxFailedErr {
			t.Errorf("EXEC after the watched key changed: err %v, want redis.TxFailedErr", err)
		}
		mustOK(t, "WATCH/EXEC", addOne(false))
		v, err := rdb.Get(ctx, "go:w").Result()
		mustOK(t, "GET", err)
		equal(t, "value after WATCH", v, "101")
	})

	t.Run("scripts", func(t *testing.T) {
		add := redis.NewScript("return redis.call('INCRBY', KEYS[1], ARGV[1]) + 0")
		step := func(what string, by, want int64) {
			t.Helper()
			n, err := add.Run(ctx, rdb, []string{"go:sc"}, by).Int64()
			mustOK(t, what, err)
			equal(t, what, n, want)
		}
		step("Script.Run, not loaded (EVALSHA -> EVAL)", 3, 3)
		exists, err := add.Exists(ctx, rdb).Result()
		mustOK(t, "SCRIPT EXISTS", err)
		// Over a cluster the EVAL reached go:sc's master only, but the
		// proxy can load it on any master, so it exists, as on one Redis.
		equal(t, "SCRIPT EXISTS after EVAL", exists, []bool{true})
		step("Script.Run, loaded (EVALSHA)", 4, 7)
		mustOK(t, "SCRIPT FLUSH", rdb.ScriptFlush(ctx).Err())
		step("Script.Run after SCRIPT FLUSH", 1, 8)

		sha, err := rdb.ScriptLoad(ctx, "return {KEYS[1], ARGV[1]}").Result()
		mustOK(t, "SCRIPT LOAD", err)
		pair, err := rdb.EvalSha(ctx, sha, []string{"k"}, "a").StringSlice()
		mustOK(t, "EVALSHA", err)
		equal(t, "EVALSHA", pair, []string{"k", "a"})
		checkRedisError(t, "EVALSHA of an unknown script",
			rdb.EvalSha(ctx, strings.Repeat("0", 40), nil).Err(), "NOSCRIPT")

		cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.EvalSha(ctx, sha, []string{"k1"}, "a1")
			p.EvalSha(ctx, add.Hash(), []string{"go:sc"}, 2)
			return nil
		})
		mustOK(t, "EVALSHA in a pipeline", err)
		equal(t, "EVALSHA in a pipeline", cmds[0].(*redis.Cmd).Val(), []any{"k1", "a1"})
		equal(t, "EVALSHA in a pipeline", cmds[1].(*redis.Cmd).Val(), int64(10))

		mustOK(t, "SET", rdb.Set(ctx, "go:str:2", "s", 0).Err())
		err = rdb.Eval(ctx, "return redis.call('LPUSH', KEYS[1], 'x')", []string{"go:str:2"}).Err()
		checkRedisError(t, "script error", err, "WRONGTYPE")
	})

	t.Run("errors", func(t *testing.T) {
		mustOK(t, "SET", rdb.Set(ctx, "go:e", "string", 0).Err())
		checkRedisError(t, "LPUSH on a string", rdb.LPush(ctx, "go:e", "x").Err(), "WRONGTYPE")
		checkRedisError(t, "unknown command", rdb.Do(ctx, "nosuchcommand", "x").Err(), "ERR unknown command")
		mustOK(t, "PING after errors", rdb.Ping(ctx).Err())
	})

	t.Run("client-list-kill", func(t *testing.T) {
		goRedisClientList(t, ctx, rdb)
	})

	t.Run("pubsub", func(t *testing.T) {
		ps := rdb.Subscribe(ctx, "go:chan")
		defer ps.Close()
		receive := func(what string) any {
			t.Helper()
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			m, err := ps.Receive(rctx)
			mustOK(t, what, err)
			return m
		}
		equal(t, "SUBSCRIBE", receive("SUBSCRIBE"), &redis.Subscription{Kind: "subscribe", Channel: "go:chan", Count: 1})
		mustOK(t, "PSUBSCRIBE", ps.PSubscribe(ctx, "go:pat:*"))
		equal(t, "PSUBSCRIBE", receive("PSUBSCRIBE"), &redis.Subscription{Kind: "psubscribe", Channel: "go:pat:*", Count: 2})

		payload := string(binaryValue())
		n, err := rdb.Publish(ctx, "go:chan", payload).Result()
		mustOK(t, "PUBLISH", err)
		equal(t, "PUBLISH receivers", n, int64(1))
		m, ok := receive("message").(*redis.Message)
		if !ok || m.Channel != "go:chan" || m.Payload != payload {
			t.Errorf("message = %#v, want go:chan with the binary payload", m)
		}
		n, err = rdb.Publish(ctx, "go:pat:x", "p").Result()
		mustOK(t, "PUBLISH", err)
		equal(t, "PUBLISH receivers", n, int64(1))
		equal(t, "pmessage", receive("pmessage"), &redis.Message{Channel: "go:pat:x", Pattern: "go:pat:*", Payload: "p"})

		mustOK(t, "PING in subscribed mode", ps.Ping(ctx))
		pong := &redis.Pong{} // RESP2: Redis's ["pong", ""]
		if rdb.Options().Protocol != 2 {
			pong.Payload = "PONG" // RESP3: +PONG, as to a client not subscribed
		}
		equal(t, "PING in subscribed mode", receive("PONG"), pong)
		mustOK(t, "UNSUBSCRIBE", ps.Unsubscribe(ctx, "go:chan"))
		equal(t, "UNSUBSCRIBE", receive("UNSUBSCRIBE"), &redis.Subscription{Kind: "unsubscribe", Channel: "go:chan", Count: 1})
		mustOK(t, "PUNSUBSCRIBE", ps.PUnsubscribe(ctx, "go:pat:*"))
		equal(t, "PUNSUBSCRIBE", receive("PUNSUBSCRIBE"), &redis.Subscription{Kind: "punsubscribe", Channel: "go:pat:*", Count: 0})
		n, err = rdb.Publish(ctx, "go:chan", "nobody").Result()
		mustOK(t, "PUBLISH", err)
		equal(t, "PUBLISH receivers after UNSUBSCRIBE", n, int64(0))
	})

	t.Run("select", func(t *testing.T) {
		// Ephemeral: Close drops the connection, which is in db 7 now,
		// instead of handing it to the pool.
		conn := rdb.EphemeralConn()
		defer conn.Close()
		if cluster {
			checkRedisError(t, "SELECT 7 over a cluster", conn.Select(ctx, 7).Err(), "ERR SELECT is not allowed in cluster mode")
			mustOK(t, "SELECT 0 over a cluster", conn.Select(ctx, 0).Err())
			mustOK(t, "PING after SELECT", conn.Ping(ctx).Err())
			return
		}
		mustOK(t, "SELECT 7", conn.Select(ctx, 7).Err())
		mustOK(t, "SET in db 7", conn.Set(ctx, "go:db", "seven", 0).Err())
		v, err := conn.Get(ctx, "go:db").Result()
		mustOK(t, "GET in db 7", err)
		equal(t, "GET in db 7", v, "seven")
		if err := rdb.Get(ctx, "go:db").Err(); err != redis.Nil {
			t.Errorf("GET of db 7's key in db %d: err %v, want redis.Nil", rdb.Options().DB, err)
		}
		db7 := redis.NewClient(&redis.Options{Addr: direct.(*redis.Client).Options().Addr, DB: 7})
		defer db7.Close()
		v, err = db7.Get(ctx, "go:db").Result()
		mustOK(t, "GET in the upstream's db 7", err)
		equal(t, "GET in the upstream's db 7", v, "seven")
	})
}

// goRedisClientList: CLIENT SETNAME shows in CLIENT LIST with the id
// CLIENT ID gives, and CLIENT KILL ID and ADDR close a client of the
// proxy, which go-redis then replaces.
func goRedisClientList(t *testing.T, ctx context.Context, rdb *redis.Client) {
	conn := rdb.Conn()
	defer conn.Close()
	mustOK(t, "CLIENT SETNAME", conn.ClientSetName(ctx, "go-listed").Err())
	id, err := conn.ClientID(ctx).Result()
	mustOK(t, "CLIENT ID", err)
	list, err := rdb.ClientList(ctx).Result()
	mustOK(t, "CLIENT LIST", err)
	var line string
	for l := range strings.SplitSeq(list, "\n") {
		if strings.Contains(l, " name=go-listed ") {
			line = l
		}
	}
	if !strings.HasPrefix(line, fmt.Sprintf("id=%d addr=", id)) || !strings.Contains(line, " cmd=client|id user=default ") {
		t.Fatalf("CLIENT LIST line of the named client: %q; want id=%d, cmd=client|id (list %q)", line, id, list)
	}
	info, err := conn.ClientInfo(ctx).Result()
	mustOK(t, "CLIENT INFO", err)
	equal(t, "CLIENT INFO id", info.ID, id)
	equal(t, "CLIENT INFO name", info.Name, "go-listed")

	killed, err := rdb.ClientKillByFilter(ctx, "ID", strconv.FormatInt(id, 10)).Result()
	mustOK(t, "CLIENT KILL ID", err)
	equal(t, "CLIENT KILL ID", killed, int64(1))
	if err := conn.Ping(ctx).Err(); err == nil {
		t.Errorf("PING on the killed connection succeeded")
	}
	victim := rdb.Conn()
	defer victim.Close()
	mustOK(t, "CLIENT SETNAME", victim.ClientSetName(ctx, "go-victim").Err())
	vinfo, err := victim.ClientInfo(ctx).Result()
	mustOK(t, "CLIENT INFO", err)
	mustOK(t, "CLIENT KILL addr", rdb.ClientKill(ctx, vinfo.Addr).Err())
	if err := rdb.ClientKill(ctx, vinfo.Addr).Err(); err == nil || err.Error() != "ERR No such client" {
		t.Errorf("CLIENT KILL of a closed address: %v, want ERR No such client", err)
	}
}

func TestClientsGoRedis(t *testing.T) {
	t.Run("default-options", func(t *testing.T) {
		// HELLO 3 and CLIENT SETINFO at connect: the session runs in RESP3.
		e := startEnv(t, nil)
		rec := &cmdRecorder{}
		rdb := redis.NewClient(&redis.Options{Addr: e.ProxyAddr()})
		rdb.AddHook(rec)
		t.Cleanup(func() { rdb.Close() })
		direct := redis.NewClient(&redis.Options{Addr: e.Redis.Addr()})
		t.Cleanup(func() { direct.Close() })

		goRedisSession(t, rdb, direct)

		hello := rec.find("hello")
		if len(hello) == 0 || strings.Contains(hello[0], "->") {
			t.Fatalf("go-redis's HELLO at connect: %q; want it accepted; commands seen: %q", hello, rec.find(""))
		}
		setinfo := rec.find("client setinfo")
		t.Logf("connect-time commands: %q, %q", hello[0], setinfo[:min(2, len(setinfo))])
	})

	t.Run("acl-users", func(t *testing.T) {
		// Redis checks the logins: the common session as the default
		// user, then a limited user's.
		e := startEnv(t, redisAuth)
		addACLUsers(t, e.Redis.Addr())
		rdb := redis.NewClient(&redis.Options{Addr: e.ProxyAddr()})
		t.Cleanup(func() { rdb.Close() })
		direct := redis.NewClient(&redis.Options{Addr: e.Redis.Addr()})
		t.Cleanup(func() { direct.Close() })
		goRedisSession(t, rdb, direct)
		goRedisACLSession(t, e.ProxyAddr())
	})

	t.Run("resp2-name-db2-pool", func(t *testing.T) {
		e := startEnv(t, nil)
		const name = "hkp-e2e-go"
		rdb := redis.NewClient(&redis.Options{
			Addr:       e.ProxyAddr(),
			Protocol:   2,
			ClientName: name,
			DB:         2,
			PoolSize:   20,
		})
		t.Cleanup(func() { rdb.Close() })
		direct := redis.NewClient(&redis.Options{Addr: e.Redis.Addr(), DB: 2})
		t.Cleanup(func() { direct.Close() })

		goRedisSession(t, rdb, direct)

		ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
		defer cancel()
		conn := rdb.Conn()
		got, err := conn.ClientGetName(ctx).Result()
		conn.Close()
		if err != nil || got != name {
			t.Errorf("CLIENT GETNAME = %q, %v; want %q", got, err, name)
		}

		const workers, n = concWorkers, concIncrs
		concurrentIncrs(t, ctx, rdb)
		keys := make([]string, workers)
		for w := range keys {
			keys[w] = fmt.Sprintf("go:conc:%d", w)
		}
		for _, c := range []struct {
			who string
			rdb *redis.Client
		}{{"proxy", rdb}, {"upstream db 2", direct}} {
			vals, err := c.rdb.MGet(ctx, keys...).Result()
			if err != nil {
				t.Fatalf("MGET via %s: %v", c.who, err)
			}
			for w, v := range vals {
				if v != strconv.Itoa(n) {
					t.Errorf("%s via %s = %v, want %d", keys[w], c.who, v, n)
				}
			}
		}
		if st := rdb.PoolStats(); st.TotalConns > 20 || st.Timeouts > 0 {
			t.Errorf("pool stats %+v: want at most 20 connections and no timeouts", *st)
		}
	})
}

func TestClientsRedisPy(t *testing.T) {
	python := lookPython(t)
	t.Run("proxy-password", func(t *testing.T) {
		e := startEnv(t, nil)
		runRedisPy(t, python, proxyPort(t, e.ProxyAddr()))
	})
	t.Run("acl-users", func(t *testing.T) {
		e := startEnv(t, redisAuth)
		runRedisPy(t, python, proxyPort(t, e.ProxyAddr()), "acl")
	})
}

// lookPython finds the Python that has redis-py.
func lookPython(t *testing.T) string {
	t.Helper()
	python := "/usr/bin/python3" // Debian's, with python3-redis
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%v (install python3 and python3-redis)", err)
	}
	return python
}

// runRedisPy runs clients/redis_py_session.py with args and checks that it
// says OK.
func runRedisPy(t *testing.T, python string, args ...string) {
	t.Helper()
	c := newClientCmd(t, python, append([]string{filepath.Join("clients", "redis_py_session.py")}, args...)...)
	out := c.run(t)
	if !strings.Contains(out, "\nOK\n") {
		t.Fatal(c.describe(errors.New("exited 0 without printing OK")))
	}
}

func TestClientsIORedis(t *testing.T) {
	node, dir := lookIORedis(t)
	for _, proto := range [][]string{nil, {"resp3"}} {
		name := "resp2"
		if proto != nil {
			name = "resp3"
		}
		t.Run(name+"/proxy-password", func(t *testing.T) {
			e := startEnv(t, nil)
			runIORedis(t, node, dir, append([]string{proxyPort(t, e.ProxyAddr())}, proto...)...)
		})
		t.Run(name+"/acl-users", func(t *testing.T) {
			e := startEnv(t, redisAuth)
			runIORedis(t, node, dir, append([]string{proxyPort(t, e.ProxyAddr()), "acl"}, proto...)...)
		})
	}
}

// lookIORedis finds node and the dir where ioredis is installed.
func lookIORedis(t *testing.T) (node, dir string) {
	t.Helper()
	dir = filepath.Join("clients", "node")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "ioredis", "package.json")); err != nil {
		t.Fatalf("ioredis is not installed in e2e/clients/node (%v): run `npm ci --prefix e2e/clients/node` from the repository root", err)
	}
	return lookTool(t, "node", "Node.js 18 or later"), dir
}

// runIORedis runs clients/node/session.js in dir with args and checks that
// it says OK.
func runIORedis(t *testing.T, node, dir string, args ...string) {
	t.Helper()
	c := newClientCmd(t, node, append([]string{"session.js"}, args...)...)
	c.Dir = dir
	out := c.run(t)
	if !strings.Contains(out, "\nOK\n") {
		t.Fatal(c.describe(errors.New("exited 0 without printing OK")))
	}
}

func TestClientsRedisCLI(t *testing.T) {
	lookTool(t, "redis-cli", "redis-tools")
	e := startEnv(t, nil)
	port := proxyPort(t, e.ProxyAddr())
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	direct := func(db int) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: e.Redis.Addr(), DB: db})
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("commands", func(t *testing.T) {
		redisCLICommands(t, port, direct(0))
	})

	t.Run("pipe", func(t *testing.T) {
		redisCLIPipe(t, port, direct(0))
	})

	t.Run("db", func(t *testing.T) {
		wantOutput(t, "-n 3 set", redisCLI(t, port, nil, "-n", "3", "set", "cli:db", "three"), "OK\n")
		wantOutput(t, "-n 3 get", redisCLI(t, port, nil, "-n", "3", "get", "cli:db"), "three\n")
		wantOutput(t, "get in db 0", redisCLI(t, port, nil, "get", "cli:db"), "\n")
		if v, err := direct(3).Get(ctx, "cli:db").Result(); err != nil || v != "three" {
			t.Errorf("upstream db 3 cli:db = %q, %v; want three", v, err)
		}
	})

	t.Run("eval", func(t *testing.T) {
		redisCLIEval(t, port)
	})

	t.Run("interactive", func(t *testing.T) {
		redisCLIInteractive(t, port)
	})
}

// wantOutput reports a client program's output that is not want.
func wantOutput(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s: output %q, want %q", what, got, want)
	}
}

// redisCLICommands runs one-shot redis-cli commands against the proxy at
// port; direct reads what they wrote from the upstream.
func redisCLICommands(t *testing.T, port string, direct redis.Cmdable) {
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	wantOutput(t, "set", redisCLI(t, port, nil, "set", "cli:k", "v"), "OK\n")
	wantOutput(t, "get", redisCLI(t, port, nil, "get", "cli:k"), "v\n")
	wantOutput(t, "get missing", redisCLI(t, port, nil, "get", "cli:missing"), "\n")
	wantOutput(t, "lpush on a string", redisCLI(t, port, nil, "lpush", "cli:k", "x"),
		"WRONGTYPE Operation against a key holding the wrong kind of value\n\n")
	wantOutput(t, "-r 5 incr", redisCLI(t, port, nil, "-r", "5", "incr", "cli:ctr"), "1\n2\n3\n4\n5\n")

	bin := binaryValue()
	wantOutput(t, "-x set", redisCLI(t, port, bin, "-x", "set", "cli:bin"), "OK\n")
	got, err := direct.Get(ctx, "cli:bin").Bytes()
	if err != nil || !bytes.Equal(got, bin) {
		t.Errorf("value set with -x: %q, %v; want %q", got, err, bin)
	}

	// Commands read from stdin, one per line, as `redis-cli < file`.
	wantOutput(t, "commands on stdin", redisCLI(t, port, []byte("multi\nset cli:tx 1\nincr cli:tx\nexec\nget cli:tx\n")),
		"OK\nQUEUED\nQUEUED\nOK\n2\n2\n")

	keys := strings.Fields(redisCLI(t, port, nil, "--scan", "--pattern", "cli:*"))
	slices.Sort(keys)
	wantOutput(t, "--scan", strings.Join(keys, " "), "cli:bin cli:ctr cli:k cli:tx")
}

// redisCLIPipe sends 1000 commands through redis-cli --pipe to the proxy
// at port; direct reads what they wrote from the upstream.
func redisCLIPipe(t *testing.T, port string, direct redis.Cmdable) {
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	var in []byte
	for i := range 1000 {
		switch i % 3 {
		case 0:
			in = resp.AppendCommand(in, []byte("SET"), []byte(fmt.Sprintf("cli:pipe:%d", i)), append(binaryValue(), byte(i)))
		case 1:
			in = resp.AppendCommand(in, []byte("INCR"), []byte("cli:pipe:ctr"))
		default:
			in = resp.AppendCommand(in, []byte("RPUSH"), []byte("cli:pipe:list"), []byte(strconv.Itoa(i)))
		}
	}
	out := redisCLI(t, port, in, "--pipe")
	if !strings.Contains(out, "errors: 0, replies: 1000") {
		t.Errorf("--pipe summary: want \"errors: 0, replies: 1000\" in\n%s", out)
	}
	if n, err := direct.Get(ctx, "cli:pipe:ctr").Int(); err != nil || n != 333 {
		t.Errorf("cli:pipe:ctr = %d, %v; want 333", n, err)
	}
	if n, err := direct.LLen(ctx, "cli:pipe:list").Result(); err != nil || n != 333 {
		t.Errorf("LLEN cli:pipe:list = %d, %v; want 333", n, err)
	}
	if v, err := direct.Get(ctx, "cli:pipe:999").Bytes(); err != nil || !bytes.Equal(v, append(binaryValue(), byte(999%256))) {
		t.Errorf("cli:pipe:999 = %q, %v", v, err)
	}
}

// redisCLIEval runs scripts with redis-cli --eval against the proxy at port.
func redisCLIEval(t *testing.T, port string) {
	dir := t.TempDir()
	incr := filepath.Join(dir, "incrby.lua")
	lpush := filepath.Join(dir, "lpush.lua")
	if err := os.WriteFile(incr, []byte("return redis.call('INCRBY', KEYS[1], ARGV[1])\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lpush, []byte("return redis.call('LPUSH', KEYS[1], ARGV[1])\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantOutput(t, "--eval", redisCLI(t, port, nil, "--eval", incr, "cli:ev", ",", "5"), "5\n")
	wantOutput(t, "--eval again", redisCLI(t, port, nil, "--eval", incr, "cli:ev", ",", "2"), "7\n")
	redisCLI(t, port, nil, "set", "cli:evs", "s")
	if out := redisCLI(t, port, nil, "--eval", lpush, "cli:evs", ",", "x"); !strings.HasPrefix(out, "WRONGTYPE") {
		t.Errorf("--eval of a failing script: output %q, want WRONGTYPE...", out)
	}
}

// redisCLIInteractive types a session into redis-cli under a pseudo-terminal
// made by util-linux script(1), so that redis-cli runs interactively: it
// sends COMMAND DOCS for its hints, and uses linenoise. A line is typed only
// once the prompt is shown, since linenoise discards input typed before it
// switches the terminal to raw mode.
func redisCLIInteractive(t *testing.T, port string) {
	lookTool(t, "script", "util-linux")
	// A pty made by script has no size; linenoise would then ask the
	// terminal for its cursor position and wait for the answer.
	c := newClientCmd(t, "script", "-qec", "stty cols 200 rows 50; exec redis-cli -h 127.0.0.1 -p "+port, "/dev/null")
	stdin, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(c.describe(err))
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	waited := false
	defer func() {
		stdin.Close()
		if !waited {
			c.Process.Kill()
			<-exited
		}
	}()

	// waitFor polls the output until it holds want after offset from,
	// and returns the offset just past it.
	waitFor := func(from int, want string) int {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			out := c.out.String()
			if i := strings.Index(out[from:], want); i >= 0 {
				return from + i + len(want)
			}
			if time.Now().After(deadline) {
				t.Fatal(c.describe(fmt.Errorf("no %q after 10s", want)))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	prompt := "127.0.0.1:" + port + "> "
	at := waitFor(0, prompt)
	steps := []struct{ line, reply, prompt string }{
		{"ping", "\r\nPONG\r\n", prompt},
		{"set a b", "\r\nOK\r\n", prompt},
		{"get a", "\r\n\"b\"\r\n", prompt},
		{"select 2", "\r\nOK\r\n", "127.0.0.1:" + port + "[2]> "},
		{"get a", "\r\n(nil)\r\n", "127.0.0.1:" + port + "[2]> "},
	}
	for _, s := range steps {
		if _, err := io.WriteString(stdin, s.line+"\r"); err != nil {
			t.Fatal(c.describe(err))
		}
		at = waitFor(at, s.reply)
		at = waitFor(at, s.prompt)
	}
	if _, err := io.WriteString(stdin, "quit\r"); err != nil {
		t.Fatal(c.describe(err))
	}
	select {
	case err := <-exited:
		waited = true
		if err != nil {
			t.Fatal(c.describe(err))
		}
	case <-time.After(10 * time.Second):
		t.Fatal(c.describe(errors.New("redis-cli still running 10s after quit")))
	}
	if out := c.out.String(); strings.Contains(out, "ERR") || strings.Contains(strings.ToLower(out), "error") {
		t.Errorf("interactive redis-cli printed an error:\n%s", out)
	}
}

func TestClientsRedisBenchmark(t *testing.T) {
	lookTool(t, "redis-benchmark", "redis-tools")
	e := startEnv(t, nil)
	runRedisBenchmark(t, proxyPort(t, e.ProxyAddr()),
		[]string{"SET", "GET", "INCR", "LPUSH", "LPOP", "SADD", "HSET", "MSET (10 keys)"},
		"-q", "-n", "20000", "-c", "20", "-t", "set,get,incr,lpush,lpop,sadd,hset,mset", "-P", "4")
}

// runRedisBenchmark runs redis-benchmark with args against the proxy at
// port and checks that it printed no error and a result for each test.
func runRedisBenchmark(t *testing.T, port string, tests []string, args ...string) {
	t.Helper()
	c := newClientCmd(t, "redis-benchmark", append([]string{"-h", "127.0.0.1", "-p", port}, args...)...)
	out := c.run(t)
	if strings.Contains(out, "ERR") || strings.Contains(strings.ToLower(out), "error") ||
		strings.Contains(out, "Could not fetch") {
		t.Errorf("redis-benchmark printed an error:\n%s", out)
	}
	// -q rewrites a progress line with \r, then ends each test with
	// "NAME: N requests per second, ...".
	done := map[string]bool{}
	re := regexp.MustCompile(`^([A-Z]+(?: \(10 keys\))?): [0-9.]+ requests per second`)
	for _, line := range strings.FieldsFunc(out, func(r rune) bool { return r == '\r' || r == '\n' }) {
		if m := re.FindStringSubmatch(line); m != nil {
			done[m[1]] = true
		}
	}
	for _, name := range tests {
		if !done[name] {
			t.Errorf("no requests-per-second line for %s in\n%s", name, out)
		}
	}
}

// The go-redis concurrency check: concWorkers goroutines share the
// client's connections; each INCRs its own key go:conc:<w> concIncrs
// times, every tenth time inside MULTI/EXEC.
const concWorkers, concIncrs = 50, 200

func concurrentIncrs(t *testing.T, ctx context.Context, rdb *redis.Client) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, concWorkers)
	for w := range concWorkers {
		wg.Go(func() {
			key := fmt.Sprintf("go:conc:%d", w)
			for i := range concIncrs {
				var err error
				if i%10 == 0 {
					_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
						p.Incr(ctx, key)
						return nil
					})
				} else {
					err = rdb.Incr(ctx, key).Err()
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d, INCR %d: %w", w, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
