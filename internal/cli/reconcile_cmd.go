package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"
)

// runReconcile asks a running proxy to reconcile a journaled hot key
// (PROXY RECONCILE) and prints its findings, one line per bucket and one
// in total; the exit status is 0 when the journal and the buckets agree,
// 1 when they differ, 2 when they could not be compared: for cron jobs.
func runReconcile(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hotkeyproxy reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: hotkeyproxy reconcile --addr host:port --key KEY [flags]

Asks the hotkeyproxy at --addr to check the journal of the hot key KEY
against its buckets (PROXY RECONCILE) and prints, per bucket and in
total, whether the journal (the units set, less deducts, plus give-backs)
explains what the buckets hold, and where and by how much it does not.
Exit status: 0 clean, 1 a difference (or a lost bucket), 2 not compared
(a journal without entries, the proxy unreachable, a bad flag).

flags:
`)
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:6380", "host:port of the proxy's client listener")
	key := fs.String("key", "", "the journaled hot key (required)")
	password := fs.String("password", "", "AUTH password, when the proxy has one")
	timeout := fs.Duration("timeout", 30*time.Second, "longest wait for the answer")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "hotkeyproxy reconcile: unexpected argument %q\n", fs.Arg(0))
		return 2
	case *key == "":
		fmt.Fprintln(stderr, "hotkeyproxy reconcile: --key is required")
		return 2
	}
	c := redis.NewClient(&redis.Options{Addr: *addr, Password: *password, Protocol: 2, MaxRetries: -1,
		ReadTimeout: *timeout, DisableIdentity: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	v, err := c.Do(ctx, "PROXY", "RECONCILE", *key).Result()
	if err != nil {
		fmt.Fprintf(stderr, "hotkeyproxy reconcile: %s: %v\n", *addr, err)
		return 2
	}
	r := fieldsOf(v)
	for _, b := range asList(r["buckets"]) {
		fmt.Fprintln(stdout, fieldsOf(b)["note"])
	}
	status := fmt.Sprint(r["status"])
	fmt.Fprintf(stdout, "%s: %s: the buckets hold %v, the journal says %v (set %v, deducted %v, given back %v): a difference of %v\n",
		*key, status, r["buckets_hold"], r["journal_says"], r["set"], r["deducted"], r["given_back"], r["difference"])
	switch status {
	case "clean":
		return 0
	case "differs":
		return 1
	}
	return 2
}

// fieldsOf reads a reply of field, value pairs.
func fieldsOf(v any) map[string]any {
	m := map[string]any{}
	l := asList(v)
	for i := 0; i+1 < len(l); i += 2 {
		m[fmt.Sprint(l[i])] = l[i+1]
	}
	return m
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}
