package row

import (
	"slices"
	"testing"

	"github.com/ackwise/ackwise"
)

func FuzzHeadersRoundTrip(f *testing.F) {
	f.Add("a", "1", "a", "\x00\xff", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		h := ackwise.Headers{{Key: k1, Value: v1}, {Key: k2, Value: v2}, {Key: k3, Value: v3}}
		got, err := DecodeHeaders(EncodeHeaders(h))
		if err != nil || !slices.Equal(got, h) {
			t.Fatalf("round trip of %q = %q, %v", h, got, err)
		}
	})
}

func FuzzDecodeHeadersNeverPanics(f *testing.F) {
	f.Add([]byte{1, 1, 'a', 1, 'b'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeaders(b)
		if err != nil {
			return
		}
		again, err := DecodeHeaders(EncodeHeaders(h))
		if err != nil || !slices.Equal(again, h) {
			t.Fatalf("decoded %x as %q, which does not round-trip: %q, %v", b, h, again, err)
		}
	})
}

func TestNoHeadersEncodeAsNil(t *testing.T) {
	if b := EncodeHeaders(nil); b != nil {
		t.Fatalf("EncodeHeaders(nil) = %x", b)
	}
	if h, err := DecodeHeaders(nil); h != nil || err != nil {
		t.Fatalf("DecodeHeaders(nil) = %v, %v", h, err)
	}
}
