package proxy

import (
	"strconv"
	"strings"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/rediserr"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// errHotDB0 answers a PROXY subcommand on a hot key from a client in
// another db.
const errHotDB0 = "ERR hotkeyproxy: hot keys live in db 0; SELECT 0 first"

// proxyCommand answers PROXY, the proxy's admin command.
func (s *session) proxyCommand(args [][]byte) {
	if len(args) < 2 {
		s.replyError(rediserr.WrongArity("proxy"))
		return
	}
	sub := strings.ToLower(string(args[1]))
	if s.tx.open {
		// Redis would queue it; the proxy answers it itself, so inside a
		// transaction it is refused, and EXEC fails.
		s.replyError("ERR PROXY " + strings.ToUpper(sub) + " is not allowed inside MULTI")
		s.tx.dirty = true
		return
	}
	arity := func(ok bool) bool {
		if !ok {
			s.replyError(rediserr.WrongArity("proxy|" + sub))
		}
		return ok
	}
	switch sub {
	case "hotkeys":
		switch {
		case len(args) > 4:
			s.replyError(rediserr.WrongArity("proxy|hotkeys"))
		case len(args) == 2:
			s.flush()
			s.reply(s.srv.hot.Report(s.proto))
		case strings.EqualFold(string(args[2]), "detected") && len(args) <= 4:
			count := int64(10)
			if len(args) == 4 {
				var ok bool
				if count, ok = resp.ParseInt(args[3]); !ok || count < 1 {
					s.replyError("ERR count must be a positive integer")
					return
				}
			}
			if !s.srv.config().Hotkeys.Detect.Enabled {
				s.replyError("ERR the detector is off: set hotkeys.detect.enabled in the config")
				return
			}
			s.reply(s.srv.detect.detectedReport(s.proto, int(min(count, 1<<20))))
		default:
			s.replyError("ERR syntax error. Try PROXY HELP.")
		}
	case "config":
		if arity(len(args) >= 3) {
			s.flush()
			s.configCommand(args)
		}
	case "shard", "unshard":
		if !arity(len(args) == 3 || len(args) == 4 && sub == "shard") {
			return
		}
		if s.db != 0 {
			s.replyError(errHotDB0)
			return
		}
		if sub == "unshard" {
			s.flush()
			s.reply(s.srv.hot.Unshard(args[2]))
			return
		}
		n := int64(0)
		if len(args) == 4 {
			var ok bool
			if n, ok = resp.ParseInt(args[3]); !ok || n < config.MinBuckets || n > config.MaxBuckets {
				s.replyError("ERR buckets must be an integer from " + strconv.Itoa(config.MinBuckets) + " to " + strconv.Itoa(config.MaxBuckets))
				return
			}
		}
		s.flush()
		s.reply(s.srv.hot.Shard(args[2], int(n)))
	case "journal", "reconcile":
		if !arity(len(args) == 3) {
			return
		}
		if s.db != 0 {
			s.replyError(errHotDB0)
			return
		}
		s.flush()
		if sub == "journal" {
			s.reply(s.srv.hot.Journal(args[2]))
		} else {
			s.reply(s.srv.hot.Reconcile(args[2]))
		}
	case "help":
		if !arity(len(args) == 2) {
			return
		}
		lines := []string{
			"PROXY <subcommand>. Subcommands are:",
			"HOTKEYS",
			"    Each hot key met: its buckets (key, node, value), their sum, whether it is sold out, counters, and its lost buckets.",
			"HOTKEYS DETECTED [<count>]",
			"    The keys the detector estimates busiest (default 10): reads and writes per second, hot or not, since when.",
			"SHARD <key> [<buckets>]",
			"    Hold <key>, a counter, as buckets from now on, live; every proxy learns it.",
			"UNSHARD <key>",
			"    Turn a key held as buckets back into one plain key, live (not one hotkeys.keys names).",
			"JOURNAL <key>",
			"    The journal streams of a journaled hot key, one per bucket, in bucket order.",
			"RECONCILE <key>",
			"    Check a journaled hot key's journal against its buckets, per bucket and in total: clean, differs (where, by how much) or unknown.",
			"CONFIG GET [<pattern>]",
			"    The running config's settings matching <pattern> (default *), by YAML path; secrets masked.",
			"CONFIG RELOAD",
			"    Read the config file again and apply what can change live (as SIGHUP does).",
			"HELP",
			"    Print this help.",
		}
		out := redcon.AppendArray(nil, len(lines))
		for _, l := range lines {
			out = redcon.AppendString(out, l)
		}
		s.reply(out)
	default:
		s.replyError(rediserr.UnknownSubcommand(string(args[1]), "PROXY"))
	}
}
