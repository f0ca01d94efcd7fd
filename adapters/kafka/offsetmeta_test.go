package kafka

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSettledMetadataRejectsWraps: commit metadata whose deltas carry an
// offset past MaxInt64 (where int64 addition wraps to a negative offset),
// or that is malformed past its prefix, or that names a negative base, is
// ignored as a whole: decodeSettled returns nil, and the records above the
// committed offset are delivered again rather than skipped on the word of
// a set that cannot be right. Before, ackwise2:-1:072007200720AX (found by
// fuzzing) decoded to offsets that wrapped around.
func TestSettledMetadataRejectsWraps(t *testing.T) {
	huge := func(base int64, deltas ...uint64) string {
		var b []byte
		for _, d := range deltas {
			b = binary.AppendUvarint(b, d)
		}
		return metaPrefix + strconv.FormatInt(base, 10) + ":" + base64.RawURLEncoding.EncodeToString(b)
	}
	for _, tc := range []struct {
		base int64
		meta string
	}{
		{-1, "ackwise2:-1:072007200720AX"},
		{100, huge(100, 1, math.MaxInt64)},               // 101, then past MaxInt64
		{100, huge(100, math.MaxUint64)},                 // a delta beyond int64
		{math.MaxInt64 - 1, huge(math.MaxInt64-1, 1, 1)}, // MaxInt64, then past it
		{-5, huge(-5, 1)},                                // no committed offset is negative
		{100, huge(100, 1) + "!"},                        // not base64
		{100, metaPrefix + "100:" + base64.RawURLEncoding.EncodeToString([]byte{0x81})},    // a cut varint
		{100, metaPrefix + "100:" + base64.RawURLEncoding.EncodeToString([]byte{1, 0, 1})}, // a zero delta
		{100, huge(100, make([]uint64, maxMetaBytes)...)},                                  // longer than any encoding
	} {
		got := decodeSettled(tc.base, tc.meta)
		if got != nil {
			var offs []int64
			for o := range got {
				offs = append(offs, o)
			}
			slices.Sort(offs)
			t.Errorf("decodeSettled(%d, %.60q) = %v, want nil", tc.base, tc.meta, offs)
		}
	}
	// A set up to MaxInt64 itself is fine.
	if got := decodeSettled(math.MaxInt64-2, encodeSettled(math.MaxInt64-2, []int64{math.MaxInt64 - 1, math.MaxInt64})); len(got) != 2 {
		t.Errorf("offsets up to MaxInt64: %v", got)
	}
}

// FuzzSettledMetadata: decodeSettled of any input never panics and returns
// only offsets above a non-negative base; what it returns encodes and
// decodes back to itself; and offsets built from the fuzzed deltas survive
// an encode and decode, but for those the size bound cut off the end.
func FuzzSettledMetadata(f *testing.F) {
	f.Add(int64(-1), "ackwise2:-1:072007200720AX", []byte{1, 2, 3})
	f.Add(int64(100), encodeSettled(100, []int64{101, 102, 150, 100000}), []byte{})
	f.Add(int64(0), "ackwise2:0:AQ", []byte{255, 0, 7})
	f.Add(int64(math.MaxInt64-3), encodeSettled(math.MaxInt64-3, []int64{math.MaxInt64}), []byte{1})
	f.Add(int64(7), "ackwise1:AQID", []byte(nil))
	f.Fuzz(func(t *testing.T, base int64, meta string, deltas []byte) {
		got := decodeSettled(base, meta)
		offs := make([]int64, 0, len(got))
		for o := range got {
			if o <= base || base < 0 {
				t.Fatalf("decodeSettled(%d, %q) holds offset %d", base, meta, o)
			}
			offs = append(offs, o)
		}
		slices.Sort(offs)
		if len(offs) > 0 {
			again := decodeSettled(base, encodeSettled(base, offs))
			if len(again) != len(got) {
				t.Fatalf("decodeSettled(%d, %q): %d offsets, %d after a round trip", base, meta, len(got), len(again))
			}
			for o := range got {
				if _, ok := again[o]; !ok {
					t.Fatalf("offset %d lost in a round trip", o)
				}
			}
		}
		// Ascending offsets from the fuzzed deltas (each byte times a
		// stride, at least 1), stopping short of overflow.
		if base < 0 {
			return
		}
		var want []int64
		prev := base
		for i, d := range deltas {
			step := int64(d)*int64(1+i%3*1000) + 1
			if prev > math.MaxInt64-step {
				break
			}
			prev += step
			want = append(want, prev)
		}
		dec := decodeSettled(base, encodeSettled(base, want))
		if len(dec) > len(want) {
			t.Fatalf("%d offsets decoded from %d", len(dec), len(want))
		}
		for _, o := range want[:len(dec)] { // encode keeps a prefix
			if _, ok := dec[o]; !ok {
				t.Fatalf("offset %d of %v lost (decoded %d)", o, want, len(dec))
			}
		}
	})
}

// TestSettledMetadataBeyondEnd: commit metadata naming offsets at or past
// the partition's end (forged by anyone allowed to commit for the group, or
// left by a truncation) is ignored: the records written there later are
// delivered, not skipped as settled. A set of existing records still
// skips them. Before, records 1 and 2, produced after the source read a
// set naming them, were never delivered.
func TestSettledMetadataBeyondEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		produce int     // records before the commit
		set     []int64 // settled above offset 0
		want    []int64 // offsets delivered of 0..2
	}{
		{"past-the-end", 1, []int64{1, 2}, []int64{0, 1, 2}},
		{"existing", 3, []int64{1}, []int64{0, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			brokers := newCluster(t)
			cfg := testConfig(t, brokers, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			sink := openSink(t, cfg)
			publishN(t, sink, tc.produce, func(int) string { return "k" })
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			var offs kadm.Offsets
			offs.Add(kadm.Offset{Topic: cfg.Topic, Partition: 0, At: 0, LeaderEpoch: -1, Metadata: encodeSettled(0, tc.set)})
			resp, err := kadm.NewClient(cl).CommitOffsets(ctx, cfg.Group, offs)
			if err == nil {
				err = resp.Error()
			}
			if err != nil {
				t.Fatal(err)
			}
			src := openSource(t, cfg)
			got := receiveN(t, src, 1) // assigned, the set read
			if n := 3 - tc.produce; n > 0 {
				publishN(t, sink, n, func(int) string { return "k" })
			}
			got = append(got, receiveN(t, src, len(tc.want)-1)...)
			var at []int64
			for _, m := range got {
				at = append(at, m.Offset)
			}
			if !slices.Equal(at, tc.want) {
				t.Fatalf("delivered offsets %v, want %v", at, tc.want)
			}
		})
	}
}
