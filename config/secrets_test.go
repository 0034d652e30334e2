package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFile writes name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPasswordFiles(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "client.pass", "client-from-file\n")
	writeFile(t, dir, "upstream.pass", "upstream-from-file\r\n")
	conf := writeFile(t, dir, "proxy.yaml", "password_file: client.pass\nupstream:\n  password_file: "+filepath.Join(dir, "upstream.pass")+"\n")
	c, err := Load(conf)
	if err != nil {
		t.Fatal(err)
	}
	if string(c.Password) != "client-from-file" || string(c.Upstream.Password) != "upstream-from-file" {
		t.Fatalf("passwords %q, %q: want the files' contents without the trailing newline", string(c.Password), string(c.Upstream.Password))
	}
	// Printed, the secrets show as their files, and the print reads them
	// again.
	s := c.String()
	if strings.Contains(s, "from-file") || !strings.Contains(s, "password_file: client.pass") {
		t.Errorf("String():\n%s", s)
	}
	back, err := parse(conf, []byte(s))
	if err != nil {
		t.Fatalf("String() does not parse back: %v\n%s", err, s)
	}
	if back.Password != c.Password || back.Upstream.Password != c.Upstream.Password {
		t.Errorf("parsed back: %q, %q", string(back.Password), string(back.Upstream.Password))
	}
	// A reload reads the file as it is now.
	writeFile(t, dir, "client.pass", "rotated")
	if c, err = Load(conf); err != nil || string(c.Password) != "rotated" {
		t.Errorf("after rotating the file: %v, %q", err, string(c.Password))
	}
	writeFile(t, dir, "client.pass", "\n")
	if _, err = Load(conf); err == nil || !strings.Contains(err.Error(), "line 1: password_file: "+filepath.Join(dir, "client.pass")+" is empty") {
		t.Errorf("empty file: %v", err)
	}
}

func TestPasswordEnv(t *testing.T) {
	t.Setenv("HKP_TEST_CLIENT_PW", "client-from-env")
	t.Setenv("HKP_TEST_UP_PW", "up-from-env")
	t.Setenv("HKP_TEST_EMPTY", "")
	c := mustParse(t, "password: ${HKP_TEST_CLIENT_PW}\nupstream:\n  password: \"a$b${HKP_TEST_UP_PW}$\"\n")
	if string(c.Password) != "client-from-env" || string(c.Upstream.Password) != "a$bup-from-env$" {
		t.Errorf("passwords %q, %q", string(c.Password), string(c.Upstream.Password))
	}
	// Other fields keep "${" as written.
	if c := mustParse(t, "upstream:\n  username: ${HKP_TEST_CLIENT_PW}\n"); c.Upstream.Username != "${HKP_TEST_CLIENT_PW}" {
		t.Errorf("username expanded: %q", c.Upstream.Username)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"password: x${HKP_TEST_EMPTY}", "line 1: password: environment variable HKP_TEST_EMPTY is empty"},
		{"upstream:\n  password: ${HKP_TEST_CLIENT_PW}${HKP_TEST_NOT_SET}", "line 2: upstream.password: environment variable HKP_TEST_NOT_SET is not set"},
		{"password: ${HKP_TEST_CLIENT_PW", `line 1: password: "${" must start`},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "from-env") {
			t.Errorf("%q: the error shows a value: %v", tc.yaml, err)
		}
	}
}
