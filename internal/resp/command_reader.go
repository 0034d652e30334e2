package resp

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"sync"
	"syscall"
)

// Sizes of the arguments' arena: what a first pipeline gets, and the
// most it grows to for the many small commands of a long one.
const (
	minArgs     = 4
	maxArgsKept = 4096
	// maxMarksKept is the most argument offsets (two an argument) an idle
	// reader keeps: one command of many arguments should not pin them.
	maxMarksKept = 128
)

// Limits Redis applies to what a client sends (networking.c, Redis 7.0).
const (
	// InlineMax is PROTO_INLINE_MAX_SIZE: the longest inline command, and the
	// longest multibulk or bulk count line, in bytes.
	InlineMax = 64 * 1024
	// UnauthMultibulkMax and UnauthBulkMax bound what a client that still has
	// to authenticate may send: at most 10 arguments of 16 KiB each.
	UnauthMultibulkMax = 10
	UnauthBulkMax      = 16384

	minReadSize = 4096
	maxReadSize = 64 * 1024
)

// ProtocolError is a malformed request. Its text is what Redis replies,
// without the "ERR " prefix; the connection must be closed after replying.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "Protocol error: " + e.Msg }

// Protocol errors with Redis 7.0's exact texts.
var (
	ErrTooBigInline        = &ProtocolError{"too big inline request"}
	ErrUnbalancedQuotes    = &ProtocolError{"unbalanced quotes in request"}
	ErrTooBigMultibulk     = &ProtocolError{"too big mbulk count string"}
	ErrInvalidMultibulk    = &ProtocolError{"invalid multibulk length"}
	ErrUnauthMultibulk     = &ProtocolError{"unauthenticated multibulk length"}
	ErrTooBigBulkCount     = &ProtocolError{"too big bulk count string"}
	ErrInvalidBulkLength   = &ProtocolError{"invalid bulk length"}
	ErrUnauthBulkLength    = &ProtocolError{"unauthenticated bulk length"}
	ErrQueryBufferExceeded = errors.New("resp: client query buffer limit reached")
)

// Command is one request. Args alias the reader's buffer and stay valid only
// until the next call to ReadCommands.
type Command struct {
	Args [][]byte
	// Raw is the request as the client framed it (multibulk), ready to be
	// forwarded as is; nil for an inline command, which must be re-encoded.
	Raw []byte
}

// readBuffers holds the minReadSize buffers of socket readers that wait
// with nothing buffered: a reader waiting for its client's next command
// holds none, so an idle client costs no read buffer; its next read takes
// one (see readIdle).
var readBuffers = sync.Pool{New: func() any { return new([minReadSize]byte) }}

// CommandReader parses client requests. It is not safe for concurrent use.
type CommandReader struct {
	rd  io.Reader
	buf []byte
	// raw is rd's socket when rd has one (syscall.Conn): then the reader
	// waits for input with no buffer; nil for other readers, TLS too.
	raw          syscall.RawConn
	readFD       func(fd uintptr) bool // readStep as a method value made once
	got          int                   // readStep's result: bytes read…
	gotErr       error                 // …or why none
	start, end   int                   // unparsed input is buf[start:end]
	maxQuery     int
	maxBulk      int64
	authRequired bool
	err          error  // sticky: once set, every call returns it
	grew         func() // called when buf was made anew; see SetGrowHook

	// A multibulk frame not yet complete, so a big value arriving in many
	// reads is not parsed again from its start each time. Offsets are
	// relative to start.
	partial struct {
		active bool
		left   int   // arguments still to read
		bulk   int64 // length of the argument being read, -1 if unknown
		pos    int   // where parsing resumes
		marks  []int // start and end offsets of the arguments read
	}
	cmds []Command
	// args holds the Args of the commands of one ReadCommands call back
	// to back, so that a pipeline costs one allocation, not one per
	// command; dropped before the reader waits for its client.
	args     [][]byte
	argsHint int // how many arguments the last call's commands had: the next arena's size
}

// NewCommandReader reads from rd. maxQuery bounds the unparsed bytes one
// client may have buffered (Redis client-query-buffer-limit, default 1 GiB);
// maxBulk is the largest bulk argument accepted (Redis proto-max-bulk-len,
// default 512 MiB).
//
// When rd is a socket (a syscall.Conn such as *net.TCPConn), a reader with
// nothing buffered gives its buffer back while it waits for the client and
// takes one from a shared pool once input arrives. Read deadlines and
// Close still end the wait; the error then is the net.Conn's.
func NewCommandReader(rd io.Reader, maxQuery int, maxBulk int64) *CommandReader {
	r := &CommandReader{rd: rd, maxQuery: maxQuery, maxBulk: maxBulk}
	if sc, ok := rd.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			r.raw = raw
			r.readFD = r.readStep
		}
	}
	return r
}

// SetAuthRequired applies Redis's tighter limits for clients that have not
// authenticated yet.
func (r *CommandReader) SetAuthRequired(v bool) { r.authRequired = v }

// Buffered reports how many bytes have been read but not yet parsed.
func (r *CommandReader) Buffered() int { return r.end - r.start }

// Size reports the bytes the reader's buffer holds, used or not: 0 while
// a socket reader waits with nothing buffered. Taking and giving back that
// pooled buffer does not call the grow hook, so that a client's every
// request does not change the accounts twice.
func (r *CommandReader) Size() int { return len(r.buf) }

// SetGrowHook sets f to be called whenever the buffer is made anew (grown,
// or given back when idle), so that a caller accounting memory sees a big
// request while it is still arriving, before ReadCommands returns.
func (r *CommandReader) SetGrowHook(f func()) { r.grew = f }

func (r *CommandReader) resized() {
	if r.grew != nil {
		r.grew()
	}
}

// Feed appends bytes read from the client by someone else (while the session
// waited on a blocking command) as if the reader had read them. Commands
// already returned stay valid: their bytes are never moved.
func (r *CommandReader) Feed(p []byte) {
	if len(r.buf)-r.end < len(p) {
		used := r.end - r.start
		buf := make([]byte, max(used+len(p), 2*len(r.buf), minReadSize))
		copy(buf, r.buf[r.start:r.end])
		r.buf, r.start, r.end = buf, 0, used
		r.resized()
	}
	r.end += copy(r.buf[r.end:], p)
}

// ReadCommands returns every complete command buffered, reading from the
// client once when none is. The error is a *ProtocolError, an I/O error, or
// ErrQueryBufferExceeded; commands parsed before a protocol error are
// returned with it, so they can be answered before the error.
func (r *CommandReader) ReadCommands() ([]Command, error) {
	if r.err != nil {
		return nil, r.err
	}
	clear(r.cmds) // drop references into an old buffer
	r.cmds = r.cmds[:0]
	if len(r.args) > 0 {
		r.argsHint = len(r.args)
	}
	clear(r.args)
	r.args = r.args[:0]
	for {
		err := r.parse()
		if len(r.cmds) > 0 || err != nil {
			r.err = err
			return r.cmds, err
		}
		if r.end-r.start > r.maxQuery {
			r.err = ErrQueryBufferExceeded
			return nil, r.err
		}
		if r.start == r.end && len(r.buf) > maxReadSize {
			r.buf, r.start, r.end = nil, 0, 0 // idle: give a grown buffer back
			r.resized()
		}
		if r.start == r.end {
			r.args = nil // may wait long: an idle client keeps none
			if cap(r.partial.marks) > maxMarksKept {
				r.partial.marks = nil
			}
		}
		n, err := r.read()
		r.end += n
		if n == 0 && err != nil {
			r.err = err
			return nil, err
		}
	}
}

// Resume forgets the error of the last read, for a caller that made it
// fail on purpose (a read deadline in the past): the input buffered stays.
func (r *CommandReader) Resume() { r.err = nil }

// read reads from the client once, into the free room after the unparsed
// input.
func (r *CommandReader) read() (int, error) {
	if r.start == r.end && r.raw != nil && len(r.buf) <= minReadSize {
		return r.readIdle()
	}
	r.compact(r.readSize())
	return r.rd.Read(r.buf[r.end:])
}

// readIdle waits for the client with no buffer, then reads into one from
// readBuffers. r.buf is empty; the commands it held are no longer valid.
func (r *CommandReader) readIdle() (int, error) {
	r.release()
	r.start, r.end = 0, 0
	r.got, r.gotErr = 0, nil
	if err := r.raw.Read(r.readFD); err != nil {
		return 0, err // a deadline, or Close: as net.Conn's Read says them
	}
	return r.got, r.gotErr
}

// readStep is readIdle's step on the socket: a read when input is there,
// false (wait) when not. The buffer goes back to the pool meanwhile.
func (r *CommandReader) readStep(fd uintptr) bool {
	if r.buf == nil {
		r.buf = readBuffers.Get().(*[minReadSize]byte)[:]
	}
	for {
		n, err := syscall.Read(int(fd), r.buf)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			r.release()
			return false
		case err != nil:
			r.gotErr = os.NewSyscallError("read", err)
		case n == 0:
			r.gotErr = io.EOF
		default:
			r.got = n
		}
		return true
	}
}

// release gives a buffer of minReadSize back to readBuffers; the reader
// keeps a bigger one (up to maxReadSize), as a client that sent big
// pipelines once is likely to again.
func (r *CommandReader) release() {
	if len(r.buf) == minReadSize {
		readBuffers.Put((*[minReadSize]byte)(r.buf))
		r.buf = nil
	}
}

// readSize is how much free room the next read wants: the rest of a bulk
// being received, but never more than what has arrived already, so a
// length header alone cannot make us allocate 512 MiB.
func (r *CommandReader) readSize() int {
	used := r.end - r.start
	if p := &r.partial; p.active && p.bulk >= 0 {
		need := p.pos + int(p.bulk) + 2 - used
		return max(min(need, used), minReadSize)
	}
	return minReadSize
}

// compact makes room for n more bytes after the unparsed input. The buffer
// at least doubles when it grows, so a request arriving in many small reads
// costs linear time, as in Redis. An idle reader drops a grown buffer, so
// idle clients stay small.
func (r *CommandReader) compact(n int) {
	if r.start == r.end {
		r.start, r.end = 0, 0
		if len(r.buf) > maxReadSize {
			r.buf = nil
		}
	}
	if len(r.buf)-r.end >= n {
		return
	}
	used := r.end - r.start
	if len(r.buf)-used >= n && r.start >= used {
		copy(r.buf, r.buf[r.start:r.end]) // cheap: less to move than was consumed
	} else {
		buf := make([]byte, max(used+n, 2*len(r.buf), minReadSize))
		copy(buf, r.buf[r.start:r.end])
		if r.raw != nil {
			r.release() // the commands it held are no longer valid
		}
		r.buf = buf
		defer r.resized()
	}
	r.start, r.end = 0, used
}

// parse appends the complete commands in the buffer to r.cmds.
func (r *CommandReader) parse() error {
	for r.start < r.end {
		if r.authRequired && len(r.cmds) > 0 {
			// One at a time until the client has authenticated: an AUTH
			// pipelined with bigger commands lifts the limits for them.
			return nil
		}
		var ok bool
		var err error
		if r.partial.active || r.buf[r.start] == '*' {
			ok, err = r.parseMultibulk()
		} else {
			ok, err = r.parseInline()
		}
		if err != nil || !ok {
			return err
		}
	}
	return nil
}

// indexCString finds c the way strchr does on Redis's query buffer: a NUL
// byte ends the search.
func indexCString(b []byte, c byte) int {
	i := bytes.IndexByte(b, c)
	if i < 0 {
		return -1
	}
	if z := bytes.IndexByte(b[:i], 0); z >= 0 {
		return -1
	}
	return i
}

func (r *CommandReader) parseInline() (bool, error) {
	b := r.buf[r.start:r.end]
	nl := indexCString(b, '\n')
	if nl < 0 {
		if len(b) > InlineMax {
			return false, ErrTooBigInline
		}
		return false, nil
	}
	line := b[:nl]
	if nl > 0 && line[nl-1] == '\r' {
		line = line[:nl-1]
	}
	args, ok := SplitArgs(line)
	if !ok {
		return false, ErrUnbalancedQuotes
	}
	r.start += nl + 1
	if len(args) > 0 {
		r.cmds = append(r.cmds, Command{Args: args})
	}
	return true, nil
}

func (r *CommandReader) parseMultibulk() (bool, error) {
	p := &r.partial
	b := r.buf[r.start:r.end]
	if !p.active {
		cr := indexCString(b, '\r')
		if cr < 0 {
			if len(b) > InlineMax {
				return false, ErrTooBigMultibulk
			}
			return false, nil
		}
		if cr > len(b)-2 {
			return false, nil
		}
		n, ok := ParseInt(b[1:cr])
		if !ok || n > math.MaxInt32 {
			return false, ErrInvalidMultibulk
		}
		if n > UnauthMultibulkMax && r.authRequired {
			return false, ErrUnauthMultibulk
		}
		if n <= 0 {
			r.start += cr + 2
			return true, nil
		}
		p.active, p.left, p.bulk, p.pos = true, int(n), -1, cr+2
		p.marks = p.marks[:0]
	}
	for p.left > 0 {
		if p.bulk < 0 {
			rest := b[p.pos:]
			cr := indexCString(rest, '\r')
			if cr < 0 {
				if len(rest) > InlineMax {
					return false, ErrTooBigBulkCount
				}
				return false, nil
			}
			if cr > len(rest)-2 {
				return false, nil
			}
			if rest[0] != '$' {
				got := rest[0]
				if got == '\r' || got == '\n' {
					got = ' ' // Redis blanks CR and LF in every error text
				}
				return false, &ProtocolError{"expected '$', got '" + string([]byte{got}) + "'"}
			}
			n, ok := ParseInt(rest[1:cr])
			if !ok || n < 0 || n > r.maxBulk {
				return false, ErrInvalidBulkLength
			}
			if n > UnauthBulkMax && r.authRequired {
				return false, ErrUnauthBulkLength
			}
			p.bulk = n
			p.pos += cr + 2
		}
		if int64(len(b)-p.pos) < p.bulk+2 {
			return false, nil
		}
		end := p.pos + int(p.bulk)
		p.marks = append(p.marks, p.pos, end)
		p.pos = end + 2 // Redis skips the two bytes after a bulk unchecked
		p.bulk = -1
		p.left--
	}
	raw := b[:p.pos]
	n := len(p.marks) / 2
	if cap(r.args)-len(r.args) < n {
		// Commands already parsed keep the old one.
		r.args = make([][]byte, 0, max(n, min(max(2*cap(r.args), r.argsHint), maxArgsKept), minArgs))
	}
	first := len(r.args)
	for i := range n {
		r.args = append(r.args, raw[p.marks[2*i]:p.marks[2*i+1]])
	}
	r.cmds = append(r.cmds, Command{Args: r.args[first:len(r.args):len(r.args)], Raw: raw})
	r.start += p.pos
	p.active = false
	return true, nil
}

// ParseInt parses a decimal the way Redis's string2ll does: an optional
// minus, no plus, no leading zeros, no spaces, within int64.
func ParseInt(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	if len(b) == 1 && b[0] == '0' {
		return 0, true
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || b[0] < '1' || b[0] > '9' {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		if v > (math.MaxUint64-9)/10 {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	if neg {
		if v > 1<<63 {
			return 0, false
		}
		return -int64(v), true
	}
	if v > math.MaxInt64 {
		return 0, false
	}
	return int64(v), true
}
