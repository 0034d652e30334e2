package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/hotkeyproxy/hotkeyproxy/internal/seckill"
)

// runBench runs a load generator named by args[0]; seckill is the only one.
func runBench(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "seckill" {
		fmt.Fprint(stderr, "usage: hotkeyproxy bench seckill [flags]   (--help for the flags)\n")
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return 0
		}
		return 2
	}
	return runSeckill(args[1:], stdout, stderr)
}

// runSeckill runs one flash sale and prints its result. It exits 1 when the
// sale could not start or broke a guarantee (oversell, false sold-out,
// stock left after sold out), so scripts and CI can gate on it.
func runSeckill(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hotkeyproxy bench seckill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: hotkeyproxy bench seckill [flags]

Sells --stock units of --key at --addr with --clients concurrent buyers and
prints throughput, latency, units sold, oversell and false sold-outs (a
deduct that succeeds after any client was told sold out). Unless --no-setup,
the key is first SET to --stock: point it at a key that sells nothing real.
The sale ends when every client has been told sold out, after --duration,
or after --requests deducts. Exits 1 if the sale oversold, answered a false
sold-out or left stock after every client was told sold out, or, with
--journal, if the journal's deducts differ from the units sold.
The password may also come from $REDISCLI_AUTH, as for redis-cli.

flags:
`)
		fs.PrintDefaults()
	}
	var (
		opts seckill.Options
		mode string
		js   bool
	)
	fs.StringVar(&opts.Addr, "addr", seckill.DefaultAddr, "host:port to sell from (a proxy or a Redis)")
	fs.StringVar(&opts.Key, "key", seckill.DefaultKey, "stock key")
	fs.Int64Var(&opts.Stock, "stock", 100000, "units for sale")
	fs.IntVar(&opts.Clients, "clients", seckill.DefaultClients, "concurrent buyers, one connection each")
	fs.StringVar(&mode, "mode", string(seckill.ModeScript), "script (EVALSHA of the deduct script as shipped in proxy.yaml: deduct-one, or deduct-n with --amount) or decr (DECR, INCR back if negative)")
	fs.Int64Var(&opts.Amount, "amount", 1, "units per deduct; > 1 uses the deduct-n script or DECRBY")
	fs.DurationVar(&opts.Duration, "duration", seckill.DefaultDuration, "longest the sale may run")
	fs.Int64Var(&opts.Requests, "requests", 0, "most deducts to send in all; 0: no limit")
	fs.StringVar(&opts.Password, "password", "", "AUTH password (default $REDISCLI_AUTH)")
	fs.BoolVar(&opts.NoSetup, "no-setup", false, "do not SET the key to --stock first")
	fs.BoolVar(&opts.Journal, "journal", false, "check at the end that the key's journal (a hotkeyproxy hot key with journal: true) deducts exactly the units sold")
	fs.BoolVar(&opts.OrderIDs, "order-ids", false, "pass an order id with every deduct, as the script's last ARGV (declare it as order_id in proxy.yaml); with --journal, check entry for entry")
	fs.BoolVar(&js, "json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hotkeyproxy bench seckill: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	opts.Mode = seckill.Mode(mode)
	if opts.Password == "" {
		opts.Password = os.Getenv("REDISCLI_AUTH")
	}
	// Zero means "default" in Options; on the command line it is a mistake.
	if opts.Clients < 1 || opts.Amount < 1 || opts.Duration <= 0 {
		fmt.Fprintln(stderr, "hotkeyproxy bench seckill: --clients, --amount and --duration must be positive")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := seckill.Run(ctx, opts)
	if err != nil {
		fmt.Fprintln(stderr, "hotkeyproxy bench seckill:", err)
		return 1
	}
	if js {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(stderr, "hotkeyproxy bench seckill:", err)
			return 1
		}
	} else {
		fmt.Fprint(stdout, res.String())
	}
	if len(res.Violations()) > 0 {
		return 1
	}
	return 0
}
