package proxy

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/hotkey"
	"github.com/hotkeyproxy/hotkeyproxy/internal/keyspec"
	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// detection is the detector with what the proxy does with its findings:
// log them, and promote (and demote) the keys ops allow.
type detection struct {
	d *hotkey.Detector

	mu       sync.Mutex // guards cfg and promoted
	cfg      config.Detect
	promoted map[string]bool // keys this proxy sharded because they turned hot, until demoted

	promotions, demotions atomic.Uint64
}

// newDetection returns the detection of cfg; its detector counts nothing
// while cfg.Enabled is false.
func newDetection(cfg config.Detect) (*detection, error) {
	d, err := hotkey.NewDetector(cfg)
	if err != nil {
		return nil, err
	}
	return &detection{d: d, cfg: cfg, promoted: make(map[string]bool)}, nil
}

// reload applies new detector settings; the keys counted so far stay.
func (dt *detection) reload(cfg config.Detect) error {
	if err := dt.d.SetConfig(cfg); err != nil {
		return err
	}
	dt.mu.Lock()
	dt.cfg = cfg
	dt.mu.Unlock()
	return nil
}

// observe counts the keys of a sampled command (args[i] for i in idx),
// as writes when Redis flags the command so.
func (s *session) observe(table *keyspec.Table, args [][]byte, idx []int) {
	write := table.Writes(args)
	for _, i := range idx {
		s.srv.detect.d.Add(args[i], write)
	}
}

// watchDetected takes the detector's news every quarter window (at most
// every 250 ms): a line in the log when a key turns hot or cools, and the
// promotion of a write-hot key matching detect.promote (or its demotion
// once cool, with detect.demote). It returns when stop is closed.
func (s *Server) watchDetected(stop <-chan struct{}) {
	dt := s.detect
	tick := time.NewTicker(min(dt.settings().Window.Duration()/4, 250*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		for _, c := range dt.d.Changes() {
			s.detected(c)
		}
	}
}

// detected acts on one change of the detector.
func (s *Server) detected(c hotkey.Detected) {
	dt := s.detect
	cfg := dt.settings()
	rates := []any{"key", c.Key, "read_ops_per_sec", int64(c.ReadRate), "write_ops_per_sec", int64(c.WriteRate)}
	if !c.Hot {
		s.log.Info("key cooled", rates...)
		dt.mu.Lock()
		promoted := dt.promoted[c.Key]
		dt.mu.Unlock()
		if promoted && cfg.Demote {
			r := s.hot.Unshard([]byte(c.Key))
			if string(r) == "+OK\r\n" {
				dt.demotions.Add(1)
				dt.mu.Lock()
				delete(dt.promoted, c.Key)
				dt.mu.Unlock()
			}
			s.log.Info("demoting key", "key", c.Key, "reply", replyText(r))
		}
		return
	}
	s.log.Info("key turned hot", append(rates, "read_hot", c.ReadHot, "write_hot", c.WriteHot)...)
	if !c.WriteHot || !promotable(cfg.Promote, c.Key) || s.hot.Hot([]byte(c.Key)) {
		return
	}
	if cfg.DryRun {
		s.log.Info("would promote key (detect.dry_run)", "key", c.Key)
		return
	}
	r := s.hot.Shard([]byte(c.Key), 0)
	if string(r) == "+OK\r\n" {
		dt.mu.Lock()
		dt.promoted[c.Key] = true
		dt.mu.Unlock()
		dt.promotions.Add(1)
	}
	s.log.Info("promoting key", "key", c.Key, "reply", replyText(r))
}

// settings are the detector's settings now.
func (dt *detection) settings() config.Detect {
	dt.mu.Lock()
	defer dt.mu.Unlock()
	return dt.cfg
}

// promotable reports whether a detect.promote glob matches key.
func promotable(globs []string, key string) bool {
	for _, p := range globs {
		if hotkey.Match([]byte(p), []byte(key)) {
			return true
		}
	}
	return false
}

// replyText is a short reply as a log shows it: "OK", or the error text.
func replyText(r []byte) string {
	if len(r) < 3 {
		return string(r)
	}
	return string(r[1 : len(r)-2])
}

// detectedReport answers PROXY HOTKEYS DETECTED [count]: the count
// (default 10) keys with the highest estimated rate, each an array (a map
// in RESP3, as p asks) of
//
//	key, <key>, read_ops_per_sec, <n>, write_ops_per_sec, <n>, hot, yes|no, since, <unix ms, 0 if not hot>
func (dt *detection) detectedReport(p resp.Proto, count int) []byte {
	top := dt.d.Top(count)
	out := redcon.AppendArray(nil, len(top))
	for _, k := range top {
		hot, since := "no", int64(0)
		if k.Hot {
			hot, since = "yes", k.Since.UnixMilli()
		}
		out = p.AppendMap(out, 5)
		for _, f := range [][2]string{
			{"key", k.Key},
			{"read_ops_per_sec", strconv.FormatInt(int64(k.ReadRate), 10)},
			{"write_ops_per_sec", strconv.FormatInt(int64(k.WriteRate), 10)},
			{"hot", hot},
			{"since", strconv.FormatInt(since, 10)},
		} {
			out = redcon.AppendBulk(out, []byte(f[0]))
			out = redcon.AppendBulk(out, []byte(f[1]))
		}
	}
	return out
}
