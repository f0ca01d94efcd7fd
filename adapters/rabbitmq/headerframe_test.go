package rabbitmq

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// TestHeaderFrameSizeMatchesClient: headerFrameSize is the size of the
// content header frame amqp091-go writes (captured over a fake broker),
// for every property and every header value type; what amqp091-go cannot
// write, headerFrameSize refuses too.
func TestHeaderFrameSizeMatchesClient(t *testing.T) {
	t.Parallel()
	ts := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	every := amqp.Table{
		"bool": true, "byte": byte(7), "int8": int8(-7), "int16": int16(-300), "uint16": uint16(300),
		"int": 70000, "int32": int32(-70000), "uint32": uint32(70000), "float32": float32(1.5),
		"int64": int64(1 << 40), "float64": 2.5, "time": ts, "decimal": amqp.Decimal{Scale: 2, Value: 12345},
		"string": "héllo", "empty": "", "bytes": []byte{0, 1, 2}, "nil": nil,
		"array":                  []any{"a", int32(1), nil, []any{true}, amqp.Table{"k": "v"}},
		"table":                  amqp.Table{"inner": amqp.Table{"x": int64(1)}, "arr": []any{}},
		"":                       "empty key",
		strings.Repeat("k", 255): "longest key",
	}
	for _, c := range []struct {
		name string
		p    amqp.Publishing
		bad  bool // amqp091-go cannot write it
	}{
		{"no properties", amqp.Publishing{}, false},
		{"every property", amqp.Publishing{
			ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 9,
			CorrelationId: "corr", ReplyTo: "reply", Expiration: "60000", MessageId: strings.Repeat("m", 255),
			Timestamp: ts, Type: "order.created", UserId: "guest", AppId: "ackwise",
		}, false},
		{"every header type", amqp.Publishing{Headers: every, MessageId: "m"}, false},
		{"empty table", amqp.Publishing{Headers: amqp.Table{}}, false},
		{"big header", amqp.Publishing{Headers: amqp.Table{"big": strings.Repeat("b", 130_500)}}, false},
		{"message-id of 256 bytes", amqp.Publishing{MessageId: strings.Repeat("m", 256)}, true},
		{"header name of 256 bytes", amqp.Publishing{Headers: amqp.Table{strings.Repeat("k", 256): "v"}}, true},
		{"uint64 header", amqp.Publishing{Headers: amqp.Table{"n": uint64(1)}}, true},
		{"map header", amqp.Publishing{Headers: amqp.Table{"m": map[string]any{"a": "b"}}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, err := headerFrameSize(&c.p)
			fc, fb := startFakeBroker(t, 1<<20, nil)
			frame, werr := fb.headerSent(fc, c.p)
			if c.bad {
				if err == nil || werr == nil {
					t.Fatalf("headerFrameSize: %v; amqp091-go writes it: %v; want both to refuse", err, werr)
				}
				return
			}
			if err != nil || werr != nil {
				t.Fatalf("headerFrameSize: %v; amqp091-go: %v", err, werr)
			}
			if got != len(frame) {
				t.Fatalf("headerFrameSize %d, amqp091-go wrote %d bytes", got, len(frame))
			}
		})
	}
}

// TestTrimToFit: a copy whose headers do not fit loses its largest
// headers, not the ones it keeps, and names them in HeaderTrimmed after
// an earlier trim's; what amqp091-go then writes fits frame_max; a copy
// that fits is left alone; one too large without its headers fails with
// ErrHeadersTooLarge.
func TestTrimToFit(t *testing.T) {
	t.Parallel()
	const frameMax = 131072
	keep := keepOnDeadLetter
	env := func() amqp.Table {
		return amqp.Table{
			ackwise.HeaderEventID: "e-1", dlq.HeaderReason: "permanent", dlq.HeaderError: strings.Repeat("e", 1024),
			"x-tenant": "acme",
		}
	}
	check := func(t *testing.T, p amqp.Publishing) {
		t.Helper()
		fc, fb := startFakeBroker(t, 1<<20, nil)
		frame, err := fb.headerSent(fc, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(frame) > frameMax {
			t.Fatalf("trimmed copy's content header frame is %d bytes, frame_max %d", len(frame), frameMax)
		}
	}

	t.Run("fits", func(t *testing.T) {
		p := amqp.Publishing{Headers: env()}
		before := p.Headers
		if names, err := trimToFit(&p, frameMax, keep); err != nil || names != nil || len(p.Headers) != len(before) {
			t.Fatalf("a copy that fits: removed %v, %v", names, err)
		}
	})
	t.Run("largest first", func(t *testing.T) {
		h := env()
		h["big"] = strings.Repeat("b", 130_500)
		h["medium"] = []byte(strings.Repeat("m", 600))
		p := amqp.Publishing{Headers: h, MessageId: "m-1", Body: []byte("payload")}
		names, err := trimToFit(&p, frameMax, keep)
		if err != nil || fmt.Sprint(names) != "[big]" {
			t.Fatalf("removed %v, %v; want [big]", names, err)
		}
		if p.Headers[HeaderTrimmed] != `["big"]` || p.Headers["medium"] == nil || p.Headers[dlq.HeaderError] == nil || h["big"] == nil {
			t.Fatalf("headers after the trim: %v (the caller's table changed: %v)", p.Headers[HeaderTrimmed], h["big"] == nil)
		}
		check(t, p)
	})
	t.Run("several, after an earlier trim", func(t *testing.T) {
		h := env()
		h[HeaderTrimmed] = `["earlier"]`
		for i := range 5 {
			h[fmt.Sprintf("h%d", i)] = strings.Repeat("v", 30_000+i)
		}
		p := amqp.Publishing{Headers: h}
		names, err := trimToFit(&p, frameMax, keep)
		if err != nil || fmt.Sprint(names) != "[h4]" {
			t.Fatalf("removed %v, %v; want the largest, h4", names, err)
		}
		var list []string
		if err := json.Unmarshal([]byte(p.Headers[HeaderTrimmed].(string)), &list); err != nil || fmt.Sprint(list) != "[earlier h4]" {
			t.Fatalf("%s = %v", HeaderTrimmed, p.Headers[HeaderTrimmed])
		}
		check(t, p)
	})
	t.Run("kept ones last", func(t *testing.T) {
		h := env()
		h[dlq.HeaderSource] = strings.Repeat("s", 131_000)
		p := amqp.Publishing{Headers: h}
		names, err := trimToFit(&p, frameMax, keep)
		if err != nil || len(names) != 2 || names[0] != "x-tenant" || names[1] != dlq.HeaderSource {
			t.Fatalf("removed %v, %v; want x-tenant, then the kept header too large to keep", names, err)
		}
		check(t, p)
	})
	t.Run("many names", func(t *testing.T) {
		h := amqp.Table{}
		for i := range 3000 {
			h[fmt.Sprintf("header-%04d", i)] = strings.Repeat("v", 40)
		}
		p := amqp.Publishing{Headers: h}
		names, err := trimToFit(&p, 65536, keep)
		if err != nil {
			t.Fatal(err)
		}
		m := p.Headers[HeaderTrimmed].(string)
		var list []string
		if err := json.Unmarshal([]byte(m), &list); err != nil || len(m) > maxTrimmedList || !strings.HasPrefix(list[len(list)-1], "…and ") {
			t.Fatalf("%d removed; %s = %q (%d bytes)", len(names), HeaderTrimmed, m, len(m))
		}
		if size, _ := headerFrameSize(&p); size > 65536 {
			t.Fatalf("%d bytes after the trim", size)
		}
	})
	t.Run("too large without headers", func(t *testing.T) {
		p := amqp.Publishing{Headers: amqp.Table{"a": "b"}, MessageId: strings.Repeat("m", 255), Type: strings.Repeat("t", 255)}
		if _, err := trimToFit(&p, frameMinSize/8, keep); !errors.Is(err, ErrHeadersTooLarge) {
			t.Fatalf("%v, want ErrHeadersTooLarge", err)
		}
	})
}
