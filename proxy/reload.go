package proxy

import (
	"crypto/tls"
	"errors"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/hotkey"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/tidwall/redcon"
)

// errNoReloader is PROXY CONFIG RELOAD's answer when the proxy was not
// started from a file it can read again.
var errNoReloader = errors.New("the proxy was not started from a config file")

// config is the running configuration: the one New got, or the last one
// Apply took. What needs a restart (listen, tls.listen, upstream,
// metrics.listen, log.format) is read from s.cfg, the one the server
// started with.
func (s *Server) config() *config.Config { return s.live.Load() }

// Apply makes cfg, already validated, the running configuration for what
// can change live: hot-key rules, deduct scripts, hotkeys.soldout_ttl,
// read_staleness, move_timeout and journal_maxlen, the detector's
// settings, the client
// password, limits (limits for clients that connect from now on), and the
// TLS listener's certificate, client CAs, min_version and
// handshake_timeout, read from their files again even when the paths are
// the same (for handshakes from now on; the clients connected keep their
// sessions). No client is dropped. It returns the YAML paths of the
// settings that differ from those the server started with but only a
// restart applies. When the TLS files do not load, nothing is applied and
// the error (an *config.Error naming the key) is returned.
func (s *Server) Apply(cfg *config.Config) (restart []string, err error) {
	var tlsConf *tls.Config
	if s.cfg.TLS.Listen != "" && cfg.TLS.Listen != "" {
		if tlsConf, err = cfg.TLS.ServerConfig(); err != nil {
			return nil, err
		}
	}
	running := *cfg
	// What only a restart changes stays as started, so that PROXY CONFIG
	// GET shows what runs.
	running.Listen, running.Upstream, running.Metrics, running.Log.Format = s.cfg.Listen, s.cfg.Upstream, s.cfg.Metrics, s.cfg.Log.Format
	if tlsConf == nil {
		// No TLS listener runs, or the file turns it off, which needs a
		// restart: the certificates stay as they are.
		running.TLS = s.config().TLS
	}
	running.TLS.Listen = s.cfg.TLS.Listen
	s.live.Store(&running)
	if tlsConf != nil {
		s.tlsConf.Store(tlsConf)
	}
	s.hot.Reload(cfg)
	if err := s.detect.reload(cfg.Hotkeys.Detect); err != nil {
		s.log.Error("detector settings not applied", "err", err) // Validate refuses what NewDetector does
	}
	for _, f := range []struct {
		path     string
		old, new any
	}{
		{"listen", s.cfg.Listen, cfg.Listen},
		{"tls.listen", s.cfg.TLS.Listen, cfg.TLS.Listen},
		{"upstream", s.cfg.Upstream, cfg.Upstream},
		{"metrics.listen", s.cfg.Metrics.Listen, cfg.Metrics.Listen},
		{"log.format", s.cfg.Log.Format, cfg.Log.Format},
	} {
		if !reflect.DeepEqual(f.old, f.new) {
			restart = append(restart, f.path)
		}
	}
	return restart, nil
}

// SetReloader sets what PROXY CONFIG RELOAD runs: read the config again
// and Apply it, or return why not. Call it before Serve.
func (s *Server) SetReloader(reload func() error) { s.reloader = reload }

// configCommand answers PROXY CONFIG GET [pattern] and PROXY CONFIG RELOAD.
func (s *session) configCommand(args [][]byte) {
	switch sub := strings.ToLower(string(args[2])); {
	case sub == "reload" && len(args) != 3, sub == "get" && len(args) > 4:
		s.replyError(rediserr.WrongArity("proxy|config|" + sub))
	case sub == "reload":
		reload := s.srv.reloader
		err := errNoReloader
		if reload != nil {
			err = reload()
		}
		if err != nil {
			s.replyError("ERR config not reloaded, the running one stays: " + oneLine(err.Error()))
			return
		}
		s.reply([]byte("+OK\r\n"))
	case sub == "get":
		pattern := []byte("*")
		if len(args) == 4 {
			pattern = []byte(strings.ToLower(string(args[3]))) // the paths are lower case, as Redis's names
		}
		pairs := configPairs(s.srv.config())
		out := []byte(nil)
		n := 0
		for _, p := range pairs {
			if hotkey.Match(pattern, []byte(p[0])) {
				out = redcon.AppendBulk(redcon.AppendBulk(out, []byte(p[0])), []byte(p[1]))
				n++
			}
		}
		s.reply(append(s.proto.AppendMap(nil, n), out...))
	default:
		s.replyError(rediserr.UnknownSubcommand("config|"+string(args[2]), "PROXY"))
	}
}

// configPairs flattens cfg into (YAML path, value) pairs in file order, as
// CONFIG GET lists Redis's: scalars as written in proxy.yaml, lists as
// one-line YAML, secrets masked.
func configPairs(cfg *config.Config) [][2]string {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(cfg.String()), &doc); err != nil || len(doc.Content) == 0 {
		return nil
	}
	var out [][2]string
	var walk func(prefix string, n *yaml.Node)
	walk = func(prefix string, n *yaml.Node) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				walk(strings.TrimPrefix(prefix+"."+n.Content[i].Value, "."), n.Content[i+1])
			}
		case yaml.ScalarNode:
			out = append(out, [2]string{prefix, n.Value})
		default:
			setFlow(n)
			b, _ := yaml.Marshal(n)
			out = append(out, [2]string{prefix, strings.TrimSpace(string(b))})
		}
	}
	walk("", doc.Content[0])
	return out
}

// setFlow makes n and what it holds print on one line.
func setFlow(n *yaml.Node) {
	n.Style = yaml.FlowStyle
	for _, c := range n.Content {
		setFlow(c)
	}
}
