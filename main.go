// Command hotkeyproxy is a Redis-protocol proxy that spreads hot counters
// over buckets. See README.md; the command line is internal/cli's.
package main

import (
	_ "embed"
	"os"

	"github.com/hotkeyproxy/hotkeyproxy/internal/cli"
)

// shippedConfig is proxy.yaml as shipped, for the demo.
//
//go:embed proxy.yaml
var shippedConfig []byte

func main() {
	os.Exit(cli.Main(os.Args[1:], shippedConfig, os.Stdout, os.Stderr))
}
