package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in YAML as a Go duration string such
// as "250ms", "1s" or "0s". A bare number is rejected, because "5" does not
// say whether it means seconds or milliseconds (overlord's int timeouts mean
// seconds in one file and milliseconds in another).
type Duration time.Duration

// Duration returns d as a time.Duration.
func (d Duration) Duration() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.String, e.g. "1.5s"; it parses back to d.
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML parses a duration string with time.ParseDuration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return nodeError(n, `want a duration such as "250ms" or "1s"`)
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return nodeError(n, fmt.Sprintf(`want a duration such as "250ms" or "1s", got %q`, n.Value))
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d as a duration string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// ByteSize is a size in bytes. In YAML it is an integer (bytes) or a string
// with a Redis-style unit, case-insensitive: "b" (bytes), "k" = 1000,
// "kb" = 1024, "m" = 1000², "mb" = 1024², "g" = 1000³, "gb" = 1024³, as
// Redis's own config file reads them (memtoull in util.c).
type ByteSize int64

// Common sizes.
const (
	KB ByteSize = 1 << 10 // 1kb
	MB ByteSize = 1 << 20 // 1mb
	GB ByteSize = 1 << 30 // 1gb
)

// byteUnits maps each unit suffix ParseByteSize accepts to its multiplier.
var byteUnits = map[string]int64{
	"":   1,
	"b":  1,
	"k":  1000,
	"kb": 1 << 10,
	"m":  1000 * 1000,
	"mb": 1 << 20,
	"g":  1000 * 1000 * 1000,
	"gb": 1 << 30,
}

// ParseByteSize parses a size such as "512mb", "1gb", "64kb", "100b", "1k"
// or "4096". The number is a non-negative decimal integer; the unit, if
// any, follows it without a space.
func ParseByteSize(s string) (ByteSize, error) {
	b, err := parseByteSize(s)
	if err != nil {
		return 0, fmt.Errorf("config: %w", err)
	}
	return b, nil
}

// parseByteSize is ParseByteSize with errors that fit after a key path.
func parseByteSize(s string) (ByteSize, error) {
	lower := strings.ToLower(s)
	i := 0
	for i < len(lower) && lower[i] >= '0' && lower[i] <= '9' {
		i++
	}
	mul, ok := byteUnits[lower[i:]]
	if i == 0 || !ok {
		return 0, fmt.Errorf(`want a size such as "512mb", "64kb" or a number of bytes, got %q`, s)
	}
	n, err := strconv.ParseInt(lower[:i], 10, 64)
	if err != nil || n > math.MaxInt64/mul {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return ByteSize(n * mul), nil
}

// String formats b with the largest binary unit that divides it exactly
// ("1gb", "512mb", "64kb"), or as a plain number of bytes; it parses back to b.
func (b ByteSize) String() string {
	switch {
	case b != 0 && b%GB == 0:
		return strconv.FormatInt(int64(b/GB), 10) + "gb"
	case b != 0 && b%MB == 0:
		return strconv.FormatInt(int64(b/MB), 10) + "mb"
	case b != 0 && b%KB == 0:
		return strconv.FormatInt(int64(b/KB), 10) + "kb"
	}
	return strconv.FormatInt(int64(b), 10)
}

// UnmarshalYAML reads an integer number of bytes or a size string.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return nodeError(n, `want a size such as "512mb", "64kb" or a number of bytes`)
	}
	if n.ShortTag() == "!!int" {
		var v int64
		if err := n.Decode(&v); err != nil || v < 0 {
			return nodeError(n, fmt.Sprintf("want a non-negative number of bytes, got %s", n.Value))
		}
		*b = ByteSize(v)
		return nil
	}
	v, err := parseByteSize(n.Value)
	if err != nil {
		return nodeError(n, err.Error())
	}
	*b = v
	return nil
}

// MarshalYAML writes b as a size string.
func (b ByteSize) MarshalYAML() (any, error) { return b.String(), nil }

// Secret is a string that is never printed or serialized in plain. Every
// way of printing it (fmt verbs, YAML, JSON, text and slog) gives "******"
// when it is set and "" when it is empty, so that a config can be logged
// whole. Use string(s) to get the value itself, only where it is sent to
// its destination (an AUTH command).
//
// A config printed with String and read back therefore holds the password
// "******", not the real one.
type Secret string

// redacted replaces a non-empty Secret wherever it would be printed.
const redacted = "******"

func (s Secret) masked() string {
	if s == "" {
		return ""
	}
	return redacted
}

// String returns "******" when s is set, "" otherwise.
func (s Secret) String() string { return s.masked() }

// GoString makes %#v print the masked value too.
func (s Secret) GoString() string { return fmt.Sprintf("config.Secret(%q)", s.masked()) }

// MarshalYAML writes the masked value.
func (s Secret) MarshalYAML() (any, error) { return s.masked(), nil }

// MarshalJSON writes the masked value.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(s.masked()) }

// MarshalText writes the masked value.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.masked()), nil }

// LogValue makes log/slog print the masked value with any handler.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.masked()) }

// Amount is how much a deduct script takes: a constant (amount: 1) or the
// integer in one of the script's ARGV entries (amount: "argv:1" takes
// ARGV[1], 1-based as in Lua). Exactly one of the fields is set.
type Amount struct {
	// Const is the fixed amount, >= 1; 0 when the amount comes from ARGV.
	Const int64
	// ArgvIndex is the 1-based index into the script's ARGV that holds
	// the amount, >= 1; 0 when the amount is Const.
	ArgvIndex int
}

// IsZero reports whether a is unset.
func (a Amount) IsZero() bool { return a == Amount{} }

// String returns "argv:N" or the constant, as written in YAML.
func (a Amount) String() string {
	if a.ArgvIndex != 0 {
		return "argv:" + strconv.Itoa(a.ArgvIndex)
	}
	return strconv.FormatInt(a.Const, 10)
}

// errAmount is the message for every malformed amount.
var errAmount = errors.New(`want a positive integer such as 1 or "argv:N" with N >= 1`)

// ParseAmount parses an amount written as a positive integer ("1") or as
// "argv:N" (N >= 1; the prefix is case-insensitive).
func ParseAmount(s string) (Amount, error) {
	a, err := parseAmount(s)
	if err != nil {
		return Amount{}, fmt.Errorf("config: %w", err)
	}
	return a, nil
}

// parseAmount is ParseAmount with errors that fit after a key path.
func parseAmount(s string) (Amount, error) {
	if len(s) > 5 && strings.EqualFold(s[:5], "argv:") {
		i, err := strconv.Atoi(s[5:])
		if err != nil || i < 1 {
			return Amount{}, fmt.Errorf("%w, got %q", errAmount, s)
		}
		return Amount{ArgvIndex: i}, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return Amount{}, fmt.Errorf("%w, got %q", errAmount, s)
	}
	return Amount{Const: n}, nil
}

// UnmarshalYAML reads an integer or an "argv:N" string.
func (a *Amount) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return nodeError(n, errAmount.Error())
	}
	v, err := parseAmount(n.Value)
	if err != nil {
		return nodeError(n, err.Error())
	}
	*a = v
	return nil
}

// MarshalYAML writes an integer or an "argv:N" string.
func (a Amount) MarshalYAML() (any, error) {
	if a.ArgvIndex != 0 {
		return a.String(), nil
	}
	return a.Const, nil
}

// Argv names one of a script's ARGV entries, written "argv:N" (N >= 1,
// 1-based as in Lua; the prefix is case-insensitive). 0 names none.
type Argv int

// String returns "argv:N", or "" for none.
func (a Argv) String() string {
	if a == 0 {
		return ""
	}
	return "argv:" + strconv.Itoa(int(a))
}

// UnmarshalYAML reads "argv:N"; "" is none.
func (a *Argv) UnmarshalYAML(n *yaml.Node) error {
	const want = `want "argv:N" with N >= 1`
	if n.Kind != yaml.ScalarNode {
		return nodeError(n, want)
	}
	if n.Value == "" {
		*a = 0
		return nil
	}
	v, err := parseAmount(n.Value)
	if err != nil || v.ArgvIndex == 0 {
		return nodeError(n, fmt.Sprintf("%s, got %q", want, n.Value))
	}
	*a = Argv(v.ArgvIndex)
	return nil
}

// MarshalYAML writes "argv:N", or "" for none.
func (a Argv) MarshalYAML() (any, error) { return a.String(), nil }
