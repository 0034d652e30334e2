// Package cli is the hotkeyproxy command line: serving (flags, config file,
// live reload, graceful stop), and the demo, bench, healthcheck and
// reconcile subcommands.
//
//	hotkeyproxy [--config proxy.yaml] [--listen addr] [--upstream a,b] [--upstream-mode m] [--metrics-listen addr]
//	hotkeyproxy --check-config proxy.yaml
//	hotkeyproxy demo
//	hotkeyproxy bench seckill [flags]
//	hotkeyproxy healthcheck [--config proxy.yaml] [--addr host:port]
//	hotkeyproxy reconcile --addr host:port --key KEY
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/signal"
	"strings"
	"syscall"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/gomaxprocs"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
)

// Main runs the command line args (without the program name) and returns
// the exit status. shippedConfig is proxy.yaml as shipped: the demo takes
// its deduct scripts, so that the commands it prints are the documented ones.
func Main(args []string, shippedConfig []byte, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "demo" {
		return runDemo(args[1:], shippedConfig, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "bench" {
		return runBench(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "healthcheck" {
		return runHealthcheck(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "reconcile" {
		return runReconcile(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("hotkeyproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage:
  hotkeyproxy [flags]                    serve (defaults, or --config FILE)
  hotkeyproxy --check-config FILE [flags]  validate FILE with the flags applied, then exit
  hotkeyproxy demo [--listen addr]       a proxy in front of a Redis it starts itself
  hotkeyproxy bench seckill [flags]      a flash sale against any address (--help)
  hotkeyproxy healthcheck [flags]        exit 0 if a running proxy is ready (--help)
  hotkeyproxy reconcile --addr A --key K  check a journaled hot key's journal against its buckets (--help)
flags:
`)
		fs.PrintDefaults()
	}
	path := fs.String("config", "", "config file (proxy.yaml); empty: built-in defaults")
	check := fs.String("check-config", "", "validate this config file and exit")
	listen := fs.String("listen", "", "client-facing address, overrides listen")
	upstream := fs.String("upstream", "", "upstream host:port[,host:port…], overrides upstream.addrs")
	mode := fs.String("upstream-mode", "", "standalone or cluster, overrides upstream.mode")
	metricsListen := fs.String("metrics-listen", "", `host:port serving /metrics, /healthz and /readyz, overrides metrics.listen ("" disables)`)
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
	if !flagSet(fs, "metrics-listen") {
		metricsListen = nil
	}
	cfg, err := loadConfig(*path, *listen, *upstream, *mode, metricsListen)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *check != "" {
		fmt.Fprintf(stdout, "%s: ok\n", *check)
		return 0
	}
	level := new(slog.LevelVar)
	log := newLogger(cfg.Log, level, stderr)
	srv, err := proxy.New(cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go gomaxprocs.Run(ctx, log)
	if *path != "" {
		r := &reloader{path: *path, srv: srv, log: log, level: level, load: func() (*config.Config, error) {
			return loadConfig(*path, *listen, *upstream, *mode, metricsListen)
		}}
		srv.SetReloader(func() error { return r.reload("PROXY CONFIG RELOAD") })
		go r.watch(ctx)
	}
	if err := serve(srv, cfg, log, nil); err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	return 0
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// loadConfig reads the file (or the defaults) and applies flag overrides,
// then validates the result so a bad flag is reported like a bad field.
// metricsListen overrides metrics.listen when not nil, "" included.
func loadConfig(path, listen, upstream, mode string, metricsListen *string) (*config.Config, error) {
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
	if metricsListen != nil {
		cfg.Metrics.Listen = *metricsListen
	}
	return cfg, cfg.Validate()
}

// newLogger makes the proxy's logger as c says; its level follows level,
// which it sets to c.Level, so that a reload can change it.
func newLogger(c config.Log, level *slog.LevelVar, w io.Writer) *slog.Logger {
	level.Set(logLevel(c.Level))
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
	// Both listeners are bound before either serves, so that a taken
	// address stops the proxy before any client is served.
	var lns []net.Listener
	for _, addr := range []string{cfg.Listen, cfg.TLS.Listen} {
		if addr == "" {
			lns = append(lns, nil)
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lns {
				if l != nil {
					l.Close()
				}
			}
			return err
		}
		lns = append(lns, ln)
	}
	errc := make(chan error, 2)
	served := 0
	for i, serve := range []func(net.Listener) error{srv.Serve, srv.ServeTLS} {
		if lns[i] != nil {
			served++
			go func() { errc <- serve(lns[i]) }()
		}
	}
	log.Info("hotkeyproxy listening", "listen", addrOf(lns[0]), "tls_listen", addrOf(lns[1]),
		"upstream_mode", cfg.Upstream.Mode, "upstream", strings.Join(cfg.Upstream.Addrs, ","), "upstream_tls", cfg.Upstream.TLS.Enabled)
	metricsDone := serveMetrics(srv, cfg, log)
	if listening != nil {
		listening()
	}
	var serveErr error
	select {
	case serveErr = <-errc:
		served--
		if serveErr == nil {
			return nil
		}
		// One listener failed: stop the other too, as for a signal.
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout.Duration())
	defer cancel()
	err := srv.Shutdown(sctx)
	<-metricsDone // Shutdown closed it
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	for range served {
		if e := <-errc; serveErr == nil {
			serveErr = e
		}
	}
	return serveErr
}

// addrOf is ln's address for the log, "" without a listener.
func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// serveMetrics serves srv's /metrics, /healthz and /readyz on
// metrics.listen, when set, until srv shuts down; the channel closes then.
// When the address cannot be bound, the proxy serves clients without them
// rather than not at all, and logs it: /readyz does not answer, which a
// health check reports.
func serveMetrics(srv *proxy.Server, cfg *config.Config, log *slog.Logger) <-chan struct{} {
	done := make(chan struct{})
	if cfg.Metrics.Listen == "" {
		close(done)
		return done
	}
	ln, err := net.Listen("tcp", cfg.Metrics.Listen)
	if err != nil {
		log.Error("metrics not served", "metrics_listen", cfg.Metrics.Listen, "err", err)
		close(done)
		return done
	}
	go func() {
		defer close(done)
		if err := srv.ServeMetrics(ln); err != nil {
			log.Error("metrics stopped", "err", err)
		}
	}()
	log.Info("metrics listening", "metrics_listen", ln.Addr().String())
	return done
}
