package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
)

// runDemo starts a Redis of its own — a Redis Cluster of three masters
// when redis-server is on PATH, otherwise an embedded miniredis — serves
// the proxy in front of it, and stops both on Ctrl-C.
func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hotkeyproxy demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:6380", "client-facing address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := config.Default()
	cfg.Listen = *listen
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
	log := newLogger(cfg.Log, stderr)
	srv, err := proxy.New(cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, "hotkeyproxy demo:", err)
		return 1
	}
	banner := func() {
		p := port(cfg.Listen)
		fmt.Fprintf(stdout, `hotkeyproxy demo
  upstream: %s on %s
  proxy:    %s

Try, in another terminal:
  redis-cli -p %[4]s ping
  redis-cli -p %[4]s mset a 1 b 2 c 3      # keys on different masters
  redis-cli -p %[4]s mget a b c
  redis-cli -p %[4]s dbsize
  redis-cli -p %[4]s set stock:sku:1001 100
  redis-cli -p %[4]s decr stock:sku:1001
  redis-benchmark -p %[4]s -q -t set,get -n 100000 -P 16

Ctrl-C stops the proxy and the Redis it started.
`, kind, strings.Join(cfg.Upstream.Addrs, " "), cfg.Listen, p)
	}
	if err := serve(srv, cfg, log, banner); err != nil {
		fmt.Fprintln(stderr, "hotkeyproxy demo:", err)
		return 1
	}
	return 0
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
