package rewrite

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// The engine's failures are Go errors inside the package and RESP error
// replies at its boundary (Do, Shard, Unshard, Report), which encode them
// with errorReply, once. The engine's own texts start with "hotkeyproxy:",
// the product's name, as the clients that get them see it.

// errGone is the failure of a bucket operation that found a bucket (or the
// key) missing: the key expired, was deleted or was merged back since this
// proxy read its layout. The commands try again on a fresh layout.
var errGone = errors.New("hotkeyproxy: the key is gone")

// errExpiring is errGone for a key that still holds the layout but is
// about to expire: its buckets may go a moment before it.
var errExpiring = fmt.Errorf("%w: it is about to expire", errGone)

// errPlain is what load gives for a learned key that holds no layout now:
// the command is to be relayed as for any plain key (Do returns nil).
var errPlain = errors.New("hotkeyproxy: the key is not held as buckets")

// keyError is a command on a hot key that the engine refuses or cannot
// finish: its reply names the key, "ERR hotkeyproxy: '<key>' <reason>".
type keyError struct {
	key    string
	reason string // what follows the quoted key: "keeps changing; try again"
}

func (e *keyError) Error() string { return "hotkeyproxy: '" + e.key + "' " + e.reason }

// lostError is a bucket found lost: its key is missing while the key
// still holds the layout that names it (a failover promoted a replica
// that never had it, or it was deleted behind the proxy). Its reply names
// the bucket; the other buckets still sell.
type lostError struct {
	keyError
	bucket int
}

func newLostError(key string, bucket int, name []byte, units int64) *lostError {
	return &lostError{bucket: bucket, keyError: keyError{key: key, reason: "lost bucket " + strconv.Itoa(bucket) + " (" + string(name) +
		"): its key is missing while the layout names it; it held " + strconv.FormatInt(units, 10) +
		" units when last seen; the other buckets still sell"}}
}

// isLost reports whether err is a lostError.
func isLost(err error) bool {
	_, ok := errors.AsType[*lostError](err)
	return ok
}

// refused is the keyError of a command a hot key does not support as a
// plain key would: why says what, and why not.
func refused(key, why string) error {
	return &keyError{key: key, reason: "is a hot key held as buckets; " + why}
}

// redisError is a reply that ends a command, passed on verbatim: an error
// reply of Redis's (a node's own, or the upstream's "-ERR upstream
// unavailable: …" for a request it could not send), one the engine gives
// in Redis's words (newRedisError), or, where it should never happen, a
// reply of another shape than a bucket script gives.
type redisError struct {
	reply []byte // one RESP frame, CRLF-terminated
}

// newRedisError is the error reply msg, as Redis words it ("ERR …").
func newRedisError(msg string) error { return &redisError{reply: redcon.AppendError(nil, msg)} }

// Error is the reply's text: without the '-' and the CRLF of an error
// reply.
func (e *redisError) Error() string {
	if !resp.IsError(e.reply) {
		return "rewrite: unexpected reply " + strconv.Quote(string(e.reply))
	}
	return string(bytes.TrimSuffix(e.reply[1:], []byte("\r\n")))
}

// replyErr is r as an error when it is an error reply; nil otherwise.
func replyErr(r []byte) error {
	if resp.IsError(r) {
		return &redisError{reply: r}
	}
	return nil
}

// errorReply is err as the error reply a client gets: a redisError's reply
// verbatim, any other error as "-ERR <its text>".
func errorReply(err error) []byte {
	if re, ok := errors.AsType[*redisError](err); ok {
		return re.reply
	}
	return redcon.AppendError(nil, "ERR "+err.Error())
}
