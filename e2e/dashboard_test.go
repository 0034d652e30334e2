package e2e

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// dashboardPath is the Grafana dashboard of issue 6, item 7, from e2e/.
const dashboardPath = "../deploy/grafana-dashboard.json"

// grafanaDashboard is the part of Grafana's dashboard JSON the tests read.
type grafanaDashboard struct {
	UID           string         `json:"uid"`
	Title         string         `json:"title"`
	SchemaVersion int            `json:"schemaVersion"`
	Panels        []grafanaPanel `json:"panels"`
	Templating    struct {
		List []grafanaVar `json:"list"`
	} `json:"templating"`
}

type grafanaPanel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Repeat     string          `json:"repeat"`
	Datasource *grafanaDS      `json:"datasource"`
	Targets    []grafanaTarget `json:"targets"`
	Panels     []grafanaPanel  `json:"panels"` // a collapsed row's panels
	GridPos    map[string]int  `json:"gridPos"`
}

type grafanaTarget struct {
	RefID        string     `json:"refId"`
	Expr         string     `json:"expr"`
	LegendFormat string     `json:"legendFormat"`
	Datasource   *grafanaDS `json:"datasource"`
}

type grafanaDS struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaVar struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"` // a string, or {"query": …}
	Definition string          `json:"definition"`
	Multi      bool            `json:"multi"`
	IncludeAll bool            `json:"includeAll"`
	Datasource *grafanaDS      `json:"datasource"`
}

// query is the variable's query text.
func (v grafanaVar) query() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	json.Unmarshal(v.Query, &o)
	return o.Query
}

// dashboardQuery is one PromQL text of the dashboard and where it is.
type dashboardQuery struct {
	where, expr, legend string
	inKeyRow            bool // in the row repeated per hot key
}

// loadDashboard reads and parses the dashboard and lists its panels
// (rows' nested panels included, rows excluded) and queries.
func loadDashboard(t *testing.T) (d grafanaDashboard, panels []grafanaPanel, queries []dashboardQuery) {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not valid dashboard JSON: %v", dashboardPath, err)
	}
	inKeyRow := false
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if p.Type == "row" {
				inKeyRow = p.Repeat == "key"
				walk(p.Panels)
				continue
			}
			panels = append(panels, p)
			for _, tg := range p.Targets {
				queries = append(queries, dashboardQuery{
					where: "panel " + strconv.Quote(p.Title) + " target " + tg.RefID, expr: tg.Expr,
					legend: tg.LegendFormat, inKeyRow: inKeyRow,
				})
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			queries = append(queries, dashboardQuery{where: "variable " + v.Name, expr: v.query()})
		}
	}
	return d, panels, queries
}

var (
	// dashMetricRE finds the metric names in a PromQL text, with the
	// selector's braces if any. Only the proxy's own families and the Go
	// runtime and process collectors' are used.
	dashMetricRE = regexp.MustCompile(`\b((?:hotkeyproxy|go|process)_[a-z_]+)\b(\{[^}]*\})?`)
	// dashMatcherRE is one label matcher of a selector.
	dashMatcherRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	// dashVarRE is a template variable reference: $name, ${name},
	// ${name:format} or [[name]].
	dashVarRE = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\$([A-Za-z0-9_]+)|\[\[([A-Za-z0-9_]+)\]\]`)
	// dashByRE is the label list of a by (…) or without (…) clause.
	dashByRE = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	// dashLegendRE is a label named in a legend format.
	dashLegendRE = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	// dashLabelValuesRE is a variable query label_values(metric, label).
	dashLabelValuesRE = regexp.MustCompile(`label_values\(\s*([a-z_]+)(?:\{[^}]*\})?\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
)

// varRefs are the template variables text references, Grafana's own
// ($__rate_interval, $__range, …) left out.
func varRefs(text string) []string {
	var names []string
	for _, m := range dashVarRE.FindAllStringSubmatch(text, -1) {
		name := m[1] + m[2] + m[3]
		if !strings.HasPrefix(name, "__") {
			names = append(names, name)
		}
	}
	return names
}

// TestDashboardStructure (issue 6, item 7): deploy/grafana-dashboard.json
// is a dashboard Grafana 10/11 imports — uid and title hotkeyproxy, a
// Prometheus datasource variable, rows of panels each with PromQL targets
// — every variable the queries reference is defined, every selector is
// restricted to $instance, and the row repeated per hot key selects
// key="$key".
func TestDashboardStructure(t *testing.T) {
	d, panels, queries := loadDashboard(t)
	if d.UID != "hotkeyproxy" || d.Title != "hotkeyproxy" {
		t.Errorf("uid %q, title %q; want both hotkeyproxy", d.UID, d.Title)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d; want 36 or later (Grafana 10/11)", d.SchemaVersion)
	}
	if len(panels) == 0 {
		t.Fatal("no panels")
	}

	vars := map[string]grafanaVar{}
	for _, v := range d.Templating.List {
		if _, dup := vars[v.Name]; dup {
			t.Errorf("variable %s defined twice", v.Name)
		}
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || v.query() != "prometheus" {
		t.Errorf("want a datasource variable \"datasource\" of Prometheus datasources, have %+v", v)
	}
	for _, name := range []string{"instance", "key"} {
		if v, ok := vars[name]; !ok || v.Type != "query" || !v.Multi || !v.IncludeAll {
			t.Errorf("want a multi-value query variable %q with All, have %+v", name, v)
		}
	}

	// Rows: the ones the issue asks for, and one repeated per hot key.
	var rows []string
	repeated := false
	for _, p := range d.Panels {
		if p.Type == "row" {
			rows = append(rows, p.Title)
			if p.Repeat != "" {
				if _, ok := vars[p.Repeat]; !ok {
					t.Errorf("row %q repeats over undefined variable %q", p.Title, p.Repeat)
				}
				repeated = repeated || p.Repeat == "key"
			}
		}
	}
	for _, want := range []string{"Traffic", "Latency", "Upstream health", "Detector", "Process"} {
		if !slices.Contains(rows, want) {
			t.Errorf("no row %q among %q", want, rows)
		}
	}
	if !repeated {
		t.Errorf("no row repeated per hot key (repeat: key) among %q", rows)
	}

	ids := map[int]bool{}
	checkDS := func(where string, ds *grafanaDS) {
		if ds == nil {
			return // the panel's datasource applies
		}
		if ds.Type != "prometheus" {
			t.Errorf("%s: datasource type %q, want prometheus", where, ds.Type)
		}
		for _, name := range varRefs(ds.UID) {
			if _, ok := vars[name]; !ok {
				t.Errorf("%s: datasource uid %q references undefined variable $%s", where, ds.UID, name)
			}
		}
	}
	for _, p := range panels {
		where := "panel " + strconv.Quote(p.Title)
		if ids[p.ID] {
			t.Errorf("%s: id %d used twice", where, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos["w"] <= 0 || p.GridPos["h"] <= 0 {
			t.Errorf("%s: gridPos %v", where, p.GridPos)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", where)
		}
		checkDS(where, p.Datasource)
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s target %q: no expr", where, tg.RefID)
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: refId %q missing or used twice", where, tg.RefID)
			}
			refs[tg.RefID] = true
			checkDS(where+" target "+tg.RefID, tg.Datasource)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			checkDS("variable "+v.Name, v.Datasource)
		}
	}

	for _, q := range queries {
		for _, name := range varRefs(q.expr) {
			if _, ok := vars[name]; !ok {
				t.Errorf("%s: $%s is not a defined variable: %s", q.where, name, q.expr)
			}
		}
		sels := dashMetricRE.FindAllStringSubmatch(q.expr, -1)
		if len(sels) == 0 {
			t.Errorf("%s: no hotkeyproxy_, go_ or process_ metric in %s", q.where, q.expr)
		}
		if q.where == "variable instance" {
			continue // the variable that lists the instances
		}
		for _, m := range sels {
			if !strings.Contains(m[2], `instance=~"$instance"`) {
				t.Errorf("%s: %s is not restricted to instance=~\"$instance\": %s", q.where, m[1], q.expr)
			}
			if q.inKeyRow && !strings.Contains(m[2], `key="$key"`) {
				t.Errorf("%s: %s in the per-key row does not select key=\"$key\": %s", q.where, m[1], q.expr)
			}
		}
	}
}

// exposition is a /metrics text parsed: each family's type, and the
// label sets of each sample name's series.
type exposition struct {
	types  map[string]string
	series map[string][]map[string]string
}

var (
	expoTypeRE   = regexp.MustCompile(`^# TYPE (\S+) (\S+)$`)
	expoSampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+`)
)

func parseExposition(text string) exposition {
	x := exposition{types: map[string]string{}, series: map[string][]map[string]string{}}
	for _, line := range strings.Split(text, "\n") {
		if m := expoTypeRE.FindStringSubmatch(line); m != nil {
			x.types[m[1]] = m[2]
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		if m := expoSampleRE.FindStringSubmatch(line); m != nil {
			labels := map[string]string{}
			for _, l := range dashMatcherRE.FindAllStringSubmatch(m[2], -1) {
				labels[l[1]] = l[3]
			}
			x.series[m[1]] = append(x.series[m[1]], labels)
		}
	}
	return x
}

// family is the family of sample name: itself, or the histogram or
// summary whose _bucket, _sum or _count it is.
func (x exposition) family(name string) (string, bool) {
	if _, ok := x.types[name]; ok {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		switch x.types[base] {
		case "histogram":
			return base, true
		case "summary":
			return base, suffix != "_bucket"
		}
	}
	return "", false
}

// hasLabel reports whether a series of sample name has the label, and
// with a value that value (a regexp) matches when value is not "".
func (x exposition) hasLabel(name, label, value string) bool {
	re := regexp.MustCompile("^(?:" + value + ")$")
	for _, ls := range x.series[name] {
		if v, ok := ls[label]; ok && (value == "" || re.MatchString(v)) {
			return true
		}
	}
	return false
}

// TestDashboardMetrics (issue 6, item 7): every metric the dashboard
// queries is a family a running proxy exposes, with series, after a small
// flash sale on a hot key with the detector on; the labels the queries
// select, group by and name in legends are labels of those series; and
// the hot-key variable lists the sale's key.
func TestDashboardMetrics(t *testing.T) {
	_, _, queries := loadDashboard(t)

	const key = "stock:dashboard"
	text, _ := metricsAfterSale(t, key, 300, 6)
	x := parseExposition(text)

	// Labels Prometheus adds at scrape time, and the histogram's le.
	scrapeLabels := []string{"instance", "job"}
	families := map[string]bool{}
	for _, q := range queries {
		known := slices.Clone(scrapeLabels)
		for _, m := range dashMetricRE.FindAllStringSubmatch(q.expr, -1) {
			name := m[1]
			fam, ok := x.family(name)
			if !ok {
				t.Errorf("%s: %s is no metric family in /metrics: %s", q.where, name, q.expr)
				continue
			}
			families[fam] = true
			if len(x.series[name]) == 0 {
				t.Errorf("%s: %s has no series in /metrics after the sale", q.where, name)
				continue
			}
			for _, ls := range x.series[name] {
				for l := range ls {
					if !slices.Contains(known, l) {
						known = append(known, l)
					}
				}
			}
			for _, mm := range dashMatcherRE.FindAllStringSubmatch(m[2], -1) {
				label, op, value := mm[1], mm[2], mm[3]
				if slices.Contains(scrapeLabels, label) {
					continue
				}
				if strings.Contains(value, "$") || op == "!=" || op == "!~" {
					value = "" // a variable's value, or a negation: the label must exist
				} else if op == "=" {
					value = regexp.QuoteMeta(value)
				}
				if !x.hasLabel(name, label, value) {
					t.Errorf("%s: no series %s{%s%s%q} in /metrics: %s", q.where, name, label, op, mm[3], q.expr)
				}
			}
		}
		var used []string
		for _, m := range dashByRE.FindAllStringSubmatch(q.expr, -1) {
			for _, l := range strings.Split(m[1], ",") {
				used = append(used, strings.TrimSpace(l))
			}
		}
		for _, m := range dashLegendRE.FindAllStringSubmatch(q.legend, -1) {
			used = append(used, m[1])
		}
		if m := dashLabelValuesRE.FindStringSubmatch(q.expr); m != nil {
			used = append(used, m[2])
		}
		slices.Sort(used)
		for _, l := range slices.Compact(used) {
			if l != "" && !slices.Contains(known, l) {
				t.Errorf("%s: label %q is on none of the series queried (labels %q): %s", q.where, l, known, q.expr)
			}
		}
	}
	if !x.hasLabel("hotkeyproxy_hotkey_units_sold_total", "key", regexp.QuoteMeta(key)) {
		t.Errorf("the key variable's metric has no series for the sale's key %s", key)
	}
	var names []string
	for f := range families {
		names = append(names, f)
	}
	slices.Sort(names)
	t.Logf("%d queries over %d families, all exposed: %s", len(queries), len(names), strings.Join(names, " "))
}
