package cli

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/proxy"
)

// reloader reads the config file again, with the command line's
// overrides, and applies it to a running proxy: on SIGHUP, on PROXY
// CONFIG RELOAD, and when the file changes on disk.
type reloader struct {
	path  string
	load  func() (*config.Config, error) // the file and the flags, validated
	srv   *proxy.Server
	log   *slog.Logger
	level *slog.LevelVar

	mu sync.Mutex // one reload at a time
}

// reload applies the config as it is now; an invalid one is refused, with
// the reason logged and returned, and the running one stays.
func (r *reloader) reload(source string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cfg, err := r.load()
	var restart []string
	if err == nil {
		restart, err = r.srv.Apply(cfg) // the TLS files may have changed since load read them
	}
	r.srv.ObserveReload(err)
	if err != nil {
		r.log.Error("config reload refused; the running config stays", "source", source, "err", err)
		return err
	}
	r.level.Set(logLevel(cfg.Log.Level))
	if len(restart) > 0 {
		r.log.Warn("config reloaded; these settings take effect only after a restart", "source", source, "needs_restart", restart)
	} else {
		r.log.Info("config reloaded", "source", source)
	}
	return nil
}

// watch reloads on SIGHUP and when the file is written, replaced or
// renamed into place (editors and ConfigMap updates do each), until ctx
// ends. Changes within 200 ms make one reload.
func (r *reloader) watch(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var events chan fsnotify.Event
	w, err := fsnotify.NewWatcher()
	if err == nil {
		defer w.Close()
		// The directory, not the file: a file replaced by rename is a new
		// inode, which a watch on the old one would never see.
		if err = w.Add(filepath.Dir(r.path)); err == nil {
			events = w.Events
		}
	}
	if err != nil {
		r.log.Warn("config file not watched; reload with SIGHUP or PROXY CONFIG RELOAD", "path", r.path, "err", err)
	}
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload("SIGHUP")
		case ev := <-events:
			if filepath.Clean(ev.Name) == filepath.Clean(r.path) && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename) != 0 {
				debounce = time.After(200 * time.Millisecond)
			}
		case <-debounce:
			debounce = nil
			r.reload("file changed")
		}
	}
}

// logLevel is a validated log.level as slog's.
func logLevel(s string) slog.Level {
	var l slog.Level
	l.UnmarshalText([]byte(s))
	return l
}
