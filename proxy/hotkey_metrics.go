package proxy

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// detectedTopN is how many of the detector's busiest keys get series: the
// key label of those comes from traffic, so it is bounded by this, not by
// the keys seen.
const detectedTopN = 10

// hotKeyCollector exports, at scrape time, the hot-key engine's counters
// for each hot key this proxy has met (labels bounded by the hot keys:
// configured, promoted or learned) and the detector's state.
type hotKeyCollector struct {
	srv *Server

	deducts, unitsSold, soldOutLocal, readsLocal, ringHops, upstreamCalls *prometheus.Desc
	bucketValue, bucketsLost, lostUnits, movesRecovered                   *prometheus.Desc
	waitsShort                                                            *prometheus.Desc
	tracked, topRate, promotions, demotions                               *prometheus.Desc
}

func newHotKeyCollector(srv *Server) *hotKeyCollector {
	key := []string{"key"}
	return &hotKeyCollector{
		srv: srv,
		deducts: prometheus.NewDesc("hotkeyproxy_hotkey_deducts_total",
			"Deducts on a hot key (declared deduct scripts, DECR, DECRBY) by result: ok (stock taken), sold_out, error.",
			[]string{"key", "result"}, nil),
		unitsSold: prometheus.NewDesc("hotkeyproxy_hotkey_units_sold_total",
			"Units the successful deducts on a hot key took.", key, nil),
		soldOutLocal: prometheus.NewDesc("hotkeyproxy_hotkey_sold_out_local_total",
			"Sold-out answers to deduct scripts given from memory (hotkeys.soldout_ttl), without an upstream call.", key, nil),
		readsLocal: prometheus.NewDesc("hotkeyproxy_hotkey_reads_local_total",
			"GETs of a hot key answered from memory within hotkeys.read_staleness, without an upstream call.", key, nil),
		ringHops: prometheus.NewDesc("hotkeyproxy_hotkey_ring_hops_total",
			"Buckets deduct scripts were run on; divided by deducts, the ring's cost (1: the first bucket tried had the stock).", key, nil),
		upstreamCalls: prometheus.NewDesc("hotkeyproxy_hotkey_upstream_commands_total",
			"Commands sent to Redis for a hot key, every kind.", key, nil),
		bucketValue: prometheus.NewDesc("hotkeyproxy_hotkey_bucket_value",
			"Each bucket's value as this proxy last saw it (no Redis call at scrape time).", []string{"key", "bucket"}, nil),
		bucketsLost: prometheus.NewDesc("hotkeyproxy_hotkey_buckets_lost_total",
			"Buckets of a hot key this proxy found lost: their key missing while the layout names them (a failover to a replica that never had it, a DEL behind the proxy).", key, nil),
		lostUnits: prometheus.NewDesc("hotkeyproxy_hotkey_lost_units",
			"Units the lost buckets of a hot key's layout held when last seen, as recorded by the proxy that found each lost first.", key, nil),
		movesRecovered: prometheus.NewDesc("hotkeyproxy_hotkey_moves_recovered_total",
			"Moves of stock between a hot key's buckets left half done (their proxy died or lost Redis) that this proxy finished or undid.", key, nil),
		waitsShort: prometheus.NewDesc("hotkeyproxy_hotkey_replica_waits_short_total",
			"WAITs after a change of a hot key's buckets that fewer replicas than the rule's wait_replicas acknowledged within its wait_timeout: the change was applied on its master, the client told it may be lost on failover.", key, nil),
		tracked: prometheus.NewDesc("hotkeyproxy_detector_keys_tracked",
			"Keys the detector counts now (at most hotkeys.detect.capacity).", nil, nil),
		topRate: prometheus.NewDesc("hotkeyproxy_detector_top_key_ops_per_second",
			"Estimated operations per second of the detector's "+strconv.Itoa(detectedTopN)+" busiest keys, by kind: read or write.",
			[]string{"key", "kind"}, nil),
		promotions: prometheus.NewDesc("hotkeyproxy_detector_promotions_total",
			"Detected keys sharded because they matched hotkeys.detect.promote.", nil, nil),
		demotions: prometheus.NewDesc("hotkeyproxy_detector_demotions_total",
			"Promoted keys merged back into plain keys once cool (hotkeys.detect.demote).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *hotKeyCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.deducts, c.unitsSold, c.soldOutLocal, c.readsLocal, c.ringHops, c.upstreamCalls,
		c.bucketValue, c.bucketsLost, c.lostUnits, c.movesRecovered, c.waitsShort, c.tracked, c.topRate, c.promotions, c.demotions} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *hotKeyCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, k := range c.srv.hot.Stats() {
		counter(c.deducts, k.DeductsOK, k.Key, "ok")
		counter(c.deducts, k.DeductsSoldOut, k.Key, "sold_out")
		counter(c.deducts, k.DeductsFailed, k.Key, "error")
		counter(c.unitsSold, k.UnitsSold, k.Key)
		counter(c.soldOutLocal, k.SoldOutLocal, k.Key)
		counter(c.readsLocal, k.ReadsLocal, k.Key)
		counter(c.ringHops, k.RingHops, k.Key)
		counter(c.upstreamCalls, k.UpstreamCalls, k.Key)
		counter(c.bucketsLost, k.BucketsLost, k.Key)
		counter(c.movesRecovered, k.MovesRecovered, k.Key)
		counter(c.waitsShort, k.WaitsShort, k.Key)
		ch <- prometheus.MustNewConstMetric(c.lostUnits, prometheus.GaugeValue, float64(k.LostUnits), k.Key)
		for i, v := range k.Buckets {
			ch <- prometheus.MustNewConstMetric(c.bucketValue, prometheus.GaugeValue, float64(v), k.Key, strconv.Itoa(i))
		}
	}
	dt := c.srv.detect
	ch <- prometheus.MustNewConstMetric(c.tracked, prometheus.GaugeValue, float64(dt.d.Tracked()))
	for _, k := range dt.d.Top(detectedTopN) {
		ch <- prometheus.MustNewConstMetric(c.topRate, prometheus.GaugeValue, k.ReadRate, k.Key, "read")
		ch <- prometheus.MustNewConstMetric(c.topRate, prometheus.GaugeValue, k.WriteRate, k.Key, "write")
	}
	counter(c.promotions, dt.promotions.Load())
	counter(c.demotions, dt.demotions.Load())
}
