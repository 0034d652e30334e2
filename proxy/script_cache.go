package proxy

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// scriptCacheSize bounds the script bodies the proxy remembers; clients
// that make a script per call (EVAL with values inlined) push old ones out.
const scriptCacheSize = 1024

// scriptCache maps the SHA1 of scripts seen in EVAL and SCRIPT LOAD to
// their bodies. Safe for concurrent use.
type scriptCache struct {
	bodies *lru.Cache[string, string]
}

func newScriptCache() scriptCache {
	c, _ := lru.New[string, string](scriptCacheSize) // fails only for size <= 0
	return scriptCache{bodies: c}
}

// learn remembers body under its SHA1, as Redis names it: lower-case hex.
func (c scriptCache) learn(body []byte) {
	sum := sha1.Sum(body)
	sha := hex.EncodeToString(sum[:])
	if !c.bodies.Contains(sha) {
		c.bodies.Add(sha, string(body))
	}
}

// knows reports whether the proxy has the script with SHA1 sha.
func (c scriptCache) knows(sha []byte) bool {
	return c.bodies.Contains(strings.ToLower(string(sha)))
}

// loadRequest is SCRIPT LOAD of the script with SHA1 sha (any case, as
// Redis accepts it), or nil when the proxy never saw that script.
func (c scriptCache) loadRequest(sha []byte) []byte {
	body, ok := c.bodies.Get(strings.ToLower(string(sha)))
	if !ok {
		return nil
	}
	return resp.AppendCommand(nil, []byte("SCRIPT"), []byte("LOAD"), []byte(body))
}
