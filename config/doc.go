// Package config reads, defaults and validates proxy.yaml, the file that
// configures hotkeyproxy.
//
// Load (or Parse, for bytes) does three steps: a strict YAML decode onto
// Default(), so that a key missing from the file keeps its default; the
// defaults of list items (a hot key's route); and Validate. The proxy.yaml
// at the root of the repository is the commented default config: every
// field with its meaning, unit and default, and a test checks that it
// loads to Default() plus its example hot key and scripts.
//
// # Errors
//
// Every error names the YAML key path, and the file and line when there is
// one:
//
//	config: proxy.yaml line 5: upstream.mode: must be "standalone" or "cluster", got "foo"
//	config: proxy.yaml line 7: lisen: unknown field
//
// All problems are reported at once (errors.Join of *Error values), not
// only the first. Unknown fields are errors, not warnings, so a misspelt
// key cannot silently leave a default in place. For the same reason a
// scalar key with no value ("listen:" and nothing after it) is an error,
// where yaml.v3 alone would keep the default; write "" for an empty
// string. A mapping or list key with no value ("detect:" with every
// sub-key commented out) keeps the defaults or means an empty list.
//
// # Units
//
// Durations are Go duration strings ("250ms", "1s", "0s"); a bare number
// is an error, since it does not say its unit. Sizes are bytes, written as
// an integer or with a Redis-style unit, case-insensitive: "k" is 1000 and
// "kb" 1024, "m" and "mb", "g" and "gb" likewise, as in redis.conf.
//
// # Files
//
// The TLS sections (tls, upstream.tls; tls.go) name PEM files. Validate
// reads them, so a config that validates has certificates and keys that
// load and CA files that hold certificates; an error names the key whose
// file is wrong. TLS.ServerConfig and UpstreamTLS.ClientConfig read them
// again, as they are then: a reload sees a replaced certificate.
//
// # Secrets
//
// Password fields have type Secret, which prints and serializes as "******"
// in every format (fmt, YAML, JSON, slog), so Config.String can be logged.
// The flip side: a printed config is not a usable config file, except for
// secrets read from a file, which print as "" beside their file.
//
// A secret may come from a file (password_file beside password, read by
// Load at start and on every reload, one trailing newline dropped) or from
// the environment: ${NAME} in a password field is replaced by the variable
// NAME. Only the password fields expand ${NAME}, so a Lua body or a glob
// keeps its "$" as written. An unset or empty variable, an unreadable or
// empty file, and both a password and its file are errors that name the
// key and the variable or file, never a value.
//
// Glob patterns (hotkeys.keys[].match, hotkeys.detect.promote) are Redis
// globs. Validation only checks that a pattern is non-empty and, for
// promote, that path.Match accepts its syntax; it does not match keys. Note
// that path.Match's '*' stops at '/', which a Redis glob does not, so the
// matcher that applies them should not be path.Match.
package config
