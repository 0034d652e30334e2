package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/seckill"
)

func TestBenchSeckillFlags(t *testing.T) {
	checkRuns(t, nil, nil, []runCase{
		{"help", []string{"bench", "seckill", "--help"}, 0, "--stock"},
		{"help names the checks", []string{"bench", "seckill", "-h"}, 0, "false sold-outs"},
		{"bench alone", []string{"bench"}, 2, "usage: hotkeyproxy bench seckill"},
		{"bench help", []string{"bench", "--help"}, 0, "usage: hotkeyproxy bench seckill"},
		{"unknown benchmark", []string{"bench", "sale"}, 2, "usage: hotkeyproxy bench seckill"},
		{"stray argument", []string{"bench", "seckill", "now"}, 2, `unexpected argument "now"`},
		{"zero clients", []string{"bench", "seckill", "--clients", "0"}, 2, "must be positive"},
		{"bad mode", []string{"bench", "seckill", "--mode", "incr"}, 1, `invalid mode "incr"`},
		{"bad flag", []string{"bench", "seckill", "--stock", "many"}, 2, "invalid value"},
		{"main usage lists it", []string{"--help"}, 0, "hotkeyproxy bench seckill"},
	})
}

func TestBenchSeckillRun(t *testing.T) {
	rs := redistest.Start(t, localredis.Options{})
	for _, mode := range []string{"script", "decr"} {
		t.Run(mode, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := []string{"bench", "seckill", "--addr", rs.Addr(), "--key", "stock:bench",
				"--stock", "1000", "--clients", "10", "--mode", mode, "--json"}
			if code := run(args, &out, &errOut); code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut.String())
			}
			var res seckill.Result
			if err := json.Unmarshal(out.Bytes(), &res); err != nil {
				t.Fatalf("%v in %s", err, out.String())
			}
			if res.Sold != 1000 || res.Final != 0 || res.Oversell != 0 || res.FalseSoldOuts != 0 || string(res.Mode) != mode {
				t.Errorf("result %+v", res)
			}
			out.Reset()
			if code := run(args[:len(args)-1], &out, &errOut); code != 0 || !strings.Contains(out.String(), "ok: no oversell") {
				t.Errorf("exit %d, table:\n%s", code, out.String())
			}
		})
	}
}
