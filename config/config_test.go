package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// articleScripts are the two deduct scripts of the articles, as the shipped
// proxy.yaml declares them.
var articleScripts = []Script{
	{
		Name:    "deduct-one",
		Body:    "if tonumber(redis.call('get', KEYS[1]) or '0') > 0 then return redis.call('decr', KEYS[1]) else return -1 end",
		Amount:  Amount{Const: 1},
		Soldout: -1,
		OrderID: 1,
	},
	{
		Name:    "deduct-n",
		Body:    "local n = tonumber(ARGV[1]) local s = tonumber(redis.call('get', KEYS[1]) or '0') if s >= n then return redis.call('decrby', KEYS[1], n) else return -1 end",
		Amount:  Amount{ArgvIndex: 1},
		Soldout: -1,
		OrderID: 2,
	},
}

func mustParse(t *testing.T, yml string) *Config {
	t.Helper()
	c, err := Parse([]byte(yml))
	if err != nil {
		t.Fatalf("Parse(%q): %v", yml, err)
	}
	return c
}

func TestDefaultIsEmptyFile(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	for _, tc := range []struct{ name, yml string }{
		{"empty", ""},
		{"comments only", "# nothing here\n\n"},
		{"empty mapping", "{}"},
		{"document marker", "---\n"},
		{"empty sections", "upstream:\nlimits:\nlog:\nhotkeys:\n  keys:\n  detect:\nscripts:\nmetrics:\n"},
		{"empty lists", "hotkeys:\n  keys: []\n  detect:\n    promote: []\nscripts: []\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mustParse(t, tc.yml); !reflect.DeepEqual(got, Default()) {
				t.Errorf("got\n%s\nwant Default()\n%s", got, Default())
			}
		})
	}
}

func TestDefaultReturnsCopies(t *testing.T) {
	a := Default()
	a.Upstream.Addrs[0] = "changed:1"
	a.Listen = "changed:2"
	if b := Default(); b.Upstream.Addrs[0] != "127.0.0.1:6379" || b.Listen != "127.0.0.1:6380" {
		t.Errorf("Default shares state between calls: %+v", b)
	}
}

// TestShippedProxyYAML checks that the documented default config in the
// repository root loads, and that it documents the real defaults: it must
// equal Default() plus its example key and scripts.
func TestShippedProxyYAML(t *testing.T) {
	got, err := Load("../proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Hotkeys.Keys = []KeyRule{{Match: "stock:sku:1001", Buckets: 8, Route: RouteRandom, WaitTimeout: DefaultWaitTimeout}}
	want.Scripts = articleScripts
	if !reflect.DeepEqual(got, want) {
		t.Errorf("../proxy.yaml loads as\n%s\nwant\n%s", got, want)
	}
	if got.Hotkeys.Detect.Enabled {
		t.Error("the shipped proxy.yaml must not enable the detector")
	}
}

func TestValidFile(t *testing.T) {
	got, err := Load("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Listen:   ":7000",
		TLS:      defaultTLS(),
		Password: "client-secret",
		Upstream: Upstream{
			Mode:         ModeCluster,
			Addrs:        []string{"10.0.0.1:7000", "10.0.0.2:7000", "[::1]:7002"},
			Username:     "proxy",
			Password:     "upstream-secret",
			ConnsPerNode: 4,
			DialTimeout:  Duration(250 * time.Millisecond),
			ReadTimeout:  Duration(2 * time.Second),
			ClientAuth:   ClientAuthProxy,
		},
		Limits: Limits{
			MaxClients:  500,
			QueryBuffer: 64 * MB,
			MaxBulk:     1 * MB,
			IdleTimeout: Duration(5 * time.Minute),

			MaxClientsPerIP:  20,
			MaxPendingOutput: 1 * MB,
			MaxClientMemory:  2 * GB,
			AuthFailureDelay: Duration(time.Second),
		},
		ShutdownTimeout: Duration(30 * time.Second),
		Log:             Log{Level: LevelDebug, Format: FormatJSON},
		Hotkeys: Hotkeys{
			Keys: []KeyRule{
				{Match: "stock:sku:*", Route: RouteRandom, WaitTimeout: DefaultWaitTimeout},
				{Match: "stock:sku:1001", Buckets: 16, Route: RouteClient, WaitReplicas: 1, WaitTimeout: Duration(250 * time.Millisecond), Journal: true},
			},
			Detect: Detect{
				Enabled:      true,
				SampleRate:   1,
				Window:       Duration(2 * time.Second),
				Threshold:    100.5,
				Capacity:     50,
				Promote:      []string{"stock:*", "seckill:?:count"},
				DryRun:       true,
				Demote:       true,
				WaitReplicas: 2,
				WaitTimeout:  Duration(50 * time.Millisecond),
				Journal:      true,
			},
			ReadStaleness: Duration(250 * time.Millisecond),
			MoveTimeout:   Duration(500 * time.Millisecond),
			JournalMaxlen: 100000,
		},
		Scripts: []Script{
			{Name: "take", Body: "return redis.call('decrby', KEYS[1], ARGV[2])", Amount: Amount{ArgvIndex: 2}, OrderID: 1},
			{Name: "take-three", Body: "return redis.call('decrby', KEYS[1], 3)", Amount: Amount{Const: 3}},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%#v\nwant\n%#v", got, want)
	}
}

// TestInvalidFixtures loads each file in testdata/invalid and checks that
// its error names the field. Every fixture must have a row here.
func TestInvalidFixtures(t *testing.T) {
	tests := []struct {
		file string
		want string // substring of the error
	}{
		{"listen-empty", "line 1: listen: must be host:port"},
		{"listen-no-port", `listen: must be host:port, got "127.0.0.1"`},
		{"listen-null", "line 1: listen: has no value"},
		{"unknown-top", "line 2: lisen: unknown field"},
		{"unknown-nested", "line 3: upstream.adrs: unknown field"},
		{"unknown-in-list", "line 4: hotkeys.keys[0].bucket: unknown field"},
		{"unknown-flow", "line 1: hotkeys.detect.sample: unknown field"},
		{"upstream-mode", `line 2: upstream.mode: must be "standalone" or "cluster", got "foo"`},
		{"upstream-addrs-empty", "upstream.addrs: must list at least one"},
		{"upstream-addrs-standalone-two", "upstream.addrs: standalone mode takes exactly one address"},
		{"upstream-addr-no-port", `line 3: upstream.addrs[1]: must be host:port, got "localhost"`},
		{"upstream-addr-no-host", "upstream.addrs[0]: needs a host"},
		{"upstream-addr-port-zero", "upstream.addrs[0]: bad port"},
		{"upstream-addr-dup", "upstream.addrs[1]: \"127.0.0.1:7000\" is listed twice"},
		{"upstream-conns-zero", "upstream.conns_per_node: must be 1..64, got 0"},
		{"upstream-conns-too-many", "upstream.conns_per_node: must be 1..64, got 65"},
		{"upstream-dial-timeout-zero", "upstream.dial_timeout: must be > 0"},
		{"upstream-dial-timeout-bad", `upstream.dial_timeout: want a duration such as "250ms" or "1s", got "soon"`},
		{"upstream-dial-timeout-number", `upstream.dial_timeout: want a duration`},
		{"upstream-read-timeout-zero", "line 2: upstream.read_timeout: must be > 0, got 0s"},
		{"upstream-password-list", "upstream.password: want a string, got a list"},
		{"limits-max-clients-zero", "limits.max_clients: must be >= 1"},
		{"limits-max-clients-string", `line 2: limits.max_clients: want an integer, got "lots"`},
		{"limits-query-buffer-small", "limits.query_buffer: must be >= 1kb"},
		{"limits-query-buffer-unit", `limits.query_buffer: want a size such as "512mb"`},
		{"limits-max-bulk-small", "limits.max_bulk: must be >= 1kb"},
		{"limits-max-bulk-over-query-buffer", "limits.max_bulk: must be <= limits.query_buffer (1mb), got 512mb"},
		{"limits-max-bulk-negative", "limits.max_bulk: want a non-negative number of bytes"},
		{"limits-idle-timeout-negative", "limits.idle_timeout: must not be negative"},
		{"limits-max-clients-per-ip-negative", "line 2: limits.max_clients_per_ip: must be 0 (no limit) or more, got -1"},
		{"limits-max-pending-output-small", "line 2: limits.max_pending_output: must be 0 (off) or >= 64kb, got 1kb"},
		{"limits-max-client-memory-small", "line 2: limits.max_client_memory: must be 0 (no bound) or >= 1mb, got 64kb"},
		{"limits-auth-failure-delay-long", "line 2: limits.auth_failure_delay: must be 0s..10s, got 1m0s"},
		{"limits-auth-failure-delay-negative", "limits.auth_failure_delay: must be 0s..10s, got -1s"},
		{"password-and-password-file", "line 2: password_file: set password or password_file, not both"},
		{"upstream-client-auth-with-password", `line 3: upstream.client_auth: "redis" has Redis check clients' passwords: password and password_file must be empty`},
		{"upstream-client-auth-word", `line 2: upstream.client_auth: must be "proxy" or "redis", got "acl"`},
		{"upstream-password-file-missing", "line 3: upstream.password_file: open testdata/invalid/no-such-password-file: no such file or directory"},
		{"password-env-unset", "line 1: password: environment variable HOTKEYPROXY_TEST_UNSET_VARIABLE is not set"},
		{"password-env-malformed", `line 1: password: "${" must start a reference to an environment variable`},
		{"shutdown-timeout-zero", "shutdown_timeout: must be > 0"},
		{"log-level", `log.level: must be "debug", "info", "warn" or "error", got "verbose"`},
		{"log-format", `log.format: must be "text" or "json", got "xml"`},
		{"hotkeys-match-empty", "line 3: hotkeys.keys[0].match: must not be empty"},
		{"hotkeys-match-missing", "line 3: hotkeys.keys[0].match: must not be empty"},
		{"hotkeys-match-dup", `hotkeys.keys[1].match: "stock:sku:1" is listed twice`},
		{"hotkeys-buckets-one", "hotkeys.keys[0].buckets: must be 0 (default) or 2..1024, got 1"},
		{"hotkeys-buckets-too-many", "hotkeys.keys[0].buckets: must be 0 (default) or 2..1024, got 1025"},
		{"hotkeys-route", `hotkeys.keys[0].route: must be "random" or "client", got "roundrobin"`},
		{"hotkeys-wait-replicas-negative", "hotkeys.keys[0].wait_replicas: must be >= 0, got -1"},
		{"hotkeys-wait-timeout-short", "hotkeys.keys[0].wait_timeout: must be 1ms or more, got 500µs"},
		{"hotkeys-wait-timeout-long", "hotkeys.keys[0].wait_timeout: must be below upstream.read_timeout (5s), got 5s"},
		{"detect-wait-timeout-zero", "hotkeys.detect.wait_timeout: must be 1ms or more, got 0s"},
		{"hotkeys-keys-mapping", "hotkeys.keys: want a list, got a mapping"},
		{"detect-sample-rate-zero", "hotkeys.detect.sample_rate: must be in (0, 1]"},
		{"detect-sample-rate-over-one", "hotkeys.detect.sample_rate: must be in (0, 1], got 1.5"},
		{"detect-window-zero", "hotkeys.detect.window: must be > 0"},
		{"detect-threshold-zero", "hotkeys.detect.threshold: must be a number > 0"},
		{"detect-threshold-inf", "hotkeys.detect.threshold: must be a number > 0, got +Inf"},
		{"detect-capacity-zero", "hotkeys.detect.capacity: must be >= 1"},
		{"detect-promote-bad-pattern", `hotkeys.detect.promote[1]: bad glob pattern "stock:[a"`},
		{"detect-promote-empty", "hotkeys.detect.promote[0]: must not be empty"},
		{"detect-enabled-not-bool", `hotkeys.detect.enabled: want true or false, got "yes please"`},
		{"soldout-ttl-negative", "hotkeys.soldout_ttl: must not be negative"},
		{"read-staleness-negative", "hotkeys.read_staleness: must not be negative"},
		{"move-timeout-zero", "hotkeys.move_timeout: must be > 0"},
		{"journal-maxlen-negative", "line 2: hotkeys.journal_maxlen: must be 0 (trimmed by the consumers) or more, got -1"},
		{"scripts-order-id-word", `line 2: scripts[0].order_id: want "argv:N" with N >= 1, got "order"`},
		{"scripts-order-id-amount", `line 2: scripts[0].order_id: names ARGV[1], the amount`},
		{"scripts-name-empty", "line 2: scripts[0].name: must not be empty"},
		{"scripts-name-dup", `line 3: scripts[1].name: "d" is listed twice`},
		{"scripts-body-empty", "scripts[0].body: must not be empty"},
		{"scripts-body-dup", "scripts[1].body: \"return 1\" is listed twice (also scripts[0].body)"},
		{"scripts-amount-missing", "scripts[0].amount: is required"},
		{"scripts-amount-zero", `scripts[0].amount: want a positive integer such as 1 or "argv:N" with N >= 1, got "0"`},
		{"scripts-amount-argv-zero", `scripts[0].amount: want a positive integer`},
		{"scripts-amount-word", `scripts[0].amount: want a positive integer`},
		{"scripts-amount-flow", `line 2: scripts[0].amount: want a positive integer such as 1 or "argv:N" with N >= 1, got "argv:x"`},
		{"scripts-soldout-string", `line 5: scripts[0].soldout: want an integer, got "none"`},
		{"metrics-listen-bad", `metrics.listen: must be host:port, got "9121"`},
		{"metrics-listen-same", "metrics.listen: must differ from listen"},
		{"tls-min-version", `line 4: tls.min_version: must be "1.2" or "1.3", got "1.1"`},
		{"tls-cert-without-listen", "line 2: tls.cert_file: is set, but tls.listen is empty"},
		{"tls-listen-no-cert", "line 1: tls.cert_file: is required when tls.listen is set"},
		{"tls-listen-same", "line 3: tls.listen: must differ from listen (127.0.0.1:6380)"},
		{"tls-handshake-timeout-zero", "tls.handshake_timeout: must be > 0"},
		{"upstream-tls-not-enabled", "line 3: upstream.tls.ca_file: is set, but upstream.tls.enabled is false"},
		{"upstream-tls-cert-no-key", "upstream.tls.key_file: is required when upstream.tls.cert_file is set"},
		{"upstream-tls-ca-missing", "line 4: upstream.tls.ca_file: cannot read: open testdata/no-such-ca.pem: no such file or directory"},
		{"not-a-mapping", "line 1: want a mapping of keys"},
		{"syntax-error", "bad YAML"},
		{"duplicate-key", `mapping key "listen" already defined`},
		{"two-documents", "more than one YAML document"},
	}

	files, err := filepath.Glob("testdata/invalid/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var covered []string
	for _, tc := range tests {
		file := filepath.Join("testdata", "invalid", tc.file+".yaml")
		covered = append(covered, file)
		t.Run(tc.file, func(t *testing.T) {
			c, err := Load(file)
			if err == nil {
				t.Fatalf("Load succeeded:\n%s", c)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "config: "+file) {
				t.Errorf("error %q does not start with %q", err, "config: "+file)
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.File != file {
				t.Errorf("error %#v is not a *config.Error for %s", err, file)
			}
		})
	}
	for _, f := range files {
		if !slices.Contains(covered, f) {
			t.Errorf("fixture %s has no row in TestInvalidFixtures", f)
		}
	}
	if len(files) != len(tests) {
		t.Errorf("%d fixtures, %d rows", len(files), len(tests))
	}
}

func TestErrorText(t *testing.T) {
	tests := []struct {
		name string
		err  func() error
		want string
	}{
		{
			name: "Parse names line and path",
			err: func() error {
				_, err := Parse([]byte("listen: 127.0.0.1:6380\nupstream:\n  mode: foo\n"))
				return err
			},
			want: `config: line 3: upstream.mode: must be "standalone" or "cluster", got "foo"`,
		},
		{
			name: "Validate names path only",
			err: func() error {
				c := Default()
				c.Upstream.Mode = "foo"
				return c.Validate()
			},
			want: `config: upstream.mode: must be "standalone" or "cluster", got "foo"`,
		},
		{
			name: "Load names file",
			err: func() error {
				_, err := Load("testdata/invalid/unknown-top.yaml")
				return err
			},
			want: "config: testdata/invalid/unknown-top.yaml line 2: lisen: unknown field",
		},
		{
			name: "missing file",
			err: func() error {
				_, err := Load("testdata/no-such-file.yaml")
				return err
			},
			want: "config: open testdata/no-such-file.yaml: no such file or directory",
		},
		{
			name: "every problem at once, in file order",
			err: func() error {
				_, err := Parse([]byte("log:\n  level: loud\n  format: xml\nlisen: x\n"))
				return err
			},
			want: "config: line 4: lisen: unknown field",
		},
		{
			name: "every validation problem at once",
			err: func() error {
				_, err := Parse([]byte("log:\n  level: loud\n  format: xml\n"))
				return err
			},
			want: `config: line 2: log.level: must be "debug", "info", "warn" or "error", got "loud"` + "\n" +
				`config: line 3: log.format: must be "text" or "json", got "xml"`,
		},
		{
			name: "several decode problems",
			err: func() error {
				_, err := Parse([]byte("upstream: {dial_timeout: 5, conns_per_node: x}\nlimits: {max_bulk: 1tb}\n"))
				return err
			},
			want: `config: line 1: upstream.dial_timeout: want a duration such as "250ms" or "1s", got "5"` + "\n" +
				`config: line 1: upstream.conns_per_node: want an integer, got "x"` + "\n" +
				`config: line 2: limits.max_bulk: want a size such as "512mb", "64kb" or a number of bytes, got "1tb"`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			if err == nil {
				t.Fatal("no error")
			}
			if err.Error() != tc.want {
				t.Errorf("got\n%s\nwant\n%s", err, tc.want)
			}
		})
	}
}

func TestUnknownFieldRejected(t *testing.T) {
	tests := []struct {
		name, yml, want string
	}{
		{"top level", "listen: 127.0.0.1:6380\nlisen: 127.0.0.1:6381\n", "line 2: lisen: unknown field"},
		{"nested", "upstream:\n  passwd: x\n", "line 2: upstream.passwd: unknown field"},
		{"list item", "scripts:\n  - name: a\n    body: b\n    amount: 1\n    sold_out: -1\n", "line 5: scripts[0].sold_out: unknown field"},
		{"flow mapping", "log: {level: info, colour: true}\n", "line 1: log.colour: unknown field"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestNullValues(t *testing.T) {
	tests := []struct {
		name, yml string
		check     func(*Config) bool
	}{
		{"null section keeps defaults", "upstream:\n", func(c *Config) bool {
			return reflect.DeepEqual(c.Upstream, Default().Upstream)
		}},
		{"null list is empty", "hotkeys:\n  keys:\n", func(c *Config) bool { return c.Hotkeys.Keys == nil }},
		{"empty string is empty", "metrics:\n  listen: \"\"\n", func(c *Config) bool { return c.Metrics.Listen == "" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if c := mustParse(t, tc.yml); !tc.check(c) {
				t.Errorf("unexpected config:\n%s", c)
			}
		})
	}
	for _, yml := range []string{"metrics:\n  listen:\n", "limits:\n  query_buffer: ~\n", "scripts:\n  - {name: a, body: b, amount: null}\n"} {
		t.Run("scalar "+yml, func(t *testing.T) {
			if _, err := Parse([]byte(yml)); err == nil || !strings.Contains(err.Error(), "has no value") {
				t.Errorf("Parse(%q) error = %v, want \"has no value\"", yml, err)
			}
		})
	}
}

func TestRouteDefault(t *testing.T) {
	c := mustParse(t, "hotkeys:\n  keys:\n    - match: a\n    - match: b\n      route: client\n")
	if got := []string{c.Hotkeys.Keys[0].Route, c.Hotkeys.Keys[1].Route}; !slices.Equal(got, []string{RouteRandom, RouteClient}) {
		t.Errorf("routes = %v", got)
	}
}

func TestSecretsMasked(t *testing.T) {
	c := mustParse(t, "password: client-pw\nupstream:\n  password: upstream-pw\n")
	if string(c.Password) != "client-pw" || string(c.Upstream.Password) != "upstream-pw" {
		t.Fatalf("passwords not read: %q %q", string(c.Password), string(c.Upstream.Password))
	}
	s := c.String()
	for _, secret := range []string{"client-pw", "upstream-pw"} {
		if strings.Contains(s, secret) {
			t.Errorf("String() shows %q:\n%s", secret, s)
		}
	}
	if !strings.Contains(s, `password: '******'`) {
		t.Errorf("String() does not show the masked password:\n%s", s)
	}
	// The printed config is a config: it parses, to the same values except
	// the secrets.
	back := mustParse(t, s)
	back.Password, back.Upstream.Password = c.Password, c.Upstream.Password
	if !reflect.DeepEqual(back, c) {
		t.Errorf("String() does not parse back:\n%s", s)
	}
}

func TestScriptSHA1(t *testing.T) {
	// As redis-cli SCRIPT LOAD "return 1" answers.
	if got := (Script{Body: "return 1"}).SHA1(); got != "e0e1f9fabfc9d4800c877a703b823ac0578ff8db" {
		t.Errorf("SHA1 = %s", got)
	}
}

func TestValidateCodeBuiltConfig(t *testing.T) {
	c := Default()
	c.Upstream.Mode = ModeCluster
	c.Upstream.Addrs = []string{"127.0.0.1:7000", "127.0.0.1:7001"}
	c.Hotkeys.Keys = []KeyRule{{Match: "k", Buckets: 4, Route: RouteClient}}
	c.Scripts = articleScripts
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Scripts = append(slices.Clone(articleScripts), Script{Name: "both", Body: "x", Amount: Amount{Const: 1, ArgvIndex: 1}})
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "scripts[2].amount: has both") {
		t.Errorf("Validate = %v", err)
	}
}

// FuzzParse checks that no input panics and that whatever Parse accepts
// is valid and prints as YAML that parses again.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*/*.yaml")
	more, _ := filepath.Glob("testdata/*.yaml")
	for _, name := range append(append(files, more...), "../proxy.yaml") {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted an invalid config: %v", err)
		}
		if _, err := Parse([]byte(c.String())); err != nil {
			t.Fatalf("String() output does not parse: %v\n%s", err, c)
		}
	})
}
