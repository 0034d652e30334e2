package resp

import (
	"bytes"
	"strconv"
)

// Proto is the protocol a client speaks: RESP2 until it sends HELLO 3.
// Its methods append the replies a proxy makes itself in that protocol,
// shaped as Redis 7.0's addReply functions (networking.c) shape them: in
// RESP2 a map is a flat array of key, value pairs, a set an array, a
// verbatim string a bulk string, a null a nil bulk or nil array.
type Proto uint8

// The protocols HELLO negotiates.
const (
	RESP2 Proto = 2
	RESP3 Proto = 3
)

// AppendMap appends the header of a map of n pairs: %n, or *2n in RESP2.
func (p Proto) AppendMap(b []byte, n int) []byte {
	if p == RESP3 {
		return appendHeader(b, '%', n)
	}
	return appendHeader(b, '*', 2*n)
}

// AppendPush appends the header of a push of n elements, which a
// subscriber gets for its (un)subscriptions and messages: >n, or *n in
// RESP2.
func (p Proto) AppendPush(b []byte, n int) []byte {
	if p == RESP3 {
		return appendHeader(b, '>', n)
	}
	return appendHeader(b, '*', n)
}

// AppendNull appends a null: _, or the nil bulk $-1 in RESP2.
func (p Proto) AppendNull(b []byte) []byte {
	if p == RESP3 {
		return append(b, "_\r\n"...)
	}
	return append(b, "$-1\r\n"...)
}

// AppendNullArray appends the null that stands for a missing array (EXEC
// of a failed transaction): _, or *-1 in RESP2.
func (p Proto) AppendNullArray(b []byte) []byte {
	if p == RESP3 {
		return append(b, "_\r\n"...)
	}
	return append(b, "*-1\r\n"...)
}

// AppendVerbatim appends text as a verbatim string of format txt (INFO's
// reply), or as a bulk string in RESP2.
func (p Proto) AppendVerbatim(b, text []byte) []byte {
	if p != RESP3 {
		return appendBlob(b, '$', text)
	}
	b = appendHeader(b, '=', len(text)+4)
	b = append(b, "txt:"...)
	return append(append(b, text...), "\r\n"...)
}

// Adapt turns reply, a RESP2 reply the proxy made or gathered from RESP2
// connections (the hot-key engine's), into p: in RESP3 each nil bulk and
// nil array in it, at any depth, becomes a null. Other replies are the
// same in both protocols, and come back unchanged.
func (p Proto) Adapt(reply []byte) []byte {
	if p != RESP3 || !bytes.Contains(reply, []byte("-1\r\n")) {
		return reply
	}
	out := make([]byte, 0, len(reply))
	for off := 0; off < len(reply); {
		eol := bytes.IndexByte(reply[off:], '\n')
		if eol < 0 {
			return append(out, reply[off:]...)
		}
		line := reply[off : off+eol+1]
		switch {
		case string(line) == "$-1\r\n" || string(line) == "*-1\r\n":
			out = append(out, "_\r\n"...)
			off += len(line)
		case line[0] == '$':
			n := FrameLen(reply[off:])
			out = append(out, reply[off:off+n]...)
			off += n
		default:
			out = append(out, line...)
			off += len(line)
		}
	}
	return out
}

func appendHeader(b []byte, typ byte, n int) []byte {
	b = append(b, typ)
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, "\r\n"...)
}

func appendBlob(b []byte, typ byte, payload []byte) []byte {
	b = appendHeader(b, typ, len(payload))
	return append(append(b, payload...), "\r\n"...)
}
