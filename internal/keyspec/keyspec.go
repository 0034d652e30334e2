package keyspec

import "errors"

// ErrUnknownCommand is returned by Keys for a command the table does not
// have. Redis answers such a command with its own error text, which names the
// command and its first arguments; callers build that reply themselves.
var ErrUnknownCommand = errors.New("keyspec: unknown command")

// Errors of Check: what Redis refuses a known command for before running it.
var (
	ErrUnknownSubcommand = errors.New("keyspec: unknown subcommand")
	ErrArity             = errors.New("keyspec: wrong number of arguments")
)

// nameBuf is the size of the stack buffer Keys lower-cases a command name
// into; Redis's longest command and subcommand names are under 32 bytes.
const nameBuf = 64

// Table knows where the keys of each command are. It is read-only once
// built, so it is safe for concurrent use.
type Table struct {
	commands map[string]*command // by lower-case name
	longest  int                 // longest name, subcommand names included
}

// command is one entry of the COMMAND reply.
type command struct {
	arity             int
	first, last, step int                 // legacy key positions; first 0 means no keys
	keys              grammar             // nil: the legacy positions tell all the keys
	subcommands       map[string]*command // by lower-case name without "container|"; nil for a plain command
	write             bool                // it may modify its keys: flagged "write", or a script or function
}

// Writes reports whether the command (or its subcommand) may modify the
// keys it names: Redis flags it "write", or it is EVAL, EVALSHA or FCALL,
// whose key specs Redis marks RW. Unknown commands do not.
func (t *Table) Writes(args [][]byte) bool {
	if len(args) == 0 {
		return false
	}
	var buf [nameBuf]byte
	c := t.lookup(t.commands, args[0], &buf)
	if c != nil && c.subcommands != nil && len(args) > 1 {
		if sub := t.lookup(c.subcommands, args[1], &buf); sub != nil {
			c = sub
		}
	}
	return c != nil && c.write
}

// Keys appends to dst the indexes into args of the arguments that are keys,
// in argument order, and returns the extended slice. args[0] is the command
// name in any case; for a container command (OBJECT, XINFO, …) args[1] picks
// the subcommand.
//
// Keys are the arguments Redis Cluster routes by, so the channels of
// SSUBSCRIBE, SUNSUBSCRIBE and SPUBLISH count, although COMMAND GETKEYS
// does not call them keys.
//
// A command Redis will refuse — wrong number of arguments, unknown
// subcommand, a numkeys that is not a valid count — has no keys and no
// error: any node gives the client Redis's own error for it. The only error
// is ErrUnknownCommand, for a name the table does not have (or an empty
// args).
//
// Keys does not allocate when dst has room for the keys, unless the table
// has a command name longer than 64 bytes and args names it.
func (t *Table) Keys(args [][]byte, dst []int) ([]int, error) {
	if len(args) == 0 {
		return dst, ErrUnknownCommand
	}
	var buf [nameBuf]byte
	c := t.lookup(t.commands, args[0], &buf)
	if c == nil {
		return dst, ErrUnknownCommand
	}
	if c.subcommands != nil && len(args) > 1 {
		if c = t.lookup(c.subcommands, args[1], &buf); c == nil {
			return dst, nil
		}
	}
	if (c.arity > 0 && len(args) != c.arity) || len(args) < -c.arity {
		return dst, nil
	}
	if c.keys != nil {
		return c.keys(args, dst), nil
	}
	return c.rangeKeys(args, dst), nil
}

// Check reports whether Redis would refuse args before running it, in the
// order Redis checks: ErrUnknownCommand, ErrUnknownSubcommand, ErrArity
// (of the subcommand when there is one); nil when name and arity are right.
func (t *Table) Check(args [][]byte) error {
	if len(args) == 0 {
		return ErrUnknownCommand
	}
	var buf [nameBuf]byte
	c := t.lookup(t.commands, args[0], &buf)
	switch {
	case c == nil:
		return ErrUnknownCommand
	case c.subcommands != nil && len(args) > 1:
		if c = t.lookup(c.subcommands, args[1], &buf); c == nil {
			return ErrUnknownSubcommand
		}
	}
	if (c.arity > 0 && len(args) != c.arity) || len(args) < -c.arity {
		return ErrArity
	}
	return nil
}

// lookup finds name in m without allocating, except for a name longer than
// buf that some command of the table does have.
func (t *Table) lookup(m map[string]*command, name []byte, buf *[nameBuf]byte) *command {
	if len(name) > t.longest {
		return nil
	}
	var lower []byte
	if len(name) <= len(buf) {
		lower = buf[:len(name)]
	} else {
		lower = make([]byte, len(name))
	}
	toLower(lower, name)
	return m[string(lower)]
}

// rangeKeys applies the legacy key positions as Redis does: a negative last
// counts from the end, and a range that does not fit args gives no keys at
// all, since the command is going to fail.
func (c *command) rangeKeys(args [][]byte, dst []int) []int {
	if c.first == 0 {
		return dst
	}
	last := c.last
	if last < 0 {
		last += len(args)
	}
	if last >= len(args) {
		return dst
	}
	for i := c.first; i <= last; i += c.step {
		dst = append(dst, i)
	}
	return dst
}

// toLower writes the ASCII lower case of src to dst, which is as long. Only
// ASCII: Redis compares command names and options with strcasecmp in the C
// locale, so "ſtore" is not "store" to it.
func toLower(dst, src []byte) {
	for i, c := range src {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst[i] = c
	}
}

// isWord reports whether arg is the lower-case word w, ignoring ASCII case.
func isWord(arg []byte, w string) bool {
	if len(arg) != len(w) {
		return false
	}
	for i, c := range arg {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != w[i] {
			return false
		}
	}
	return true
}
