package hotkey

import (
	"fmt"
	"sync"
	"testing"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

func rule(match string, buckets int) config.KeyRule {
	return config.KeyRule{Match: match, Buckets: buckets, Route: config.RouteRandom}
}

func TestRegistryLookup(t *testing.T) {
	r := NewRegistry([]config.KeyRule{
		rule("stock:sku:*", 4),     // a glob listed before the exact key it covers
		rule("stock:sku:1001", 16), // exact: wins over the glob above
		rule("stock:*", 2),         // never reached for stock:sku:…: the first glob wins
		rule("flash:[ab]:?", 32),   // glob
		rule("literal\\*star", 8),  // '\' makes it a glob: matches "literal*star"
		rule("odd]key^-", 3),       // ']' '^' '-' alone are not metacharacters
		{Match: "client:1", Buckets: 5, Route: config.RouteClient},
	})
	if got := r.Len(); got != 7 {
		t.Errorf("Len() = %d, want 7", got)
	}
	for _, c := range []struct {
		key     string
		match   string
		buckets int
	}{
		{"stock:sku:1001", "stock:sku:1001", 16},
		{"stock:sku:1002", "stock:sku:*", 4},
		{"stock:sku:", "stock:sku:*", 4},
		{"stock:spu:1", "stock:*", 2},
		{"flash:a:1", "flash:[ab]:?", 32},
		{"literal*star", "literal\\*star", 8},
		{"odd]key^-", "odd]key^-", 3},
		{"client:1", "client:1", 5},
		{"flash:c:1", "", 0},
		{"literal\\*star", "", 0},
		{"stock", "", 0},
		{"", "", 0},
		{"STOCK:sku:1001", "", 0},
	} {
		got, ok := r.Lookup([]byte(c.key))
		if ok != (c.match != "") || got.Match != c.match || got.Buckets != c.buckets {
			t.Errorf("Lookup(%q) = %+v, %v; want match %q buckets %d", c.key, got, ok, c.match, c.buckets)
		}
	}
	if got, _ := r.Lookup([]byte("client:1")); got.Route != config.RouteClient {
		t.Errorf("Lookup(client:1).Route = %q, want %q", got.Route, config.RouteClient)
	}
}

func TestRegistryFirstGlobWins(t *testing.T) {
	r := NewRegistry([]config.KeyRule{rule("a*", 2), rule("*b", 3), rule("ab", 4)})
	for key, want := range map[string]int{"ab": 4, "axb": 2, "xb": 3, "a": 2} {
		if got, ok := r.Lookup([]byte(key)); !ok || got.Buckets != want {
			t.Errorf("Lookup(%q) = %+v, %v; want buckets %d", key, got, ok, want)
		}
	}
	r = NewRegistry([]config.KeyRule{rule("*b", 3), rule("a*", 2)})
	if got, _ := r.Lookup([]byte("axb")); got.Buckets != 3 {
		t.Errorf("with *b first, Lookup(axb).Buckets = %d, want 3", got.Buckets)
	}
}

// TestRegistryDuplicates: config.Validate refuses a repeated match, but a
// Registry built without it keeps the first, as config order promises.
func TestRegistryDuplicates(t *testing.T) {
	r := NewRegistry([]config.KeyRule{rule("k", 2), rule("k", 3), rule("g*", 4), rule("g*", 5)})
	if r.Len() != 2 {
		t.Errorf("Len() = %d, want 2", r.Len())
	}
	if got, _ := r.Lookup([]byte("k")); got.Buckets != 2 {
		t.Errorf("Lookup(k).Buckets = %d, want 2", got.Buckets)
	}
	if got, _ := r.Lookup([]byte("gx")); got.Buckets != 4 {
		t.Errorf("Lookup(gx).Buckets = %d, want 4", got.Buckets)
	}
}

func TestRegistryEmpty(t *testing.T) {
	var nilReg *Registry
	for name, r := range map[string]*Registry{"nil": nilReg, "no rules": NewRegistry(nil)} {
		if _, ok := r.Lookup([]byte("k")); ok {
			t.Errorf("%s: Lookup(k) found a rule", name)
		}
		if r.Len() != 0 {
			t.Errorf("%s: Len() = %d", name, r.Len())
		}
	}
}

// TestRegistryOwnsRules: changing the caller's slice afterwards changes
// nothing, so a Registry stays immutable.
func TestRegistryOwnsRules(t *testing.T) {
	rules := []config.KeyRule{rule("k", 2), rule("g*", 4)}
	r := NewRegistry(rules)
	rules[0].Buckets, rules[1].Buckets, rules[1].Match = 99, 99, "zzz"
	if got, _ := r.Lookup([]byte("k")); got.Buckets != 2 {
		t.Errorf("Lookup(k).Buckets = %d after the caller's change, want 2", got.Buckets)
	}
	if got, _ := r.Lookup([]byte("gx")); got.Buckets != 4 || got.Match != "g*" {
		t.Errorf("Lookup(gx) = %+v after the caller's change, want g* with 4 buckets", got)
	}
}

func TestRegistryAllocs(t *testing.T) {
	exact := NewRegistry([]config.KeyRule{rule("stock:sku:1001", 8), rule("stock:sku:1002", 8)})
	mixed := NewRegistry([]config.KeyRule{rule("stock:sku:1001", 8), rule("flash:*", 4), rule("promo:[0-9]?", 2)})
	for _, c := range []struct {
		name string
		r    *Registry
		key  string
	}{
		{"exact hit", exact, "stock:sku:1001"},
		{"exact miss", exact, "stock:sku:9999"},
		{"glob hit", mixed, "flash:1"},
		{"glob miss", mixed, "session:1"},
		{"empty", NewRegistry(nil), "k"},
	} {
		key := []byte(c.key)
		if n := testing.AllocsPerRun(100, func() { c.r.Lookup(key) }); n != 0 {
			t.Errorf("%s: Lookup allocates %v times per call", c.name, n)
		}
	}
}

// TestRegistryConcurrent has many goroutines read one Registry; run with
// -race it shows that Lookup writes nothing shared.
func TestRegistryConcurrent(t *testing.T) {
	r := NewRegistry([]config.KeyRule{rule("exact", 2), rule("glob:*", 3)})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				key := fmt.Appendf(nil, "glob:%d:%d", g, i)
				if got, ok := r.Lookup(key); !ok || got.Buckets != 3 {
					t.Errorf("Lookup(%q) = %+v, %v", key, got, ok)
					return
				}
				if _, ok := r.Lookup([]byte("exact")); !ok {
					t.Error("Lookup(exact) found nothing")
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkLookup(b *testing.B) {
	exactRules := make([]config.KeyRule, 1000)
	for i := range exactRules {
		exactRules[i] = rule(fmt.Sprintf("stock:sku:%d", i), 8)
	}
	globRules := []config.KeyRule{rule("flash:*", 4), rule("promo:[0-9]*", 4), rule("*:hot", 4), rule("stock:eu:*", 4)}
	for _, bc := range []struct {
		name string
		r    *Registry
		key  string
	}{
		{"empty", NewRegistry(nil), "session:4f3a9c"},
		{"exact-hit", NewRegistry(exactRules), "stock:sku:500"},
		{"exact-miss", NewRegistry(exactRules), "session:4f3a9c"},
		{"globs-miss", NewRegistry(append(exactRules[:1:1], globRules...)), "session:4f3a9c"},
		{"globs-last-hit", NewRegistry(append(exactRules[:1:1], globRules...)), "stock:eu:1"},
	} {
		key := []byte(bc.key)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.r.Lookup(key)
			}
		})
	}
}
