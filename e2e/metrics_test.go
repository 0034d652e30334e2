package e2e

import (
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/hotkeyproxy/hotkeyproxy/config"
)

// TestMetricsFlashSale (issue 6): /metrics scraped after a flash sale of
// a hot key through the proxy: the units sold in the metrics are the units
// the clients were told they bought, the deducts by result add up to the
// requests, each bucket's value is there, the commands counted include the
// sale's EVALSHAs, and the exposition is promlint clean.
func TestMetricsFlashSale(t *testing.T) {
	const key, stock, clients = "stock:metrics", 3000, 20
	text, r := metricsAfterSale(t, key, stock, clients)
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	value := func(series string) float64 {
		t.Helper()
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(text)
		if m == nil {
			t.Errorf("no series %s in /metrics", series)
			return -1
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	lk := `{key="` + key + `"}`
	if v := value("hotkeyproxy_hotkey_units_sold_total" + lk); v != stock {
		t.Errorf("units sold in the metrics %v, the clients bought %d", v, r.sold)
	}
	ok := value(`hotkeyproxy_hotkey_deducts_total{key="` + key + `",result="ok"}`)
	so := value(`hotkeyproxy_hotkey_deducts_total{key="` + key + `",result="sold_out"}`)
	if int(ok) != r.success || int(so) != r.soldOuts {
		t.Errorf("deducts in the metrics: ok %v, sold_out %v; the clients saw %d and %d", ok, so, r.success, r.soldOuts)
	}
	var buckets float64
	for i := range 4 {
		buckets += value(`hotkeyproxy_hotkey_bucket_value{bucket="` + strconv.Itoa(i) + `",key="` + key + `"}`)
	}
	if buckets != 0 {
		t.Errorf("bucket values in the metrics sum to %v after the sell-out, want 0", buckets)
	}
	if v := value(`hotkeyproxy_commands_total{command="evalsha",result="ok"}`); int(v) != r.success+r.soldOuts {
		t.Errorf("EVALSHA commands counted %v, the clients sent %d", v, r.success+r.soldOuts)
	}
	if v := value("hotkeyproxy_detector_keys_tracked"); v < 1 {
		t.Errorf("detector tracks %v keys after the sale, want the stock key", v)
	}
	if !strings.Contains(text, `hotkeyproxy_detector_top_key_ops_per_second{key="`+key+`",kind="write"}`) {
		t.Errorf("the stock key is not among the detector's top keys in /metrics")
	}
	t.Logf("units sold %v, deducts ok %v, sold_out %v, upstream commands %v, ring hops %v", stock, ok, so,
		value("hotkeyproxy_hotkey_upstream_commands_total"+lk), value("hotkeyproxy_hotkey_ring_hops_total"+lk))
}

// metricsAfterSale sells stock units of key, a hot key of 4 buckets, to
// clients through a proxy with the detector on (every command sampled),
// and returns the proxy's /metrics text and the sale.
func metricsAfterSale(t *testing.T, key string, stock int64, clients int) (string, hkSaleResult) {
	t.Helper()
	scripts := hkScripts(t)
	e := startEnv(t, func(c *config.Config) {
		c.Scripts = scripts
		c.Hotkeys.Keys = []config.KeyRule{{Match: key, Buckets: 4, Route: config.RouteRandom}}
		c.Hotkeys.Detect = config.Detect{Enabled: true, SampleRate: 1, Window: config.Duration(1e9), Threshold: 100, Capacity: 100}
	})
	script := hkDeductOne(t, scripts)
	sha := script.SHA1()
	hkMust(t, e.ProxyAddr(), "+OK\r\n", "SET", key, strconv.FormatInt(stock, 10))
	hkMust(t, e.ProxyAddr(), "$40\r\n"+sha+"\r\n", "SCRIPT", "LOAD", script.Body)
	r := hkRunSale(t, []hkProxy{{name: "A", addr: e.ProxyAddr()}}, clients, func(c *hkClient) error {
		return c.sellScript([]byte("EVALSHA"), []byte(sha), []byte(key), 1)
	})
	if r.sold != stock {
		t.Fatalf("sold %d of %d", r.sold, stock)
	}
	rec := httptest.NewRecorder()
	e.Proxy.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String(), r
}
