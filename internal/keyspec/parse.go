package keyspec

import (
	"bytes"
	"fmt"
	"math"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// Parse builds a Table from the reply to COMMAND: the RESP2 bytes as
// resp.ReadReply returns them, an array with one entry per command:
//
//	name, arity, flags, first key, last key, key step,
//	[ACL categories, tips, key specs, subcommands]
//
// The first six elements are all Redis before 6.0 sends. Subcommands (Redis
// 7.0 and later) are entries of the same shape named "container|sub". Any
// other element is skipped, so replies of later versions parse as long as
// these keep their places.
//
// The error is a malformed reply: not RESP2, an element of the wrong type,
// a duplicate name, or key positions that cannot be applied (a negative
// first key, a step below 1). An error reply, such as a NOPERM for COMMAND,
// is a malformed reply too; its text is in the error.
func Parse(reply []byte) (*Table, error) {
	r := &reader{b: reply}
	t := &Table{commands: make(map[string]*command)}
	for i, n := 0, r.array(); i < n && r.err == nil; i++ {
		name, c := r.command(t, "")
		if _, dup := t.commands[name]; dup && r.err == nil {
			r.failf("command %q listed twice", name)
		}
		t.commands[name] = c
	}
	if r.err == nil && len(r.b) > 0 {
		r.failf("%d bytes after the reply", len(r.b))
	}
	if r.err != nil {
		return nil, r.err
	}
	return t, nil
}

// command reads one entry; container is the name of the command whose
// subcommand it is, or "" at the top level, where subcommands are read.
func (r *reader) command(t *Table, container string) (string, *command) {
	n := r.array()
	if n < 6 && r.err == nil {
		r.failf("a command entry has %d elements, want at least 6", n)
	}
	raw := r.str()
	lower := make([]byte, len(raw))
	toLower(lower, raw)
	name := string(lower)
	if container != "" {
		sub, ok := strings.CutPrefix(name, container+"|")
		if !ok && r.err == nil {
			r.failf("subcommand %q of %q is not named %q", name, container, container+"|…")
		}
		name = sub
	}
	if name == "" && r.err == nil {
		r.failf("a command entry has an empty name")
	}
	t.longest = max(t.longest, len(name))
	c := &command{arity: r.int("arity", name)}
	movable := false
	for range r.array() {
		switch f := r.str(); {
		case isWord(f, "movablekeys"):
			movable = true
		case isWord(f, "write"):
			c.write = true
		}
	}
	// Scripts and functions carry no "write" flag, their key specs say
	// RW: they may write unless called as the read-only variant.
	c.write = c.write || name == "eval" || name == "evalsha" || name == "fcall"
	c.first = r.int("first key", name)
	c.last = r.int("last key", name)
	c.step = r.int("key step", name)
	if c.first < 0 || (c.first > 0 && c.step < 1) {
		r.failf("command %q: key positions %d, %d, %d", name, c.first, c.last, c.step)
	}
	if movable && container == "" {
		c.keys = grammars[name]
	}
	for i := 6; i < n && r.err == nil; i++ {
		if i == 9 && container == "" {
			c.subcommands = r.subcommands(t, name)
		} else {
			r.skip()
		}
	}
	return name, c
}

// subcommands reads the subcommand entries of container; nil when there
// are none, so Keys tells a container by a non-nil map.
func (r *reader) subcommands(t *Table, container string) map[string]*command {
	n := r.array()
	if n == 0 {
		return nil
	}
	subs := make(map[string]*command)
	for i := 0; i < n && r.err == nil; i++ {
		name, c := r.command(t, container)
		if _, dup := subs[name]; dup && r.err == nil {
			r.failf("subcommand %q of %q listed twice", name, container)
		}
		subs[name] = c
	}
	return subs
}

// reader walks a RESP2 reply held in memory. After the first error every
// method returns zero values, so callers check err once at the end.
type reader struct {
	b   []byte
	err error
}

func (r *reader) failf(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("keyspec: malformed COMMAND reply: "+format, args...)
	}
}

// line returns the next line without its CRLF; it is at least the type byte.
func (r *reader) line() []byte {
	if r.err != nil {
		return nil
	}
	i := bytes.Index(r.b, []byte("\r\n"))
	if i < 1 {
		r.failf("truncated")
		return nil
	}
	line := r.b[:i]
	r.b = r.b[i+2:]
	return line
}

// array reads an array header and returns its length.
func (r *reader) array() int {
	line := r.line()
	if r.err != nil {
		return 0
	}
	n, ok := resp.ParseInt(line[1:])
	if line[0] != '*' || !ok || n < 0 || n > int64(len(r.b)) {
		// Every element takes at least 3 bytes, so a length beyond what is
		// left is truncation, and a loop over it would only spin.
		r.failf("want an array, got %.60q", line)
		return 0
	}
	return int(n)
}

// str reads a bulk or status string.
func (r *reader) str() []byte {
	line := r.line()
	if r.err != nil {
		return nil
	}
	switch line[0] {
	case '+':
		return line[1:]
	case '$':
		return r.bulk(line)
	}
	r.failf("want a string, got %.60q", line)
	return nil
}

// bulk reads the body of the bulk string whose header is line; nil for a
// nil bulk.
func (r *reader) bulk(line []byte) []byte {
	n, ok := resp.ParseInt(line[1:])
	if ok && n == -1 {
		return nil
	}
	if !ok || n < 0 || n > int64(len(r.b))-2 || r.b[n] != '\r' || r.b[n+1] != '\n' {
		r.failf("bad bulk string %.60q", line)
		return nil
	}
	s := r.b[:n]
	r.b = r.b[n+2:]
	return s
}

// int reads an integer reply in int32 range: the what of command name.
func (r *reader) int(what, name string) int {
	line := r.line()
	if r.err != nil {
		return 0
	}
	n, ok := resp.ParseInt(line[1:])
	if line[0] != ':' || !ok || n < math.MinInt32 || n > math.MaxInt32 {
		r.failf("command %q: %s: want an integer, got %.60q", name, what, line)
		return 0
	}
	return int(n)
}

// skip reads one value of any type, nested arrays included.
func (r *reader) skip() {
	for pending := 1; pending > 0; pending-- {
		line := r.line()
		if r.err != nil {
			return
		}
		switch line[0] {
		case '+', '-', ':':
		case '$':
			r.bulk(line)
		case '*':
			n, ok := resp.ParseInt(line[1:])
			if !ok || n < -1 || n > int64(len(r.b)) {
				r.failf("bad array header %.60q", line)
				return
			}
			pending += max(int(n), 0)
		default:
			r.failf("bad type byte in %.60q", line)
			return
		}
	}
}
