// Package proxy is the client-facing side of hotkeyproxy: a RESP server
// whose sessions relay every command to an upstream Redis and write the
// replies back byte for byte, in request order.
//
// A Server runs one session goroutine per client, from a plain listener
// (Serve), a TLS one (ServeTLS: crypto/tls with the running config's
// certificates, swapped by Apply, so a reload changes new handshakes
// only), or both. A session reads all the commands a client has
// pipelined (resp.CommandReader), routes each by the command table in
// commands.go, and sends the relayed ones upstream as one batch. Replies
// are framed, never decoded (resp.ReadReply), so status, bulk, nil and
// error replies, and RESP3's types, reach the client as Redis sent them.
//
// Upstream connections come in two kinds:
//
//   - shared (package upstream): a few per db and protocol, multiplexing
//     many clients. The first session with a batch to send writes it,
//     together with whatever other sessions queued meanwhile; one reader
//     goroutine hands each batch its replies in FIFO order. Clients never see each other's state
//     because nothing stateful is sent on them.
//   - own: dialed for a client that needs connection state in Redis
//     (MULTI, WATCH, blocking commands, pub/sub, MONITOR) and kept for the
//     rest of its life, in its db and with its name; taken from a spare
//     dialed in advance (upstream.Pool.DialOwn), so that the command
//     needing it is not overtaken by what other clients send after it. Pub/sub and MONITOR
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
// the Redis id of that client's own connection, found by its address.
//
// Protocols: each client speaks RESP2 until HELLO 3, and RESP3 until HELLO
// 2 or RESET (session.proto). Its requests go to shared connections of its
// protocol, and its own connection said HELLO 3 when dialed or switches
// with it, so Redis's replies come in its protocol. What the session makes
// itself is built with resp.Proto's methods (maps, nulls, pushes, verbatim
// strings as Redis 7.0 shapes them in either); the hot-key engine speaks
// RESP2 upstream, and its replies are adapted (nil → null). A RESP3 client
// may run any command while subscribed: on the stream's connection, or,
// in cluster mode and on hot keys, as when not subscribed once the stream
// is in step (streamAside). RESP3 pushes that arrive on an own connection between
// replies (a message, an invalidation) are passed on where they came and
// count as no reply.
//
// Users (acl.go): with the proxy's password every client is Redis's
// default user on the proxy's connections. With upstream.client_auth:
// redis, Redis checks AUTH and HELLO … AUTH (upstream.Redis.Verify: one
// verification connection per node, so a wrong password costs a round
// trip there and no connection), and a client that logged in holds its
// user's upstream.Login: its shared connections, in standalone mode and
// on each cluster node, and its own connection are authenticated as the
// user, so Redis answers NOPERM itself. The clients of one user share its
// pools (up to conns_per_node per node and db); a user's pools close a minute
// after its last client let go. A client that has not logged in is
// Redis's default user, on connections that send no AUTH: Redis's NOAUTH
// is the answer while the default user has a password. Hot keys are
// served with the proxy's own credentials.
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
// is closed, as when that connection fails. The session relays CLIENT
// PAUSE and UNPAUSE itself (clientPause) and tells the pool, and marks a
// batch with a command a WRITE pause holds (commands.go heldCommands), so
// that a pause holds no more clients than Redis would and what it holds
// does not time out (upstream/pause.go).
package proxy
