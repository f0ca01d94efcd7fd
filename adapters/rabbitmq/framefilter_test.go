package rabbitmq

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// nestedArray returns a header value of depth arrays, one inside the other.
func nestedArray(depth int) any {
	var v any = "leaf"
	for range depth {
		v = []any{v}
	}
	return v
}

func manyEntries(n int) amqp.Table {
	t := make(amqp.Table, n)
	for i := range n {
		t[fmt.Sprintf("k%05d", i)] = int8(1)
	}
	return t
}

// filtered starts a fake broker whose client reads through a frame filter
// and returns what the filter reported.
func filtered(t *testing.T, frameMax uint32) (*amqp.Connection, *fakeBroker, func() []unreadable) {
	var mu sync.Mutex
	var reports []unreadable
	c, b := startFakeBroker(t, frameMax, func(c net.Conn) net.Conn {
		return newFrameFilter(c, clientFrameMax, func(u unreadable) {
			mu.Lock()
			defer mu.Unlock()
			reports = append(reports, u)
		})
	})
	return c, b, func() []unreadable {
		mu.Lock()
		defer mu.Unlock()
		return reports
	}
}

// encoded returns the content header payload amqp091-go writes for p.
func encoded(t testing.TB, p amqp.Publishing) []byte {
	t.Helper()
	c, b := startFakeBroker(t, clientFrameMax, nil)
	f, err := b.headerSent(c, p)
	if err != nil {
		t.Fatal(err)
	}
	return f[7 : len(f)-1]
}

// TestFrameFilterMatchesClientLimits: for header tables at and past each
// of amqp091-go's read limits, amqp091-go itself (over a fake broker) reads
// the content header exactly when the filter leaves it alone; through the
// filter, every one reads, the readable ones unchanged, the others with
// each unreadable entry as its encoded bytes, named in HeaderUnreadable
// (a producer's own value of it replaced), and the cause reported.
func TestFrameFilterMatchesClientLimits(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		headers amqp.Table
		names   []string // unreadable entries; nil: readable
		reason  string
	}{
		{"flat", amqp.Table{"a": "b", "n": int32(7), "f": 1.5, "x": []byte{0, 1}, "v": nil}, nil, ""},
		{"tables 32 deep", amqp.Table{"deep": nested(32)}, nil, ""},
		{"tables 33 deep", amqp.Table{"deep": nested(33), "ok": "yes"}, []string{"deep"}, "nested deeper than 32"},
		{"tables 40 deep", amqp.Table{"deep": nested(40), "also": nested(35), "ok": "yes"}, []string{"also", "deep"}, "nested deeper than 32"},
		{"arrays 32 deep", amqp.Table{"deep": nestedArray(32)}, nil, ""},
		{"arrays 33 deep", amqp.Table{"deep": nestedArray(33)}, []string{"deep"}, "nested deeper than 32"},
		{"array of tables 33 deep", amqp.Table{"deep": []any{nested(32)}}, []string{"deep"}, "nested deeper than 32"},
		{"8192 array values", amqp.Table{"arr": make([]any, 8192)}, nil, ""},
		{"8193 array values", amqp.Table{"arr": make([]any, 8193)}, []string{"arr"}, "more than 8192"},
		{"8192 nested entries", amqp.Table{"t": manyEntries(8192)}, nil, ""},
		{"8193 nested entries", amqp.Table{"t": manyEntries(8193)}, []string{"t"}, "more than 8192"},
		{"8192 entries", manyEntries(8192), nil, ""},
		{"8193 entries", manyEntries(8193), []string{HeaderUnreadableRest}, "more than 8192"},
		{"producer's marker alone", amqp.Table{HeaderUnreadable: `["forged"]`, "a": "b"}, nil, ""},
		{"producer's marker", amqp.Table{HeaderUnreadable: `["forged"]`, "deep": nested(33)}, []string{"deep"}, "nested deeper than 32"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := amqp.Publishing{ContentType: "text/plain", Headers: c.headers, DeliveryMode: 2, MessageId: "m-1", Body: []byte("body")}
			hdr := encoded(t, p)

			pc, pb := startFakeBroker(t, clientFrameMax, nil)
			plain, err := pb.delivered(pc, hdr)
			if (err == nil) != (c.names == nil) {
				t.Fatalf("amqp091-go reads it: %v (%v); the filter takes it for readable: %v", err == nil, err, c.names == nil)
			}

			fc, fb, reports := filtered(t, clientFrameMax)
			d, err := fb.delivered(fc, hdr)
			if err != nil {
				t.Fatalf("through the filter: %v", err)
			}
			if d.MessageId != "m-1" || d.ContentType != "text/plain" || d.DeliveryMode != 2 || string(d.Body) != "body" {
				t.Fatalf("properties or body changed: %+v", d)
			}
			if c.names == nil {
				if !reflect.DeepEqual(d.Headers, plain.Headers) || len(reports()) != 0 {
					t.Fatalf("a readable table was changed (%d reports)", len(reports()))
				}
				return
			}
			var names []string
			if err := json.Unmarshal([]byte(d.Headers[HeaderUnreadable].(string)), &names); err != nil || !sameSet(names, c.names) {
				t.Fatalf("%s = %v, want %v", HeaderUnreadable, d.Headers[HeaderUnreadable], c.names)
			}
			for k, v := range c.headers {
				switch {
				case k == HeaderUnreadable:
				case contains(c.names, k):
					if b, ok := d.Headers[k].([]byte); !ok || len(b) == 0 {
						t.Errorf("%s: %T, want its encoded bytes", k, d.Headers[k])
					}
				case c.names[0] == HeaderUnreadableRest:
					// Past the first 8190 entries, the rest are in bytes.
				case !reflect.DeepEqual(d.Headers[k], v):
					t.Errorf("%s: %v, want %v unchanged", k, d.Headers[k], v)
				}
			}
			r := reports()
			if len(r) != 1 || !strings.Contains(r[0].reason, c.reason) || r[0].messageID != "m-1" || !r[0].kept || !sameSet(r[0].names, c.names) {
				t.Fatalf("reports %+v, want one naming %v, %q, message m-1", r, c.names, c.reason)
			}
		})
	}
}

// TestFrameFilterStaysWithinFrameMax: an unreadable entry in a content
// header that fills the negotiated frame_max (4096 here): the marker would
// not fit beside the entry's bytes, so they are dropped, and the frame
// still reads.
func TestFrameFilterStaysWithinFrameMax(t *testing.T) {
	t.Parallel()
	const frameMax = 4096
	p := amqp.Publishing{Headers: amqp.Table{"deep": nested(40), "pad": ""}, Body: []byte("body")}
	base := len(encoded(t, p)) + frameOverhead
	p.Headers["pad"] = strings.Repeat("p", frameMax-base)
	hdr := encoded(t, p)
	if len(hdr)+frameOverhead != frameMax {
		t.Fatalf("content header frame of %d bytes, want %d", len(hdr)+frameOverhead, frameMax)
	}
	fc, fb, reports := filtered(t, frameMax)
	d, err := fb.delivered(fc, hdr)
	if err != nil {
		t.Fatalf("through the filter: %v", err)
	}
	if b, ok := d.Headers["deep"].([]byte); !ok || len(b) != 0 || d.Headers["pad"] != p.Headers["pad"] || d.Headers[HeaderUnreadable] != `["deep"]` {
		t.Fatalf("headers %v %q, want deep empty, pad unchanged, the marker", d.Headers["deep"], d.Headers[HeaderUnreadable])
	}
	if r := reports(); len(r) != 1 || r[0].kept {
		t.Fatalf("reports %+v, want one with the values dropped", r)
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, s := range a {
		if !contains(b, s) {
			return false
		}
	}
	return true
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// FuzzReadableHeader: whatever header table bytes a producer got the
// broker to deliver, the filter does not panic, leaves a table amqp091-go
// reads untouched, and otherwise gives a content header whose table
// amqp091-go reads (checkTable, which TestFrameFilterMatchesClientLimits
// holds to amqp091-go's reader), within the frame limit, with the
// properties around it unchanged.
func FuzzReadableHeader(f *testing.F) {
	for _, h := range []amqp.Table{
		{"a": "b"},
		{"deep": nested(33), "ok": int32(1)},
		{"deep": nestedArray(40)},
		{HeaderUnreadable: "x", "deep": []any{nested(32)}},
	} {
		f.Add(encodeTableForFuzz(f, h), 4096)
	}
	f.Add([]byte{1, 'k', 'F', 0, 0, 0, 9}, 4096)    // a table longer than its frame
	f.Add([]byte{1, 'k', 'Z'}, 4096)                // an unknown type
	f.Add([]byte{0, 'A', 0, 0, 0, 2, 'S', 0}, 4096) // a truncated array value
	f.Add([]byte{2, 'k', 'k', 'V', 200, 'x'}, 300)  // a key past the end
	f.Fuzz(func(t *testing.T, table []byte, limit int) {
		limit = max(limit%(1<<17), 64)
		// content-type "ct", the table, delivery-mode 2, message-id "mid".
		p := append([]byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4}, u16(flagContentType|flagHeaders|flagDeliveryMode|flagMessageID)...)
		p = append(p, shortstr("ct")...)
		off := len(p)
		p = append(p, u32(uint32(len(table)))...)
		p = append(p, table...)
		p = append(p, 2)
		p = append(p, shortstr("mid")...)
		out, u, ok := readableHeader(p, limit, nil)
		_, why := checkTable(table, 0)
		if !ok {
			if why != "" {
				t.Fatalf("unreadable table (%s) left alone", why)
			}
			return
		}
		if why == "" {
			t.Fatal("a readable table was rewritten")
		}
		if len(out) > limit && len(out) > len(p) {
			t.Fatalf("rewritten to %d bytes, limit %d, was %d", len(out), limit, len(p))
		}
		n := int(binary.BigEndian.Uint32(out[off : off+4]))
		if off+4+n > len(out) {
			t.Fatalf("table length %d past the end", n)
		}
		if _, why := checkTable(out[off+4:off+4+n], 0); why != "" {
			t.Fatalf("rewritten table still unreadable: %s", why)
		}
		if !bytes.Equal(out[:off], p[:off]) || !bytes.Equal(out[off+4+n:], p[off+4+len(table):]) || u.messageID != "mid" || u.reason == "" {
			t.Fatalf("properties around the table changed, or the report is incomplete: %+v", u)
		}
	})
}

// encodeTableForFuzz returns t as amqp091-go encodes a header table (its
// entries, without the length).
func encodeTableForFuzz(tb testing.TB, t amqp.Table) []byte {
	tb.Helper()
	c, b := startFakeBroker(tb, clientFrameMax, nil)
	f, err := b.headerSent(c, amqp.Publishing{Headers: t})
	if err != nil {
		tb.Fatal(err)
	}
	// class, weight, body size, flags (headers only), then the table.
	return f[7+14+4 : len(f)-1]
}

// readerConn is a net.Conn that reads from r (nothing else is called).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// BenchmarkFrameFilter: the cost of the filter per delivery (basic.deliver,
// a content header with 6 headers, a 200-byte body), read in the 4 KiB
// chunks amqp091-go's buffered reader asks for, against reading the same
// bytes straight.
func BenchmarkFrameFilter(b *testing.B) {
	hdr := encoded(b, amqp.Publishing{ContentType: "application/json", DeliveryMode: 2, MessageId: "0123456789abcdef", Timestamp: time.Now(),
		Headers: amqp.Table{"ackwise-event-id": "0123456789abcdef", "ackwise-key": "customer-42", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-tenant": "acme", "x-attempt": int32(1), "x-flags": []any{"a", "b"}}})
	var one []byte
	frame := func(typ byte, p []byte) {
		one = append(one, typ)
		one = append(one, u16(1)...)
		one = append(one, u32(uint32(len(p)))...)
		one = append(one, p...)
		one = append(one, frameEndOctet)
	}
	deliver := append(append(u16(60), u16(60)...), shortstr("ctag")...)
	deliver = append(append(append(deliver, u64(1)...), 0), shortstr("")...)
	frame(frameMethod, append(deliver, shortstr("orders")...))
	frame(frameHeader, hdr)
	frame(3, bytes.Repeat([]byte("b"), 200))
	const n = 1000
	stream := bytes.Repeat(one, n)
	buf := make([]byte, 4096)
	for _, filtered := range []bool{false, true} {
		b.Run(fmt.Sprintf("filtered=%v", filtered), func(b *testing.B) {
			b.SetBytes(int64(len(one)))
			for i := 0; i < b.N; i += n {
				var r io.Reader = bytes.NewReader(stream)
				if filtered {
					r = newFrameFilter(readerConn{r: r}, clientFrameMax, nil)
				}
				for {
					if _, err := r.Read(buf); err != nil {
						break
					}
				}
			}
		})
	}
}
