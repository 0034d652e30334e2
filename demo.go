package main

import (
	"flag"
	"fmt"
	"io"
	"net"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
)

// runDemo starts a Redis of its own (redis-server when on PATH, otherwise an
// embedded miniredis), serves the proxy in front of it, and stops both on
// Ctrl-C.
func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hotkeyproxy demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:6380", "client-facing address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rs, err := localredis.Start(localredis.Options{Embedded: !localredis.Available()})
	if err != nil {
		fmt.Fprintln(stderr, "hotkeyproxy demo:", err)
		return 1
	}
	defer rs.Stop()
	kind := "redis-server (pid " + fmt.Sprint(rs.Pid()) + ")"
	if rs.Embedded() {
		kind = "an embedded miniredis (install redis-server for the real thing)"
	}

	cfg := config.Default()
	cfg.Listen = *listen
	cfg.Upstream.Addrs = []string{rs.Addr()}
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
  redis-cli -p %[4]s set stock:sku:1001 100
  redis-cli -p %[4]s decr stock:sku:1001
  redis-cli -p %[4]s get stock:sku:1001
  redis-benchmark -p %[4]s -q -t set,get -n 100000 -P 16

Ctrl-C stops the proxy and the Redis it started.
`, kind, rs.Addr(), cfg.Listen, p)
	}
	if err := serve(srv, cfg, log, banner); err != nil {
		fmt.Fprintln(stderr, "hotkeyproxy demo:", err)
		return 1
	}
	return 0
}

func port(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return p
}
