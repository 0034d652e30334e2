package hotkey

// maxStarNesting is how deep Redis's matcher recurses before it gives up:
// it recurses once per '*' that has more pattern after it and answers "no
// match" past this depth, to protect its stack (Redis 7.0 util.c,
// stringmatchlen). Match has no recursion to guard but keeps the limit, so
// that it agrees with KEYS on such patterns.
const maxStarNesting = 1000

// Match reports whether key matches the Redis glob pattern, giving the
// answer KEYS and SCAN MATCH of Redis 7.0 give:
//
//   - '*' matches any run of bytes, '?' any one byte.
//   - '[abc]' matches one of the bytes listed, '[^abc]' one byte not listed,
//     '[a-z]' a byte in the range, also written '[z-a]'. Inside brackets
//     '\x' stands for x. A '[' with no ']' after it takes the rest of the
//     pattern as its list, so "[ab" matches "a" or "b", and "[^" any byte.
//   - '\x' matches x; a '\' at the end of the pattern matches '\'.
//   - Everything else matches itself, byte for byte, case-sensitive.
//
// Quirks kept from Redis, because a rule must select exactly the keys KEYS
// lists with the same pattern:
//   - A range compares bytes as signed 8-bit numbers, as Redis does when
//     built for x86-64 (where C's char is signed): "[\x01-\xff]" matches
//     0xff, 0x00 and 0x01 only. ARM builds of Redis compare unsigned.
//   - In "[a-]" the '-' makes a range up to ']', and the list goes on to the
//     end of the pattern.
//   - The empty key matches only the empty pattern and "*" ("**" does not:
//     KEYS special-cases a lone "*").
//   - A pattern with more than 1000 '*' that have more pattern after them
//     matches nothing.
//
// Match never allocates, and its time is at most proportional to
// len(pattern)·len(key), whatever the pattern.
func Match(pattern, key []byte) bool {
	if len(key) == 0 {
		// Redis matches only while key bytes remain, so nothing but the
		// empty pattern survives; KEYS and SCAN skip matching for "*".
		return len(pattern) == 0 || len(pattern) == 1 && pattern[0] == '*'
	}
	// Each '*' counted needs at least two bytes, so short patterns, the
	// usual ones, skip the count.
	if len(pattern) > 2*maxStarNesting && nestedStars(pattern) > maxStarNesting {
		return false
	}

	// Every token but '*' consumes exactly one key byte, so when the
	// pattern fails after a '*' only the latest '*' needs to take one more
	// byte: earlier ones taking more would just start the same fixed-width
	// tokens further on. That keeps the work to one pass over the key per
	// start of the latest '*', instead of the exponential search a
	// backtracking matcher does.
	p, k := 0, 0
	star, starK := -1, 0 // pattern index just after the latest '*', and the key index it resumed at
	for k < len(key) {
		if p < len(pattern) {
			switch c := pattern[p]; c {
			case '*':
				for p < len(pattern) && pattern[p] == '*' {
					p++
				}
				if p == len(pattern) {
					return true
				}
				star, starK = p, k
				continue
			case '?':
				p++
				k++
				continue
			case '[':
				if ok, next := matchClass(pattern, p, key[k]); ok {
					p = next
					k++
					continue
				}
			case '\\':
				next := p + 1
				if next < len(pattern) {
					c = pattern[next]
					next++
				}
				if c == key[k] {
					p = next
					k++
					continue
				}
			default:
				if c == key[k] {
					p++
					k++
					continue
				}
			}
		}
		if star < 0 {
			return false
		}
		starK++
		p, k = star, starK
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// matchClass matches c against the bracket expression that starts at
// pattern[i] == '['. It returns whether c matched and the index just past
// the expression. Where the expression ends depends on the pattern alone.
func matchClass(pattern []byte, i int, c byte) (matched bool, next int) {
	n := len(pattern)
	j := i + 1
	negate := j < n && pattern[j] == '^'
	if negate {
		j++
	}
	for {
		if j == n {
			// No ']': the list ran to the end of the pattern. Step back
			// onto its last byte so that next lands on n, as Redis does;
			// this also makes "[" and "[^" one byte long.
			j--
			break
		}
		switch b := pattern[j]; {
		case b == '\\' && n-j >= 2:
			j++
			if pattern[j] == c {
				matched = true
			}
		case b == ']':
			return matched != negate, j + 1
		case n-j >= 3 && pattern[j+1] == '-':
			lo, hi := int8(b), int8(pattern[j+2])
			if lo > hi {
				lo, hi = hi, lo
			}
			if v := int8(c); v >= lo && v <= hi {
				matched = true
			}
			j += 2
		case b == c:
			matched = true
		}
		j++
	}
	return matched != negate, j + 1
}

// nestedStars counts the runs of '*' that have more pattern after them: how
// deep Redis's matcher would recurse on the pattern.
func nestedStars(pattern []byte) int {
	n := 0
	for p := 0; p < len(pattern); {
		switch pattern[p] {
		case '*':
			for p < len(pattern) && pattern[p] == '*' {
				p++
			}
			if p < len(pattern) {
				n++
			}
		case '[':
			_, p = matchClass(pattern, p, 0)
		case '\\':
			p = min(p+2, len(pattern))
		default:
			p++
		}
	}
	return n
}
