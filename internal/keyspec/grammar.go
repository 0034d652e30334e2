package keyspec

import "github.com/hotkeyproxy/hotkeyproxy/internal/resp"

// grammar appends the key indexes of a command whose keys move with its
// options. It gets args that passed the arity check, but must not trust the
// arity: a table may come from a server whose arities differ.
type grammar func(args [][]byte, dst []int) []int

// grammars covers every command that Redis 7.0 flags movablekeys, except
// SORT_RO, whose one key is at index 1 where its legacy range puts it. Each
// follows the command's own parsing. Redis Cluster routes these commands with
// the getkeys procedures of Redis's db.c, and COMMAND GETKEYS mostly with the
// key specs; where either disagrees with a grammar on a command Redis
// accepts, it names as a key an argument the command never touches. Each
// grammar's doc gives the cases.
var grammars = map[string]grammar{
	"eval":       numkeys(2, false),
	"evalsha":    numkeys(2, false),
	"eval_ro":    numkeys(2, false),
	"evalsha_ro": numkeys(2, false),
	"fcall":      numkeys(2, false),
	"fcall_ro":   numkeys(2, false),

	"zunionstore": numkeys(2, true),
	"zinterstore": numkeys(2, true),
	"zdiffstore":  numkeys(2, true),

	"zunion":     numkeys(1, false),
	"zinter":     numkeys(1, false),
	"zdiff":      numkeys(1, false),
	"zintercard": numkeys(1, false),
	"sintercard": numkeys(1, false),
	"lmpop":      numkeys(1, false),
	"zmpop":      numkeys(1, false),

	"blmpop": numkeys(2, false), // after the timeout
	"bzmpop": numkeys(2, false),

	"xread":      streamKeys,
	"xreadgroup": streamKeys,

	"sort":    sortKeys,
	"migrate": migrateKeys,

	"georadius":         storeKeys(6), // key longitude latitude radius unit
	"georadiusbymember": storeKeys(5), // key member radius unit
}

// numkeys is the grammar "numkeys key [key ...] ..." with the count at index
// at; withDest adds a destination key at index 1 (ZUNIONSTORE dest numkeys
// …). The count is parsed as the commands parse it (string2ll), so "+2",
// "02" or "2x" give no keys: the command fails with "value is not an
// integer". The same goes for a count below 1 or past the end of args.
//
// Redis's getkeys procedure reads the count with atoi, so COMMAND GETKEYS
// names a and b for "EVAL s 2x a b" and Redis Cluster routes by them; with no
// keys it goes to any node, which gives the same error, unless a and b are in
// different slots, where Redis Cluster answers CROSSSLOT instead.
func numkeys(at int, withDest bool) grammar {
	return func(args [][]byte, dst []int) []int {
		if at >= len(args) {
			return dst
		}
		n, ok := resp.ParseInt(args[at])
		if !ok || n < 1 || n > int64(len(args)-at-1) {
			return dst
		}
		if withDest {
			dst = append(dst, 1)
		}
		for i := range int(n) {
			dst = append(dst, at+1+i)
		}
		return dst
	}
}

// streamKeys is XREAD and XREADGROUP: the keys are the first half of what
// follows STREAMS, the other half being one ID per key. The options before
// STREAMS are skipped with their values, so a group or consumer named
// "streams" is not taken for the keyword; an unknown option or an odd
// number of arguments after STREAMS gives no keys, as the command fails.
//
// COMMAND GETKEYS, from the key specs, takes the first "STREAMS" at or
// after index 4 of XREADGROUP, so for XREADGROUP COUNT 1 GROUP g streams
// STREAMS s 0 it names "STREAMS"; the command reads s.
func streamKeys(args [][]byte, dst []int) []int {
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case isWord(a, "count"), isWord(a, "block"):
			i++
		case isWord(a, "group"):
			i += 2
		case isWord(a, "noack"):
		case isWord(a, "streams"):
			rest := len(args) - i - 1
			if rest == 0 || rest%2 != 0 {
				return dst
			}
			for k := range rest / 2 {
				dst = append(dst, i+1+k)
			}
			return dst
		default:
			return dst
		}
	}
	return dst
}

// sortKeys is SORT key [BY pattern] [LIMIT offset count] [GET pattern ...]
// [ASC|DESC] [ALPHA] [STORE dest]: the key, and the destination of the last
// STORE. BY and GET patterns name keys only through the sorted values, so
// no router can know them; Redis does not count them either.
//
// Redis's getkeys procedure reads the word after STORE again as an option,
// so for SORT k STORE store LIMIT 0 1 COMMAND GETKEYS (and Redis Cluster)
// name "LIMIT" as the destination; SORT writes to "store", and so do we.
func sortKeys(args [][]byte, dst []int) []int {
	if len(args) < 2 {
		return dst
	}
	dst = append(dst, 1)
	store := 0
	for i := 2; i < len(args); i++ {
		switch a := args[i]; {
		case isWord(a, "limit"):
			i += 2
		case isWord(a, "by"), isWord(a, "get"):
			i++
		case isWord(a, "store") && i+1 < len(args):
			i++
			store = i
		}
	}
	if store > 0 {
		dst = append(dst, store)
	}
	return dst
}

// migrateKeys is MIGRATE host port key|"" db timeout [COPY] [REPLACE]
// [AUTH password | AUTH2 username password] [KEYS key ...]: the key at 3, or
// the keys after KEYS when that key is empty. KEYS with a non-empty key is an
// error, so no keys.
//
// COMMAND GETKEYS names the empty key "" for a KEYS with nothing after it;
// MIGRATE then moves no key at all.
func migrateKeys(args [][]byte, dst []int) []int {
	if len(args) < 4 {
		return dst
	}
	for i := 6; i < len(args); i++ {
		switch a := args[i]; {
		case isWord(a, "auth"):
			i++
		case isWord(a, "auth2"):
			i += 2
		case isWord(a, "keys"):
			if len(args[3]) > 0 {
				return dst
			}
			for k := i + 1; k < len(args); k++ {
				dst = append(dst, k)
			}
			return dst
		}
	}
	return append(dst, 3)
}

// storeKeys is GEORADIUS and GEORADIUSBYMEMBER: the key at 1, and the
// destination of the last STORE or STOREDIST among the options, which start
// at index from. Both options set the one destination, so the last wins.
//
// COMMAND GETKEYS, from the key specs, names the first STORE and the first
// STOREDIST destination; Redis Cluster routes by the last, as we do.
func storeKeys(from int) grammar {
	return func(args [][]byte, dst []int) []int {
		if len(args) < 2 {
			return dst
		}
		dst = append(dst, 1)
		store := 0
		for i := from; i+1 < len(args); i++ {
			if isWord(args[i], "store") || isWord(args[i], "storedist") {
				i++
				store = i
			}
		}
		if store > 0 {
			dst = append(dst, store)
		}
		return dst
	}
}
