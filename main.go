// Command hotkeyproxy is a Redis-protocol proxy that spreads hot counters
// over buckets. See README.md.
//
//	hotkeyproxy [--config proxy.yaml] [--listen addr] [--upstream a,b] [--upstream-mode m]
//	hotkeyproxy --check-config proxy.yaml
//	hotkeyproxy demo
//	hotkeyproxy bench seckill [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the exit, so tests can call it.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "demo" {
		return runDemo(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "bench" {
		return runBench(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("hotkeyproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage:
  hotkeyproxy [flags]                    serve (defaults, or --config FILE)
  hotkeyproxy --check-config FILE [flags]  validate FILE with the flags applied, then exit
  hotkeyproxy demo [--listen addr]       a proxy in front of a Redis it starts itself
  hotkeyproxy bench seckill [flags]      a flash sale against any address (--help)
flags:
`)
		fs.PrintDefaults()
	}
	path := fs.String("config", "", "config file (proxy.yaml); empty: built-in defaults")
	check := fs.String("check-config", "", "validate this config file and exit")
	listen := fs.String("listen", "", "client-facing address, overrides listen")
	upstream := fs.String("upstream", "", "upstream host:port[,host:port…], overrides upstream.addrs")
	mode := fs.String("upstream-mode", "", "standalone or cluster, overrides upstream.mode")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hotkeyproxy: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *check != "" {
		*path = *check
	}
	cfg, err := loadConfig(*path, *listen, *upstream, *mode)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *check != "" {
		fmt.Fprintf(stdout, "%s: ok\n", *check)
		return 0
	}
	log := newLogger(cfg.Log, stderr)
	srv, err := proxy.New(cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if err := serve(srv, cfg, log, nil); err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	return 0
}

// loadConfig reads the file (or the defaults) and applies flag overrides,
// then validates the result so a bad flag is reported like a bad field.
func loadConfig(path, listen, upstream, mode string) (*config.Config, error) {
	cfg := config.Default()
	if path != "" {
		var err error
		if cfg, err = config.Load(path); err != nil {
			return nil, err
		}
	}
	if listen != "" {
		cfg.Listen = listen
	}
	if upstream != "" {
		cfg.Upstream.Addrs = strings.Split(upstream, ",")
	}
	if mode != "" {
		cfg.Upstream.Mode = mode
	}
	return cfg, cfg.Validate()
}

func newLogger(c config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(c.Level)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == config.FormatJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs srv until SIGINT or SIGTERM, then stops it gracefully within
// shutdown_timeout. listening, if set, runs once the address is bound.
func serve(srv *proxy.Server, cfg *config.Config, log *slog.Logger, listening func()) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("hotkeyproxy listening", "listen", ln.Addr().String(),
		"upstream_mode", cfg.Upstream.Mode, "upstream", strings.Join(cfg.Upstream.Addrs, ","))
	if listening != nil {
		listening()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout.Duration())
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return <-errc
}
