// Package upstream is the proxy's side toward Redis, knowing nothing of
// clients: dialing (TLS when upstream.tls is on, AUTH, SELECT), the shared
// connections that multiplex many clients' requests, a pool of them per
// node and Key (db and protocol: a RESP3 one says HELLO 3 when dialed),
// a cluster's slot map and its refresh, the round trip that
// follows a cluster's redirections, and the script bodies it loads where
// a node lacks one.
//
// Redis is the entry point: a standalone server (its Pool) or a cluster
// (its Cluster), and the hot-key engine's rewrite.Upstream.
//
// A Conn is shared by many clients: the first sender with a Batch writes
// it, together with whatever others queued meanwhile, and one reader
// goroutine hands each Batch its replies in FIFO order. Replies are
// framed, never decoded, so they reach clients as Redis sent them. Only
// stateless requests may go on a Conn; a client that needs connection
// state (MULTI, blocking commands, pub/sub) takes its own with
// Pool.DialOwn, from a spare dialed in advance per db (spare.go).
//
// Failures: a Redis error reply is an answer, and the connection stays. A
// transport failure retires the connection and fails every Batch in
// flight on it (ErrorText words it for the client as "-ERR upstream
// unavailable: …"); the next Get dials again, so the proxy recovers by
// itself when Redis returns. Waiting clients share one dial's failure
// rather than wait a dial timeout each.
//
// Timeouts and node health (health.go): a watchdog per pool, ticking only
// while requests are in flight, looks at each shared connection's oldest
// request. Past 50 ms the connection is stalled (a script, KEYS *, a big
// reply): new batches go on another, which Get dials in its place, at
// most perDB more per node, and the stalled one closes once drained.
// Past the read timeout it fails with a TimeoutError ("ERR upstream
// timeout: …; the command may have run") and the node is probed with
// PING; while no probe is answered the node is down and Get, Dial and
// Ask fail at once with a DownError, without a dial each.
//
// CLIENT PAUSE (pause.go): told by the proxy of a pause Redis accepted,
// the pool sends batches the pause holds (Batch.Held) on held connections
// of their own during a WRITE pause, so they hold no other client, and
// times nothing a pause holds out before the pause's end plus the read
// timeout.
//
// Users (users.go): Logins are the ACL users clients logged in as, each
// with a pool per node dialed with the user's name and password (up to
// upstream.conns_per_node shared connections per db, as needed), held
// by its clients and closed LoginIdle after the last let go. Pool.Verify
// checks a client's AUTH on the node's verification connection, one AUTH
// at a time, so a wrong password never opens a connection.
//
// Redis refusing the proxy's own credentials, at a dial (AUTH refused,
// NOAUTH to SELECT) or as a NOAUTH reply on a connection dialed without a
// password once requirepass was set, is an AuthError whose text names
// the settings to change (ErrorText, Pool.Refusal), logged once per node
// rather than per connection; a Login's refusals are Redis's words, the
// client's own business.
//
// The package counts into prometheus counters it is handed (Metrics); it
// registers nothing.
package upstream
