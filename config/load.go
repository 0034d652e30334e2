package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Error is one problem in a config, tied to the YAML key it is about.
//
// Its text is "config: [FILE ][line N: ][PATH: ]MSG", for example
//
//	config: proxy.yaml line 5: upstream.mode: must be "standalone" or "cluster", got "foo"
//	config: proxy.yaml line 7: lisen: unknown field
//	config: limits.max_bulk: must be <= limits.query_buffer (1mb), got 512mb
type Error struct {
	// File is the path given to Load; empty for Parse and Validate.
	File string
	// Line is the 1-based line of the key in the file; 0 when unknown
	// (Validate, or a field left at its default).
	Line int
	// Path is the YAML key path, e.g. "upstream.addrs[1]"; empty for a
	// problem with the document as a whole (a YAML syntax error).
	Path string
	// Msg says what is wrong.
	Msg string
}

// Error implements error.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s line %d: ", e.File, e.Line)
	case e.File != "":
		fmt.Fprintf(&b, "%s: ", e.File)
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Load reads the YAML file at path and returns its Config: the defaults
// with the file's fields on top, the secrets read from their files
// (password_file, relative to path's directory) or their ${NAME}
// references expanded from the environment, validated. Unknown fields,
// bad values, an unreadable secret file, an unset variable and an empty
// value for a scalar key ("listen:" with nothing after it) are errors;
// each names the file, line and key path. A key written as an
// empty mapping or list ("upstream:" with every sub-key commented out)
// keeps its defaults or means an empty list.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parse(path, data)
}

// Parse is Load for YAML already in memory; its errors name no file, and
// relative secret files start in the working directory. Empty data gives
// Default().
func Parse(data []byte) (*Config, error) {
	return parse("", data)
}

func parse(file string, data []byte) (*Config, error) {
	fail := func(errs []*Error) (*Config, error) {
		for _, e := range errs {
			e.File = file
		}
		return nil, joinErrors(errs)
	}

	// First pass: the node tree, for syntax errors and for the line and
	// key path of everything in the file.
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	switch err := dec.Decode(&root); {
	case errors.Is(err, io.EOF):
		return Default(), nil // empty, or comments only
	case err != nil:
		return fail([]*Error{syntaxError(err)})
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return fail([]*Error{syntaxError(err)})
	default:
		return fail([]*Error{{Line: extra.Line, Msg: "more than one YAML document; a config is one"}})
	}
	idx := newIndex(&root)

	// Second pass: strict decode onto the defaults. A key absent from the
	// file keeps its default; yaml.v3 creates list items from zero.
	c := Default()
	dec = yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	errs := idx.nullErrors()
	if err := dec.Decode(c); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return fail([]*Error{syntaxError(err)})
		}
		for _, msg := range te.Errors {
			errs = append(errs, idx.decodeError(msg))
		}
	}
	if len(errs) > 0 {
		slices.SortStableFunc(errs, func(a, b *Error) int { return a.Line - b.Line })
		return fail(errs)
	}

	dir := ""
	if file != "" {
		dir = filepath.Dir(file)
	}
	errs = c.readSecrets(dir)
	c.applyDefaults()
	errs = append(errs, c.validate()...)
	for _, e := range errs {
		e.Line = idx.line(e.Path)
	}
	if len(errs) > 0 {
		return fail(errs)
	}
	return c, nil
}

// syntaxPattern matches yaml.v3's "yaml: line N: msg" errors.
var syntaxPattern = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError turns a yaml.v3 parse error into an *Error with its line.
func syntaxError(err error) *Error {
	msg := err.Error()
	if m := syntaxPattern.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{Line: line, Msg: "bad YAML: " + m[2]}
	}
	return &Error{Msg: "bad YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

// nodeError is what this package's UnmarshalYAML methods return: a
// yaml.TypeError, so that yaml.v3 goes on decoding and reports every bad
// value at once, with the node's exact position so that decodeError can
// find the key it belongs to even in a one-line flow mapping.
func nodeError(n *yaml.Node, msg string) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d column %d: %s", n.Line, n.Column, msg)}}
}

// index knows where every key and value of a document is and which key
// path it has.
type index struct {
	// lines maps a key path to the line of its key (of the item, for a
	// list item).
	lines map[string]int
	// at maps a line to the nodes on it, in document order.
	at map[int][]indexed
	// nulls are the keys whose value is an explicit null and whose field
	// is a scalar, in document order.
	nulls []indexed
}

// indexed is one node and its key path.
type indexed struct {
	path  string
	node  *yaml.Node
	isKey bool // node is a mapping key; path is the key's own path
}

// newIndex indexes the document under root.
func newIndex(root *yaml.Node) *index {
	idx := &index{lines: map[string]int{}, at: map[int][]indexed{}}
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		idx.walk(root.Content[0], "", reflect.TypeFor[Config]())
	}
	return idx
}

// walk indexes n, the value at path p, whose Go type is t (nil when the
// key is unknown).
func (idx *index) walk(n *yaml.Node, p string, t reflect.Type) {
	idx.at[n.Line] = append(idx.at[n.Line], indexed{path: p, node: n})
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			kp := k.Value
			if p != "" {
				kp = p + "." + k.Value
			}
			if _, seen := idx.lines[kp]; !seen {
				idx.lines[kp] = k.Line
			}
			idx.at[k.Line] = append(idx.at[k.Line], indexed{path: kp, node: k, isKey: true})
			ft := fieldType(t, k.Value)
			if val.Kind == yaml.ScalarNode && val.ShortTag() == "!!null" && isScalar(ft) {
				idx.nulls = append(idx.nulls, indexed{path: kp, node: k, isKey: true})
			}
			idx.walk(val, kp, ft)
		}
	case yaml.SequenceNode:
		var et reflect.Type
		if t != nil && t.Kind() == reflect.Slice {
			et = t.Elem()
		}
		for i, item := range n.Content {
			ip := p + "[" + strconv.Itoa(i) + "]"
			idx.lines[ip] = item.Line
			idx.walk(item, ip, et)
		}
	}
}

// line returns the line of the key at path p or, when p is not in the
// file (a required field left out, a default that conflicts), of its
// nearest ancestor that is; 0 when none is.
func (idx *index) line(p string) int {
	for p != "" {
		if l, ok := idx.lines[p]; ok {
			return l
		}
		p = p[:max(strings.LastIndexAny(p, ".["), 0)]
	}
	return 0
}

// fieldType returns the type of the field of struct type t whose yaml name
// is name, or nil.
func fieldType(t reflect.Type, name string) reflect.Type {
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	for f := range t.Fields() {
		if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag == name {
			return f.Type
		}
	}
	return nil
}

// isScalar reports whether a field of type t is written as a YAML scalar:
// yaml.v3 leaves such a field unchanged on null, which would silently keep
// its default. Lists and mappings are not scalars: null there means empty.
func isScalar(t reflect.Type) bool {
	if t == nil {
		return false
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()) {
		return true // Duration, ByteSize, Amount
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Slice, reflect.Map:
		return false
	}
	return true
}

// nullErrors reports keys with no value whose field is a scalar.
func (idx *index) nullErrors() []*Error {
	var errs []*Error
	for _, n := range idx.nulls {
		errs = append(errs, &Error{
			Line: n.node.Line,
			Path: n.path,
			Msg:  `has no value; give one (write "" for an empty string) or remove the key for its default`,
		})
	}
	return errs
}

var (
	// ownPattern matches nodeError's messages.
	ownPattern = regexp.MustCompile(`^line (\d+) column (\d+): (.*)$`)
	// unknownPattern matches yaml.v3's unknown-field message.
	unknownPattern = regexp.MustCompile(`^line (\d+): field (.*) not found in type \S+$`)
	// typePattern matches yaml.v3's wrong-type message; the value is cut
	// to 7 bytes and "..." when longer than 10.
	typePattern = regexp.MustCompile("^line (\\d+): cannot unmarshal (\\S+)(?: `(.*)`)? into (\\S+)$")
	// linePattern matches any other yaml.v3 message with a line.
	linePattern = regexp.MustCompile(`^line (\d+): (.*)$`)
)

// decodeError turns one yaml.TypeError message into an *Error naming the
// key path.
func (idx *index) decodeError(msg string) *Error {
	if m := ownPattern.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		col, _ := strconv.Atoi(m[2])
		e := &Error{Line: line, Msg: m[3]}
		for _, n := range idx.at[line] {
			if !n.isKey && n.node.Column == col {
				e.Path = n.path
				break
			}
		}
		return e
	}
	if m := unknownPattern.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		e := &Error{Line: line, Path: m[2], Msg: "unknown field"}
		for _, n := range idx.at[line] {
			if n.isKey && n.node.Value == m[2] {
				e.Path = n.path
				break
			}
		}
		return e
	}
	if m := typePattern.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		tag, value := m[2], m[3]
		e := &Error{Line: line, Msg: "want " + goTypeName(m[4])}
		collection := tag == "!!seq" || tag == "!!map"
		if collection {
			e.Msg += ", got a " + yamlKindName(tag)
		} else {
			e.Msg += fmt.Sprintf(", got %q", value)
		}
		// A line may hold several values (a flow mapping, or a key and
		// the mapping it opens): take the scalar whose text yaml.v3
		// quoted, or the innermost collection of the kind it named.
		prefix, cut := strings.CutSuffix(value, "...")
		for _, n := range idx.at[line] {
			if n.isKey || n.node.ShortTag() != tag {
				continue
			}
			if collection {
				e.Path = n.path
				continue
			}
			if n.node.Value == value || cut && strings.HasPrefix(n.node.Value, prefix) {
				e.Path = n.path
				break
			}
		}
		return e
	}
	if m := linePattern.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{Line: line, Msg: m[2]}
	}
	return &Error{Msg: msg}
}

// goTypeName says in words what a Go type in a yaml.v3 message needs.
func goTypeName(t string) string {
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case t == "bool":
		return "true or false"
	case t == "string", t == "config.Secret":
		return "a string"
	case t == "float64":
		return "a number"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "an integer"
	case strings.HasPrefix(t, "config."):
		return "a mapping of keys"
	}
	return t
}

// yamlKindName names a YAML tag for a value yaml.v3 did not quote.
func yamlKindName(tag string) string {
	switch tag {
	case "!!seq":
		return "list"
	case "!!map":
		return "mapping"
	}
	return strings.TrimPrefix(tag, "!!")
}
