package proxy

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hotkeyproxy/hotkeyproxy/internal/resp"
	"github.com/hotkeyproxy/hotkeyproxy/proxy/upstream"
)

// Label values. Every label takes its values from a fixed set, so no
// client can add series: commands from commandLabels (else "other"),
// nodes from the upstream's addresses.
const (
	resultOK      = "ok"    // result: any reply but an error
	resultError   = "error" // result: an error reply
	redirectMoved = "moved" // kind: -MOVED, the slot has a new master
	redirectAsk   = "ask"   // kind: -ASK, the slot is migrating

	rejectMaxClients = "max_clients"        // reason: limits.max_clients were connected
	rejectPerIP      = "max_clients_per_ip" // reason: as many from the client's address

	evictMemory = "max_client_memory" // reason: the clients together held too much
	evictOutput = "output_limit"      // reason: too many replies unread
	evictQuery  = "query_buffer"      // reason: too much input unparsed
)

// latencyBuckets are the buckets of the latency histograms, in seconds:
// 100µs (a pipelined command's share of a round trip) to 10s (a blocking
// command, a stalled node).
var latencyBuckets = [...]float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// metrics are a Server's Prometheus metrics, all made by newMetrics.
// What the request path touches is resolved to children once, because
// WithLabelValues hashes the labels and takes a lock on every call: per
// command on its first use (commandMetrics), per node when the node is
// first named (upstream.NodeMetrics).
type metrics struct {
	reg *prometheus.Registry

	commands       *prometheus.CounterVec // command, result
	commandSeconds *commandHistograms     // command
	byCommand      []atomic.Pointer[commandMetrics]

	rejectedClients      prometheus.Counter            // reason rejectMaxClients
	rejectedPerIP        prometheus.Counter            // reason rejectPerIP
	evicted              map[string]prometheus.Counter // by reason: evictMemory, evictOutput, evictQuery
	authFailures         prometheus.Counter
	tlsHandshakeFailures prometheus.Counter

	upstreamRequests *prometheus.CounterVec   // node
	upstreamErrors   *prometheus.CounterVec   // node
	upstreamTimeouts *prometheus.CounterVec   // node
	upstreamSeconds  *prometheus.HistogramVec // node

	moved, ask   prometheus.Counter
	reloadOK     prometheus.Counter
	reloadFailed prometheus.Counter
}

// newMetrics makes the proxy's metrics and registers them, with the Go
// runtime and process collectors, on reg. clients reports the connected
// clients and clientMemory what they hold, at scrape time.
func newMetrics(reg *prometheus.Registry, clients func() int, clientMemory func() int64) *metrics {
	m := &metrics{
		reg: reg,
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotkeyproxy_commands_total",
			Help: "Commands answered, by command name (Redis's commands, else \"other\") and result (\"error\" for an error reply, else \"ok\"). Commands sent in subscribe mode count as ok.",
		}, []string{"command", "result"}),
		byCommand: make([]atomic.Pointer[commandMetrics], len(commandLabels)),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotkeyproxy_auth_failures_total",
			Help: "AUTH and HELLO ... AUTH commands refused for a wrong username or password.",
		}),
		tlsHandshakeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hotkeyproxy_tls_handshake_failures_total",
			Help: "Clients of the TLS listener (tls.listen) closed because their TLS handshake failed or did not end within tls.handshake_timeout.",
		}),
		upstreamRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotkeyproxy_upstream_requests_total",
			Help: "Requests written to an upstream node's shared connections, by node address.",
		}, []string{"node"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotkeyproxy_upstream_errors_total",
			Help: "Transport failures with an upstream node, by node address: failed dials and broken connections. Redis error replies are not counted here.",
		}, []string{"node"}),
		upstreamTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hotkeyproxy_upstream_timeouts_total",
			Help: "Upstream connections closed for want of a reply, by node address: a request waited past upstream.read_timeout (plus a blocking command's own timeout), or the node was found down with requests in flight. Every request in flight on it got \"ERR upstream timeout\". Also counted in hotkeyproxy_upstream_errors_total.",
		}, []string{"node"}),
		upstreamSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hotkeyproxy_upstream_batch_duration_seconds",
			Help:    "Time from writing a batch of pipelined requests to an upstream node's shared connection (one write: the requests of every client that queued meanwhile) until its last reply arrived, by node address.",
			Buckets: latencyBuckets[:],
		}, []string{"node"}),
	}
	m.commandSeconds = &commandHistograms{
		desc: prometheus.NewDesc("hotkeyproxy_command_duration_seconds",
			"Time from reading a command to its reply being ready for the client, by command name. Commands read in one pipeline share the start.",
			[]string{"command"}, nil),
		byCommand: m.byCommand,
	}
	redirects := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hotkeyproxy_cluster_redirections_total",
		Help: "Redirections followed in cluster mode, by kind: moved (-MOVED) or ask (-ASK).",
	}, []string{"kind"})
	m.moved = redirects.WithLabelValues(redirectMoved)
	m.ask = redirects.WithLabelValues(redirectAsk)
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hotkeyproxy_rejected_clients_total",
		Help: "Clients refused as they connected, by reason: max_clients (limits.max_clients clients were connected) or max_clients_per_ip (limits.max_clients_per_ip from the client's address were).",
	}, []string{"reason"})
	m.rejectedClients = rejected.WithLabelValues(rejectMaxClients)
	m.rejectedPerIP = rejected.WithLabelValues(rejectPerIP)
	evicted := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hotkeyproxy_evicted_clients_total",
		Help: "Clients the proxy closed for going over a limit, by reason: max_client_memory (the clients together held more than limits.max_client_memory and this one held the most), output_limit (more unread replies than limits.query_buffer) or query_buffer (more unparsed input than limits.query_buffer).",
	}, []string{"reason"})
	m.evicted = map[string]prometheus.Counter{}
	for _, r := range []string{evictMemory, evictOutput, evictQuery} {
		m.evicted[r] = evicted.WithLabelValues(r)
	}
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hotkeyproxy_config_reloads_total",
		Help: "Configuration reloads, by result: ok (applied) or error (refused, the old config kept).",
	}, []string{"result"})
	m.reloadOK = reloads.WithLabelValues(resultOK)
	m.reloadFailed = reloads.WithLabelValues(resultError)
	reg.MustRegister(
		m.commands, m.commandSeconds, rejected, evicted, m.authFailures, m.tlsHandshakeFailures,
		m.upstreamRequests, m.upstreamErrors, m.upstreamTimeouts, m.upstreamSeconds,
		redirects, reloads,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hotkeyproxy_connected_clients",
			Help: "Clients connected now.",
		}, func() float64 { return float64(clients()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hotkeyproxy_client_memory_bytes",
			Help: "Memory the connected clients hold, as limits.max_client_memory counts it: query buffers, replies not yet written, requests being relayed.",
		}, func() float64 { return float64(clientMemory()) }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// commandMetrics are one command's children of the command metrics.
type commandMetrics struct {
	label   string
	ok, err prometheus.Counter
	seconds latencyHistogram
}

// command returns the metrics of cmd's label.
func (m *metrics) command(cmd *command) *commandMetrics {
	i := cmd.metric
	if c := m.byCommand[i].Load(); c != nil {
		return c
	}
	label := commandLabels[i]
	// Racing sessions make the same children: WithLabelValues returns
	// the existing one.
	c := &commandMetrics{
		label: label,
		ok:    m.commands.WithLabelValues(label, resultOK),
		err:   m.commands.WithLabelValues(label, resultError),
	}
	m.byCommand[i].CompareAndSwap(nil, c)
	return m.byCommand[i].Load()
}

// node returns the metrics of the upstream node at addr. Nodes are a
// bounded set: the configured ones and, in cluster mode, those the slot
// map and redirections name.
func (m *metrics) node(addr string) *upstream.NodeMetrics {
	return &upstream.NodeMetrics{
		Requests: m.upstreamRequests.WithLabelValues(addr),
		Errors:   m.upstreamErrors.WithLabelValues(addr),
		Timeouts: m.upstreamTimeouts.WithLabelValues(addr),
		Seconds:  m.upstreamSeconds.WithLabelValues(addr),
	}
}

// sessionMetrics counts one session's commands by their replies. handle
// queues each command; write, which every reply to a request passes on
// its way to the client, counts them against the replies in order. The
// session answers every command it has handled, one reply each, before
// it writes, so the two line up. The zero value is ready to use.
type sessionMetrics struct {
	queue []*commandMetrics // handled, not yet counted, in request order
	start time.Duration     // monoNow when the first of queue was handled
}

// add queues a command the session is about to handle. In subscribe mode
// the replies reach the client from relay, not through write, so the
// command counts as ok at once, without a duration.
func (sm *sessionMetrics) add(m *metrics, cmd *command, streaming bool) {
	c := m.command(cmd)
	if streaming {
		c.ok.Inc()
		return
	}
	if len(sm.queue) == 0 {
		sm.start = monoNow()
	}
	sm.queue = append(sm.queue, c)
}

// monoStart is the origin of monoNow.
var monoStart = time.Now()

// monoNow is the time on the monotonic clock, for durations: it reads
// one clock where time.Now reads two (wall and monotonic), which counts
// on the request path (about 30ns a clock on this project's machine).
func monoNow() time.Duration { return time.Since(monoStart) }

// maxQueueKept is the capacity of a queue kept after a long pipeline.
const maxQueueKept = 4096

// replied counts the queued commands against the replies in out: an
// error reply (-…) counts as error, any other as ok. A command left
// without a reply in out was answered another way (SUBSCRIBE: by the
// stream) and counts as ok; a reply left over (the error the session adds
// before it closes a client) belongs to no command. All took the same
// time, so a run of one command with one result is counted at once.
func (sm *sessionMetrics) replied(out []byte) {
	if len(sm.queue) == 0 {
		return
	}
	d := monoNow() - sm.start
	bucket := latencyBucket(d)
	var run *commandMetrics
	var runErr bool
	n := 0
	for _, c := range sm.queue {
		isErr := len(out) > 0 && out[0] == '-'
		out = out[resp.FrameLen(out):]
		if c == run && isErr == runErr {
			n++
			continue
		}
		if n > 0 {
			run.count(runErr, bucket, d, n)
		}
		run, runErr, n = c, isErr, 1
	}
	run.count(runErr, bucket, d, n)
	if cap(sm.queue) > maxQueueKept {
		sm.queue = nil
	} else {
		sm.queue = sm.queue[:0]
	}
}

// count adds n commands with one result and duration.
func (c *commandMetrics) count(isErr bool, bucket int, d time.Duration, n int) {
	if isErr {
		c.err.Add(float64(n))
	} else {
		c.ok.Add(float64(n))
	}
	c.seconds.observe(bucket, d, n)
}

// latencyHistogram is a histogram over latencyBuckets that takes n
// observations of one value in two atomic adds, where a
// prometheus.Histogram takes n Observe calls: the commands of a pipeline
// all get the same duration.
type latencyHistogram struct {
	counts [len(latencyBuckets) + 1]atomic.Uint64 // the last: above every bucket
	sum    atomic.Int64                           // nanoseconds
}

// latencyBucket is the index in latencyBuckets of the first bucket d fits
// in, or len(latencyBuckets).
func latencyBucket(d time.Duration) int {
	sec := d.Seconds()
	i := 0
	for i < len(latencyBuckets) && sec > latencyBuckets[i] {
		i++
	}
	return i
}

func (h *latencyHistogram) observe(bucket int, d time.Duration, n int) {
	h.counts[bucket].Add(uint64(n))
	h.sum.Add(int64(d) * int64(n))
}

// commandHistograms collects the latencyHistogram of each command in use.
type commandHistograms struct {
	desc      *prometheus.Desc
	byCommand []atomic.Pointer[commandMetrics]
}

// Describe implements prometheus.Collector.
func (h *commandHistograms) Describe(ch chan<- *prometheus.Desc) { ch <- h.desc }

// Collect implements prometheus.Collector. The buckets of one histogram
// are read one by one while commands may be counted: the count is their
// sum, so each histogram is consistent in itself.
func (h *commandHistograms) Collect(ch chan<- prometheus.Metric) {
	for i := range h.byCommand {
		c := h.byCommand[i].Load()
		if c == nil {
			continue
		}
		var count uint64
		buckets := make(map[float64]uint64, len(latencyBuckets))
		for j, upper := range latencyBuckets {
			count += c.seconds.counts[j].Load()
			buckets[upper] = count
		}
		count += c.seconds.counts[len(latencyBuckets)].Load()
		sum := time.Duration(c.seconds.sum.Load()).Seconds()
		ch <- prometheus.MustNewConstHistogram(h.desc, count, sum, buckets, c.label)
	}
}

// Register adds a collector to the server's registry, the one /metrics
// serves; it fails as prometheus.Registerer.Register does, on a metric
// registered twice or inconsistent with one already there. For the parts
// wired to the proxy from outside, such as the hot-key engine's Stats.
func (s *Server) Register(c prometheus.Collector) error { return s.m.reg.Register(c) }

// ObserveReload counts a configuration reload by its result: err nil for
// a config applied, else refused.
func (s *Server) ObserveReload(err error) {
	if err != nil {
		s.m.reloadFailed.Inc()
	} else {
		s.m.reloadOK.Inc()
	}
}

// MetricsHandler serves the operator's endpoints: /metrics (Prometheus),
// /healthz (200 while the process runs) and /readyz (200 when Ready
// reports nil, else 503 with the reason).
func (s *Server) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := s.Ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("not ready: " + oneLine(err.Error()) + "\n"))
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}

// ServeMetrics serves MetricsHandler on ln until Shutdown, after which it
// returns nil. Shutdown closes it last, so that /readyz says "shutting
// down" while clients finish.
func (s *Server) ServeMetrics(ln net.Listener) error {
	hs := &http.Server{
		Handler:           s.MetricsHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.httpServers = append(s.httpServers, hs)
	s.mu.Unlock()
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// closeMetrics stops the servers ServeMetrics started.
func (s *Server) closeMetrics() {
	s.mu.Lock()
	servers := s.httpServers
	s.httpServers = nil
	s.mu.Unlock()
	for _, hs := range servers {
		hs.Close()
	}
}

// ErrShuttingDown is Ready's answer once Shutdown has begun.
var ErrShuttingDown = errors.New("proxy: shutting down")

// readyTTL is how long Ready reuses its last answer, so that a flood of
// /readyz requests does not become a flood of connections to Redis.
const readyTTL = time.Second

// readiness is Ready's last answer.
type readiness struct {
	mu  sync.Mutex // guards at and err; held while one check runs
	at  time.Time
	err error
}

// Ready reports why the proxy cannot serve clients now, or nil. In
// standalone mode the upstream must answer PING on a connection of its
// own, within upstream.dial_timeout; in cluster mode the slot map must be
// loaded and its last refresh have succeeded. Answers are reused for a
// second.
func (s *Server) Ready() error {
	if s.closing.Load() {
		return ErrShuttingDown
	}
	if s.up.Cluster != nil {
		return s.up.Cluster.Ready()
	}
	r := &s.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.at) < readyTTL {
		return r.err
	}
	r.err = s.up.Pool.Ping()
	r.at = time.Now()
	return r.err
}

// oneLine makes text fit one line of a response.
func oneLine(text string) string { return strings.NewReplacer("\r", " ", "\n", " ").Replace(text) }
