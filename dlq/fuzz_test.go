package dlq_test

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// headersFrom decodes fuzz bytes into a header list: records separated by
// 0x1e, each a key and a value separated by the first 0x1f (a record
// without one is a key with an empty value). Any bytes are some header
// list, repeated and empty keys included.
func headersFrom(data []byte) ackwise.Headers {
	if len(data) == 0 {
		return nil
	}
	var h ackwise.Headers
	for rec := range bytes.SplitSeq(data, []byte{0x1e}) {
		k, v, _ := bytes.Cut(rec, []byte{0x1f})
		h = append(h, ackwise.Header{Key: string(k), Value: string(v)})
	}
	return h
}

// FuzzDecode: Decode, Strip, Apply and RedriveCount never panic on any
// header list a broker may deliver; Strip keeps exactly the headers that
// are not the envelope's, in order; and an envelope Apply writes over any
// header list decodes back (the header list's own envelope headers, forged
// or stale, are replaced).
func FuzzDecode(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte("ackwise-dlq-reason\x1fpermanent\x1eackwise-dlq-attempts\x1f3"))
	f.Add([]byte("ackwise-dlq-reason\x1fx\x1eackwise-dlq-partition\x1f99999999999"))
	f.Add([]byte("ackwise-dlq-reason\x1eackwise-dlq-first-failure\x1f2026-13-01T00:00:00Z"))
	f.Add([]byte("ackwise-dlq-reason\x1fmax-attempts\x1eackwise-dlq-attempts\x1f-9223372036854775809"))
	f.Add([]byte("x-tenant\x1facme\x1eAuthorization\x1fBearer s3cret\x1eackwise-redrive-count\x1f2"))
	f.Add([]byte("ackwise-redrive-count\x1f18446744073709551616\x1eackwise-redrive-count\x1f1"))
	f.Add([]byte("ackwise-dlq-trimmed\x1fvalue-bytes=10;value-kept=4"))
	f.Add([]byte("ackwise-dlq-trimmed\x1fvalue-bytes=10;value-kept=10;value-bytes=11"))
	valid := dlq.Envelope{Reason: dlq.ReasonPermanent, Error: "e", ErrorClass: "permanent", Source: "q", Partition: -1, Offset: -1, Attempts: 2, Consumer: "c"}
	f.Fuzz(func(t *testing.T, data []byte) {
		h := headersFrom(data)
		orig := h.Clone()
		env, err := dlq.Decode(h)
		if err == nil && !h.Has(dlq.HeaderReason) {
			t.Fatalf("Decode succeeded without %s: %+v", dlq.HeaderReason, env)
		}
		if n, ok := dlq.RedriveCount(h); ok && n < 0 || !ok && n != 0 {
			t.Fatalf("RedriveCount = %d, %v", n, ok)
		}
		// Only a marker that reads as the whole payload kept lets a dead
		// letter be redriven; a marker is replaced at dead-lettering.
		if marker, ok := h.Lookup(dlq.HeaderTrimmed); ok && !dlq.PayloadCut(h) &&
			(!strings.Contains(marker, "value-bytes=") || !strings.Contains(marker, "value-kept=")) {
			t.Fatalf("PayloadCut(%q) = false without both sizes", marker)
		}
		if dlq.PayloadCut(valid.Apply(h)) {
			t.Fatalf("PayloadCut after Apply over %q: a producer's marker survived", h)
		}
		stripped := dlq.Strip(h)
		var want ackwise.Headers
		for _, kv := range h {
			if !strings.HasPrefix(kv.Key, dlq.HeaderPrefix) {
				want = append(want, kv)
			}
		}
		if !slices.Equal(stripped, want) {
			t.Fatalf("Strip(%q) = %q, want %q", h, stripped, want)
		}
		applied := valid.Apply(h)
		got, err := dlq.Decode(applied)
		if err != nil || got != valid {
			t.Fatalf("Decode(Apply(%q)) = %+v, %v; want %+v", h, got, err, valid)
		}
		for _, kv := range applied {
			if dlq.IsSecretHeader(kv.Key) {
				t.Fatalf("Apply kept the credential header %q", kv.Key)
			}
		}
		if !slices.Equal(h, orig) {
			t.Fatalf("the header list changed: %q, was %q", h, orig)
		}
	})
}

// FuzzEnvelopeRoundTrip: Decode(Apply(env)) == env for every valid
// envelope (Partition and Offset at least -1, the error text within
// MaxErrorLen, times between the years 1678 and 2262 in UTC or zero), over
// any header list.
func FuzzEnvelopeRoundTrip(f *testing.F) {
	f.Add("permanent", "boom", "permanent", "orders", int32(3), int64(42), "orders/3@42", 5, int64(1764410400123000000), int64(1764410490000000000), "billing", "v2", []byte("x-tenant\x1facme"))
	f.Add("", "", "", "", int32(-1), int64(-1), "", 0, int64(0), int64(0), "", "", []byte(nil))
	f.Add("max-attempts", strings.Repeat("é", 600), "transient", "q", int32(math.MaxInt32), int64(math.MaxInt64), "id", math.MinInt, int64(math.MinInt64), int64(math.MaxInt64), "c", "", []byte("ackwise-dlq-reason\x1fforged"))
	f.Add("x\x00y", "\xff\xfe", "permanent", "q\n", int32(0), int64(0), "", math.MaxInt, int64(-1), int64(1), "c", "v", []byte("ackwise-dlq-error\x1fold"))
	f.Fuzz(func(t *testing.T, reason, errText, class, source string, partition int32, offset int64, messageID string, attempts int, first, last int64, consumer, version string, headers []byte) {
		env := dlq.Envelope{
			Reason: dlq.Reason(reason), Error: dlq.BoundError(errText), ErrorClass: class, Source: source,
			Partition: max(partition, -1), Offset: max(offset, -1), MessageID: messageID, Attempts: attempts,
			FirstFailure: unixUTC(first), LastFailure: unixUTC(last), Consumer: consumer, ConsumerVersion: version,
		}
		if len(env.Error) > dlq.MaxErrorLen {
			t.Fatalf("BoundError left %d bytes", len(env.Error))
		}
		got, err := dlq.Decode(env.Apply(headersFrom(headers)))
		if err != nil {
			t.Fatalf("Decode(Apply(%+v)): %v", env, err)
		}
		if !sameEnvelope(got, env) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, env)
		}
	})
}

// unixUTC is the time n ns after the Unix epoch in UTC, or the zero time
// for 0 (Apply leaves zero times out).
func unixUTC(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func sameEnvelope(a, b dlq.Envelope) bool {
	ta := [2]time.Time{a.FirstFailure, a.LastFailure}
	tb := [2]time.Time{b.FirstFailure, b.LastFailure}
	for i := range ta {
		if !ta[i].Equal(tb[i]) || ta[i].Location() != tb[i].Location() {
			return false
		}
	}
	a.FirstFailure, a.LastFailure, b.FirstFailure, b.LastFailure = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return a == b
}

// FuzzRedriveCount: the count Redrive reads from a header is in range or
// refused, never negative, and one it accepts reads back from its decimal
// form.
func FuzzRedriveCount(f *testing.F) {
	for _, s := range []string{"", "0", "3", "-1", "+3", "03", "x", "1e3", " 1", "9223372036854775807", "9223372036854775808", "-9223372036854775808"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n, ok := dlq.RedriveCount(ackwise.HeadersOf(dlq.HeaderRedriveCount, v))
		if !ok {
			if n != 0 {
				t.Fatalf("RedriveCount(%q) refused with %d", v, n)
			}
			return
		}
		if n < 0 {
			t.Fatalf("RedriveCount(%q) = %d", v, n)
		}
		if back, ok := dlq.RedriveCount(ackwise.HeadersOf(dlq.HeaderRedriveCount, strconv.Itoa(n))); !ok || back != n {
			t.Fatalf("RedriveCount(%q) = %d does not read back: %d, %v", v, n, back, ok)
		}
	})
}
