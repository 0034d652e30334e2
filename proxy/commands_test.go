package proxy

import (
	"strings"
	"testing"
)

// TestLookup: a command's entry, by name and subcommand, whatever the case.
func TestLookup(t *testing.T) {
	tests := []struct {
		cmd     string
		route   route
		cluster clusterRoute
		label   string
	}{
		{"GET k", routeShared, byKeys, "get"},
		{"client", routeShared, byKeys, "client"},
		{"CLIENT ID", routeLocal, byKeys, "client"},
		{"client list", routeLocal, byKeys, "client"},
		{"client Tracking on", routeLocal, byKeys, "client"},
		{"client caching yes", routeLocal, byKeys, "client"},
		{"client reply off", routeLocal, byKeys, "client"},
		{"config get maxmemory", routeLocal, byKeys, "config"},
		{"config set maxmemory 1", routeShared, byKeys, "config"},
		{"XREAD COUNT 2 STREAMS s 0", routeShared, byKeys, "xread"},
		{"xread block 0 streams s $", routeOwn, onKeyNode, "xread"},
		{"xreadgroup group block streams count 1 block 0 streams s >", routeOwn, onKeyNode, "xreadgroup"},
		{"xreadgroup group block streams streams s >", routeShared, byKeys, "xreadgroup"},
		{"script kill", routeOwn, killAll, "script"},
		{"script debug yes", routeRefuse, byKeys, "script"},
		{"script load x", routeShared, everyMaster, "script"},
		{"wait 1 0", routeOwn, refusedInCluster, "wait"},
		{"blpop q 0", routeOwn, onKeyNode, "blpop"},
		{"multi", routeOwn, clusterMulti, "multi"},
		{"subscribe c", routeStream, byKeys, "subscribe"},
		{"psync ? -1", routeRefuse, byKeys, "psync"},
		{"pubsub shardnumsub a", routeShared, shardNumSub, "pubsub"},
		{"frobnicate", routeShared, byKeys, "other"},
		{"averyveryveryverylongcommandname", routeShared, byKeys, "other"},
	}
	for _, tc := range tests {
		var args [][]byte
		for _, f := range strings.Fields(tc.cmd) {
			args = append(args, []byte(f))
		}
		var buf [24]byte
		c, _ := lookup(args, &buf)
		if c.route != tc.route || c.cluster != tc.cluster || commandLabels[c.metric] != tc.label {
			t.Errorf("%q: route %d, cluster %d, label %q; want %d, %d, %q",
				tc.cmd, c.route, c.cluster, commandLabels[c.metric], tc.route, tc.cluster, tc.label)
		}
	}
}
