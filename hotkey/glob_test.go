package hotkey

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
)

// matchCase is one pattern and key with the answer Redis 7.0 gives.
type matchCase struct {
	pattern, key string
	want         bool
}

// matchCases pin the documented syntax and each quirk. TestMatchKeys checks
// the same ground against a real server; these say what is meant.
var matchCases = []matchCase{
	// Literals and the empty key.
	{"", "", true},
	{"", "a", false},
	{"a", "", false},
	{"abc", "abc", true},
	{"abc", "ABC", false},
	{"abc", "abcd", false},
	{"a\x00b", "a\x00b", true},
	{"a\x00b", "a", false},
	{"\xff\xfe", "\xff\xfe", true},

	// '*' and '?'.
	{"*", "", true}, // KEYS and SCAN treat a lone "*" as "all keys"
	{"**", "", false},
	{"?", "", false},
	{"*", "anything", true},
	{"**", "x", true},
	{"a*", "a", true},
	{"a*", "abc", true},
	{"a**", "a", true},
	{"*a", "a", true},
	{"*a", "ba", true},
	{"*a", "ab", false},
	{"a*b", "ab", true},
	{"a*b", "axxxb", true},
	{"a*b", "axxxbx", false},
	{"a*b*c", "abbbcbc", true},
	{"a*b*c", "acb", false},
	{"h?llo", "hello", true},
	{"h?llo", "hllo", false},
	{"?", "\x00", true},
	{"??", "a", false},
	{"*?", "a", true},
	{"?*", "a", true},
	{"*?*?*", "a", false},
	{"*?*?*", "ab", true},
	{"*a*a*a*a*a*b", strings.Repeat("a", 64), false},
	{"*a*a*a*a*a*b", strings.Repeat("a", 64) + "b", true},

	// Bracket lists.
	{"h[ae]llo", "hallo", true},
	{"h[ae]llo", "hillo", false},
	{"h[^e]llo", "hallo", true},
	{"h[^e]llo", "hello", false},
	{"h[a-b]llo", "hbllo", true},
	{"h[a-b]llo", "hcllo", false},
	{"[z-a]", "m", true}, // a reversed range is swapped
	{"[a-z]", "A", false},
	{"[-a]", "-", true},
	{"[a-b-c]", "-", true},
	{"[a-b-c]", "c", true},
	{"[--0]", "/", true},
	{"[]", "]", false},  // empty list: matches nothing
	{"[]]", "]", false}, // "[]" then a literal "]"
	{"[^]", "x", true},  // negated empty list: any byte
	{"[\\]]", "]", true},
	{"[\\-]", "-", true},
	{"[a\\-z]", "b", false},
	{"[a\\-z]", "-", true},
	{"[\\\\]", "\\", true},
	{"[*]", "*", true},
	{"[*]", "a", false},
	{"[?]", "x", false},
	{"[[]", "[", true},

	// A '[' without ']' takes the rest of the pattern as its list.
	{"[", "[", false},
	{"[", "", false},
	{"[^", "x", true},
	{"[^", "xy", false},
	{"[ab", "b", true},
	{"[ab", "ab", false},
	{"x[ab", "xa", true},
	{"[a-", "-", true},
	{"[\\", "\\", true},
	{"*[", "x[", false},

	// "[a-]": the '-' makes the range a..']' (0x5d..0x61) and the list
	// goes on to the end of the pattern.
	{"[a-]", "^", true},
	{"[a-]", "]", true},
	{"[a-]", "b", false},
	{"[a-]x", "x", true},
	{"[a-]x", "ax", false},

	// A range ends at the byte after '-', even a '\'.
	{"[a-\\]", "_", true}, // the range '\\'..'a', then ']' closes the list
	{"[\\a-c]", "b", false},

	// Ranges compare signed bytes, as x86-64 builds of Redis do.
	{"[\x01-\xff]", "\xff", true},
	{"[\x01-\xff]", "\x00", true},
	{"[\x01-\xff]", "\x02", false},
	{"[\x01-\xff]", "\x80", false},
	{"[\x7f-\x80]", "a", true},
	{"[\x80-\xff]", "\x90", true},
	{"[\x80-\xff]", "a", false},

	// Escapes outside brackets.
	{"\\*", "*", true},
	{"\\*", "a", false},
	{"\\?", "?", true},
	{"\\[", "[", true},
	{"\\a", "a", true},
	{"\\", "\\", true}, // a trailing '\' is itself
	{"a\\", "a\\", true},
	{"\\\\", "\\", true},
	{"\\\\", "\\\\", false},
	{"user:\\*", "user:*", true},
	{"user:\\*", "user:1", false},

	// Realistic rules.
	{"stock:sku:*", "stock:sku:1001", true},
	{"stock:sku:*", "stock:sku:", true},
	{"stock:sku:*", "stock:spu:1", false},
	{"stock:sku:100?", "stock:sku:1001", true},
	{"stock:{sku}:*", "stock:{sku}:7", true},
	{"stock:[0-9][0-9]", "stock:42", true},
	{"stock:[0-9][0-9]", "stock:4x", false},
}

func TestMatchTable(t *testing.T) {
	for _, c := range matchCases {
		if got := Match([]byte(c.pattern), []byte(c.key)); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pattern, c.key, got, c.want)
		}
		if got := specMatch([]byte(c.pattern), []byte(c.key)); got != c.want {
			t.Errorf("specMatch(%q, %q) = %v, want %v (the test oracle is wrong)", c.pattern, c.key, got, c.want)
		}
	}
}

// TestMatchNesting checks the limit Redis puts on nested '*': 1000 are
// followed, one more matches nothing, a final '*' does not count.
func TestMatchNesting(t *testing.T) {
	key := []byte(strings.Repeat("a", 1100))
	stars := func(n int) string { return strings.Repeat("*a", n) }
	for _, c := range []matchCase{
		{stars(1000), string(key), true},
		{stars(1000) + "*", string(key), true},
		{stars(1001), string(key), false},
		{stars(1001) + "*", string(key), false},
		{stars(999) + "*b", string(key), false},
		{stars(999) + "*b", string(key) + "b", true},
		{"*" + strings.Repeat("\\*a", 1200), strings.Repeat("*a", 1200), true}, // escaped stars do not nest
		{"*" + strings.Repeat("[*]a", 1200), strings.Repeat("*a", 1200), true}, // nor listed ones
	} {
		if got := Match([]byte(c.pattern), []byte(c.key)); got != c.want {
			t.Errorf("Match(%.20q…(%d bytes), %d-byte key) = %v, want %v", c.pattern, len(c.pattern), len(c.key), got, c.want)
		}
	}
}

// TestMatchPathological runs patterns on which a backtracking matcher takes
// exponential time. Match must simply return; a regression shows up as the
// test binary's timeout, not as a flaky timed assertion.
func TestMatchPathological(t *testing.T) {
	long := []byte(strings.Repeat("a", 20_000))
	for _, c := range []matchCase{
		{"*a*a*a*a*a*b", string(long), false},
		{strings.Repeat("*a", 40) + "*b", string(long), false},
		{strings.Repeat("a*", 40) + "b", string(long), false},
		{strings.Repeat("*?", 40) + "*b", string(long), false},
		{"*" + strings.Repeat("a", 500) + "b", string(long), false},
		{"*" + strings.Repeat("[a]", 200) + "b", string(long), false},
		{"*[" + strings.Repeat("a", 500) + "]b", string(long), false},
		{strings.Repeat("*a", 1000), string(long), true},
		{strings.Repeat("*a", 1001), string(long), false},
		{strings.Repeat("*a", 40) + "*", string(long), true},
	} {
		if got := Match([]byte(c.pattern), long); got != c.want {
			t.Errorf("Match(%.30q…, %d×a) = %v, want %v", c.pattern, len(long), got, c.want)
		}
	}
}

func TestMatchAllocs(t *testing.T) {
	pattern := []byte("stock:[a-z]*:1?0\\*")
	key := []byte("stock:sku:100*")
	var ok bool
	if n := testing.AllocsPerRun(100, func() { ok = Match(pattern, key) }); n != 0 {
		t.Errorf("Match allocates %v times per call", n)
	}
	if !ok {
		t.Errorf("Match(%q, %q) = false", pattern, key)
	}
}

// TestMatchKeys compares Match with the KEYS command of a real redis-server
// over a corpus of tricky keys and patterns.
func TestMatchKeys(t *testing.T) {
	srv := redistest.Start(t, localredis.Options{})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()

	keys := corpusKeys()
	pairs := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		pairs = append(pairs, k, "1")
	}
	if err := rdb.MSet(ctx, pairs...).Err(); err != nil {
		t.Fatal(err)
	}
	if n := rdb.DBSize(ctx).Val(); n != int64(len(keys)) {
		t.Fatalf("DBSIZE = %d, want %d keys", n, len(keys))
	}

	// Redis built where C's char is unsigned (arm64) compares range ends
	// unsigned; Match follows x86-64. Probe which one runs here.
	probe, err := rdb.Keys(ctx, "[\x01-\xff]").Result()
	if err != nil {
		t.Fatal(err)
	}
	signed := !slices.Contains(probe, "\x80")
	if !signed {
		t.Log("redis-server compares bytes unsigned; skipping patterns with bytes >= 0x80")
	}

	patterns := corpusPatterns()
	cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, pat := range patterns {
			p.Keys(ctx, pat)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	compared := 0
	for i, pat := range patterns {
		if !signed && strings.ContainsFunc(pat, func(r rune) bool { return r >= 0x80 }) {
			continue
		}
		want := cmds[i].(*redis.StringSliceCmd).Val()
		slices.Sort(want)
		var got []string
		for _, k := range keys {
			if Match([]byte(pat), []byte(k)) {
				got = append(got, k)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("pattern %q: Match accepts %d keys, KEYS returns %d\n  only Match: %q\n  only KEYS:  %q",
				shorten(pat), len(got), len(want), shortenAll(difference(got, want)), shortenAll(difference(want, got)))
		}
		compared++
	}
	t.Logf("%d patterns compared over %d keys", compared, len(keys))
}

// corpusKeys returns distinct keys, sorted: every single byte, every pair
// over an alphabet of metacharacters, hand-picked keys and seeded random
// ones.
func corpusKeys() []string {
	set := map[string]bool{}
	for b := range 256 {
		set[string([]byte{byte(b)})] = true
	}
	pairAlphabet := "ab*?[]\\^-\x00\xff"
	for i := range len(pairAlphabet) {
		for j := range len(pairAlphabet) {
			set[string([]byte{pairAlphabet[i], pairAlphabet[j]})] = true
		}
	}
	for _, k := range []string{
		"", "abc", "aab", "abb", "hello", "hallo", "hillo", "hllo", "heeeello",
		"stock:sku:1001", "stock:sku:1002", "stock:sku:", "stock:spu:1", "stock:{sku}:1",
		"stock:42", "stock:4x", "user:*", "user:?", "user:1", "a*b", "a?b", "a[b", "a]b",
		"a\\b", "\\\\", "[]", "[a]", "**", "a-z", "\r\n", "\x00a", "a\x00", "a\x00b",
		"\xff\xff", "\xc3\xa9", "日本", "a b", "ab]", "abx", "axb",
		strings.Repeat("a", 1100), strings.Repeat("a", 1100) + "b",
		strings.Repeat("ab", 300), strings.Repeat("*a", 1200),
	} {
		set[k] = true
	}
	rng := rand.New(rand.NewPCG(1, 2))
	randAlphabet := "abc*?[]\\^-:\x00\x80\xff"
	for range 150 {
		b := make([]byte, 3+rng.IntN(8))
		for i := range b {
			b[i] = randAlphabet[rng.IntN(len(randAlphabet))]
		}
		set[string(b)] = true
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// corpusPatterns returns the table's patterns, more hand-picked ones and
// seeded random ones heavy in metacharacters.
func corpusPatterns() []string {
	var ps []string
	for _, c := range matchCases {
		ps = append(ps, c.pattern)
	}
	ps = append(ps,
		"***", "*?*", "a?b", "a**b", "*ab", "ab*", "*ab*", "a*a*a", "*aaaa", "?[^a]?",
		"[ab][ab]", "[a-b][*-?]", "*[]]*", "*[^a]*", "[^]]", "[]a]", "[^[]", "*[]", "[*",
		"*]", "]", "^", "-", "*\\", "\\]", "a\\*b", "a\\?b", "a[\\]b", "[\\]", "[^\\",
		"[^a-", "*[a-", "[a-]b", "[-]", "[\x00]", "[\x00-\x01]", "[\xff-\x01]", "[^\x80-\xff]",
		"\xff*", "*\xff", "\x00*", "*\x00", "stock:*:1*", "user:[*?]", "\xc3\xa9*", "[\xc3\xa9]",
		"[a-\x00]", "[\x00-a]", "*[\\", "[[-]]", "[\\^a]", "[^^]",
		strings.Repeat("*a", 1000), strings.Repeat("*a", 1001), strings.Repeat("*a", 1000)+"*",
		strings.Repeat("*a", 999)+"*b", "*"+strings.Repeat("\\*a", 1200), strings.Repeat("a", 1100)+"*",
		strings.Repeat("?", 1100), strings.Repeat("?", 1101), strings.Repeat("[ab]", 600),
	)
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := "ab*?[]\\^-\x00\xff"
	for range 300 {
		b := make([]byte, rng.IntN(7))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		ps = append(ps, string(b))
	}
	slices.Sort(ps)
	return slices.Compact(ps)
}

// difference returns the elements of a (sorted) that are not in b (sorted).
func difference(a, b []string) []string {
	var d []string
	for _, x := range a {
		if _, found := slices.BinarySearch(b, x); !found {
			d = append(d, x)
		}
	}
	return d
}

// shorten cuts long strings for failure messages.
func shorten(s string) string {
	if len(s) <= 40 {
		return s
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:40], len(s))
}

func shortenAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = shorten(s)
	}
	return out
}

// FuzzMatch checks that Match does not panic and agrees with specMatch, with
// byte equality for patterns without metacharacters, and with byte equality
// again for a key escaped byte by byte into a pattern.
func FuzzMatch(f *testing.F) {
	for _, c := range matchCases {
		f.Add([]byte(c.pattern), []byte(c.key))
	}
	f.Fuzz(func(t *testing.T, pattern, key []byte) {
		// Match's time grows with len(pattern)·len(key); the fuzzer's
		// inputs of megabytes would spend it on a few slow runs.
		if len(pattern) > 4096 || len(key) > 4096 {
			t.Skip()
		}
		got := Match(pattern, key)
		if len(pattern) <= 512 && len(key) <= 512 {
			if want := specMatch(pattern, key); got != want {
				t.Fatalf("Match(%q, %q) = %v, specMatch says %v", pattern, key, got, want)
			}
		}
		if !bytes.ContainsAny(pattern, globMeta) {
			if want := bytes.Equal(pattern, key); got != want {
				t.Fatalf("Match(%q, %q) = %v for a literal pattern", pattern, key, got)
			}
		}
		escaped := make([]byte, 0, 2*len(pattern))
		for _, b := range pattern {
			escaped = append(escaped, '\\', b)
		}
		if got, want := Match(escaped, key), bytes.Equal(pattern, key); got != want {
			t.Fatalf("Match(%q, %q) = %v for an escaped pattern", escaped, key, got)
		}
	})
}

// specMatch is a second matcher, written from the rules in Match's doc
// rather than from its code: it compiles the pattern into byte sets and
// matches with dynamic programming over (token, key offset). Slow and
// allocating; only the tests use it.
func specMatch(pattern, key []byte) bool {
	if len(key) == 0 {
		return len(pattern) == 0 || string(pattern) == "*"
	}
	toks := compileSpec(pattern)
	nested := 0
	for i, tk := range toks {
		if tk.star && i+1 < len(toks) {
			nested++
		}
	}
	if nested > 1000 {
		return false
	}
	// ok[k] says whether the tokens seen so far can match key[:k].
	ok := make([]bool, len(key)+1)
	ok[0] = true
	for _, tk := range toks {
		next := make([]bool, len(key)+1)
		for k := range ok {
			switch {
			case tk.star:
				next[k] = ok[k] || k > 0 && next[k-1]
			case k > 0:
				next[k] = ok[k-1] && tk.set[key[k-1]]
			}
		}
		ok = next
	}
	return ok[len(key)]
}

// specToken is a run of '*' or a set of bytes that one key byte must be in.
type specToken struct {
	star bool
	set  [256]bool
}

// compileSpec turns a pattern into tokens, merging runs of '*'.
func compileSpec(p []byte) []specToken {
	var toks []specToken
	one := func(b byte) specToken {
		var tk specToken
		tk.set[b] = true
		return tk
	}
	for i := 0; i < len(p); {
		switch p[i] {
		case '*':
			if len(toks) == 0 || !toks[len(toks)-1].star {
				toks = append(toks, specToken{star: true})
			}
			i++
		case '?':
			var tk specToken
			for b := range tk.set {
				tk.set[b] = true
			}
			toks = append(toks, tk)
			i++
		case '\\':
			if i+1 < len(p) {
				toks = append(toks, one(p[i+1]))
				i += 2
			} else {
				toks = append(toks, one('\\'))
				i++
			}
		case '[':
			var tk specToken
			i++
			negate := i < len(p) && p[i] == '^'
			if negate {
				i++
			}
			for i < len(p) && p[i] != ']' {
				rest := len(p) - i
				switch {
				case p[i] == '\\' && rest >= 2:
					tk.set[p[i+1]] = true
					i += 2
				case rest >= 3 && p[i+1] == '-':
					lo, hi := int(int8(p[i])), int(int8(p[i+2]))
					if lo > hi {
						lo, hi = hi, lo
					}
					for v := lo; v <= hi; v++ {
						tk.set[byte(int8(v))] = true
					}
					i += 3
				default:
					tk.set[p[i]] = true
					i++
				}
			}
			i++ // the ']', or past the end when there is none
			if negate {
				for b := range tk.set {
					tk.set[b] = !tk.set[b]
				}
			}
			toks = append(toks, tk)
		default:
			toks = append(toks, one(p[i]))
			i++
		}
	}
	return toks
}

func BenchmarkMatch(b *testing.B) {
	long := []byte(strings.Repeat("a", 10_000))
	for _, bc := range []struct {
		name         string
		pattern, key []byte
	}{
		{"literal", []byte("stock:sku:1001"), []byte("stock:sku:1001")},
		{"prefix", []byte("stock:sku:*"), []byte("stock:sku:1001")},
		{"prefix-miss", []byte("stock:sku:*"), []byte("session:4f3a9c")},
		{"class", []byte("stock:sku:[0-9][0-9][0-9][0-9]"), []byte("stock:sku:1001")},
		{"stars", []byte("*:sku:*:1?0*"), []byte("shop:7:stock:sku:eu:1001")},
		{"pathological-10k", []byte("*a*a*a*a*a*b"), long},
		{"long-segment-10k", []byte("*" + strings.Repeat("a", 100) + "b"), long},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Match(bc.pattern, bc.key)
			}
		})
	}
}
