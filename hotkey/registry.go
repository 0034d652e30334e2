package hotkey

import (
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// globMeta are the bytes that make a rule's Match a glob. ']', '^' and '-'
// mean something only after a '[', so a Match without these is matched
// byte for byte.
const globMeta = `*?[\`

// Registry maps keys to the rules that make them hot. It is immutable after
// NewRegistry and safe for concurrent use; a nil *Registry is empty.
type Registry struct {
	exact map[string]config.KeyRule // rules whose Match has no glob metacharacter, by Match
	globs []globRule                // the other rules, in config order
}

// globRule is a glob KeyRule with its pattern kept as bytes, so that Lookup
// does not convert it on every call.
type globRule struct {
	pattern []byte
	rule    config.KeyRule
}

// NewRegistry returns a Registry of rules. A rule whose Match contains none
// of * ? [ \ is an exact key; the others are Redis globs (see Match). When
// two rules have the same Match, the first one counts; config.Validate
// refuses that anyway. The Registry keeps its own copy of the rules.
func NewRegistry(rules []config.KeyRule) *Registry {
	r := &Registry{}
	var seenGlob map[string]bool
	for _, rule := range rules {
		if !strings.ContainsAny(rule.Match, globMeta) {
			if r.exact == nil {
				r.exact = make(map[string]config.KeyRule)
			}
			if _, dup := r.exact[rule.Match]; !dup {
				r.exact[rule.Match] = rule
			}
			continue
		}
		if seenGlob[rule.Match] {
			continue
		}
		if seenGlob == nil {
			seenGlob = make(map[string]bool)
		}
		seenGlob[rule.Match] = true
		r.globs = append(r.globs, globRule{pattern: []byte(rule.Match), rule: rule})
	}
	return r
}

// Lookup returns the rule that makes key hot, and false if none does. An
// exact rule wins over every glob; among globs the first in config order
// that matches wins. Lookup does not allocate.
//
// Lookup runs on every keyed command, hot or not: with no rules it returns
// at once, and with exact rules only it is one map lookup. Each glob rule
// adds a Match call.
func (r *Registry) Lookup(key []byte) (config.KeyRule, bool) {
	if r == nil {
		return config.KeyRule{}, false
	}
	if r.exact != nil {
		// The compiler turns string(key) used only as a map index into a
		// lookup without a copy.
		if rule, ok := r.exact[string(key)]; ok {
			return rule, true
		}
	}
	for i := range r.globs {
		if Match(r.globs[i].pattern, key) {
			return r.globs[i].rule, true
		}
	}
	return config.KeyRule{}, false
}

// Len returns the number of rules in r, exact and glob.
func (r *Registry) Len() int {
	if r == nil {
		return 0
	}
	return len(r.exact) + len(r.globs)
}
