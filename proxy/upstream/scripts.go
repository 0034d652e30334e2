package upstream

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

// ScriptCache maps the SHA1 of scripts seen in EVAL and SCRIPT LOAD to
// their bodies, the 1024 used last, so that an EVALSHA meeting NOSCRIPT on
// a node that never saw its script (a new master after a failover) can be
// answered by loading it there. Safe for concurrent use.
type ScriptCache struct {
	bodies *lru.Cache[string, string]
}

func newScriptCache() *ScriptCache {
	c, _ := lru.New[string, string](scriptCacheSize) // fails only for size <= 0
	return &ScriptCache{bodies: c}
}

// Learn remembers body under its SHA1, as Redis names it: lower-case hex.
func (c *ScriptCache) Learn(body []byte) {
	sum := sha1.Sum(body)
	sha := hex.EncodeToString(sum[:])
	if !c.bodies.Contains(sha) {
		c.bodies.Add(sha, string(body))
	}
}

// Knows reports whether the cache has the script with SHA1 sha, in hex of
// any case, as Redis accepts it.
func (c *ScriptCache) Knows(sha []byte) bool {
	return c.bodies.Contains(strings.ToLower(string(sha)))
}

// Purge forgets every script, as SCRIPT FLUSH makes the nodes do.
func (c *ScriptCache) Purge() { c.bodies.Purge() }

// loadRequest is SCRIPT LOAD of the script with SHA1 sha (any case), or
// nil when the proxy never saw that script.
func (c *ScriptCache) loadRequest(sha []byte) []byte {
	body, ok := c.bodies.Get(strings.ToLower(string(sha)))
	if !ok {
		return nil
	}
	return resp.AppendCommand(nil, []byte("SCRIPT"), []byte("LOAD"), []byte(body))
}
