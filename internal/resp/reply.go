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

// ErrBadReply is a reply that is not well-formed RESP2; the connection it
// came from can no longer be trusted.
var ErrBadReply = errors.New("resp: malformed reply from server")

// ReadReply appends one complete RESP2 reply from r to dst, nested arrays
// included, byte for byte as the server sent it.
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
		case '$':
			n, ok := ParseInt(line[1:])
			if !ok || n < -1 || n > maxReplyLen {
				return dst, fmt.Errorf("%w: bulk length %q", ErrBadReply, line[1:])
			}
			if n >= 0 {
				if dst, err = readFull(r, dst, int(n)+2); err != nil {
					return dst, err
				}
			}
		case '*':
			n, ok := ParseInt(line[1:])
			if !ok || n < -1 || n > maxReplyLen {
				return dst, fmt.Errorf("%w: array length %q", ErrBadReply, line[1:])
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
