package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/redis/go-redis/v9"
)

// aclUsers are the ACL users the tests create on every Redis node: alice
// may read and set keys under app: and use channels under chan:, and
// nothing else; bob may do anything.
var aclUsers = [][]string{
	{"ACL", "SETUSER", "alice", "on", ">alice-pw", "~app:*", "&chan:*", "+@read", "+set", "+multi", "+exec", "+blpop", "+ping", "+@connection", "+acl|whoami", "+subscribe"},
	{"ACL", "SETUSER", "bob", "on", ">bob-pw", "~*", "&*", "+@all"},
}

// addACLUsers creates aclUsers on the Redis at each of addrs, directly.
func addACLUsers(t *testing.T, addrs ...string) {
	t.Helper()
	for _, a := range addrs {
		c := dialRaw(t, a)
		for _, u := range aclUsers {
			if got := c.do(u...); got != "+OK\r\n" {
				t.Fatalf("%s on %s: %q", strings.Join(u[:3], " "), a, got)
			}
		}
	}
}

// redisAuth is the edit for a proxy whose clients Redis checks, with
// refused logins answered at once.
func redisAuth(c *config.Config) {
	c.Upstream.ClientAuth = config.ClientAuthRedis
	c.Limits.AuthFailureDelay = 0
}

// infoField is field's value in the INFO section of the Redis at addr.
func infoField(t *testing.T, addr, section, field string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + field + `:(\d+)\r$`).FindStringSubmatch(dialRaw(t, addr).do("INFO", section))
	if m == nil {
		t.Fatalf("INFO %s has no %s", section, field)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestACLUsers logs in as ACL users through a proxy whose clients Redis
// checks (upstream.client_auth: redis) and runs the same session directly
// on Redis: every reply byte for byte as Redis's, its NOPERM for a command,
// a key and a channel the user may not use, in and out of a transaction
// (the client's own connection runs as the user too); WRONGPASS for wrong
// passwords and unknown users, and the two users' sessions side by side.
func TestACLUsers(t *testing.T) {
	e := startEnv(t, redisAuth)
	addACLUsers(t, e.Redis.Addr())
	session := [][]string{
		{"ACL", "WHOAMI"},
		{"AUTH", "alice", "alice-pw"},
		{"ACL", "WHOAMI"},
		{"SET", "app:1", "v"},
		{"GET", "app:1"},
		{"SET", "other:1", "v"},
		{"DEL", "app:1"},
		{"ACL", "LIST"},
		{"AUTH", "alice", "wrong"},
		{"AUTH", "nobody", "alice-pw"},
		{"AUTH", "alice-pw"},
		{"HELLO", "2", "AUTH", "alice", "wrong"},
		{"ACL", "WHOAMI"},
		{"BLPOP", "other:list", "0.01"},
		{"BLPOP", "app:list", "0.01"},
		{"MULTI"},
		{"SET", "app:2", "x"},
		{"FLUSHALL"},
		{"EXEC"},
		{"MULTI"},
		{"SET", "app:2", "x"},
		{"GET", "app:2"},
		{"EXEC"},
		{"AUTH", "bob", "bob-pw"},
		{"ACL", "WHOAMI"},
		{"DEL", "app:1", "app:2"},
		{"AUTH", "alice", "alice-pw"},
		{"SUBSCRIBE", "other"},
	}
	// Directly first, then through the proxy, on the same keys.
	direct := dialRaw(t, e.Redis.Addr())
	want := make([]string, len(session))
	for i, cmd := range session {
		want[i] = direct.do(cmd...)
	}
	if got := dialRaw(t, e.Redis.Addr()).do("FLUSHALL"); got != "+OK\r\n" {
		t.Fatalf("FLUSHALL: %q", got)
	}
	proxied := dialRaw(t, e.ProxyAddr())
	for i, cmd := range session {
		if got := proxied.do(cmd...); got != want[i] {
			t.Errorf("%s: proxy %q, Redis %q", strings.Join(cmd, " "), got, want[i])
		}
	}

	// Two users at once: each client runs as its own.
	var wg sync.WaitGroup
	for _, u := range []struct{ user, pass, forbidden, want string }{
		{"alice", "alice-pw", "other:x", "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"},
		{"bob", "bob-pw", "other:x", "+OK\r\n"},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dialRaw(t, e.ProxyAddr())
			if got := c.do("AUTH", u.user, u.pass); got != "+OK\r\n" {
				t.Errorf("AUTH %s: %q", u.user, got)
			}
			if got := c.do("CLIENT", "INFO"); !strings.Contains(got, " user="+u.user+" ") {
				t.Errorf("%s's CLIENT INFO: %q", u.user, got)
			}
			for i := range 50 {
				if got := c.do("ACL", "WHOAMI"); got != fmt.Sprintf("$%d\r\n%s\r\n", len(u.user), u.user) {
					t.Errorf("%s's ACL WHOAMI %d: %q", u.user, i, got)
					return
				}
				if got := c.do("SET", u.forbidden, "v"); got != u.want {
					t.Errorf("%s's SET %s: %q, want %q", u.user, u.forbidden, got, u.want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestACLPubSub subscribes as alice, on a connection of the client's own
// authenticated as her: Redis checks the channels.
func TestACLPubSub(t *testing.T) {
	e := startEnv(t, redisAuth)
	addACLUsers(t, e.Redis.Addr())
	sub, pub := dialRaw(t, e.ProxyAddr()), dialRaw(t, e.ProxyAddr())
	sub.do("AUTH", "alice", "alice-pw")
	pub.do("AUTH", "bob", "bob-pw")
	if got, want := sub.do("SUBSCRIBE", "chan:a"), "*3\r\n$9\r\nsubscribe\r\n$6\r\nchan:a\r\n:1\r\n"; got != want {
		t.Fatalf("SUBSCRIBE chan:a: %q, want %q", got, want)
	}
	if got, want := sub.do("SUBSCRIBE", "other"), "-NOPERM this user has no permissions to access one of the channels used as arguments\r\n"; got != want {
		t.Errorf("SUBSCRIBE other while subscribed: %q, want %q", got, want)
	}
	if got := pub.do("PUBLISH", "chan:a", "hi"); got != ":1\r\n" {
		t.Errorf("PUBLISH: %q", got)
	}
	if got, want := sub.readReplies(1), "*3\r\n$7\r\nmessage\r\n$6\r\nchan:a\r\n$2\r\nhi\r\n"; got != want {
		t.Errorf("message: %q, want %q", got, want)
	}
}

// TestACLHello logs in with HELLO 2 AUTH: Redis's HELLO reply (the id the
// proxy's own), and the user from then on.
func TestACLHello(t *testing.T) {
	e := startEnv(t, redisAuth)
	addACLUsers(t, e.Redis.Addr())
	id := regexp.MustCompile(`\$2\r\nid\r\n:\d+\r\n`)
	hello := []string{"HELLO", "2", "AUTH", "bob", "bob-pw", "SETNAME", "app"}
	want := id.ReplaceAllString(dialRaw(t, e.Redis.Addr()).do(hello...), "")
	c := dialRaw(t, e.ProxyAddr())
	if got := id.ReplaceAllString(c.do(hello...), ""); got != want {
		t.Errorf("HELLO AUTH: %q, want %q", got, want)
	}
	for _, step := range []struct{ cmd, want string }{
		{"ACL WHOAMI", "$3\r\nbob\r\n"},
		{"CLIENT GETNAME", "$3\r\napp\r\n"},
		{"HELLO 2 AUTH alice alice-pw", ""},
		{"ACL WHOAMI", "$5\r\nalice\r\n"},
		{"DEL app:1", "-NOPERM this user has no permissions to run the 'del' command\r\n"},
	} {
		got := c.do(strings.Fields(step.cmd)...)
		if step.want == "" {
			if !strings.HasPrefix(got, "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n") {
				t.Errorf("%s: %q", step.cmd, got)
			}
			continue
		}
		if got != step.want {
			t.Errorf("%s: %q, want %q", step.cmd, got, step.want)
		}
	}
}

// TestACLFailedLogins checks that refused logins open no upstream
// connection: many clients each trying wrong passwords and unknown users
// leave Redis's count of connections received where it was.
func TestACLFailedLogins(t *testing.T) {
	e := startEnv(t, redisAuth)
	addACLUsers(t, e.Redis.Addr())
	ok := dialRaw(t, e.ProxyAddr())
	if got := ok.do("AUTH", "alice", "alice-pw"); got != "+OK\r\n" {
		t.Fatalf("AUTH alice: %q", got)
	}
	before := infoField(t, e.Redis.Addr(), "stats", "total_connections_received")
	const clients, tries = 20, 10
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dialRaw(t, e.ProxyAddr())
			for j := range tries {
				user := []string{"alice", "user" + strconv.Itoa(i*tries+j)}[j%2]
				if got := c.do("AUTH", user, "guess"+strconv.Itoa(j)); got != "-WRONGPASS invalid username-password pair or user is disabled.\r\n" {
					t.Errorf("AUTH %s with a wrong password: %q", user, got)
					return
				}
			}
			if got := c.do("HELLO", "2", "AUTH", "bob", "guess"); got != "-WRONGPASS invalid username-password pair or user is disabled.\r\n" {
				t.Errorf("HELLO AUTH with a wrong password: %q", got)
			}
		}()
	}
	wg.Wait()
	// The one direct connection infoField makes is the only new one.
	if after := infoField(t, e.Redis.Addr(), "stats", "total_connections_received"); after != before+1 {
		t.Errorf("Redis received %d connections during %d refused logins, want none", after-before-1, clients*(tries+1))
	}
	if n := metricValue(t, e.Proxy, "hotkeyproxy_upstream_logins"); n != 2 {
		t.Errorf("%v logins hold pools, want 2 (alice, and the clients that have not logged in)", n)
	}
}

// TestACLDefaultUserPassword: with a password on Redis's default user and
// the proxy authenticated as an ACL user of its own, a client that has not
// logged in gets Redis's NOAUTH, and AUTH with the password alone logs it
// in as default.
func TestACLDefaultUserPassword(t *testing.T) {
	e := startEnv(t, func(c *config.Config) {
		redisAuth(c)
		c.Upstream.Username, c.Upstream.Password = "bob", "bob-pw"
	})
	addACLUsers(t, e.Redis.Addr())
	if got := dialRaw(t, e.Redis.Addr()).do("CONFIG", "SET", "requirepass", "default-pw"); got != "+OK\r\n" {
		t.Fatalf("CONFIG SET requirepass: %q", got)
	}
	c := dialRaw(t, e.ProxyAddr())
	for _, step := range []struct{ cmd, want string }{
		{"GET app:1", "-NOAUTH Authentication required.\r\n"},
		{"HELLO 2", "-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n"},
		{"AUTH wrong", "-WRONGPASS invalid username-password pair or user is disabled.\r\n"},
		{"AUTH default-pw", "+OK\r\n"},
		{"ACL WHOAMI", "$7\r\ndefault\r\n"},
		{"GET app:1", "$-1\r\n"},
		{"RESET", "+RESET\r\n"},
		{"GET app:1", "-NOAUTH Authentication required.\r\n"},
	} {
		if got := c.do(strings.Fields(step.cmd)...); got != step.want {
			t.Errorf("%s: %q, want %q", step.cmd, got, step.want)
		}
	}
}

// TestACLCluster logs in as an ACL user through a proxy in front of a
// cluster, every node knowing the user: the user's permissions apply on
// every master its keys live on.
func TestACLCluster(t *testing.T) {
	e := startClusterEnv(t, redisAuth)
	var addrs []string
	for _, n := range e.Cluster.Nodes() {
		addrs = append(addrs, n.Addr())
	}
	addACLUsers(t, addrs...)
	c := dialRaw(t, e.ProxyAddr())
	steps := []struct{ cmd, want string }{
		{"AUTH alice wrong", "-WRONGPASS invalid username-password pair or user is disabled.\r\n"},
		{"AUTH alice alice-pw", "+OK\r\n"},
		{"ACL WHOAMI", "$5\r\nalice\r\n"},
		{"DEL app:1", "-NOPERM this user has no permissions to run the 'del' command\r\n"},
		{"MGET app:1 other:1", "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"},
		{"BLPOP other:list 0.01", "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"},
	}
	for i := range 20 { // keys in many slots, so on every master
		k := "app:" + strconv.Itoa(i)
		steps = append(steps, struct{ cmd, want string }{"SET " + k + " " + k, "+OK\r\n"},
			struct{ cmd, want string }{"GET " + k, fmt.Sprintf("$%d\r\n%s\r\n", len(k), k)},
			struct{ cmd, want string }{"SET other:" + strconv.Itoa(i) + " v", "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"})
	}
	steps = append(steps, struct{ cmd, want string }{"MGET app:1 app:2 app:3", "*3\r\n$5\r\napp:1\r\n$5\r\napp:2\r\n$5\r\napp:3\r\n"},
		struct{ cmd, want string }{"AUTH bob bob-pw", "+OK\r\n"},
		struct{ cmd, want string }{"DEL app:1 app:2 app:3", ":3\r\n"},
		struct{ cmd, want string }{"ACL WHOAMI", "$3\r\nbob\r\n"},
		// A blocking command's own connection, kept on the node, is
		// dialed again as the user logged in since.
		struct{ cmd, want string }{"BLPOP app:{t}l 0.01", "*-1\r\n"},
		struct{ cmd, want string }{"AUTH alice alice-pw", "+OK\r\n"},
		struct{ cmd, want string }{"BLPOP other:{t}l 0.01", "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"})
	for _, step := range steps {
		if got := c.do(strings.Fields(step.cmd)...); got != step.want {
			t.Errorf("%s: %q, want %q", step.cmd, got, step.want)
		}
	}
}

// TestWhoamiProxyPassword: with the proxy's own password, every client
// is Redis's default user.
func TestWhoamiProxyPassword(t *testing.T) {
	e := startEnv(t, func(c *config.Config) { c.Password = "proxy-pw" })
	c := dialRaw(t, e.ProxyAddr())
	for _, step := range []struct{ cmd, want string }{
		{"ACL WHOAMI", "-NOAUTH Authentication required.\r\n"},
		{"AUTH proxy-pw", "+OK\r\n"},
		{"ACL WHOAMI", "$7\r\ndefault\r\n"},
		{"ACL WHOAMI extra", "-ERR wrong number of arguments for 'acl|whoami' command\r\n"},
	} {
		if got := c.do(strings.Fields(step.cmd)...); got != step.want {
			t.Errorf("%s: %q, want %q", step.cmd, got, step.want)
		}
	}
}

// TestUpstreamRequirepass sets requirepass through a proxy that has no
// upstream password: the connections it dials from then on are refused,
// and clients get words that name the setting to change instead of a bare
// NOAUTH, while the log says so once.
func TestUpstreamRequirepass(t *testing.T) {
	e, log := startEnvLog(t, nil)
	c := dialRaw(t, e.ProxyAddr())
	if got := c.do("CONFIG", "SET", "requirepass", "set-behind"); got != "+OK\r\n" {
		t.Fatalf("CONFIG SET requirepass: %q", got)
	}
	want := "-ERR upstream " + e.Redis.Addr() + " refused the proxy's credentials (NOAUTH Authentication required.): set upstream.username and upstream.password (or upstream.password_file) to an ACL user Redis accepts, or undo the requirepass change on Redis\r\n"
	for i := range 5 {
		n := dialRaw(t, e.ProxyAddr())
		for _, cmd := range [][]string{{"SELECT", strconv.Itoa(1 + i)}, {"MULTI"}} {
			if got := n.do(cmd...); got != want {
				t.Errorf("%s: %q, want %q", strings.Join(cmd, " "), got, want)
			}
		}
	}
	// The shared connections dialed before stay authenticated, as Redis
	// keeps them; once Redis drops them, those dialed again are refused.
	if got := c.do("GET", "k"); got != "$-1\r\n" {
		t.Errorf("GET on a connection dialed before: %q", got)
	}
	kill := dialRaw(t, e.Redis.Addr())
	if got := kill.do("AUTH", "set-behind"); got != "+OK\r\n" {
		t.Fatalf("AUTH on Redis: %q", got)
	}
	if got := kill.do("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"); got == ":0\r\n" {
		t.Fatalf("CLIENT KILL: %q", got)
	}
	for {
		got := c.do("GET", "k")
		if strings.HasPrefix(got, "-ERR upstream unavailable") {
			continue // the pool found its connection gone only now; the next GET dials
		}
		if got != want {
			t.Errorf("GET on a connection dialed since: %q, want %q", got, want)
		}
		break
	}
	if got := strings.Count(log.String(), "upstream refused the proxy's credentials"); got != 1 {
		t.Errorf("the refusal logged %d times, want once:\n%s", got, log.String())
	}
}

// goRedisACLSession logs go-redis in at addr as alice and as bob (see
// aclUsers), with its defaults, and checks that Redis's permissions and
// errors reach it: commands, pipelines and a transaction as the user.
func goRedisACLSession(t *testing.T, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	user := func(name, pass string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, Username: name, Password: pass, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	alice, bob := user("alice", "alice-pw"), user("bob", "bob-pw")

	whoami := func(c *redis.Client) string {
		name, err := c.Do(ctx, "ACL", "WHOAMI").Text()
		mustOK(t, "ACL WHOAMI", err)
		return name
	}
	equal(t, "alice's ACL WHOAMI", whoami(alice), "alice")
	equal(t, "bob's ACL WHOAMI", whoami(bob), "bob")
	mustOK(t, "alice's SET", alice.Set(ctx, "app:go", "v", 0).Err())
	got, err := alice.Get(ctx, "app:go").Result()
	mustOK(t, "alice's GET", err)
	equal(t, "alice's GET", got, "v")
	checkRedisError(t, "alice's DEL", alice.Del(ctx, "app:go").Err(), "NOPERM this user has no permissions to run the 'del' command")
	checkRedisError(t, "alice's SET of another key", alice.Set(ctx, "other:go", "v", 0).Err(), "NOPERM this user has no permissions to access one of the keys")

	cmds, _ := alice.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "app:pipe", "1", 0)
		p.Set(ctx, "other:pipe", "1", 0)
		p.Get(ctx, "app:pipe")
		return nil
	})
	mustOK(t, "pipelined SET", cmds[0].Err())
	checkRedisError(t, "pipelined SET of another key", cmds[1].Err(), "NOPERM")
	equal(t, "pipelined GET", cmds[2].(*redis.StringCmd).Val(), "1")

	_, err = alice.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "app:tx", "1", 0)
		p.FlushAll(ctx)
		return nil
	})
	checkRedisError(t, "FLUSHALL in alice's transaction", err, "EXECABORT")

	n, err := bob.Del(ctx, "app:go", "app:pipe").Result()
	mustOK(t, "bob's DEL", err)
	equal(t, "bob's DEL", n, int64(2))
	checkRedisError(t, "a wrong password", user("alice", "wrong").Ping(ctx).Err(), "WRONGPASS")
}
