package seckill

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

// Result is what one sale did. Durations are in nanoseconds in JSON (the
// _ns fields); times "at" are measured from the start of the sale.
type Result struct {
	// The sale as run, with defaults applied.
	Addr    string `json:"addr"`
	Key     string `json:"key"`
	Mode    Mode   `json:"mode"`
	Amount  int64  `json:"amount"`
	Stock   int64  `json:"stock"`
	Clients int    `json:"clients"`

	// Stopped says why the sale ended.
	Stopped StopReason `json:"stopped"`
	// Elapsed is the whole sale, sold-out replies after the sell-out
	// included.
	Elapsed time.Duration `json:"elapsed_ns"`
	// SoldOutAt is the end of the earliest sold-out reply; zero if no
	// client was told "sold out".
	SoldOutAt time.Duration `json:"sold_out_at_ns"`
	// LastSaleAt is the end of the last successful deduct; zero if none.
	LastSaleAt time.Duration `json:"last_sale_at_ns"`

	// Requests counts the deducts sent: OK + SoldOut + Errors. Give-backs
	// are not deducts and are not counted here.
	Requests int64 `json:"requests"`
	// OK counts successful deducts; Sold is the units they took
	// (OK × Amount).
	OK   int64 `json:"ok"`
	Sold int64 `json:"sold"`
	// SoldOut counts sold-out replies.
	SoldOut int64 `json:"sold_out"`
	// GiveBacks counts the INCR/INCRBY that returned a negative deduct
	// (ModeDecr only).
	GiveBacks int64 `json:"give_backs"`
	// Errors counts deducts and give-backs that failed: error replies,
	// transport errors and unexpected replies. ErrorSamples holds the
	// first few.
	Errors       int64    `json:"errors"`
	ErrorSamples []string `json:"error_samples,omitempty"`

	// Oversell is the units sold beyond Stock: max(0, Sold - Stock).
	Oversell int64 `json:"oversell"`
	// FalseSoldOuts counts successful deducts that started after the end
	// of the earliest sold-out reply.
	FalseSoldOuts int64 `json:"false_sold_outs"`

	// Start is the key's value when the sale began (after setup), Final
	// its value once every client stopped; a missing key reads as 0.
	// FinalErr is set, and Final and Unaccounted are zero, when the final
	// GET failed.
	Start    int64  `json:"start"`
	Final    int64  `json:"final"`
	FinalErr string `json:"final_error,omitempty"`
	// Unaccounted is Start - Sold - Final: units neither sold nor left
	// (negative: units created). Transport errors can make it non-zero
	// innocently, since a deduct whose reply was lost may have been applied.
	Unaccounted int64 `json:"unaccounted"`

	// RequestsPerSec is Requests over Elapsed; UnitsPerSec is Sold over
	// LastSaleAt, the rate of the sale itself.
	RequestsPerSec float64 `json:"requests_per_sec"`
	UnitsPerSec    float64 `json:"units_per_sec"`

	Latency Latencies `json:"latency"`

	// Journal is the check of the key's journal (Options.Journal); nil
	// when not asked.
	Journal *JournalCheck `json:"journal,omitempty"`
}

// Latencies are the deduct round trips, all and by reply.
type Latencies struct {
	All     Latency `json:"all"`
	OK      Latency `json:"ok"`
	SoldOut Latency `json:"sold_out"`
}

// StockLeft reports the units still in the key although every client was
// told "sold out": the final value when the sale stopped for that reason
// and the value could still cover a deduct, else 0.
func (r Result) StockLeft() int64 {
	if r.Stopped != StopSoldOut || r.FinalErr != "" || r.Final < r.Amount {
		return 0
	}
	return r.Final
}

// Violations lists the ways the sale broke a flash sale's guarantees:
// oversell, false sold-outs, and stock left after every client was told
// "sold out". Empty means the sale was correct as far as one run can tell.
func (r Result) Violations() []string {
	var v []string
	if r.Oversell > 0 {
		v = append(v, fmt.Sprintf("oversell: %d units sold beyond the stock of %d", r.Oversell, r.Stock))
	}
	if r.FalseSoldOuts > 0 {
		v = append(v, fmt.Sprintf("false sold-out: %d deducts succeeded after a client was told sold out", r.FalseSoldOuts))
	}
	if n := r.StockLeft(); n > 0 {
		v = append(v, fmt.Sprintf("stock left: every client was told sold out while %d units remained", n))
	}
	if r.Journal != nil {
		v = append(v, r.Journal.violations(r.Sold)...)
	}
	return v
}

// String formats the result as a table for people.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seckill %s mode, amount %d: %d units of %s at %s, %d clients\n",
		r.Mode, r.Amount, r.Stock, r.Key, r.Addr, r.Clients)
	fmt.Fprintf(&b, "stopped: %s after %s\n\n", r.Stopped, fmtSeconds(r.Elapsed))

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "requests\t%d\t%.0f/s\n", r.Requests, r.RequestsPerSec)
	sale := "no sale"
	if r.LastSaleAt > 0 {
		sale = fmt.Sprintf("%.0f units/s over %s", r.UnitsPerSec, fmtSeconds(r.LastSaleAt))
	}
	fmt.Fprintf(tw, "units sold\t%d\t%s\n", r.Sold, sale)
	first := "never"
	if r.SoldOut > 0 {
		first = "first at " + fmtSeconds(r.SoldOutAt)
	}
	fmt.Fprintf(tw, "sold-out replies\t%d\t%s\n", r.SoldOut, first)
	if r.Mode == ModeDecr {
		fmt.Fprintf(tw, "give-backs\t%d\n", r.GiveBacks)
	}
	fmt.Fprintf(tw, "errors\t%d\n", r.Errors)
	fmt.Fprintf(tw, "oversell\t%d\n", r.Oversell)
	fmt.Fprintf(tw, "false sold-outs\t%d\n", r.FalseSoldOuts)
	if r.FinalErr != "" {
		fmt.Fprintf(tw, "value\tstart %d, final unknown: %s\n", r.Start, r.FinalErr)
	} else {
		fmt.Fprintf(tw, "value\tstart %d, final %d, unaccounted %d\n", r.Start, r.Final, r.Unaccounted)
	}
	if r.Journal != nil {
		fmt.Fprintf(tw, "journal\t%s\n", r.Journal)
	}
	tw.Flush()

	b.WriteString("\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "latency\tcount\tmean\tp50\tp99\tp99.9\tmax\t\n")
	for _, row := range []struct {
		name string
		l    Latency
	}{{"all", r.Latency.All}, {"ok", r.Latency.OK}, {"sold out", r.Latency.SoldOut}} {
		l := row.l
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", row.name, l.Count,
			fmtLatency(l.Mean), fmtLatency(l.P50), fmtLatency(l.P99), fmtLatency(l.P999), fmtLatency(l.Max))
	}
	tw.Flush()

	b.WriteString("\n")
	for i, e := range r.ErrorSamples {
		if i == 0 {
			fmt.Fprintf(&b, "first errors:\n")
		}
		fmt.Fprintf(&b, "  %s\n", e)
	}
	if v := r.Violations(); len(v) > 0 {
		for _, s := range v {
			fmt.Fprintf(&b, "FAIL %s\n", s)
		}
	} else {
		b.WriteString("ok: no oversell, no false sold-out, no stock left after sold out\n")
		if r.Journal != nil {
			b.WriteString("ok: the journal deducts exactly the units sold")
			if r.Journal.OrderIDs {
				b.WriteString(", entry for entry by order id")
			}
			b.WriteString("\n")
		}
	}
	if r.Journal != nil {
		for _, s := range r.Journal.Samples {
			fmt.Fprintf(&b, "  journal: %s\n", s)
		}
	}
	if r.Unaccounted != 0 {
		fmt.Fprintf(&b, "warning: %d units unaccounted (start - sold - final)", r.Unaccounted)
		if r.Errors > 0 {
			b.WriteString("; deducts whose reply was lost to an error may have been applied")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// fmtSeconds formats an elapsed time in seconds with millisecond precision.
func fmtSeconds(d time.Duration) string {
	return fmt.Sprintf("%.3fs", d.Seconds())
}

// fmtLatency formats a latency with three significant digits or so, in the
// unit that keeps it short.
func fmtLatency(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < 10*time.Microsecond:
		return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.3fs", d.Seconds())
	}
}
