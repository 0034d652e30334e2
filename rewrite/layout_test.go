package rewrite

import (
	"strings"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
)

// threeMasters serves slots 0-5460, 5461-10922, 10923-16383, as
// redis-cli --cluster create would.
func threeMasters(slot uint16) int {
	switch {
	case slot <= 5460:
		return 0
	case slot <= 10922:
		return 1
	}
	return 2
}

func TestPlaceSpreadsOverMasters(t *testing.T) {
	for _, key := range []string{"stock:sku:1001", "stock:{sku1001}", "{}", "a", "stock:{x}:{y}"} {
		for _, n := range []int{2, 3, 8, 10, 64} {
			l := Place(key, n, 3, threeMasters)
			if l.N() != n {
				t.Fatalf("%s: %d buckets, want %d", key, l.N(), n)
			}
			per := make([]int, 3)
			slots := map[uint16]bool{}
			for i := 0; i < n; i++ {
				b := l.Bucket(i)
				if !strings.Contains(string(b), key) {
					t.Errorf("bucket %q does not contain the key %q", b, key)
				}
				s := hashslot.Of(b)
				per[threeMasters(s)]++
				if slots[s] {
					t.Errorf("%s/%d: two buckets in slot %d", key, n, s)
				}
				slots[s] = true
			}
			if s0 := hashslot.Of(l.Bucket(0)); s0 != hashslot.Of([]byte(key)) {
				t.Errorf("%s: bucket 0 in slot %d, the key in %d", key, s0, hashslot.Of([]byte(key)))
			}
			for m, c := range per {
				if c != n/3 && c != (n+2)/3 {
					t.Errorf("%s/%d: master %d holds %d buckets, want %d or %d", key, n, m, c, n/3, (n+2)/3)
				}
			}
		}
	}
}

func TestMarkerRoundTrip(t *testing.T) {
	l := Place("stock:sku:1001", 8, 3, threeMasters)
	m := l.Marker()
	if !IsMarker(m) {
		t.Fatalf("%q is not a marker", m)
	}
	got, err := ParseMarker(l.Key, m)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got.Tags, ",") != strings.Join(l.Tags, ",") {
		t.Fatalf("tags %v, want %v", got.Tags, l.Tags)
	}
	l.Pending, l.Fill = true, 12345
	got, err = ParseMarker(l.Key, l.Marker())
	if err != nil || !got.Pending || got.Fill != 12345 || got.Gen != l.Gen {
		t.Fatalf("pending marker %q parsed as %+v, %v", l.Marker(), got, err)
	}
	for _, bad := range []string{"", "100", MarkerPrefix, MarkerPrefix + "1 x", MarkerPrefix + "-1",
		MarkerPrefix + "ab:1 x", MarkerPrefix + ":1 2", MarkerPrefix + "zz:1 2", MarkerPrefix + "ab:1 2:x", MarkerPrefix + "ab:1:2:3", MarkerPrefix + "ab:",
		MarkerPrefix + "ab:1  2", MarkerPrefix + "ab:1\t2", MarkerPrefix + "ab:1 2:+5", MarkerPrefix + "AB:1 2", MarkerPrefix + "ab:01 2",
		MarkerPrefix + "ab:" + strings.Repeat("1 ", 1024) + "1"} {
		if _, err := ParseMarker("k", []byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestShare(t *testing.T) {
	l := &Layout{Tags: make([]string, 8)}
	for _, total := range []int64{0, 1, 7, 8, 9, 100000, 100003, -5, 1<<62 + 3} {
		var sum, lo, hi int64 = 0, 1 << 62, -1 << 62
		for i := range 8 {
			v := l.Share(total, i)
			sum += v
			lo, hi = min(lo, v), max(hi, v)
			if total >= 0 && i > 0 && v > l.Share(total, i-1) {
				t.Errorf("total %d: bucket %d gets more than bucket %d", total, i, i-1)
			}
		}
		if sum != total {
			t.Errorf("total %d: shares sum to %d", total, sum)
		}
		if total >= 0 && hi-lo > 1 {
			t.Errorf("total %d: shares from %d to %d", total, lo, hi)
		}
	}
}

func BenchmarkPlace(b *testing.B) {
	for range b.N {
		Place("stock:sku:1001", 8, 3, threeMasters)
	}
}
