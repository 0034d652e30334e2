package seckill

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Deduct scripts, byte for byte as the default proxy.yaml declares them: a
// proxy recognises a deduct script on a hot key by its body (or its SHA1),
// so a script that differs by one space would be refused there.
const (
	// DeductOneScript takes 1 when the key holds more than 0, else returns -1.
	DeductOneScript = "if tonumber(redis.call('get', KEYS[1]) or '0') > 0 then return redis.call('decr', KEYS[1]) else return -1 end"
	// DeductNScript takes ARGV[1] when the key holds at least that much,
	// else returns -1.
	DeductNScript = "local n = tonumber(ARGV[1]) local s = tonumber(redis.call('get', KEYS[1]) or '0') if s >= n then return redis.call('decrby', KEYS[1], n) else return -1 end"
	// ScriptSoldOut is what both scripts return when the stock cannot
	// cover the amount.
	ScriptSoldOut = -1
)

// Mode is how a client deducts.
type Mode string

const (
	// ModeScript runs DeductOneScript (or DeductNScript when Amount > 1)
	// with EVALSHA, and EVAL when the server answers NOSCRIPT.
	ModeScript Mode = "script"
	// ModeDecr sends DECR (DECRBY when Amount > 1) and, when the reply is
	// negative, gives the amount back with INCR (INCRBY).
	ModeDecr Mode = "decr"
)

// Defaults for zero Options fields.
const (
	DefaultAddr     = "127.0.0.1:6380"
	DefaultKey      = "stock:sku:1001"
	DefaultClients  = 200
	DefaultDuration = 60 * time.Second
)

const (
	// maxErrorSamples is how many error messages a Result keeps.
	maxErrorSamples = 5
	// errorPause is how long a client waits after a transport error, so a
	// dead server is not hammered by every client in a tight loop.
	errorPause = 10 * time.Millisecond
	// readTimeout bounds the setup, warm-up and final reads.
	readTimeout = 10 * time.Second
)

// Options configures Run.
type Options struct {
	// Addr is the host:port to sell from. Default DefaultAddr (a local
	// hotkeyproxy).
	Addr string
	// Password is sent with AUTH (HELLO) when not empty. Default none.
	Password string `json:"-"`
	// Key is the stock key. Default DefaultKey.
	Key string
	// Stock is the number of units for sale, >= 0. Unless NoSetup, Run
	// first SETs the key to it; either way, oversell is measured against
	// it. Zero is a sale of nothing.
	Stock int64
	// Clients is the number of concurrent buyers, each with its own
	// connection. Default DefaultClients.
	Clients int
	// Mode is how clients deduct. Default ModeScript.
	Mode Mode
	// Amount is the units one deduct takes, >= 1. Default 1.
	Amount int64
	// Duration bounds the sale; it ends earlier once every client has been
	// told "sold out". Default DefaultDuration.
	Duration time.Duration
	// Requests bounds the deducts sent by all clients together. 0 (the
	// default) means no bound.
	Requests int64
	// NoSetup leaves the key as it is instead of SETting it to Stock.
	NoSetup bool
	// Journal checks, at the end, the key's journal (a hotkeyproxy hot
	// key with journal: true; PROXY JOURNAL lists its streams): its
	// entries since the sale began must deduct, less what they give
	// back, exactly the units the clients were told they bought.
	Journal bool
	// OrderIDs, in ModeScript, passes a new order id with every deduct,
	// as the script's last ARGV (ARGV[1] of deduct-one, ARGV[2] of
	// deduct-n; declare it as the script's order_id in proxy.yaml), and
	// with Journal checks entry for entry: no deduct entry without a
	// success, no success without one.
	OrderIDs bool
}

// withDefaults returns o with zero fields set to their defaults, or an
// error naming the first invalid field.
func (o Options) withDefaults() (Options, error) {
	if o.Addr == "" {
		o.Addr = DefaultAddr
	}
	if o.Key == "" {
		o.Key = DefaultKey
	}
	if o.Clients == 0 {
		o.Clients = DefaultClients
	}
	if o.Mode == "" {
		o.Mode = ModeScript
	}
	if o.Amount == 0 {
		o.Amount = 1
	}
	if o.Duration == 0 {
		o.Duration = DefaultDuration
	}
	switch {
	case o.Stock < 0:
		return o, fmt.Errorf("seckill: invalid stock %d, want >= 0", o.Stock)
	case o.Clients < 0:
		return o, fmt.Errorf("seckill: invalid clients %d, want >= 1", o.Clients)
	case o.Mode != ModeScript && o.Mode != ModeDecr:
		return o, fmt.Errorf("seckill: invalid mode %q, want %q or %q", o.Mode, ModeScript, ModeDecr)
	case o.Amount < 0:
		return o, fmt.Errorf("seckill: invalid amount %d, want >= 1", o.Amount)
	case o.Duration < 0:
		return o, fmt.Errorf("seckill: invalid duration %v, want > 0", o.Duration)
	case o.Requests < 0:
		return o, fmt.Errorf("seckill: invalid requests %d, want >= 0", o.Requests)
	case o.OrderIDs && o.Mode != ModeScript:
		return o, fmt.Errorf("seckill: order ids need mode %q", ModeScript)
	}
	return o, nil
}

// StopReason says why a sale ended.
type StopReason string

const (
	// StopSoldOut: every client was told "sold out" at least once.
	StopSoldOut StopReason = "sold out"
	// StopDuration: Options.Duration passed.
	StopDuration StopReason = "duration"
	// StopRequests: Options.Requests deducts were sent.
	StopRequests StopReason = "requests"
	// StopCanceled: the caller's context ended.
	StopCanceled StopReason = "canceled"
)

// sale is the state of one Run shared by its clients.
type sale struct {
	opts   Options
	rdb    *redis.Client
	script *redis.Script // nil in ModeDecr
	args   []any         // script ARGV
	run    string        // names this sale in its order ids
	start  time.Time
	done   context.Context // ends with the sale; requests use their own
	cancel context.CancelFunc

	// soldOutAt is the end, in ns since start, of the earliest sold-out
	// reply any client has received; MaxInt64 until then.
	soldOutAt atomic.Int64
	told      atomic.Int64 // clients told "sold out" at least once
	sent      atomic.Int64 // deducts sent, counted only when Requests > 0

	mu      sync.Mutex // guards reason and samples
	reason  StopReason
	samples []string
}

// clientStats is one client's tally, merged into the Result at the end.
type clientStats struct {
	ok, soldOut, giveBacks, errors, falseSoldOuts int64
	lastSale                                      time.Duration // end of the last success since start
	okLat, soldOutLat                             histogram
	orders                                        []string // with OrderIDs: the order ids told they bought
}

// Run sells opts.Stock units of opts.Key at opts.Addr and returns what
// happened. It returns an error, and no Result, when the options are
// invalid or the server cannot be set up or reached before the sale
// starts; errors during the sale are counted in the Result. Canceling ctx
// ends the sale early: deducts in flight still complete (bounded by
// go-redis's 3 s read timeout), so the Result stays consistent.
func Run(ctx context.Context, opts Options) (Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Result{}, err
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:     opts.Addr,
		Password: opts.Password,
		// RESP2 whatever the server offers, and never retry: a retried
		// deduct whose first attempt was applied sells a unit twice.
		Protocol:   2,
		MaxRetries: -1,
		PoolSize:   opts.Clients,
	})
	defer rdb.Close()

	// Requests in flight finish even when ctx ends, so that every deduct
	// sent is counted; the read timeout bounds the wait.
	reqCtx := context.WithoutCancel(ctx)
	setupCtx, cancelSetup := context.WithTimeout(ctx, readTimeout)
	defer cancelSetup()
	if !opts.NoSetup {
		if err := rdb.Set(setupCtx, opts.Key, opts.Stock, 0).Err(); err != nil {
			return Result{}, fmt.Errorf("seckill: setup: SET %s at %s: %w", opts.Key, opts.Addr, err)
		}
	}
	startValue, err := getInt(setupCtx, rdb, opts.Key)
	if err != nil {
		return Result{}, fmt.Errorf("seckill: setup: %w", err)
	}

	var streams, tips []string
	if opts.Journal {
		if streams, tips, err = journalTips(setupCtx, rdb, opts.Key); err != nil {
			return Result{}, fmt.Errorf("seckill: setup: %w", err)
		}
	}

	conns, err := warmUp(setupCtx, rdb, opts.Clients)
	if err != nil {
		return Result{}, fmt.Errorf("seckill: connecting %d clients to %s: %w", opts.Clients, opts.Addr, err)
	}

	s := &sale{opts: opts, rdb: rdb, run: strconv.FormatInt(time.Now().UnixNano(), 36)}
	if opts.Mode == ModeScript {
		if opts.Amount == 1 {
			s.script = redis.NewScript(DeductOneScript)
		} else {
			s.script = redis.NewScript(DeductNScript)
			s.args = []any{opts.Amount}
		}
	}
	s.soldOutAt.Store(math.MaxInt64)
	// The clock starts before the deadline is set, so a sale stopped by
	// it never reports less than Duration.
	s.start = time.Now()
	done, cancel := context.WithTimeout(ctx, opts.Duration)
	defer cancel()
	s.done, s.cancel = done, cancel

	stats := make([]clientStats, opts.Clients)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { s.client(reqCtx, i, c, &stats[i]) })
	}
	wg.Wait()
	elapsed := time.Since(s.start)
	switch {
	case s.reason != "":
	case ctx.Err() != nil:
		s.reason = StopCanceled
	default:
		s.reason = StopDuration
	}

	res := s.result(stats, elapsed, startValue)
	finalCtx, cancelFinal := context.WithTimeout(reqCtx, readTimeout)
	defer cancelFinal()
	if res.Final, err = getInt(finalCtx, rdb, opts.Key); err != nil {
		res.FinalErr = err.Error()
	} else {
		res.Unaccounted = res.Start - res.Sold - res.Final
	}
	if opts.Journal {
		var orders map[string]bool
		if opts.OrderIDs {
			orders = make(map[string]bool, res.OK)
			for i := range stats {
				for _, o := range stats[i].orders {
					orders[o] = true
				}
			}
		}
		res.Journal = checkJournal(finalCtx, rdb, streams, tips, orders)
	}
	return res, nil
}

// getInt reads key as an integer; a missing key is 0, as DECR and the
// deduct scripts treat it.
func getInt(ctx context.Context, rdb *redis.Client, key string) (int64, error) {
	v, err := rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", key, err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %q is not an integer", key, v)
	}
	return n, nil
}

// warmUp opens one connection per client and PINGs on each, so that dialing
// is not counted in the first deducts' latency. On error it closes them all.
func warmUp(ctx context.Context, rdb *redis.Client, n int) ([]*redis.Conn, error) {
	conns := make([]*redis.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range conns {
		conns[i] = rdb.Conn()
		wg.Go(func() { errs[i] = conns[i].Ping(ctx).Err() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range conns {
			c.Close()
		}
		return nil, err
	}
	return conns, nil
}

// stop ends the sale; the first reason given wins.
func (s *sale) stop(r StopReason) {
	s.mu.Lock()
	if s.reason == "" {
		s.reason = r
	}
	s.mu.Unlock()
	s.cancel()
}

// client deducts on c until the sale ends, then closes c; it holds one of
// the pool's connections until then. Only this goroutine touches st.
func (s *sale) client(ctx context.Context, id int, c *redis.Conn, st *clientStats) {
	// A Conn whose connection broke fails every later command (go-redis
	// never redials a Conn), so a transport error swaps in a new one.
	defer func() { c.Close() }()
	reconnect := func(err error) {
		if s.fail(id, st, err) {
			c.Close()
			c = s.rdb.Conn()
		}
	}
	told := false
	for seq := 0; s.done.Err() == nil; seq++ {
		if s.opts.Requests > 0 && s.sent.Add(1) > s.opts.Requests {
			s.stop(StopRequests)
			return
		}
		var order string
		if s.opts.OrderIDs {
			order = s.run + "-" + strconv.Itoa(id) + "-" + strconv.Itoa(seq)
		}
		t0 := time.Now()
		n, err := s.deduct(ctx, c, order)
		t1 := time.Now()
		began, ended := t0.Sub(s.start), t1.Sub(s.start)
		switch {
		case err != nil:
			reconnect(err)
		case n >= 0:
			st.ok++
			st.okLat.record(t1.Sub(t0))
			st.lastSale = ended
			if order != "" {
				st.orders = append(st.orders, order)
			}
			if int64(began) > s.soldOutAt.Load() {
				st.falseSoldOuts++
			}
		case s.opts.Mode == ModeScript && n != ScriptSoldOut:
			s.fail(id, st, replyError(fmt.Sprintf("deduct script replied %d, want >= 0 or %d", n, ScriptSoldOut)))
		default:
			st.soldOut++
			st.soldOutLat.record(t1.Sub(t0))
			s.markSoldOut(int64(ended))
			if s.opts.Mode == ModeDecr {
				if err := s.giveBack(ctx, c); err != nil {
					reconnect(fmt.Errorf("give-back: %w", err))
				} else {
					st.giveBacks++
				}
			}
			if !told {
				told = true
				if s.told.Add(1) == int64(s.opts.Clients) {
					s.stop(StopSoldOut)
				}
			}
		}
	}
}

// deduct sends one deduct, with order as the script's last ARGV when not
// empty, and returns its integer reply.
func (s *sale) deduct(ctx context.Context, c *redis.Conn, order string) (int64, error) {
	keys := []string{s.opts.Key}
	switch {
	case s.script != nil && order != "":
		return s.script.Run(ctx, c, keys, append(s.args[:len(s.args):len(s.args)], order)...).Int64()
	case s.script != nil:
		return s.script.Run(ctx, c, keys, s.args...).Int64()
	case s.opts.Amount == 1:
		return c.Decr(ctx, s.opts.Key).Result()
	default:
		return c.DecrBy(ctx, s.opts.Key, s.opts.Amount).Result()
	}
}

func (s *sale) giveBack(ctx context.Context, c *redis.Conn) error {
	if s.opts.Amount == 1 {
		return c.Incr(ctx, s.opts.Key).Err()
	}
	return c.IncrBy(ctx, s.opts.Key, s.opts.Amount).Err()
}

// markSoldOut lowers soldOutAt to end if end is earlier.
func (s *sale) markSoldOut(end int64) {
	for {
		cur := s.soldOutAt.Load()
		if end >= cur || s.soldOutAt.CompareAndSwap(cur, end) {
			return
		}
	}
}

// replyError is a reply the server sent but the sale cannot use. Like a
// Redis error reply, it leaves the connection healthy.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var _ redis.Error = replyError("")

// fail counts err and keeps its text if it is among the first few. After
// a transport error it pauses, so a dead server is not hammered, and
// reports true: the connection is broken. An error reply leaves it healthy.
func (s *sale) fail(id int, st *clientStats, err error) (transport bool) {
	st.errors++
	s.mu.Lock()
	if len(s.samples) < maxErrorSamples {
		s.samples = append(s.samples, fmt.Sprintf("client %d: %v", id, err))
	}
	s.mu.Unlock()
	var reply redis.Error
	if errors.As(err, &reply) {
		return false
	}
	select {
	case <-s.done.Done():
	case <-time.After(errorPause):
	}
	return true
}

// result merges the clients' tallies.
func (s *sale) result(stats []clientStats, elapsed time.Duration, startValue int64) Result {
	o := s.opts
	r := Result{
		Addr: o.Addr, Key: o.Key, Mode: o.Mode, Amount: o.Amount, Stock: o.Stock,
		Clients: o.Clients, Stopped: s.reason, Elapsed: elapsed, Start: startValue,
		ErrorSamples: s.samples,
	}
	var okLat, soldOutLat, allLat histogram
	for i := range stats {
		st := &stats[i]
		r.OK += st.ok
		r.SoldOut += st.soldOut
		r.GiveBacks += st.giveBacks
		r.Errors += st.errors
		r.FalseSoldOuts += st.falseSoldOuts
		r.LastSaleAt = max(r.LastSaleAt, st.lastSale)
		okLat.merge(&st.okLat)
		soldOutLat.merge(&st.soldOutLat)
	}
	allLat.merge(&okLat)
	allLat.merge(&soldOutLat)
	r.Latency = Latencies{All: allLat.latency(), OK: okLat.latency(), SoldOut: soldOutLat.latency()}
	r.Requests = r.OK + r.SoldOut + r.Errors
	r.Sold = r.OK * o.Amount
	r.Oversell = max(0, r.Sold-o.Stock)
	if at := s.soldOutAt.Load(); at != math.MaxInt64 {
		r.SoldOutAt = time.Duration(at)
	}
	if elapsed > 0 {
		r.RequestsPerSec = float64(r.Requests) / elapsed.Seconds()
	}
	if r.LastSaleAt > 0 {
		r.UnitsPerSec = float64(r.Sold) / r.LastSaleAt.Seconds()
	}
	return r
}
