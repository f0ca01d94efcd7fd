package ackwise_test

import (
	"reflect"
	"testing"

	"github.com/ackwise/ackwise"
)

func TestHeadersGetSetAddDel(t *testing.T) {
	t.Parallel()
	var h ackwise.Headers
	if h.Get("a") != "" || h.Has("a") {
		t.Fatal("nil headers have a value")
	}
	h.Set("a", "1")
	h.Add("b", "2")
	h.Add("a", "3") // a repeated key, as on a Kafka record
	if got := h.Get("a"); got != "3" {
		t.Fatalf("Get of a repeated key = %q, want the last value 3", got)
	}
	if v, ok := h.Lookup("b"); !ok || v != "2" {
		t.Fatalf("Lookup(b) = %q, %v", v, ok)
	}
	h.Set("a", "4")
	if want := (ackwise.Headers{{Key: "a", Value: "4"}, {Key: "b", Value: "2"}}); !reflect.DeepEqual(h, want) {
		t.Fatalf("after Set: %v, want %v (Set leaves one value in the first place)", h, want)
	}
	h.Del("a")
	if h.Has("a") || len(h) != 1 {
		t.Fatalf("after Del: %v", h)
	}
	if got := h.Keys(); !reflect.DeepEqual(got, []string{"b"}) {
		t.Fatalf("Keys = %v", got)
	}
}

func TestHeadersOf(t *testing.T) {
	t.Parallel()
	h := ackwise.HeadersOf("k1", "v1", "k2", "v2", "k1", "v3")
	if want := (ackwise.Headers{{Key: "k1", Value: "v3"}, {Key: "k2", Value: "v2"}}); !reflect.DeepEqual(h, want) {
		t.Fatalf("HeadersOf = %v, want %v", h, want)
	}
	if m := h.Map(); len(m) != 2 || m["k1"] != "v3" {
		t.Fatalf("Map = %v", m)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("HeadersOf with an odd number of arguments did not panic")
		}
	}()
	ackwise.HeadersOf("k")
}

// Adapters carve the headers of many messages from one backing array, with
// the capacity cut to the length: appending to one message's headers must
// not write over the next message's.
func TestHeadersCarvedAppendDoesNotClobberNeighbour(t *testing.T) {
	t.Parallel()
	backing := ackwise.Headers{{Key: "a", Value: "1"}, {Key: "b", Value: "2"}}
	first, second := backing[0:1:1], backing[1:2:2]
	first.Set("c", "3")
	first.Add("d", "4")
	if second[0] != (ackwise.Header{Key: "b", Value: "2"}) {
		t.Fatalf("neighbour changed: %v", second)
	}
	if first.Get("c") != "3" || first.Get("d") != "4" || first.Get("a") != "1" {
		t.Fatalf("first = %v", first)
	}
}

func TestHeadersClone(t *testing.T) {
	t.Parallel()
	if ackwise.Headers(nil).Clone() != nil {
		t.Fatal("Clone of nil is not nil")
	}
	h := ackwise.HeadersOf("a", "1")
	c := h.Clone()
	c.Set("a", "2")
	c.Add("b", "3")
	if h.Get("a") != "1" || h.Has("b") {
		t.Fatalf("Clone shares memory: original %v", h)
	}
}
