package seckill

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// JournalCheck is what the key's journal (hotkeyproxy's PROXY JOURNAL: one
// stream per bucket) says of a sale, against what the clients were told:
// the entries appended since the sale began.
type JournalCheck struct {
	// Streams is how many journal streams were read; Entries how many
	// of their entries the sale appended (moves between buckets too).
	Streams int   `json:"streams"`
	Entries int64 `json:"entries"`
	// Deducted and GivenBack are the units of the deduct and give_back
	// entries: Deducted - GivenBack is what the journal says was sold.
	Deducted  int64 `json:"deducted"`
	GivenBack int64 `json:"given_back"`
	// OrderIDs is set when each deduct carried an order id; then NoEntry
	// counts the successes no deduct entry names, and NoSuccess the deduct
	// entries naming an order id no client was told bought (or one twice).
	OrderIDs  bool     `json:"order_ids"`
	NoEntry   int64    `json:"no_entry"`
	NoSuccess int64    `json:"no_success"`
	Samples   []string `json:"samples,omitempty"`
	// Err is why the journal could not be read, if it could not.
	Err string `json:"error,omitempty"`
}

// journalPage is how many entries one XRANGE reads.
const journalPage = 10000

// journalTips asks the proxy for key's journal streams and reads the id of
// each one's last entry ("0-0" for none): the sale's entries come after.
func journalTips(ctx context.Context, rdb *redis.Client, key string) (streams, tips []string, err error) {
	v, err := rdb.Do(ctx, "PROXY", "JOURNAL", key).StringSlice()
	if err != nil {
		return nil, nil, fmt.Errorf("PROXY JOURNAL %s (is it a journaled hot key behind a hotkeyproxy?): %w", key, err)
	}
	for _, s := range v {
		last, err := rdb.XRevRangeN(ctx, s, "+", "-", 1).Result()
		if err != nil {
			return nil, nil, fmt.Errorf("XREVRANGE %s: %w", s, err)
		}
		tip := "0-0"
		if len(last) > 0 {
			tip = last[0].ID
		}
		streams, tips = append(streams, s), append(tips, tip)
	}
	return streams, tips, nil
}

// checkJournal reads the entries after tips and compares them with the
// sale: the units, and when orders is not nil (the order ids told they
// bought) entry for entry.
func checkJournal(ctx context.Context, rdb *redis.Client, streams, tips []string, orders map[string]bool) *JournalCheck {
	j := &JournalCheck{Streams: len(streams), OrderIDs: orders != nil}
	seen := make(map[string]bool, len(orders))
	sample := func(format string, args ...any) {
		if len(j.Samples) < maxErrorSamples {
			j.Samples = append(j.Samples, fmt.Sprintf(format, args...))
		}
	}
	for i, s := range streams {
		start := "(" + tips[i]
		for {
			msgs, err := rdb.XRangeN(ctx, s, start, "+", journalPage).Result()
			if err != nil {
				j.Err = fmt.Sprintf("XRANGE %s: %v", s, err)
				return j
			}
			for _, m := range msgs {
				j.Entries++
				amount, _ := strconv.ParseInt(fmt.Sprint(m.Values["amount"]), 10, 64)
				switch m.Values["op"] {
				case "deduct":
					j.Deducted += amount
					if orders == nil {
						continue
					}
					o, _ := m.Values["order"].(string)
					switch {
					case !orders[o] || seen[o]:
						j.NoSuccess++
						sample("%s entry %s: order %q: no client was told it bought, or journaled twice", s, m.ID, o)
					default:
						seen[o] = true
					}
				case "give_back":
					j.GivenBack += amount
				}
			}
			if len(msgs) < journalPage {
				break
			}
			start = "(" + msgs[len(msgs)-1].ID
		}
	}
	for o := range orders {
		if !seen[o] {
			j.NoEntry++
			sample("order %q was told it bought, but no entry names it", o)
		}
	}
	return j
}

// violations lists where the journal and the sale disagree.
func (j *JournalCheck) violations(sold int64) []string {
	var v []string
	switch {
	case j.Err != "":
		v = append(v, "journal: "+j.Err)
	case j.Deducted-j.GivenBack != sold:
		v = append(v, fmt.Sprintf("journal: deducted %d, gave back %d: %d units, but the clients were told %d", j.Deducted, j.GivenBack, j.Deducted-j.GivenBack, sold))
	}
	if j.NoEntry > 0 || j.NoSuccess > 0 {
		v = append(v, fmt.Sprintf("journal: %d sales without an entry, %d entries without a sale", j.NoEntry, j.NoSuccess))
	}
	return v
}

// String is the journal's line in the report.
func (j *JournalCheck) String() string {
	if j.Err != "" {
		return "unknown: " + j.Err
	}
	s := fmt.Sprintf("%d streams, %d entries: deducted %d, gave back %d", j.Streams, j.Entries, j.Deducted, j.GivenBack)
	if j.OrderIDs {
		s += fmt.Sprintf("; by order id: %d sales without an entry, %d entries without a sale", j.NoEntry, j.NoSuccess)
	}
	return s
}
