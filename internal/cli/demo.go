package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
)

// runDemo starts a Redis of its own — a Redis Cluster of three masters
// when redis-server is on PATH, otherwise an embedded miniredis — serves
// the proxy in front of it, and stops both on Ctrl-C.
func runDemo(args []string, shippedConfig []byte, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hotkeyproxy demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:6380", "client-facing address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := config.Default()
	cfg.Listen = *listen
	shipped, err := config.Parse(shippedConfig)
	if err != nil {
		fmt.Fprintln(stderr, "hotkeyproxy demo: the shipped proxy.yaml:", err)
		return 1
	}
	cfg.Scripts = shipped.Scripts
	cfg.Hotkeys.Keys = []config.KeyRule{{Match: demoKey, Route: config.RouteRandom}}
	cfg.Metrics.Listen = ""
	var kind string
	if localredis.Available() {
		c, err := localredis.StartCluster(localredis.ClusterOptions{Masters: demoMasters})
		if err != nil {
			fmt.Fprintln(stderr, "hotkeyproxy demo:", err)
			return 1
		}
		defer c.Stop()
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Addrs = c.Seeds()
		kind = fmt.Sprintf("a Redis Cluster of %d masters (redis-server)", demoMasters)
	} else {
		rs, err := localredis.Start(localredis.Options{Embedded: true})
		if err != nil {
			fmt.Fprintln(stderr, "hotkeyproxy demo:", err)
			return 1
		}
		defer rs.Stop()
		cfg.Upstream.Addrs = []string{rs.Addr()}
		kind = "an embedded miniredis (install redis-server for a real Redis Cluster)"
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "hotkeyproxy demo:", err)
		return 1
	}
	log := newLogger(cfg.Log, new(slog.LevelVar), stderr)
	srv, err := proxy.New(cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, "hotkeyproxy demo:", err)
		return 1
	}
	banner := func() {
		stock := "it holds " + fmt.Sprint(demoStock) + " units in buckets"
		if err := setStock(cfg.Listen); err != nil {
			stock = "setting its stock failed: " + err.Error()
		}
		p := port(cfg.Listen)
		fmt.Fprintf(stdout, `hotkeyproxy demo
  upstream: %s on %s
  proxy:    %s
  hot key:  %s (%s)

Try, in another terminal:
  redis-cli -p %[6]s ping
  redis-cli -p %[6]s mset a 1 b 2 c 3      # keys on different masters
  redis-cli -p %[6]s mget a b c
  redis-cli -p %[6]s get %[4]s           # the sum of its buckets
  redis-cli -p %[6]s eval "%[8]s" 1 %[4]s
  redis-cli -p %[6]s decrby %[4]s 5
  redis-cli -p %[6]s proxy hotkeys         # each bucket: key, node, value
  go run . bench seckill --addr %[3]s --key %[4]s --stock %[7]d   # sell it all

Ctrl-C stops the proxy and the Redis it started.
`, kind, strings.Join(cfg.Upstream.Addrs, " "), cfg.Listen, demoKey, stock, p, demoStock, cfg.Scripts[0].Body)
	}
	if err := serve(srv, cfg, log, banner); err != nil {
		fmt.Fprintln(stderr, "hotkeyproxy demo:", err)
		return 1
	}
	return 0
}

// The demo's hot key and its stock.
const (
	demoKey   = "stock:demo"
	demoStock = 100000
)

// setStock sets the demo key's stock through the proxy, as a client would.
func setStock(addr string) error {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(nc, "SET %s %d\r\n", demoKey, demoStock)
	buf := make([]byte, 512)
	n, err := nc.Read(buf)
	if err != nil {
		return err
	}
	if reply := string(buf[:n]); reply != "+OK\r\n" {
		return fmt.Errorf("SET said %q", strings.TrimSpace(reply))
	}
	return nil
}

// demoMasters is the size of the demo's cluster: enough for hot-key
// buckets to spread, and for a replica-less cluster to stay small.
const demoMasters = 3

func port(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return p
}
