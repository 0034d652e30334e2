package proxy

import (
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
)

// started is when the process started serving, for proxy_uptime_in_seconds.
var started = time.Now()

// version is the module version and VCS revision the binary was built
// from, as the Go toolchain recorded them ("(devel)" in a source build).
var version = func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}()

// infoSection is the proxy's own INFO section, added after Redis's when
// the client asks for every section (no argument, all, everything,
// default) or for "proxy"; else "". In cluster mode t is the topology the
// command was routed by.
func (srv *Server) infoSection(args [][]byte, t *upstream.Topology) string {
	want := len(args) == 0
	for _, a := range args {
		switch strings.ToLower(string(a)) {
		case "all", "everything", "default", "proxy":
			want = true
		}
	}
	if !want {
		return ""
	}
	var b strings.Builder
	line := func(k, v string) { b.WriteString(k + ":" + v + "\r\n") }
	b.WriteString("\r\n# Proxy\r\n")
	line("proxy_version", version)
	line("proxy_uptime_in_seconds", strconv.FormatInt(int64(time.Since(started).Seconds()), 10))
	line("proxy_connected_clients", strconv.Itoa(srv.Clients()))
	line("proxy_client_memory", strconv.FormatInt(srv.clientMem.total.Load(), 10))
	line("proxy_upstream_mode", srv.cfg.Upstream.Mode)
	if t != nil {
		// Counts only: in front of a cluster, clients see one Redis and
		// never a node's address (the metrics' node label has them).
		line("proxy_cluster_masters", strconv.Itoa(len(t.Masters)))
	} else {
		line("proxy_upstream_nodes", strings.Join(srv.cfg.Upstream.Addrs, ","))
	}
	cfg := srv.config()
	line("proxy_hotkey_rules", strconv.Itoa(len(cfg.Hotkeys.Keys)))
	line("proxy_hotkeys_met", strconv.Itoa(srv.hot.Met()))
	d := srv.detect
	if cfg.Hotkeys.Detect.Enabled {
		line("proxy_detector", "on")
	} else {
		line("proxy_detector", "off")
	}
	hot := 0
	for _, k := range d.d.Top(detectedTopN) {
		if k.Hot {
			hot++
		}
	}
	line("proxy_detector_keys_tracked", strconv.Itoa(d.d.Tracked()))
	line("proxy_detector_hot_keys", strconv.Itoa(hot))
	line("proxy_detector_promotions", strconv.FormatUint(d.promotions.Load(), 10))
	return b.String()
}

// standaloneInfo relays INFO and adds the proxy's section to Redis's
// reply.
func (s *session) standaloneInfo(cmd *resp.Command) {
	mark := s.exchange(cmd)
	extra := s.srv.infoSection(cmd.Args[1:], nil)
	if extra != "" {
		s.out = addInfoSection(s.out[:mark], s.out[mark:], extra, s.proto)
	}
}

// addInfoSection appends reply, Redis's INFO reply (a bulk string, or a
// verbatim one in RESP3), with extra, the proxy's section, after its
// text, to dst, in p as Redis replies INFO. Any other reply (an error) is
// appended as it is. dst may hold reply: the text is copied first.
func addInfoSection(dst, reply []byte, extra string, p resp.Proto) []byte {
	v, ok := resp.TextValue(reply)
	if !ok {
		return append(dst, reply...)
	}
	if len(v) == 0 {
		extra = strings.TrimPrefix(extra, "\r\n") // only the proxy's section: no blank line before it
	}
	return p.AppendVerbatim(dst, append(append([]byte(nil), v...), extra...))
}
