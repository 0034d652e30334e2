package upstream

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/redistest"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
)

// authBackend is a Redis stand-in whose only user is alice, password
// "secret".
func authBackend(t *testing.T) *redistest.Backend {
	return redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		if strings.EqualFold(args[0], "AUTH") && (len(args) != 3 || args[1] != "alice" || args[2] != "secret") {
			return redistest.Reply{Raw: "-WRONGPASS invalid username-password pair or user is disabled.\r\n"}
		}
		return redistest.Reply{Raw: "+OK\r\n"}
	}})
}

// TestVerify checks that passwords are checked on one connection of the
// node's, wrong or right: a wrong password costs an AUTH there, never a
// connection.
func TestVerify(t *testing.T) {
	be := authBackend(t)
	p := testPool(t, dialer{addr: be.Addr()}, 1, nil)
	for i, tc := range []struct{ user, pass, want string }{
		{"alice", "secret", "+OK\r\n"},
		{"alice", "guess", "-WRONGPASS invalid username-password pair or user is disabled.\r\n"},
		{"mallory", "secret", "-WRONGPASS invalid username-password pair or user is disabled.\r\n"},
		{"alice", "secret", "+OK\r\n"},
	} {
		got, err := p.Verify(resp.AppendCommand(nil, []byte("AUTH"), []byte(tc.user), []byte(tc.pass)))
		if err != nil || string(got) != tc.want {
			t.Errorf("Verify %d (%s): %q, %v; want %q", i, tc.user, got, err, tc.want)
		}
	}
	if n := be.Conns(); n != 1 {
		t.Errorf("%d connections dialed for 4 checks, want 1", n)
	}
}

// TestLogins checks a Login's pools: dialed with the user's name and
// password, shared by the clients holding it, kept while one does and
// closed once none did for the idle time; a Login got again after that
// dials anew.
func TestLogins(t *testing.T) {
	be := authBackend(t)
	node := testPool(t, dialer{addr: be.Addr()}, 2, nil)
	node.authRetry = time.Hour // its users' pools take it: no dial after a refusal
	ls := newLogins()
	t.Cleanup(ls.close)

	a, b := ls.Get("alice", "secret"), ls.Get("alice", "secret")
	if a != b || ls.Len() != 1 {
		t.Fatalf("two clients of one user got two Logins (%d held)", ls.Len())
	}
	p := a.Pool(node)
	if p != b.Pool(node) {
		t.Fatal("two clients of one user got two pools of one node")
	}
	if _, err := p.Get(Key{}, 0); err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got := be.Received(); len(got) != 1 || strings.Join(got[0], " ") != "AUTH alice secret" {
		t.Errorf("the user's pool sent %q, want AUTH alice secret", got)
	}
	wrong := ls.Get("alice", "old")
	conns := be.Conns()
	for range 5 {
		if _, err := wrong.Pool(node).Get(Key{}, 0); err == nil || ErrorText(err) != "WRONGPASS invalid username-password pair or user is disabled." {
			t.Errorf("Get as a user Redis refuses: %v, want Redis's WRONGPASS as it is", err)
		}
	}
	if n := be.Conns() - conns; n != 1 {
		t.Errorf("5 Gets as a user Redis refuses dialed %d times, want once", n)
	}
	wrong.Release()

	a.Release()
	ls.reap(time.Now().Add(time.Hour))
	if ls.Len() != 1 {
		t.Fatalf("%d Logins after a reap, want alice's, still held", ls.Len())
	}
	if _, err := p.Get(Key{}, 0); err != nil {
		t.Fatalf("Get on a held Login after a reap: %v", err)
	}
	b.Release()
	ls.reap(time.Now().Add(time.Hour))
	if ls.Len() != 0 {
		t.Fatalf("%d Logins after a reap with none held, want 0", ls.Len())
	}
	if _, err := p.Get(Key{}, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Get on a reaped Login's pool: %v, want ErrClosed", err)
	}
	again := ls.Get("alice", "secret")
	defer again.Release()
	if again == a {
		t.Fatal("a reaped Login came back")
	}
	if _, err := again.Pool(node).Get(Key{}, 0); err != nil {
		t.Errorf("Get on a Login made again: %v", err)
	}
}

// TestVerifyRedials: a verification connection Redis closed while it was
// kept (its timeout setting, or the user it was left authenticated as
// deleted) costs the next client a dial, not an error.
func TestVerifyRedials(t *testing.T) {
	var auths atomic.Int64
	be := redistest.StartBackend(t, redistest.BackendOptions{Answer: func(args []string) redistest.Reply {
		if auths.Add(1) == 2 {
			return redistest.Reply{Drop: true} // as Redis closing the kept connection
		}
		return redistest.Reply{Raw: "+OK\r\n"}
	}})
	p := testPool(t, dialer{addr: be.Addr()}, 1, nil)
	auth := resp.AppendCommand(nil, []byte("AUTH"), []byte("alice"), []byte("secret"))
	for i := range 2 {
		if got, err := p.Verify(auth); err != nil || string(got) != "+OK\r\n" {
			t.Fatalf("Verify %d: %q, %v; want +OK", i, got, err)
		}
	}
	if n := be.Conns(); n != 2 {
		t.Errorf("%d connections dialed, want 2 (the kept one, then one dialed again)", n)
	}
}
