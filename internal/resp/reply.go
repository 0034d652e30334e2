package resp

import (
	"bufio"
	"errors"
	"fmt"
	"slices"

	"github.com/tidwall/redcon"
)

// maxReplyLen bounds a bulk or array length in a reply (4 GiB). Redis's
// own limit on a string is 512 MiB by default; anything near int64's range
// is a corrupt stream, not data.
const maxReplyLen = 1 << 32

// ErrBadReply is a reply that is not well-formed RESP2 or RESP3; the
// connection it came from can no longer be trusted.
var ErrBadReply = errors.New("resp: malformed reply from server")

// ReadReply appends one complete reply from r to dst, nested aggregates
// included, byte for byte as the server sent it: RESP2's types and
// RESP3's (map, set, double, boolean, big number, verbatim string, blob
// error, null, push). An attribute is framed together with the reply it
// precedes, as one.
func ReadReply(r *bufio.Reader, dst []byte) ([]byte, error) {
	for pending := 1; pending > 0; pending-- {
		start := len(dst)
		var err error
		if dst, err = readLine(r, dst); err != nil {
			return dst, err
		}
		line := dst[start : len(dst)-2]
		switch line[0] {
		case '+', '-', ':':
		case ',', '(': // double, big number: a number on the line
			if len(line) == 1 {
				return dst, fmt.Errorf("%w: empty %q", ErrBadReply, line[0])
			}
		case '#': // boolean
			if len(line) != 2 || line[1] != 't' && line[1] != 'f' {
				return dst, fmt.Errorf("%w: boolean %q", ErrBadReply, line[1:])
			}
		case '_': // null
			if len(line) != 1 {
				return dst, fmt.Errorf("%w: null %q", ErrBadReply, line)
			}
		case '$', '=', '!': // bulk string, verbatim string, blob error
			n, err := replyLen(line, line[0] == '$')
			if err != nil {
				return dst, err
			}
			if n >= 0 {
				if dst, err = readFull(r, dst, int(n)+2); err != nil {
					return dst, err
				}
				if dst[len(dst)-2] != '\r' || dst[len(dst)-1] != '\n' {
					return dst, fmt.Errorf("%w: %q payload not ended by CRLF", ErrBadReply, line[0])
				}
			}
		case '*', '~', '>', '%', '|': // array, set, push; map, attribute: pairs
			n, err := replyLen(line, line[0] == '*')
			if err != nil {
				return dst, err
			}
			switch line[0] {
			case '%':
				n *= 2
			case '|':
				n = 2*n + 1 // and the reply it is about
			}
			if n > 0 {
				pending += int(n)
			}
		default:
			return dst, fmt.Errorf("%w: type byte %q", ErrBadReply, line[0])
		}
	}
	return dst, nil
}

// replyLen is the length in the header line of a blob or an aggregate;
// -1 (RESP2's nil) only where nilOK.
func replyLen(line []byte, nilOK bool) (int64, error) {
	n, ok := ParseInt(line[1:])
	if !ok || n < -1 || n == -1 && !nilOK || n > maxReplyLen {
		return 0, fmt.Errorf("%w: length %q after %q", ErrBadReply, line[1:], line[0])
	}
	return n, nil
}

// readLine appends one CRLF-terminated line, CRLF included.
func readLine(r *bufio.Reader, dst []byte) ([]byte, error) {
	start := len(dst)
	for {
		chunk, err := r.ReadSlice('\n')
		dst = append(dst, chunk...)
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull {
			return dst, err
		}
	}
	if n := len(dst) - start; n < 3 || dst[len(dst)-2] != '\r' {
		return dst, fmt.Errorf("%w: line %q", ErrBadReply, dst[start:])
	}
	return dst, nil
}

// bigReplies is where readFull's buffer starts to double.
const bigReplies = 1 << 20

// readFull appends n bytes from r. Room grows with what arrives, not with
// the announced length, so a bad length cannot allocate gigabytes.
func readFull(r *bufio.Reader, dst []byte, n int) ([]byte, error) {
	for n > 0 {
		if len(dst) == cap(dst) {
			room := min(n, max(len(dst), 4096))
			if len(dst) >= bigReplies {
				// Replies gathered by the MiB (a pipeline of big GETs):
				// double, or each one would copy all before it again.
				room = max(room, len(dst))
			}
			dst = slices.Grow(dst, room)
		}
		m, err := r.Read(dst[len(dst):min(cap(dst), len(dst)+n)])
		dst = dst[:len(dst)+m]
		n -= m
		if err != nil && n > 0 {
			return dst, err
		}
	}
	return dst, nil
}

// AppendCommand appends args as a multibulk request.
func AppendCommand(b []byte, args ...[]byte) []byte {
	b = redcon.AppendArray(b, len(args))
	for _, a := range args {
		b = redcon.AppendBulk(b, a)
	}
	return b
}
