package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// runHealthcheck asks a running proxy's /readyz and exits 0 when it says
// ready, 1 when it says not ready or does not answer, with one line saying
// which: a container's HEALTHCHECK, a script's gate.
func runHealthcheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hotkeyproxy healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: hotkeyproxy healthcheck [flags]

Asks the /readyz endpoint of a running hotkeyproxy, at --addr or else at
metrics.listen of --config (or of the built-in defaults: 127.0.0.1:9121),
and exits 0 when it is ready (its upstream answers), 1 otherwise. An
unspecified host (0.0.0.0, ::) is asked on the loopback address.

flags:
`)
		fs.PrintDefaults()
	}
	path := fs.String("config", "", "config file whose metrics.listen to ask; empty: built-in defaults")
	addr := fs.String("addr", "", "host:port of the proxy's metrics listener; overrides --config")
	timeout := fs.Duration("timeout", 3*time.Second, "longest wait for the answer")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hotkeyproxy healthcheck: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintln(stderr, "hotkeyproxy healthcheck: --timeout must be positive")
		return 2
	}
	target := *addr
	if target == "" {
		cfg, err := loadConfig(*path, "", "", "", nil)
		if err != nil {
			fmt.Fprintln(stderr, "hotkeyproxy healthcheck:", err)
			return 1
		}
		if target = cfg.Metrics.Listen; target == "" {
			fmt.Fprintln(stderr, "hotkeyproxy healthcheck: metrics.listen is empty, so the proxy serves no /readyz; give --addr")
			return 1
		}
	}
	url, err := readyURL(target)
	if err != nil {
		fmt.Fprintln(stderr, "hotkeyproxy healthcheck:", err)
		return 2
	}
	ready, msg := askReady(url, *timeout)
	if !ready {
		fmt.Fprintf(stderr, "hotkeyproxy healthcheck: %s: %s\n", url, msg)
		return 1
	}
	fmt.Fprintf(stdout, "hotkeyproxy healthcheck: %s: %s\n", url, msg)
	return 0
}

// readyURL is the /readyz URL of the metrics listener at addr, with an
// unspecified host replaced by the loopback address.
func readyURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("want host:port, got %q", addr)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}

// askReady GETs url and reports whether it answered 200, with the first
// line of its answer (or why there was none).
func askReady(url string, timeout time.Duration) (ready bool, msg string) {
	client := &http.Client{Timeout: timeout}
	res, err := client.Get(url)
	if err != nil {
		return false, "no answer: " + err.Error()
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
	msg, _, _ = strings.Cut(strings.TrimSpace(string(body)), "\n")
	if res.StatusCode != http.StatusOK {
		return false, fmt.Sprintf("%s (HTTP %d)", msg, res.StatusCode)
	}
	return true, msg
}
