package proxy

import (
	"strings"
	"testing"
	"time"
)

// TestBlockTimeout: each blocking command's own timeout is read where
// Redis 7.0 reads it, in its unit; 0 waits forever; a timeout Redis
// refuses, and any other command, add nothing.
func TestBlockTimeout(t *testing.T) {
	for _, tc := range []struct {
		cmd     string
		d       time.Duration
		forever bool
	}{
		{"BLPOP a b 2", 2 * time.Second, false},
		{"brpop a 0.25", 250 * time.Millisecond, false},
		{"BRPOPLPUSH a b 1", time.Second, false},
		{"BLMOVE a b LEFT RIGHT 3", 3 * time.Second, false},
		{"BZPOPMIN z 0", 0, true},
		{"BZPOPMAX z 0.0", 0, true},
		{"BLMPOP 1.5 2 a b LEFT COUNT 3", 1500 * time.Millisecond, false},
		{"BZMPOP 0 1 z MIN", 0, true},
		{"XREAD COUNT 2 BLOCK 1500 STREAMS s $", 1500 * time.Millisecond, false},
		{"XREAD BLOCK 0 STREAMS s $", 0, true},
		{"XREADGROUP GROUP block streams BLOCK 20 STREAMS s >", 20 * time.Millisecond, false},
		{"WAIT 1 100", 100 * time.Millisecond, false},
		{"WAIT 1 0", 0, true},
		{"WAITAOF 1 0 250", 250 * time.Millisecond, false},
		{"BLPOP a 1e300", 0, true}, // past any wait that matters
		// Refused by Redis at once: nothing to wait for.
		{"BLPOP a -1", 0, false},
		{"BLPOP a soon", 0, false},
		{"BLPOP a nan", 0, false},
		{"XREAD BLOCK 1.5 STREAMS s $", 0, false},
		{"XREAD BLOCK", 0, false},
		{"BLMPOP", 0, false},
		{"SCRIPT KILL", 0, false},
		{"SHUTDOWN", 0, false},
	} {
		var args [][]byte
		for _, a := range strings.Fields(tc.cmd) {
			args = append(args, []byte(a))
		}
		if d, forever := blockTimeout(args); d != tc.d || forever != tc.forever {
			t.Errorf("%s: %v, forever %v; want %v, %v", tc.cmd, d, forever, tc.d, tc.forever)
		}
	}
}
