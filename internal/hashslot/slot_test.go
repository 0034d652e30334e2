package hashslot

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// TestCRC16KnownValue checks the check value the Redis Cluster spec gives
// for its CRC16 variant.
func TestCRC16KnownValue(t *testing.T) {
	if got := crc16([]byte("123456789")); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#04x, want 0x31c3", got)
	}
	if got := Of([]byte("123456789")); got != 0x31C3%Count {
		t.Fatalf("Of(123456789) = %d, want %d", got, 0x31C3%Count)
	}
}

// trickyKeys are keys whose hash tag is easy to get wrong, with the part
// that must be hashed.
var trickyKeys = []struct {
	name, key, tag string
}{
	{"empty", "", ""},
	{"plain", "foo", "foo"},
	{"open only", "{", "{"},
	{"close only", "}", "}"},
	{"empty tag", "{}", "{}"},
	{"empty tag then tag", "{}{a}x", "{}{a}x"},
	{"nested open", "foo{{bar}}zap", "{bar"},
	{"two tags", "foo{bar}{zap}", "bar"},
	{"tag first", "{user1000}.following", "user1000"},
	{"tag of the same user", "{user1000}.followers", "user1000"},
	{"tag last", "following.{user1000}", "user1000"},
	{"whole key is tag", "{user1000}", "user1000"},
	{"close before open", "}a{b}", "b"},
	{"unclosed", "a{bc", "a{bc"},
	{"close then unclosed open", "a}b{c", "a}b{c"},
	{"empty tag after text", "foo{}{bar}", "foo{}{bar}"},
	{"one byte tag", "{a}", "a"},
	{"brace in tag", "{{}}", "{"},
	{"binary", "\x00\xff\r\n{\x00\x01}\xfe", "\x00\x01"},
	{"binary no tag", "\x00\x80\xff\x7f", "\x00\x80\xff\x7f"},
	{"long", string(bytes.Repeat([]byte("k"), 100000)), string(bytes.Repeat([]byte("k"), 100000))},
	{"long with tag at end", string(bytes.Repeat([]byte("k"), 100000)) + "{t}", "t"},
}

func TestHashTag(t *testing.T) {
	for _, tc := range trickyKeys {
		t.Run(tc.name, func(t *testing.T) {
			if got := Tag([]byte(tc.key)); string(got) != tc.tag {
				t.Errorf("Tag(%.40q) = %.40q, want %.40q", tc.key, got, tc.tag)
			}
		})
	}
}

// TestSlotTrickyKeys compares Slot with CLUSTER KEYSLOT of redis-server.
func TestSlotTrickyKeys(t *testing.T) {
	keys := make([][]byte, len(trickyKeys))
	for i, tc := range trickyKeys {
		keys[i] = []byte(tc.key)
	}
	want := serverSlots(t, keys)
	for i, tc := range trickyKeys {
		t.Run(tc.name, func(t *testing.T) {
			if got := Of(keys[i]); got != want[i] {
				t.Errorf("Of(%.40q) = %d, CLUSTER KEYSLOT says %d", tc.key, got, want[i])
			}
		})
	}
}

// TestSlotRandomKeys compares Slot with CLUSTER KEYSLOT for random binary
// keys. Braces are drawn often, so many keys have tags, empty tags and
// unbalanced braces.
func TestSlotRandomKeys(t *testing.T) {
	const n = 2000
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("{}{}ab\x00\xff")
	keys := make([][]byte, n)
	for i := range keys {
		key := make([]byte, rng.IntN(40))
		for j := range key {
			if rng.IntN(2) == 0 {
				key[j] = alphabet[rng.IntN(len(alphabet))]
			} else {
				key[j] = byte(rng.UintN(256))
			}
		}
		keys[i] = key
	}
	want := serverSlots(t, keys)
	for i, key := range keys {
		if got := Of(key); got != want[i] {
			t.Errorf("Of(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want[i])
		}
	}
}

func TestSlotAllocs(t *testing.T) {
	key := []byte("{user1000}.following")
	if n := testing.AllocsPerRun(100, func() { Of(key) }); n != 0 {
		t.Fatalf("Slot allocates %v times, want 0", n)
	}
}

// serverSlots asks a cluster-enabled redis-server for the slot of each key,
// in one pipeline.
func serverSlots(t *testing.T, keys [][]byte) []uint16 {
	t.Helper()
	srv := redistest.Start(t, localredis.Options{Args: []string{"--cluster-enabled", "yes"}})
	nc, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	var req []byte
	for _, key := range keys {
		req = resp.AppendCommand(req, []byte("CLUSTER"), []byte("KEYSLOT"), key)
	}
	// Write while reading, so a pipeline bigger than the socket buffers
	// cannot deadlock against the server's replies.
	werr := make(chan error, 1)
	go func() {
		_, err := nc.Write(req)
		werr <- err
	}()
	br := bufio.NewReader(nc)
	slots := make([]uint16, len(keys))
	var reply []byte
	for i := range keys {
		if reply, err = resp.ReadReply(br, reply[:0]); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		n, ok := int64(0), false
		if len(reply) > 3 && reply[0] == ':' {
			n, ok = resp.ParseInt(reply[1 : len(reply)-2])
		}
		if !ok || n < 0 || n >= Count {
			t.Fatalf("CLUSTER KEYSLOT %.40q: reply %q", keys[i], reply)
		}
		slots[i] = uint16(n)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	return slots
}

func BenchmarkSlot(b *testing.B) {
	for _, key := range []string{
		"stock:sku:1001",
		"{user1000}.following",
		string(bytes.Repeat([]byte("k"), 1024)),
	} {
		b.Run(fmt.Sprintf("len=%d", len(key)), func(b *testing.B) {
			k := []byte(key)
			b.SetBytes(int64(len(k)))
			b.ReportAllocs()
			for b.Loop() {
				Of(k)
			}
		})
	}
}
