package seckill

import (
	"math"
	"math/bits"
	"time"
)

const (
	// subBits sets the precision: each power of two is split into
	// 1<<subBits buckets, so a bucket is at most 1/64 of its values wide.
	subBits  = 6
	subCount = 1 << subBits
	// maxExp bounds what the buckets cover: durations of 2^36 ns (about
	// 69 s) or more share the last bucket. Max is kept exactly anyway.
	maxExp = 36
	// numBuckets holds 0..2*subCount-1 exactly, then subCount per power of
	// two up to 2^maxExp.
	numBuckets = (maxExp - subBits + 1) * subCount
)

// histogram counts durations in log-linear buckets, like HdrHistogram with
// two significant digits. It is not safe for concurrent use: each client
// has its own, merged at the end.
type histogram struct {
	counts [numBuckets]uint64
	n      int64
	sum    time.Duration
	max    time.Duration
}

// bucketOf returns the bucket of d: d itself below 2*subCount, else the
// power of two (e) and the top subBits+1 bits of d (d>>e, in
// [subCount, 2*subCount)), laid out so that buckets stay in value order.
func bucketOf(d time.Duration) int {
	v := uint64(max(d, 0))
	v = min(v, 1<<maxExp-1)
	e := max(bits.Len64(v)-subBits-1, 0)
	return e<<subBits + int(v>>e)
}

// bucketHigh returns the largest duration that falls in bucket i.
func bucketHigh(i int) time.Duration {
	if i < 2*subCount {
		return time.Duration(i)
	}
	e := i>>subBits - 1
	m := uint64(i - e<<subBits)
	return time.Duration((m+1)<<e - 1)
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(d)]++
	h.n++
	h.sum += d
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// quantile returns an upper bound of the q-quantile (0 < q ≤ 1): the top of
// the bucket holding the ceil(q*n)-th smallest duration, never above max.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(max(math.Ceil(q*float64(h.n)), 1))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(bucketHigh(i), h.max)
		}
	}
	return h.max
}

// Latency summarises the round trips of one kind of reply. Quantiles are
// upper bounds at most 1/64 above the true value; Max is exact.
type Latency struct {
	Count int64         `json:"count"`
	Mean  time.Duration `json:"mean_ns"`
	P50   time.Duration `json:"p50_ns"`
	P99   time.Duration `json:"p99_ns"`
	P999  time.Duration `json:"p999_ns"`
	Max   time.Duration `json:"max_ns"`
}

func (h *histogram) latency() Latency {
	if h.n == 0 {
		return Latency{}
	}
	return Latency{
		Count: h.n,
		Mean:  h.sum / time.Duration(h.n),
		P50:   h.quantile(0.50),
		P99:   h.quantile(0.99),
		P999:  h.quantile(0.999),
		Max:   h.max,
	}
}
