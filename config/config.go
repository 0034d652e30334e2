package config

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"path"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole of proxy.yaml. Start from Default (or Load/Parse) and
// call Validate after changing fields; the rest of the proxy assumes a
// validated Config.
type Config struct {
	// Listen is the client-facing address, host:port. An empty host
	// listens on every interface; port 0 picks a free port. Required,
	// except that "" turns the plain listener off when tls.listen is set;
	// default "127.0.0.1:6380".
	Listen string `yaml:"listen"`
	// TLS configures a TLS listener for clients (tls.go). Default off.
	TLS TLS `yaml:"tls"`
	// Password, when set, makes clients AUTH before any other command, as
	// Redis's requirepass. Empty (the default) means no AUTH. Load expands
	// ${NAME} in it from the environment (see ExpandSecret).
	Password Secret `yaml:"password"`
	// PasswordFile names a file whose content Load reads into Password, at
	// start and on every reload (one trailing newline dropped). A relative
	// path is relative to the config file's directory. Empty (the default)
	// reads none; set Password or PasswordFile, not both.
	PasswordFile string `yaml:"password_file"`
	// Upstream is the Redis the proxy relays to.
	Upstream Upstream `yaml:"upstream"`
	// Limits bound what one client, and all of them, may hold.
	Limits Limits `yaml:"limits"`
	// ShutdownTimeout is how long a graceful stop waits for in-flight
	// replies before closing client connections. Must be > 0; default 10s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
	// Log sets the proxy's own log output.
	Log Log `yaml:"log"`
	// Hotkeys lists the keys held as buckets and configures the detector.
	Hotkeys Hotkeys `yaml:"hotkeys"`
	// Scripts are the deduct scripts recognised on hot keys, by body (the
	// SHA1 for EVALSHA is derived from it). Empty (the default) means
	// EVAL/EVALSHA on a hot key is refused.
	Scripts []Script `yaml:"scripts"`
	// Metrics configures the Prometheus endpoint.
	Metrics Metrics `yaml:"metrics"`
}

// Upstream modes.
const (
	ModeStandalone = "standalone" // one Redis server (a master)
	ModeCluster    = "cluster"    // a Redis Cluster, reached through seed nodes
)

// Upstream configures the Redis servers behind the proxy.
type Upstream struct {
	// Mode is ModeStandalone or ModeCluster. Default "standalone".
	Mode string `yaml:"mode"`
	// Addrs are host:port addresses: exactly one server in standalone
	// mode, one or more seed nodes in cluster mode (the rest are found
	// with CLUSTER SLOTS). Default ["127.0.0.1:6379"].
	Addrs []string `yaml:"addrs"`
	// Username is the ACL user for upstream AUTH. Empty (the default)
	// sends AUTH with the password only (the "default" user).
	Username string `yaml:"username"`
	// Password is sent with AUTH on every upstream connection. Empty (the
	// default) sends no AUTH. Load expands ${NAME} in it, as in the
	// client password.
	Password Secret `yaml:"password"`
	// PasswordFile is read into Password, as the client password_file.
	PasswordFile string `yaml:"password_file"`
	// TLS configures TLS toward Redis (tls.go). Default off.
	TLS UpstreamTLS `yaml:"tls"`
	// ConnsPerNode is the number of shared upstream connections per node
	// and db, 1..64. Default 2. Connections pinned to one client (MULTI,
	// blocking commands, pub/sub) are not counted here.
	ConnsPerNode int `yaml:"conns_per_node"`
	// DialTimeout bounds connecting to a node, AUTH included. Must be > 0;
	// default 1s.
	DialTimeout Duration `yaml:"dial_timeout"`
	// ReadTimeout bounds the wait for a reply, from the write of its
	// request: past it the request fails ("-ERR upstream timeout …"), its
	// connection is closed, and the node is probed. A blocking command
	// (BLPOP, XREAD BLOCK, WAIT…) gets its own timeout on top of it.
	// Must be > 0; default 5s, Redis's busy-reply-threshold.
	ReadTimeout Duration `yaml:"read_timeout"`
	// ClientAuth says who checks clients' AUTH and HELLO … AUTH:
	// ClientAuthProxy (the default) checks them against password, as
	// Redis's default user; ClientAuthRedis has Redis check them, as its
	// ACL users, and runs each client's commands on connections
	// authenticated as the user it logged in as, so Redis applies the
	// user's permissions. With ClientAuthRedis, password must be empty.
	// Changing it needs a restart.
	ClientAuth string `yaml:"client_auth"`
}

// Who checks clients' passwords (Upstream.ClientAuth).
const (
	ClientAuthProxy = "proxy" // the proxy, against password
	ClientAuthRedis = "redis" // Redis, as ACL users
)

// Limits bound client resources. The defaults are Redis's own.
type Limits struct {
	// MaxClients is the most client connections served at once; one more
	// is answered "-ERR max number of clients reached" and closed, as
	// Redis's maxclients. Must be >= 1; default 10000.
	MaxClients int `yaml:"max_clients"`
	// QueryBuffer is how many bytes of unparsed input one client may have
	// buffered before it is closed, as Redis's client-query-buffer-limit;
	// it also bounds the replies waiting for a client that does not read.
	// Must be >= 1kb; default 1gb.
	QueryBuffer ByteSize `yaml:"query_buffer"`
	// MaxBulk is the largest bulk string a client may send, as Redis's
	// proto-max-bulk-len; a larger one is a protocol error. Must be >= 1kb
	// and <= QueryBuffer; default 512mb.
	MaxBulk ByteSize `yaml:"max_bulk"`
	// IdleTimeout closes a client that sent nothing for this long, as
	// Redis's timeout. 0 (the default) never closes idle clients; must not
	// be negative.
	IdleTimeout Duration `yaml:"idle_timeout"`
	// MaxClientsPerIP is the most client connections from one IP address
	// at once; one more is answered "-ERR hotkeyproxy: max number of
	// clients per IP address reached" and closed. Redis has no such
	// limit. 0 (the default) means none: behind a load balancer or NAT
	// every client may come from one address. Must not be negative.
	MaxClientsPerIP int `yaml:"max_clients_per_ip"`
	// MaxPendingOutput is how many bytes of replies may wait to be written
	// to one client before the proxy stops reading that client's next
	// commands, until the client has read enough of them (backpressure,
	// which Redis does not apply: it buffers a normal client's replies
	// without limit). A client that reads nothing for a second while over
	// it is read on, as Redis would, so that a client that writes a whole
	// pipeline before reading any reply is served; QueryBuffer then bounds
	// its replies (so a MaxPendingOutput above QueryBuffer never applies).
	// 0 turns backpressure off. Must be 0 or >= 64kb; default 4mb.
	MaxPendingOutput ByteSize `yaml:"max_pending_output"`
	// MaxClientMemory bounds the memory all clients hold together: their
	// query buffers, pending replies and requests being relayed. Past it,
	// the client holding the most is closed, logged and counted, as
	// Redis 7.0's maxmemory-clients. 0 (the default, as Redis's) means no
	// bound. Must be 0 or >= 1mb.
	MaxClientMemory ByteSize `yaml:"max_client_memory"`
	// AuthFailureDelay is how long the proxy waits before it answers a
	// failed AUTH (or HELLO … AUTH), so that guessing passwords over one
	// connection is slow; failures are counted in the metrics either way.
	// 0 answers at once. Must be 0..10s; default 100ms.
	AuthFailureDelay Duration `yaml:"auth_failure_delay"`
}

// Log levels and formats.
const (
	LevelDebug = "debug"
	LevelInfo  = "info"
	LevelWarn  = "warn"
	LevelError = "error"

	FormatText = "text" // log/slog TextHandler: key=value
	FormatJSON = "json" // log/slog JSONHandler: one object per line
)

// Log configures the proxy's log.
type Log struct {
	// Level is the least severe level written: "debug", "info", "warn" or
	// "error". Default "info".
	Level string `yaml:"level"`
	// Format is "text" or "json". Default "text".
	Format string `yaml:"format"`
}

// DefaultStandaloneBuckets is the bucket count of a hot key with buckets 0
// in standalone mode. In cluster mode, buckets 0 means one per master.
const DefaultStandaloneBuckets = 8

// Bucket count bounds of a KeyRule with buckets set.
const (
	MinBuckets = 2
	MaxBuckets = 1024
)

// Routes: how a deduct picks the bucket it tries first.
const (
	RouteRandom = "random" // a random bucket per command
	RouteClient = "client" // one bucket per client connection, fixed while it lasts
)

// Hotkeys configures which keys the proxy holds as buckets.
type Hotkeys struct {
	// Keys are the keys ops marks hot. Empty (the default) marks none;
	// the detector and admin commands can still add some.
	Keys []KeyRule `yaml:"keys"`
	// Detect configures the detector that finds hot keys by sampling.
	Detect Detect `yaml:"detect"`
	// SoldoutTTL is how long a proxy remembers that a hot key answered
	// "sold out" for an amount, and answers the same without asking Redis.
	// 0 never remembers; must not be negative; default 100ms.
	SoldoutTTL Duration `yaml:"soldout_ttl"`
	// ReadStaleness lets GET and MGET of a hot key answer from the sum
	// this proxy last read of every bucket, with its own deducts and
	// give-backs since, while that read is younger than this: a product
	// page polling the stock then costs no upstream call. What it hides
	// is other proxies' changes and the key's expiry, for at most this
	// long. 0 (the default) reads every bucket on each GET; must not be
	// negative.
	ReadStaleness Duration `yaml:"read_staleness"`
	// MoveTimeout bounds how long a move of stock between two buckets of
	// a hot key (a gather, a merge) stays unfinished when the proxy doing
	// it dies or loses Redis half way: any proxy that knows the key finds
	// a move older than half of it and finishes it (or undoes it, when its
	// target bucket is gone), looking every quarter of it. Must be > 0;
	// default 2s.
	MoveTimeout Duration `yaml:"move_timeout"`
	// JournalMaxlen bounds each journal stream (one per bucket of a
	// journaled hot key): every entry is added with XADD MAXLEN ~ this, so
	// Redis drops the oldest entries past about this many, read or not. 0
	// (the default) trims nothing: entries are kept until the consumers
	// trim what they have acknowledged (XTRIM MINID), so none is lost to
	// a slow consumer, at the cost of memory while none trims. Must not
	// be negative.
	JournalMaxlen int64 `yaml:"journal_maxlen"`
}

// KeyRule marks the keys matching Match as hot.
type KeyRule struct {
	// Match is an exact key or a Redis glob pattern (*, ?, [...], \ to
	// escape). Required, non-empty, unique among the rules.
	Match string `yaml:"match"`
	// Buckets is how many buckets each matching key is split into,
	// MinBuckets..MaxBuckets. 0 (the default) means one per master in
	// cluster mode and DefaultStandaloneBuckets in standalone mode.
	Buckets int `yaml:"buckets"`
	// Route is RouteRandom or RouteClient. Default (and when empty in the
	// file) "random".
	Route string `yaml:"route"`
	// WaitReplicas makes every change of a bucket of a matching key (a
	// deduct, a give back, a SET, a move between buckets) wait, before the
	// client is answered, until this many replicas of the bucket's master
	// have it (Redis's WAIT, on the connection that wrote it): then a
	// failover cannot lose it. When fewer acknowledge within WaitTimeout,
	// the client gets an error saying that the change was applied but may
	// be lost on failover. 0 (the default) does not wait: Redis
	// replicates asynchronously. Must not be negative, nor exceed the
	// replicas each master has, or every change gets that error.
	WaitReplicas int `yaml:"wait_replicas"`
	// WaitTimeout bounds that wait, in whole milliseconds as WAIT takes
	// it. With WaitReplicas set it must be 1ms or more and below
	// upstream.read_timeout; default (and when 0) 100ms.
	WaitTimeout Duration `yaml:"wait_timeout"`
	// Journal makes every change of a matching key's buckets (deducts,
	// give-backs, SETs, moves between buckets) append an entry to a
	// Redis stream per bucket, in the same Lua step as the change; the
	// layout records it, so every proxy journals the key. It applies to
	// the layouts made from then on (the next SET, a conversion). Default
	// false.
	Journal bool `yaml:"journal"`
}

// DefaultWaitTimeout is a KeyRule's WaitTimeout when the file sets none.
const DefaultWaitTimeout = Duration(100 * time.Millisecond)

// Detect configures the hot-key detector.
type Detect struct {
	// Enabled turns the detector on. Default false.
	Enabled bool `yaml:"enabled"`
	// SampleRate is the fraction of commands whose key is counted, in
	// (0, 1]. Default 0.01.
	SampleRate float64 `yaml:"sample_rate"`
	// Window is the period over which a key's rate is estimated. Must be
	// > 0; default 1s.
	Window Duration `yaml:"window"`
	// Threshold is the estimated operations per second that make a key
	// hot. Must be > 0 and finite; default 5000.
	Threshold float64 `yaml:"threshold"`
	// Capacity is the most keys counted at once (least recently seen are
	// dropped). Must be >= 1; default 10000.
	Capacity int `yaml:"capacity"`
	// Promote are the glob patterns of keys that may be turned into hot
	// keys automatically. Empty (the default) promotes nothing: detected
	// keys are only reported.
	Promote []string `yaml:"promote"`
	// DryRun reports the keys that would be promoted without promoting
	// them. Default false.
	DryRun bool `yaml:"dry_run"`
	// Demote turns promoted keys back into plain keys once they stay
	// below the threshold. Default false: a promoted key stays hot.
	Demote bool `yaml:"demote"`
	// WaitReplicas and WaitTimeout are KeyRule's, for the keys hot
	// without a rule: promoted, sharded by PROXY SHARD, or learned from
	// Redis. Default 0 and 100ms.
	WaitReplicas int      `yaml:"wait_replicas"`
	WaitTimeout  Duration `yaml:"wait_timeout"`
	// Journal journals the keys made hot without a hotkeys.keys rule
	// (promoted by the detector, or by PROXY SHARD) as KeyRule.Journal
	// does. Default false.
	Journal bool `yaml:"journal"`
}

// Script is a deduct script recognised on hot keys.
type Script struct {
	// Name identifies the script in logs, metrics and admin commands.
	// Required, unique.
	Name string `yaml:"name"`
	// Body is the Lua source, byte for byte as clients send it to EVAL or
	// SCRIPT LOAD. Required, unique.
	Body string `yaml:"body"`
	// Amount is how much one call takes. Required.
	Amount Amount `yaml:"amount"`
	// Soldout is the integer the script returns when the stock cannot
	// cover the amount. Default 0.
	Soldout int64 `yaml:"soldout"`
	// OrderID names the script's ARGV entry ("argv:N", 1-based) that
	// holds the caller's order id: a journaled key's deduct entry carries
	// it (field "order"), so that each sale can be matched to its order.
	// Empty (the default): no order id. A call without that ARGV entry
	// is journaled without one.
	OrderID Argv `yaml:"order_id"`
}

// SHA1 returns the lowercase hex SHA1 of the body, as SCRIPT LOAD returns
// it and EVALSHA names it.
func (s Script) SHA1() string {
	sum := sha1.Sum([]byte(s.Body))
	return hex.EncodeToString(sum[:])
}

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	// Listen is the host:port serving /metrics. Empty disables metrics;
	// default "127.0.0.1:9121".
	Listen string `yaml:"listen"`
}

// Default returns the configuration an empty proxy.yaml gives. Each call
// returns a new Config.
func Default() *Config {
	return &Config{
		Listen: "127.0.0.1:6380",
		TLS:    defaultTLS(),
		Upstream: Upstream{
			Mode:         ModeStandalone,
			Addrs:        []string{"127.0.0.1:6379"},
			ConnsPerNode: 2,
			DialTimeout:  Duration(time.Second),
			ReadTimeout:  Duration(5 * time.Second),
			ClientAuth:   ClientAuthProxy,
		},
		Limits: Limits{
			MaxClients:       10000,
			QueryBuffer:      1 * GB,
			MaxBulk:          512 * MB,
			MaxPendingOutput: 4 * MB,
			AuthFailureDelay: Duration(100 * time.Millisecond),
		},
		ShutdownTimeout: Duration(10 * time.Second),
		Log:             Log{Level: LevelInfo, Format: FormatText},
		Hotkeys: Hotkeys{
			Detect: Detect{
				SampleRate:  0.01,
				Window:      Duration(time.Second),
				Threshold:   5000,
				Capacity:    10000,
				WaitTimeout: DefaultWaitTimeout,
			},
			SoldoutTTL:  Duration(100 * time.Millisecond),
			MoveTimeout: Duration(2 * time.Second),
		},
		Metrics: Metrics{Listen: "127.0.0.1:9121"},
	}
}

// applyDefaults fills what the decoder cannot prefill: fields of list
// items, which yaml creates from zero. It also turns empty lists into nil,
// so that "promote: []" and no promote give equal Configs.
func (c *Config) applyDefaults() {
	for i := range c.Hotkeys.Keys {
		if c.Hotkeys.Keys[i].Route == "" {
			c.Hotkeys.Keys[i].Route = RouteRandom
		}
		if c.Hotkeys.Keys[i].WaitTimeout == 0 {
			c.Hotkeys.Keys[i].WaitTimeout = DefaultWaitTimeout
		}
	}
	if len(c.Upstream.Addrs) == 0 {
		c.Upstream.Addrs = nil
	}
	if len(c.Hotkeys.Keys) == 0 {
		c.Hotkeys.Keys = nil
	}
	if len(c.Hotkeys.Detect.Promote) == 0 {
		c.Hotkeys.Detect.Promote = nil
	}
	if len(c.Scripts) == 0 {
		c.Scripts = nil
	}
}

// Validate checks every field and returns nil or all the problems found,
// joined (errors.Join); each is an *Error naming its YAML key.
func (c *Config) Validate() error {
	return joinErrors(c.validate())
}

// validate returns the problems in field order.
func (c *Config) validate() []*Error {
	var v validator

	v.validateListeners(c)

	u := &c.Upstream
	switch u.Mode {
	case ModeStandalone, ModeCluster:
	default:
		v.errorf("upstream.mode", `must be "standalone" or "cluster", got %q`, u.Mode)
	}
	switch {
	case len(u.Addrs) == 0:
		v.errorf("upstream.addrs", "must list at least one host:port")
	case u.Mode == ModeStandalone && len(u.Addrs) > 1:
		v.errorf("upstream.addrs", "standalone mode takes exactly one address, got %d", len(u.Addrs))
	}
	seenAddr := map[string]int{}
	for i, a := range u.Addrs {
		key := fmt.Sprintf("upstream.addrs[%d]", i)
		if v.addr(key, a, false) {
			if j, dup := seenAddr[a]; dup {
				v.errorf(key, "%q is listed twice (also upstream.addrs[%d])", a, j)
			}
			seenAddr[a] = i
		}
	}
	v.validateUpstreamTLS(&u.TLS)
	if u.ConnsPerNode < 1 || u.ConnsPerNode > 64 {
		v.errorf("upstream.conns_per_node", "must be 1..64, got %d", u.ConnsPerNode)
	}
	v.positive("upstream.dial_timeout", u.DialTimeout)
	v.positive("upstream.read_timeout", u.ReadTimeout)
	switch {
	case u.ClientAuth != ClientAuthProxy && u.ClientAuth != ClientAuthRedis:
		v.errorf("upstream.client_auth", `must be "proxy" or "redis", got %q`, u.ClientAuth)
	case u.ClientAuth == ClientAuthRedis && (c.Password != "" || c.PasswordFile != ""):
		v.errorf("upstream.client_auth", `"redis" has Redis check clients' passwords: password and password_file must be empty`)
	}

	l := &c.Limits
	if l.MaxClients < 1 {
		v.errorf("limits.max_clients", "must be >= 1, got %d", l.MaxClients)
	}
	if l.QueryBuffer < KB {
		v.errorf("limits.query_buffer", "must be >= 1kb, got %s", l.QueryBuffer)
	}
	switch {
	case l.MaxBulk < KB:
		v.errorf("limits.max_bulk", "must be >= 1kb, got %s", l.MaxBulk)
	case l.MaxBulk > l.QueryBuffer:
		v.errorf("limits.max_bulk", "must be <= limits.query_buffer (%s), got %s", l.QueryBuffer, l.MaxBulk)
	}
	v.nonNegative("limits.idle_timeout", l.IdleTimeout)
	if l.MaxClientsPerIP < 0 {
		v.errorf("limits.max_clients_per_ip", "must be 0 (no limit) or more, got %d", l.MaxClientsPerIP)
	}
	if l.MaxPendingOutput != 0 && l.MaxPendingOutput < 64*KB {
		v.errorf("limits.max_pending_output", "must be 0 (off) or >= 64kb, got %s", l.MaxPendingOutput)
	}
	if l.MaxClientMemory != 0 && l.MaxClientMemory < MB {
		v.errorf("limits.max_client_memory", "must be 0 (no bound) or >= 1mb, got %s", l.MaxClientMemory)
	}
	if d := l.AuthFailureDelay; d < 0 || d.Duration() > 10*time.Second {
		v.errorf("limits.auth_failure_delay", "must be 0s..10s, got %s", d)
	}

	v.positive("shutdown_timeout", c.ShutdownTimeout)

	switch c.Log.Level {
	case LevelDebug, LevelInfo, LevelWarn, LevelError:
	default:
		v.errorf("log.level", `must be "debug", "info", "warn" or "error", got %q`, c.Log.Level)
	}
	switch c.Log.Format {
	case FormatText, FormatJSON:
	default:
		v.errorf("log.format", `must be "text" or "json", got %q`, c.Log.Format)
	}

	h := &c.Hotkeys
	seenMatch := map[string]string{}
	for i, k := range h.Keys {
		p := fmt.Sprintf("hotkeys.keys[%d]", i)
		v.unique(seenMatch, p+".match", k.Match)
		if k.Buckets != 0 && (k.Buckets < MinBuckets || k.Buckets > MaxBuckets) {
			v.errorf(p+".buckets", "must be 0 (default) or %d..%d, got %d", MinBuckets, MaxBuckets, k.Buckets)
		}
		switch k.Route {
		case RouteRandom, RouteClient:
		default:
			v.errorf(p+".route", `must be "random" or "client", got %q`, k.Route)
		}
		v.wait(p, k.WaitReplicas, k.WaitTimeout, c.Upstream.ReadTimeout)
	}
	d := &h.Detect
	v.wait("hotkeys.detect", d.WaitReplicas, d.WaitTimeout, c.Upstream.ReadTimeout)
	if !(d.SampleRate > 0 && d.SampleRate <= 1) {
		v.errorf("hotkeys.detect.sample_rate", "must be in (0, 1], got %v", d.SampleRate)
	}
	v.positive("hotkeys.detect.window", d.Window)
	if !(d.Threshold > 0) || math.IsInf(d.Threshold, 0) {
		v.errorf("hotkeys.detect.threshold", "must be a number > 0, got %v", d.Threshold)
	}
	if d.Capacity < 1 {
		v.errorf("hotkeys.detect.capacity", "must be >= 1, got %d", d.Capacity)
	}
	for i, p := range d.Promote {
		key := fmt.Sprintf("hotkeys.detect.promote[%d]", i)
		if p == "" {
			v.errorf(key, "must not be empty")
		} else if _, err := path.Match(p, ""); err != nil {
			v.errorf(key, "bad glob pattern %q", p)
		}
	}
	v.nonNegative("hotkeys.soldout_ttl", h.SoldoutTTL)
	v.nonNegative("hotkeys.read_staleness", h.ReadStaleness)
	v.positive("hotkeys.move_timeout", h.MoveTimeout)
	if h.JournalMaxlen < 0 {
		v.errorf("hotkeys.journal_maxlen", "must be 0 (trimmed by the consumers) or more, got %d", h.JournalMaxlen)
	}

	seenName := map[string]string{}
	seenBody := map[string]string{}
	for i, s := range c.Scripts {
		p := fmt.Sprintf("scripts[%d]", i)
		v.unique(seenName, p+".name", s.Name)
		// Scripts are told apart by SHA1, so two with one body are one.
		v.unique(seenBody, p+".body", strings.TrimSpace(s.Body))
		switch a := s.Amount; {
		case a.IsZero():
			v.errorf(p+".amount", `is required: a positive integer or "argv:N"`)
		case a.Const != 0 && a.ArgvIndex != 0:
			v.errorf(p+".amount", "has both a constant and an ARGV index")
		case a.Const < 0 || a.ArgvIndex < 0:
			v.errorf(p+".amount", "must be positive, got %s", a)
		}
		switch {
		case s.OrderID < 0:
			v.errorf(p+".order_id", "must be \"argv:N\" with N >= 1, got %d", s.OrderID)
		case s.OrderID != 0 && int(s.OrderID) == s.Amount.ArgvIndex:
			v.errorf(p+".order_id", "names ARGV[%d], the amount", s.OrderID)
		}
	}

	if c.Metrics.Listen != "" {
		if v.addr("metrics.listen", c.Metrics.Listen, true) && c.Metrics.Listen == c.Listen {
			v.errorf("metrics.listen", "must differ from listen (%s)", c.Listen)
		}
	}
	return v.errs
}

// validator collects *Error values in the order they are found.
type validator struct {
	errs []*Error
}

func (v *validator) errorf(key, format string, args ...any) {
	v.errs = append(v.errs, &Error{Path: key, Msg: fmt.Sprintf(format, args...)})
}

// unique checks that value is not empty and that no earlier item of the
// list had it; seen maps values to the key that first had them.
func (v *validator) unique(seen map[string]string, key, value string) {
	if value == "" {
		v.errorf(key, "must not be empty")
		return
	}
	if first, dup := seen[value]; dup {
		v.errorf(key, "%q is listed twice (also %s)", value, first)
		return
	}
	seen[value] = key
}

// addr checks a host:port address and reports whether it is well formed.
// A listen address may have an empty host and port 0; an upstream address
// needs both.
func (v *validator) addr(key, addr string, listen bool) bool {
	if addr == "" {
		v.errorf(key, "must be host:port, got an empty string")
		return false
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.errorf(key, "must be host:port, got %q", addr)
		return false
	}
	if !listen && host == "" {
		v.errorf(key, "needs a host, got %q", addr)
		return false
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || (!listen && n == 0) {
		v.errorf(key, "bad port in %q", addr)
		return false
	}
	return true
}

// wait checks the wait_replicas and wait_timeout under prefix: WAIT's
// timeout is whole milliseconds (0 would wait forever), and a wait as long
// as the read timeout would fail as a timeout instead.
func (v *validator) wait(prefix string, replicas int, timeout, readTimeout Duration) {
	if replicas < 0 {
		v.errorf(prefix+".wait_replicas", "must be >= 0, got %d", replicas)
	}
	switch {
	case replicas <= 0:
	case timeout < Duration(time.Millisecond):
		v.errorf(prefix+".wait_timeout", "must be 1ms or more, got %s", timeout)
	case timeout >= readTimeout:
		v.errorf(prefix+".wait_timeout", "must be below upstream.read_timeout (%s), got %s", readTimeout, timeout)
	}
}

func (v *validator) positive(key string, d Duration) {
	if d <= 0 {
		v.errorf(key, "must be > 0, got %s", d)
	}
}

func (v *validator) nonNegative(key string, d Duration) {
	if d < 0 {
		v.errorf(key, "must not be negative, got %s", d)
	}
}

// String returns c as YAML with every Secret masked, for logs and for the
// validate-only command-line mode. A secret read from a file prints as ""
// beside its file, so that the printed config reads the file again.
func (c *Config) String() string {
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(c.secretsAsFiles()); err != nil {
		return "config: cannot print: " + err.Error()
	}
	if err := enc.Close(); err != nil {
		return "config: cannot print: " + err.Error()
	}
	return b.String()
}

// joinErrors returns nil for no errors, the error itself for one, and
// errors.Join of all otherwise.
func joinErrors(errs []*Error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	all := make([]error, len(errs))
	for i, e := range errs {
		all[i] = e
	}
	return errors.Join(all...)
}
