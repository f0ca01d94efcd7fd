package middleware_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/meminbox"
)

// FuzzAggregateVersion: the version parser accepts exactly the base-10
// integers from 1 to MaxInt64 and refuses everything else wrapping
// ErrInvalid; and the gate, given a recorded version prev and any header
// value s, applies s exactly when it parses, is newer than prev and at most
// gap above it, records only what it applied, and never overflows in the
// gap arithmetic.
func FuzzAggregateVersion(f *testing.F) {
	for _, s := range []struct {
		v         string
		prev, gap int64
	}{
		{"1", 0, 0},
		{"9223372036854775807", 1, 0},
		{"9223372036854775807", 0, -1},
		{"9223372036854775808", 0, 0},
		{"0", 0, 0},
		{"-1", 5, 0},
		{"-9223372036854775808", 0, 1},
		{"+5", 4, 1},
		{"0x10", 0, 0},
		{"", 0, 0},
		{"１２", 0, 0},
		{"11", 1, 10},
		{"12", 1, 10},
		{"1764410400123456789", 0, 0},
		{"4611686018427387905", 0, 0},
	} {
		f.Add(s.v, s.prev, s.gap)
	}
	f.Fuzz(func(t *testing.T, s string, prev, gap int64) {
		msg := func(v string) *ackwise.Message {
			return &ackwise.Message{ID: "e-" + v, Key: "agg", Headers: ackwise.HeadersOf(ackwise.HeaderAggregateVersion, v)}
		}
		v, err := middleware.AggregateVersion(msg(s))
		n, perr := strconv.ParseInt(s, 10, 64)
		switch {
		case err == nil && (perr != nil || n != v || v < 1):
			t.Fatalf("AggregateVersion(%q) = %d; ParseInt says %d, %v", s, v, n, perr)
		case err != nil && (perr == nil && n >= 1 || !errors.Is(err, middleware.ErrInvalid)):
			t.Fatalf("AggregateVersion(%q) refused: %v", s, err)
		}

		if gap < 0 && gap != middleware.NoVersionGapLimit {
			gap = -gap - 1 // a valid gap: 0 (default) and up, or no limit
		}
		store := meminbox.New(nil)
		ran := 0
		mw, err := middleware.VersionGate(store, middleware.VersionGateConfig{Consumer: "c", MaxVersionGap: gap})
		if err != nil {
			t.Fatal(err)
		}
		h := mw(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { ran++; return nil }))
		key := middleware.VersionKey{Consumer: "c", Aggregate: "agg"}
		if prev >= 1 {
			// Record prev: with no limit the gate applies any valid version.
			pmw, _ := middleware.VersionGate(store, middleware.VersionGateConfig{Consumer: "c", MaxVersionGap: middleware.NoVersionGapLimit})
			if err := pmw(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })).Handle(context.Background(), msg(strconv.FormatInt(prev, 10))); err != nil {
				t.Fatalf("recording v%d: %v", prev, err)
			}
		} else {
			prev = 0
		}
		herr := h.Handle(context.Background(), msg(s))
		eff := gap
		if eff == 0 {
			eff = middleware.DefaultMaxVersionGap
		}
		// v - prev > eff, computed without overflow (v >= 1, prev >= 0).
		tooFar := eff != middleware.NoVersionGapLimit && v > prev && uint64(v-prev) > uint64(eff)
		wantApplied := perr == nil && n >= 1 && n > prev && !tooFar
		if wantApplied != (ran == 1) || wantApplied != (herr == nil && ran == 1) {
			t.Fatalf("prev %d, gap %d, s %q: ran %d, err %v; want applied %v", prev, gap, s, ran, herr, wantApplied)
		}
		if herr != nil && ackwise.ClassOf(herr) != ackwise.ClassPermanent {
			t.Fatalf("prev %d, gap %d, s %q: %v is not permanent", prev, gap, s, herr)
		}
		rec, ok := store.Version(key)
		want := prev
		if wantApplied {
			want = v
		}
		if rec != want || ok != (want >= 1) {
			t.Fatalf("prev %d, gap %d, s %q: recorded %d (%v), want %d", prev, gap, s, rec, ok, want)
		}
	})
}
