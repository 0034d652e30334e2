package proxy

import (
	"bufio"
	"net"
	"time"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
	"github.com/hotkeyproxy/hotkeyproxy/rewrite"
)

// newsRetry is how long the layout news follower waits before it
// subscribes again after losing its connection.
const newsRetry = time.Second

// followLayouts keeps a subscription to rewrite.LayoutChannel, on the
// server in standalone mode or on a master in cluster mode (Redis Cluster
// delivers PUBLISH to every node), and hands each message to the hot-key
// engine, so that a key another proxy made hot, or plain again, is served
// as such here within a round trip. While it is not subscribed, the layout
// held in each key is the safety net (contract 9). The server runs it when
// hot keys are in use (rules, scripts or detection configured), as its
// subscription shows in PUBSUB CHANNELS. It returns when stop is closed.
func (s *Server) followLayouts(stop <-chan struct{}) {
	for {
		nc, br, err := s.dialNews()
		if err == nil {
			done := make(chan struct{})
			go func() {
				select {
				case <-stop:
				case <-done:
				}
				nc.Close()
			}()
			err = s.readNews(nc, br)
			close(done)
		}
		select {
		case <-stop:
			return
		case <-time.After(newsRetry):
		}
		if err != nil {
			s.log.Debug("layout news: subscribing again", "err", err)
		}
	}
}

// dialNews connects to the node that carries the news.
func (s *Server) dialNews() (net.Conn, *bufio.Reader, error) {
	if s.up.Cluster == nil {
		return s.up.Pool.Dial(upstream.Key{})
	}
	t, _, err := s.up.Cluster.Current()
	if err != nil {
		return nil, nil, err
	}
	return t.Masters[0].Pool.Dial(upstream.Key{})
}

// readNews subscribes on nc and reads messages until the connection fails.
func (s *Server) readNews(nc net.Conn, br *bufio.Reader) error {
	if _, err := nc.Write(resp.AppendCommand(nil, []byte("SUBSCRIBE"), []byte(rewrite.LayoutChannel))); err != nil {
		return err
	}
	var buf []byte
	var elems [][]byte
	for {
		var err error
		if buf, err = resp.ReadReply(br, buf[:0]); err != nil {
			return err
		}
		elems, _ = resp.ArrayElems(buf, elems[:0])
		if len(elems) == 3 {
			kind, _ := resp.BulkValue(elems[0])
			msg, _ := resp.BulkValue(elems[2])
			if string(kind) == "message" {
				s.hot.News(msg)
			}
		}
	}
}
