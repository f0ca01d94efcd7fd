package rabbitmq

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
)

// TestMoveTableRepeatedKeyKeepsWireType: a header whose value, as Get
// reads it (the last of a repeated key), is the delivery's keeps its wire
// type on the moved copy. With a repeated key, moveTable compared the last
// value with the string an earlier duplicate had just written, not with the
// delivery's value, and turned an unchanged int header into a string.
func TestMoveTableRepeatedKeyKeepsWireType(t *testing.T) {
	t.Parallel()
	orig := amqp.Table{"x-count": int32(5), "x-name": "a"}
	h := fromTable(orig)
	h.Add("x-count", "5") // a repeated key whose last value is unchanged
	h = append(ackwise.Headers{{Key: "x-count", Value: "7"}}, h...)
	if got := h.Get("x-count"); got != "5" {
		t.Fatalf("Get = %q", got)
	}
	out := moveTable(orig, h, "", false)
	if v, ok := out["x-count"].(int32); !ok || v != 5 {
		t.Fatalf("x-count = %#v (%T), want int32(5) as delivered", out["x-count"], out["x-count"])
	}
	// A changed value is written as the string Get returns.
	h.Set("x-count", "9")
	if out := moveTable(orig, h, "", false); out["x-count"] != "9" {
		t.Fatalf("changed x-count = %#v, want \"9\"", out["x-count"])
	}
}
