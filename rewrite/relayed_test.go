package rewrite

import (
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
)

func TestMayShowLayout(t *testing.T) {
	for _, tc := range []struct {
		cmd       string
		keyAt     int
		fails, ok bool
	}{
		{"get k", 0, false, true},
		{"mget a b", 0, false, true},
		{"incr k", 1, true, true},
		{"decrby k 2", 1, true, true},
		{"incr", 0, false, false},
		{"eval body 1 k", 3, true, true},
		{"evalsha_ro sha 1 k 5", 3, true, true},
		{"eval body 2 k j", 0, false, false},
		{"eval body 1", 0, false, false},
		{"set k 1", 0, false, false},
		{"incrbyfloat k 1", 0, false, false},
	} {
		args := cmd(tc.cmd)
		keyAt, fails, ok := MayShowLayout(string(args[0]), args)
		if keyAt != tc.keyAt || fails != tc.fails || ok != tc.ok {
			t.Errorf("MayShowLayout(%s) = %d, %v, %v; want %d, %v, %v", tc.cmd, keyAt, fails, ok, tc.keyAt, tc.fails, tc.ok)
		}
	}
}

func TestLayoutFailure(t *testing.T) {
	e, _, _ := testEngine(t, config.RouteRandom, 0, nil)
	declared := "EVALSHA " + sha(deductOne) + " 1 k"
	undeclared := "EVALSHA 0123 1 k"
	for _, tc := range []struct {
		cmd, reply string
		want       bool
	}{
		{"INCR k", errR(rediserr.NotInteger), true},
		{"decrby k 3", errR(rediserr.NotInteger), true},
		{"INCR k", errR("ERR increment or decrement would overflow"), false},
		{"INCR k", downR, false},
		{"INCR k", num(1), false},
		{declared, errR("ERR user_script:1: Script attempted to access nonexistent global variable"), true},
		{declared, errR("ERR Error running script (call to f_0123): @user_script:1: bad argument"), true},
		{declared, errR(rediserr.NotInteger), false},
		{declared, downR, false},
		{undeclared, errR("ERR user_script:1: attempt to compare"), false},
		{undeclared, errR(rediserr.NotInteger), false},
	} {
		if got := e.LayoutFailure(cmd(tc.cmd), []byte(tc.reply)); got != tc.want {
			t.Errorf("LayoutFailure(%s, %q) = %v, want %v", tc.cmd, strings.TrimSpace(tc.reply), got, tc.want)
		}
	}
}
