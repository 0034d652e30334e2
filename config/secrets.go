package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// secretField is a Secret of the config and the key of the file it may be
// read from.
type secretField struct {
	key, fileKey string
	value        *Secret
	file         string
}

func (c *Config) secretFields() []secretField {
	return []secretField{
		{"password", "password_file", &c.Password, c.PasswordFile},
		{"upstream.password", "upstream.password_file", &c.Upstream.Password, c.Upstream.PasswordFile},
	}
}

// secretsAsFiles returns a copy of c whose secrets read from a file are
// empty, as they were written.
func (c *Config) secretsAsFiles() *Config {
	p := *c
	for _, f := range p.secretFields() {
		if f.file != "" {
			*f.value = ""
		}
	}
	return &p
}

// readSecrets fills each Secret from its file, or expands the environment
// variables in it; dir is where relative file paths start ("" for the
// working directory). No error quotes a secret's value.
func (c *Config) readSecrets(dir string) []*Error {
	var v validator
	for _, f := range c.secretFields() {
		switch {
		case f.file != "" && *f.value != "":
			v.errorf(f.fileKey, "set %s or %s, not both", f.key, f.fileKey)
		case f.file != "":
			s, err := readSecretFile(dir, f.file)
			if err != nil {
				v.errorf(f.fileKey, "%v", err)
				continue
			}
			*f.value = s
		default:
			s, err := ExpandSecret(string(*f.value), os.LookupEnv)
			if err != nil {
				v.errorf(f.key, "%v", err)
				continue
			}
			*f.value = Secret(s)
		}
	}
	return v.errs
}

// readSecretFile reads a secret from a file: its content without one
// trailing newline (LF or CRLF), which editors and "echo" add.
func readSecretFile(dir, name string) (Secret, error) {
	if !filepath.IsAbs(name) && dir != "" {
		name = filepath.Join(dir, name)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return "", err // *fs.PathError: names the file, not its content
	}
	b, _ = bytes.CutSuffix(b, []byte("\n"))
	b, _ = bytes.CutSuffix(b, []byte("\r"))
	if len(b) == 0 {
		return "", fmt.Errorf("%s is empty", name)
	}
	return Secret(b), nil
}

// envRef matches ${NAME} and, to report them, malformed references.
var envRef = regexp.MustCompile(`\$\{[^}]*\}?`)

// envName is a valid variable name, as a POSIX shell takes it.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ExpandSecret replaces every ${NAME} in s with the value of the
// environment variable NAME, as lookup (os.LookupEnv) finds it. A "$" not
// followed by "{" is kept as it is. An unset or empty variable, or a "${"
// that does not start a ${NAME}, is an error naming the variable, never a
// value: an empty password would turn AUTH off without anyone noticing. A
// secret that must hold "${" itself belongs in a password file.
func ExpandSecret(s string, lookup func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var err error
	out := envRef.ReplaceAllStringFunc(s, func(ref string) string {
		name, ok := strings.CutSuffix(strings.TrimPrefix(ref, "${"), "}")
		if err != nil {
			return ""
		}
		if !ok || !envName.MatchString(name) {
			err = fmt.Errorf(`"${" must start a reference to an environment variable, ${NAME}, with NAME made of letters, digits and _`)
			return ""
		}
		v, set := lookup(name)
		switch {
		case !set:
			err = fmt.Errorf("environment variable %s is not set", name)
		case v == "":
			err = fmt.Errorf("environment variable %s is empty", name)
		}
		return v
	})
	if err != nil {
		return "", err
	}
	return out, nil
}
