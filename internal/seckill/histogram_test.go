package seckill

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketsCoverEveryValueInOrder(t *testing.T) {
	prev := -1
	for _, d := range []time.Duration{0, 1, 127, 128, 129, 130, 255, 256, 1000, time.Millisecond, time.Second, 1<<maxExp - 1} {
		i := bucketOf(d)
		if i < prev || i >= numBuckets {
			t.Fatalf("bucketOf(%d) = %d after %d (of %d)", d, i, prev, numBuckets)
		}
		prev = i
		if hi := bucketHigh(i); hi < d || (i > 0 && bucketHigh(i-1) >= d) {
			t.Errorf("%d in bucket %d, whose top is %d (previous top %d)", d, i, hi, bucketHigh(i-1))
		}
	}
	if bucketOf(time.Hour) != numBuckets-1 || bucketOf(-1) != 0 {
		t.Errorf("out of range: hour in %d, -1 in %d", bucketOf(time.Hour), bucketOf(-1))
	}
}

func TestQuantilesAreTightUpperBounds(t *testing.T) {
	tests := []struct {
		name string
		gen  func(r *rand.Rand) time.Duration
	}{
		{"small exact", func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(100)) }},
		{"uniform 0-10ms", func(r *rand.Rand) time.Duration { return time.Duration(r.Int64N(int64(10 * time.Millisecond))) }},
		{"long tail", func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * float64(time.Millisecond)) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var a, b histogram
			var all []time.Duration
			for i := range 20000 {
				d := tc.gen(r)
				all = append(all, d)
				if i%2 == 0 {
					a.record(d)
				} else {
					b.record(d)
				}
			}
			a.merge(&b)
			slices.Sort(all)
			for _, q := range []float64{0.5, 0.99, 0.999, 1} {
				exact := all[int(math.Ceil(q*float64(len(all))))-1]
				got := a.quantile(q)
				if got < exact || float64(got-exact) > float64(exact)/subCount+1 {
					t.Errorf("q%v = %v, exact %v", q, got, exact)
				}
			}
			l := a.latency()
			if l.Count != int64(len(all)) || l.Max != all[len(all)-1] {
				t.Errorf("count %d max %v, want %d %v", l.Count, l.Max, len(all), all[len(all)-1])
			}
		})
	}
}
