package proxy

import "time"

// finishMoves has the hot-key engine finish the moves between buckets
// that a proxy left half done (it died, or lost Redis, in the middle),
// every quarter of hotkeys.move_timeout as the running config says, until
// stop is closed.
func (s *Server) finishMoves(stop <-chan struct{}) {
	t := time.NewTimer(s.config().Hotkeys.MoveTimeout.Duration() / 4)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if s.hot.Any() {
			s.hot.FinishMoves()
		}
		t.Reset(s.config().Hotkeys.MoveTimeout.Duration() / 4)
	}
}
