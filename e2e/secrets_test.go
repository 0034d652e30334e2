package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/localredis"
	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
)

// TestSecretsNeverShown runs the proxy binary with its client password in
// a file and its upstream password from an environment variable, and
// looks for either in everything the proxy says: its log at debug level
// (start, reloads by PROXY CONFIG RELOAD and SIGHUP, a refused reload),
// PROXY CONFIG GET, INFO, CONFIG GET, CLIENT LIST, HELLO, /metrics, and
// the error replies when the upstream refuses a wrong password. A rotated
// password file applies on reload.
func TestSecretsNeverShown(t *testing.T) {
	const (
		clientPW  = "cl-S3cret-file"
		rotatedPW = "cl-R0tated-file"
		upPW      = "up-S3cret-env"
		wrongUpPW = "up-Wr0ng-file"
	)
	secrets := []string{clientPW, rotatedPW, upPW, wrongUpPW}
	t.Setenv("HKP_TEST_UPSTREAM_PASSWORD", upPW)
	bin := hkBuild(t)
	rs := redistest.Start(t, localredis.Options{Password: upPW})
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("client.pass", clientPW+"\n")
	write("wrong-upstream.pass", wrongUpPW+"\n")
	listen, metrics := hkFreeAddr(t), hkFreeAddr(t)
	cfgPath := write("proxy.yaml", "listen: "+listen+"\npassword_file: client.pass\n"+
		"upstream:\n  addrs: [\""+rs.Addr()+"\"]\n  password: ${HKP_TEST_UPSTREAM_PASSWORD}\n"+
		"log: {level: debug}\nmetrics: {listen: \""+metrics+"\"}\n")
	p := hkSpawn(t, bin, cfgPath, listen)

	var seen strings.Builder // every reply and page the proxy gave
	c := dialRaw(t, listen)
	do := func(args ...string) string {
		t.Helper()
		r := c.do(args...)
		seen.WriteString(r)
		return r
	}
	if got := do("AUTH", "nope"); !strings.HasPrefix(got, "-WRONGPASS") {
		t.Fatalf("AUTH nope: %q", got)
	}
	if got := do("AUTH", clientPW); got != "+OK\r\n" {
		t.Fatalf("AUTH with the file's password: %q", got)
	}
	for _, cmd := range []string{"PROXY CONFIG GET *", "PROXY CONFIG GET *password*", "INFO", "INFO everything",
		"CONFIG GET *", "CLIENT LIST", "HELLO 2", "SET k v", "GET k"} {
		do(strings.Fields(cmd)...)
	}
	if got := do("PROXY", "CONFIG", "GET", "password_file"); !strings.Contains(got, "client.pass") {
		t.Errorf("PROXY CONFIG GET password_file: %q", got)
	}
	res, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), "hotkeyproxy_auth_failures_total 1\n") {
		t.Errorf("/metrics lacks the failed AUTH")
	}
	seen.Write(body)

	// Rotate the file: a reload takes the new password for new clients.
	write("client.pass", rotatedPW+"\n")
	if got := do("PROXY", "CONFIG", "RELOAD"); got != "+OK\r\n" {
		t.Fatalf("PROXY CONFIG RELOAD: %q", got)
	}
	c2 := dialRaw(t, listen)
	if got := c2.do("AUTH", rotatedPW); got != "+OK\r\n" {
		t.Errorf("AUTH with the rotated password: %q", got)
	}
	// A refused reload (the variable unset by a file edit naming another).
	os.WriteFile(cfgPath, []byte(strings.Replace(mustRead(t, cfgPath), "HKP_TEST_UPSTREAM_PASSWORD", "HKP_TEST_NOT_SET", 1)), 0o600)
	if got := do("PROXY", "CONFIG", "RELOAD"); !strings.Contains(got, "HKP_TEST_NOT_SET is not set") {
		t.Errorf("reload with an unset variable: %q", got)
	}
	p.cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, func() bool { return strings.Count(p.out.String(), "config reload") >= 3 })

	// A proxy whose upstream password is wrong: Redis's refusal reaches
	// the client, the password does not.
	listen2 := hkFreeAddr(t)
	cfg2 := write("wrong.yaml", "listen: "+listen2+"\npassword_file: client.pass\nupstream:\n  addrs: [\""+rs.Addr()+"\"]\n  password_file: wrong-upstream.pass\n"+
		"log: {level: debug}\nmetrics: {listen: \"\"}\n")
	p2 := hkSpawn(t, bin, cfg2, listen2)
	w := dialRaw(t, listen2)
	w.do("AUTH", rotatedPW)
	if got := w.do("GET", "k"); !strings.Contains(got, "WRONGPASS") {
		t.Errorf("GET with a wrong upstream password: %q, want Redis's WRONGPASS", got)
	} else {
		seen.WriteString(got)
	}
	time.Sleep(100 * time.Millisecond) // the log line of the failed dial

	for what, text := range map[string]string{"replies and /metrics": seen.String(), "log": p.out.String(), "log (wrong upstream password)": p2.out.String()} {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s show the secret %q:\n%s", what, s, text)
			}
		}
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
