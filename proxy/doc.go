// Package proxy is the client-facing side of hotkeyproxy: a RESP server
// whose sessions relay every command to an upstream Redis and write the
// replies back byte for byte, in request order.
//
// A Server runs one session goroutine per client, from a plain listener
// (Serve), a TLS one (ServeTLS: crypto/tls with the running config's
// certificates, swapped by Apply, so a reload changes new handshakes
// only), or both. A session reads all the commands a client has
// pipelined (resp.CommandReader), routes each by the command table in
// commands.go, and sends the relayed ones upstream as one batch. Replies are framed, never decoded (resp.ReadReply), so status,
// bulk, nil and error replies reach the client as Redis sent them.
//
// Upstream connections come in two kinds:
//
//   - shared (package upstream): a few per db, multiplexing many clients. The
//     first session with a batch to send writes it, together with whatever
//     other sessions queued meanwhile; one reader goroutine hands each batch
//     its replies in FIFO order. Clients never see each other's state
//     because nothing stateful is sent on them.
//   - own: dialed for a client that needs connection state in Redis
//     (MULTI, WATCH, blocking commands, pub/sub, MONITOR) and kept for the
//     rest of its life, in its db and with its name. Pub/sub and MONITOR
//     switch the session to a stream: a relay goroutine copies whatever
//     Redis sends.
//
// What Redis keeps per connection but the proxy must keep per client on
// shared connections (AUTH, HELLO, SELECT, CLIENT ID/SETNAME/GETNAME,
// RESET, QUIT) is answered by the session with Redis 7.0's replies and
// error texts. The CLIENT family (LIST, INFO, KILL, UNBLOCK, REPLY,
// TRACKING … REDIRECT) is about the proxy's clients and speaks proxy ids:
// each session publishes what CLIENT LIST shows of it (clients.go), and
// where Redis must act on a client (UNBLOCK, REDIRECT) the proxy gives it
// the Redis id of that client's own connection, found by its address. The proxy speaks RESP2 only: HELLO 3 gets NOPROTO, from which
// clients fall back.
//
// Limits: a session stops reading a client while more than
// limits.max_pending_output of replies wait for it, as long as the client
// reads them (Redis has no such backpressure; a client that reads nothing
// for a second is read on, so pipelines written before reading work, and
// limits.query_buffer bounds its replies). Sessions account what they hold
// in clientMemory; past limits.max_client_memory the client holding the
// most is closed. The listener refuses clients past limits.max_clients and
// limits.max_clients_per_ip; a failed AUTH is answered after
// limits.auth_failure_delay.
//
// Failures: a Redis error reply is relayed and the connection stays. A
// transport failure retires the connection; every request in flight gets
// "-ERR upstream unavailable: …", and the next request dials again, so the
// proxy recovers by itself when Redis returns. No wait is unbounded: a
// request with no reply within upstream.read_timeout gets "-ERR upstream
// timeout: …" (package upstream times the shared connections; the session
// its own connection, a blocking command by its own timeout on top, a
// subscription not at all), and a client whose own connection timed out
// is closed, as when that connection fails.
package proxy
