package proxy

import (
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
)

func TestMergeReplies(t *testing.T) {
	cases := []struct {
		name    string
		cmd     clusterCmd
		replies []string
		want    string
	}{
		{"one", clusterCmd{merge: mergeOne}, []string{"+OK\r\n"}, "+OK\r\n"},
		{"mget back in key order", clusterCmd{merge: mergeArray, order: []int{1, 0, 1}},
			[]string{"*1\r\n$1\r\na\r\n", "*2\r\n$-1\r\n$2\r\nbb\r\n"},
			"*3\r\n$-1\r\n$1\r\na\r\n$2\r\nbb\r\n"},
		{"mget error wins", clusterCmd{merge: mergeArray, order: []int{0, 1}},
			[]string{"*1\r\n$1\r\na\r\n", "-ERR x\r\n"}, "-ERR x\r\n"},
		{"sum", clusterCmd{merge: mergeSum}, []string{":2\r\n", ":0\r\n", ":5\r\n"}, ":7\r\n"},
		{"sum first error", clusterCmd{merge: mergeSum}, []string{":2\r\n", "-WRONGTYPE a\r\n", "-ERR b\r\n"}, "-WRONGTYPE a\r\n"},
		{"all", clusterCmd{merge: mergeAll}, []string{"+OK\r\n", "+OK\r\n"}, "+OK\r\n"},
		{"and", clusterCmd{merge: mergeAnd}, []string{"*3\r\n:1\r\n:1\r\n:0\r\n", "*3\r\n:1\r\n:0\r\n:0\r\n"}, "*3\r\n:1\r\n:0\r\n:0\r\n"},
		{"concat", clusterCmd{merge: mergeConcat}, []string{"*1\r\n$1\r\na\r\n", "*0\r\n", "*2\r\n$1\r\nb\r\n$1\r\nc\r\n"},
			"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"},
		{"random from a master that has keys", clusterCmd{merge: mergeRandom}, []string{"$-1\r\n", "$1\r\nk\r\n", "$-1\r\n"}, "$1\r\nk\r\n"},
		{"random none", clusterCmd{merge: mergeRandom}, []string{"$-1\r\n", "$-1\r\n"}, "$-1\r\n"},
		{"info", clusterCmd{merge: mergeInfo, info: "cd"}, []string{"$2\r\nab\r\n"}, "$4\r\nabcd\r\n"},
	}
	for _, c := range cases {
		replies := make([][]byte, len(c.replies))
		for i, r := range c.replies {
			replies[i] = []byte(r)
		}
		if got := string(c.cmd.mergeReplies(nil, replies)); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// threeMasters is a topology of three masters over contiguous ranges.
func threeMasters() *upstream.Topology {
	var slots [hashslot.Count]*upstream.Node
	for i, start := range []int{0, 5461, 10923} {
		n := &upstream.Node{Addr: string(rune('a' + i))}
		for s := start; s < hashslot.Count; s++ {
			slots[s] = n
		}
	}
	return upstream.NewTopology(&slots)
}

// TestScanCursorWalksEveryMaster follows the proxy's SCAN cursors from 0
// back to 0: each master is visited in turn, from its own cursor 0.
func TestScanCursorWalksEveryMaster(t *testing.T) {
	topo := threeMasters()
	// Each master answers two pages: cursor 0 → 7, 7 → 0.
	var visited []string
	cursor := "0"
	for steps := 0; steps < 10; steps++ {
		pos, ok := parseScanCursor(topo, []byte(cursor))
		if !ok {
			t.Fatalf("cursor %s not accepted", cursor)
		}
		next := "7"
		if pos.cursor == 7 {
			next = "0"
		}
		visited = append(visited, topo.Masters[pos.i].Addr+":"+string(rune('0'+pos.cursor)))
		reply := "*2\r\n$1\r\n" + next + "\r\n*0\r\n"
		out := string(pos.merge(nil, []byte(reply)))
		parts := strings.Split(out, "\r\n")
		cursor = parts[2]
		if cursor == "0" {
			break
		}
	}
	if got := strings.Join(visited, " "); got != "a:0 a:7 b:0 b:7 c:0 c:7" {
		t.Fatalf("visited %s", got)
	}
	for _, bad := range []string{"x", "-1", "5", "18446744073709551616"} {
		if _, ok := parseScanCursor(topo, []byte(bad)); ok {
			t.Errorf("cursor %q accepted", bad)
		}
	}
}
