package rewrite

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/hotkeyproxy/hotkeyproxy/config"
	"github.com/hotkeyproxy/hotkeyproxy/internal/hashslot"
)

// MarkerPrefix starts the value a hot key's own key holds in place of its
// value: the layout. It is not an integer, so a proxy that does not know
// the key is hot fails on it (DECR: "value is not an integer", the deduct
// scripts: a Lua error) instead of acting on a stale plain value, and a
// GET that returns it tells any proxy to read the buckets (contract 9).
const MarkerPrefix = "hotkeyproxy-layout:1:"

// MaxValue bounds the value of a hot key, and of each bucket, both ways:
// the bucket scripts run in Redis's Lua, whose numbers are doubles, exact
// below 2^53.
const MaxValue = 1<<53 - 1

// Layout is how a hot key is held: its buckets' hash tags, in bucket order.
// Bucket i is the key "{tag_i}key#i.gen", so its name contains the key, and
// its slot is the tag's, whatever hash tag the key itself has.
type Layout struct {
	Key string
	// Gen is drawn at random for each layout made, so that the buckets
	// of a new layout never meet what an old one of the same key left.
	Gen  string
	Tags []string
	// Pending is set while a plain value being turned into buckets is
	// still to be spread: buckets 1..N-1 are to be made with their
	// shares of Fill (bucket 0 holds its own already).
	Pending bool
	Fill    int64
	// Merging is set while the layout is being merged back into its key
	// (PROXY UNSHARD): any proxy that reads it finishes the merge.
	Merging bool
	// Journal is set when every change of the buckets is journaled
	// (journal.go): in the marker, so that every proxy journals it.
	Journal bool

	// byMaster are the bucket numbers grouped by the master serving them
	// when this proxy took the layout up, and starts counts the deducts
	// started on them since, for the start bucket (Engine.startBucket).
	byMaster [][]int
	starts   *atomic.Uint64
	// keys are the buckets' keys, made once when this proxy took the
	// layout up: a deduct names its bucket without building the name.
	keys [][]byte
}

// nameBuckets makes the bucket keys that Bucket returns from then on.
func (l *Layout) nameBuckets() {
	keys := make([][]byte, l.N())
	for i := range keys {
		k := l.Bucket(i)
		keys[i] = k[:len(k):len(k)] // shared: an append must copy
	}
	l.keys = keys
}

// groupByMaster sets byMaster from owner, the index of the master serving
// a slot (-1 for none: such buckets form a group of their own), and
// starts the turns at a random master.
func (l *Layout) groupByMaster(owner func(slot uint16) int) {
	group := make(map[int]int)
	l.byMaster = nil
	for i, tag := range l.Tags {
		m := owner(hashslot.Of([]byte(tag)))
		g, ok := group[m]
		if !ok {
			g = len(l.byMaster)
			group[m] = g
			l.byMaster = append(l.byMaster, nil)
		}
		l.byMaster[g] = append(l.byMaster[g], i)
	}
	l.starts = new(atomic.Uint64)
	l.starts.Store(uint64(rand.IntN(len(l.byMaster))) * startRun)
}

// N is the number of buckets.
func (l *Layout) N() int { return len(l.Tags) }

// Bucket is the key of bucket i. The caller must not change it.
func (l *Layout) Bucket(i int) []byte {
	if l.keys != nil {
		return l.keys[i]
	}
	b := make([]byte, 0, len(l.Tags[i])+len(l.Key)+len(l.Gen)+8)
	b = append(b, '{')
	b = append(b, l.Tags[i]...)
	b = append(b, '}')
	b = append(b, l.Key...)
	b = append(b, '#')
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, '.')
	return append(b, l.Gen...)
}

// IntentsKey is the key of bucket i's intents, in its slot: a hash of
// the moves out of it in flight, id -> "<to> <amount> <created ms>" (see
// "Moves between buckets" in the package doc).
func (l *Layout) IntentsKey(i int) []byte { return append(l.Bucket(i), ":intents"...) }

// AppliedKey is the key of bucket i's applied marks, in its slot: a
// sorted set of the ids of the moves into it, scored by when they were
// applied (Unix ms, the node's clock).
func (l *Layout) AppliedKey(i int) []byte { return append(l.Bucket(i), ":applied"...) }

// LostKey is the key of the layout's record of lost buckets, in the key's
// slot (bucket 0's): a hash, bucket number -> "<units> <detected ms>",
// the units being those the proxy that found it lost last saw in it.
func (l *Layout) LostKey() []byte { return append(l.Bucket(0), ":lost"...) }

// requests appends to dst the command "cmd bucket args…" for each bucket
// of l, in bucket order.
func (l *Layout) requests(dst []Request, cmd []byte, args ...[]byte) []Request {
	for i := range l.N() {
		b := l.Bucket(i)
		dst = append(dst, Request{Key: b, Args: append([][]byte{cmd, b}, args...)})
	}
	return dst
}

// records are the keys of bucket i's records of moves, in its slot, and
// for bucket 0 the layout's record of lost buckets too.
func (l *Layout) records(i int) [][]byte {
	r := [][]byte{l.IntentsKey(i), l.AppliedKey(i)}
	if i == 0 {
		r = append(r, l.LostKey())
	}
	return r
}

// dropRequests appends to dst, for each bucket of l, the command "cmd"
// (DEL or UNLINK) of the bucket with its records, in one request: all are
// in the bucket's slot.
func (l *Layout) dropRequests(dst []Request, cmd []byte) []Request {
	for i := range l.N() {
		b := l.Bucket(i)
		dst = append(dst, Request{Key: b, Args: append([][]byte{cmd, b}, l.records(i)...)})
	}
	return dst
}

// recordRequests appends to dst the command "cmd record args…" for each
// record of each bucket of l, in bucket order.
func (l *Layout) recordRequests(dst []Request, cmd []byte, args ...[]byte) []Request {
	for i := range l.N() {
		for _, r := range l.records(i) {
			dst = append(dst, Request{Key: r, Args: append([][]byte{cmd, r}, args...)})
		}
	}
	return dst
}

// Share is bucket i's part of total spread over the buckets: total/N
// each, the remainder one each on the first buckets (contract 1). A
// total below zero is a debt and stays whole on bucket 0, which
// give-backs repay first: spread, some buckets could hold stock while
// the sum is negative.
func (l *Layout) Share(total int64, i int) int64 {
	n := int64(l.N())
	switch {
	case total < 0 && i == 0:
		return total
	case total < 0:
		return 0
	case int64(i) < total%n:
		return total/n + 1
	}
	return total / n
}

// Marker is the value the key holds once the layout is complete:
// "hotkeyproxy-layout:1:<gen>:<tag> <tag>…" (tags are decimal numbers).
// When journaled, ":journal" follows; then while Pending, ":<fill>"
// (which the convert script appends), while Merging, ":merge".
func (l *Layout) Marker() []byte {
	b := append([]byte(MarkerPrefix), l.Gen...)
	b = append(b, ':')
	for i, t := range l.Tags {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, t...)
	}
	if l.Journal {
		b = append(b, ":journal"...)
	}
	switch {
	case l.Pending:
		b = append(b, ':')
		b = strconv.AppendInt(b, l.Fill, 10)
	case l.Merging:
		b = append(b, ":merge"...)
	}
	return b
}

// IsMarker reports whether a key's value is a layout.
func IsMarker(v []byte) bool { return bytes.HasPrefix(v, []byte(MarkerPrefix)) }

var errBadMarker = errors.New("rewrite: malformed layout")

// ParseMarker reads the layout a key's value holds: at most
// config.MaxBuckets buckets, written exactly as Marker writes it.
func ParseMarker(key string, v []byte) (*Layout, error) {
	if !IsMarker(v) {
		return nil, errBadMarker
	}
	parts := bytes.Split(v[len(MarkerPrefix):], []byte{':'})
	journal := len(parts) > 2 && string(parts[2]) == "journal"
	if journal {
		parts = slices.Delete(parts, 2, 3)
	}
	if len(parts) < 2 || len(parts) > 3 || len(parts[0]) == 0 {
		return nil, errBadMarker
	}
	gen, err := strconv.ParseUint(string(parts[0]), 16, 64)
	if err != nil {
		return nil, errBadMarker
	}
	fields := bytes.Fields(parts[1])
	if len(fields) < 1 {
		return nil, errBadMarker
	}
	l := &Layout{Key: key, Gen: strconv.FormatUint(gen, 16), Tags: make([]string, len(fields)), Journal: journal}
	for i, f := range fields {
		t, err := strconv.ParseUint(string(f), 10, 32)
		if err != nil {
			return nil, errBadMarker
		}
		l.Tags[i] = strconv.FormatUint(t, 10)
	}
	if len(parts) == 3 && string(parts[2]) == "merge" {
		l.Merging = true
	} else if len(parts) == 3 {
		fill, err := strconv.ParseInt(string(parts[2]), 10, 64)
		if err != nil {
			return nil, errBadMarker
		}
		l.Pending, l.Fill = true, fill
	}
	// Only what Marker writes: a value written some other way (a client
	// can SET anything) is not a layout, whatever it starts with.
	if l.N() > config.MaxBuckets || !bytes.Equal(l.Marker(), v) {
		return nil, errBadMarker
	}
	return l, nil
}

// Place makes the layout of a new hot key of n buckets over the masters
// that serve slots now: masters of them, owner(slot) the index of the one
// serving slot. Bucket 0 shares the key's slot, so that one script can
// turn a plain value into buckets atomically; bucket i goes to the master
// i places after the key's, so each master holds ⌊n/masters⌋ or
// ⌈n/masters⌉ buckets. No two buckets share a slot when there are slots
// enough, so migrating one slot moves one bucket.
func Place(key string, n, masters int, owner func(slot uint16) int) *Layout {
	keySlot := hashslot.Of([]byte(key))
	first := owner(keySlot)
	l := &Layout{Key: key, Gen: strconv.FormatUint(uint64(rand.Uint32()), 16), Tags: make([]string, n)}
	used := make(map[uint16]bool, n)
	find := func(ok func(slot uint16) bool) string {
		for t := 0; ; t++ {
			tag := strconv.Itoa(t)
			// Past a million tags, a master with fewer free slots than
			// buckets (or none) takes a shared or any slot.
			s := hashslot.Of([]byte(tag))
			if t > 1<<21 || ok(s) && (!used[s] || t > 1<<20) {
				used[s] = true
				return tag
			}
		}
	}
	// Bucket 0's tag must hash to the key's slot exactly: about one tag
	// in 16384 does, found in well under a millisecond.
	l.Tags[0] = find(func(s uint16) bool { return s == keySlot })
	for i := 1; i < n; i++ {
		m := (first + i) % masters
		l.Tags[i] = find(func(s uint16) bool { return owner(s) == m })
	}
	return l
}
