package e2e

import "testing"

func TestClusterSmoke(t *testing.T) {
	e := startClusterEnv(t, nil)
	c := dialRaw(t, e.ProxyAddr())
	for _, cmd := range [][]string{
		{"PING"}, {"SET", "a", "1"}, {"SET", "b", "2"}, {"SET", "c", "3"},
		{"MGET", "a", "b", "c", "zz"}, {"MSET", "x", "1", "y", "2", "z", "3"}, {"DEL", "a", "b", "x", "nope"},
		{"DBSIZE"}, {"KEYS", "*"}, {"SCAN", "0"}, {"MSETNX", "a", "1", "b", "2"}, {"SELECT", "1"}, {"SELECT", "0"},
		{"CLUSTER", "SLOTS"}, {"CLUSTER", "FOO"}, {"READONLY"}, {"MULTI"}, {"PING"}, {"SET", "q", "1"}, {"INCR", "q"}, {"EXEC"},
		{"MULTI"}, {"SET", "a", "1"}, {"SET", "b", "1"}, {"EXEC"},
		{"RENAME", "a", "b"}, {"EVAL", "return redis.call('get', KEYS[1])", "1", "y"},
		{"SCRIPT", "LOAD", "return 1"}, {"SCRIPT", "EXISTS", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "abc"},
		{"RANDOMKEY"}, {"FLUSHALL"}, {"DBSIZE"}, {"BLPOP", "list", "0.1"}, {"GET", "y"},
	} {
		t.Logf("%v → %q", cmd, c.do(cmd...))
	}
}
