package ackwise_test

import (
	"slices"
	"testing"

	"github.com/ackwise/ackwise"
)

// FuzzHeaders: the header readers and writers every adapter, the engine and
// the middleware use on producer-set headers (Get, Lookup, Has, Set, Add,
// Del, Clone, Map, Keys) keep their contract for any sequence of
// operations on any keys and values, repeated keys and empty ones
// included. ops is read three bytes at a time (64 operations at most): the
// operation, a key (one of a few, so that keys repeat) and a value.
func FuzzHeaders(f *testing.F) {
	f.Add([]byte{0, 0, 1, 1, 0, 2, 0, 0, 3})
	f.Add([]byte{1, 0, 1, 1, 0, 2, 1, 0, 3, 2, 0, 0, 0, 1, 4})
	f.Add([]byte{3, 2, 0, 1, 3, 9, 0, 3, 1, 2, 3, 0})
	f.Add([]byte{})
	keys := []string{"", "ackwise-event-id", "ackwise-attempt", "x-death", "X-Death", "k"}
	f.Fuzz(func(t *testing.T, ops []byte) {
		var h ackwise.Headers
		for i := 0; i+3 <= len(ops) && i < 3*64; i += 3 {
			op, k, v := ops[i]%4, keys[int(ops[i+1])%len(keys)], string(ops[i+2:i+3])
			before := h.Clone()
			others := func(hs ackwise.Headers) ackwise.Headers {
				return slices.DeleteFunc(slices.Clone(hs), func(kv ackwise.Header) bool { return kv.Key == k })
			}
			switch op {
			case 0: // Set: one value, the first place kept, the others untouched
				h.Set(k, v)
				if got, ok := h.Lookup(k); !ok || got != v || count(h, k) != 1 {
					t.Fatalf("after Set(%q, %q): %q", k, v, h)
				}
				if was := index(before, k); was >= 0 && index(h, k) != was || was < 0 && index(h, k) != len(before) {
					t.Fatalf("Set(%q) put the key elsewhere than its first place (or the end): %q → %q", k, before, h)
				}
			case 1: // Add: appended, the last value wins
				h.Add(k, v)
				if len(h) != len(before)+1 || h.Get(k) != v || h[len(h)-1] != (ackwise.Header{Key: k, Value: v}) {
					t.Fatalf("after Add(%q, %q): %q", k, v, h)
				}
			case 2: // Del: every value gone
				h.Del(k)
				if h.Has(k) || len(h) != len(before)-count(before, k) {
					t.Fatalf("after Del(%q): %q", k, h)
				}
			case 3: // Clone: equal, and independent
				c := h.Clone()
				c.Set(k, v+"x")
				if !slices.Equal(h, before) {
					t.Fatalf("changing a clone changed the original: %q → %q", before, h)
				}
			}
			if op != 1 && !slices.Equal(others(h), others(before)) {
				t.Fatalf("op %d on %q changed other keys: %q → %q", op, k, before, h)
			}
			m := h.Map()
			for _, key := range keys {
				last, ok := h.Lookup(key)
				if mv, mok := m[key]; ok != mok || mv != last || ok != h.Has(key) || h.Get(key) != last {
					t.Fatalf("readers disagree on %q in %q: Lookup %q %v, Map %q %v", key, h, last, ok, mv, mok)
				}
			}
			if got := h.Keys(); len(got) != len(h) {
				t.Fatalf("Keys = %q for %q", got, h)
			}
		}
	})
}

func count(h ackwise.Headers, k string) int {
	n := 0
	for _, kv := range h {
		if kv.Key == k {
			n++
		}
	}
	return n
}

func index(h ackwise.Headers, k string) int {
	return slices.IndexFunc(h, func(kv ackwise.Header) bool { return kv.Key == k })
}
