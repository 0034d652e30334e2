package rewrite

import (
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
)

// A proxy that relays a command as for plain keys, not knowing that a key
// is hot (another proxy made it so, or this one's config is older), finds
// out from Redis's reply (contract 9): the value of a GET is the layout,
// and a command that would act on a stale value fails on the layout
// instead, as it is not an integer, before writing anything.

// failsOnLayout reports whether name is a single-key command that fails on
// a layout without doing anything, and that the engine answers on a hot
// key. A switch, not a map: it runs for every command relayed in db 0.
func failsOnLayout(name string) bool {
	switch name {
	case "incr", "decr", "incrby", "decrby", "eval", "evalsha", "eval_ro", "evalsha_ro":
		return true
	}
	return false
}

// MayShowLayout reports whether Redis's reply to the command name (lower
// case) with args, relayed as for plain keys, may show that a key holds a
// layout (ok), and how:
//
//   - GET and MGET: a value may be a layout (IsMarker); fails is false
//     and keyAt 0, the keys being args[1:].
//   - INCR, DECR, INCRBY, DECRBY, and EVAL, EVALSHA and their _RO forms
//     naming exactly one key: the error may be the one a layout causes
//     (LayoutFailure); fails is true, and the key is args[keyAt].
//
// Where the keys are follows from each command's syntax, so no command
// table is needed.
func MayShowLayout(name string, args [][]byte) (keyAt int, fails, ok bool) {
	switch {
	case name == "get" || name == "mget":
		return 0, false, true
	case !failsOnLayout(name):
		return 0, false, false
	case strings.HasPrefix(name, "eval"):
		if len(args) < 4 || string(args[2]) != "1" {
			return 0, false, false
		}
		return 3, true, true
	case len(args) < 2:
		return 0, false, false
	}
	return 1, true, true
}

// LayoutFailure reports whether reply, one RESP frame that Redis answered
// to args relayed as for a plain key, is the failure a layout in that key
// causes before anything is written: "not an integer" to INCR, DECR,
// INCRBY or DECRBY, or a Lua error to a deduct script the config declares
// (which fails at its first comparison, before any write). Any other
// failure — a script that may have written before it failed, a lost
// reply — is not: the command may have applied, and a retry could apply
// it twice.
func (e *Engine) LayoutFailure(args [][]byte, reply []byte) bool {
	err := replyErr(reply)
	if err == nil {
		return false
	}
	text := err.Error()
	if e.deductScript(args) != nil {
		return strings.HasPrefix(text, "ERR user_script:") || strings.HasPrefix(text, "ERR Error running script")
	}
	return text == rediserr.NotInteger && !strings.HasPrefix(strings.ToLower(string(args[0])), "eval")
}
