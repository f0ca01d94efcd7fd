package rabbitmq

import (
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// HeaderKey carries Message.Key on the wire: AMQP has no message key of its
// own, and the routing key is the queue name on the default exchange.
const HeaderKey = ackwise.HeaderKey

// Broker headers ackwise reads.
const (
	headerDeliveryCount = "x-delivery-count"
	headerDeath         = "x-death"
	// CC and BCC are RabbitMQ's sender-selected distribution: extra routing
	// keys the broker routes a publish to. A delivery keeps CC.
	headerCC  = "CC"
	headerBCC = "BCC"
)

// toTable encodes headers as an AMQP table of strings, but for a header
// whose value is that of the same key in orig (the table of the delivery
// the message came from, or nil): it keeps orig's value and so its wire
// type (an int header stays an int). Of a repeated key the last value wins.
// It leaves out what a message copied from a delivery (a redriven dead
// letter) carries of that delivery alone: x-delivery-count, the broker's
// per-delivery count, which a quorum queue would add to the message's
// attempts (attemptOf) on its first delivery, and the x-first-death-* and
// x-last-death-* summaries of an x-death history the copy does not carry.
// CC and BCC become what RabbitMQ requires of them, an array of strings
// (as a string, the broker refuses the message, closing the channel): one
// routing key per header, every value of a repeated key in order.
func toTable(h ackwise.Headers, orig amqp.Table, extra int) amqp.Table {
	t := make(amqp.Table, len(h)+extra)
	for _, kv := range h {
		if kv.Key == headerDeliveryCount || isDeathHeader(kv.Key) {
			continue
		}
		if kv.Key == headerCC || kv.Key == headerBCC {
			keys, _ := t[kv.Key].([]any)
			t[kv.Key] = append(keys, kv.Value)
			continue
		}
		t[kv.Key] = wireValue(orig, kv.Key, kv.Value)
	}
	return t
}

// wireValue is the value to send for header key with string value v: orig's
// value of key when it reads as v (its wire type kept: an int header stays
// an int), else v. Compare with the delivery's table, not with the one
// being built: of a repeated key the last value wins, and an earlier one
// may have been written already.
func wireValue(orig amqp.Table, key, v string) any {
	if ov, ok := orig[key]; ok {
		if s, ok := scalarString(ov); ok && s == v {
			return ov
		}
	}
	return v
}

// isDeathHeader reports whether key is one of RabbitMQ's summaries of a
// message's dead-letterings (x-first-death-*, x-last-death-*), which go
// with its x-death history.
func isDeathHeader(key string) bool {
	return strings.HasPrefix(key, "x-first-death-") || strings.HasPrefix(key, "x-last-death-")
}

// fromTable decodes the scalar entries of t into string headers. Tables and
// arrays (x-death) stay only on the wire copy the receipt keeps, which moves
// and dead letters carry forward unchanged. An AMQP table has no order: the
// headers come sorted by key.
func fromTable(t amqp.Table) ackwise.Headers {
	h := make(ackwise.Headers, 0, len(t))
	for k, v := range t {
		if s, ok := scalarString(v); ok {
			h = append(h, ackwise.Header{Key: k, Value: s})
		}
	}
	slices.SortFunc(h, func(a, b ackwise.Header) int { return strings.Compare(a.Key, b.Key) })
	return h
}

func scalarString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	case bool:
		return strconv.FormatBool(x), true
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), true
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), true
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano), true
	case amqp.Decimal:
		return strconv.FormatInt(int64(x.Value), 10) + "e-" + strconv.Itoa(int(x.Scale)), true
	}
	if n, ok := intOf(v); ok {
		return strconv.FormatInt(n, 10), true
	}
	return "", false
}

func intOf(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		return int64(x), true
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// attemptOf computes Message.Attempt of a delivery (see the package doc):
// the ackwise-attempt header (set by Nack on the copy it moves to a wait
// queue), else 1 plus the x-death counts of hops through the work queue and
// its wait queues; then, on a quorum queue, plus x-delivery-count; on a
// classic queue, plus one when the redelivered flag is set.
func attemptOf(t amqp.Table, redelivered, quorum bool, queue string) int {
	base := 0
	if n, ok := intOf(t[ackwise.HeaderAttempt]); ok && n > 0 {
		base = int(n)
	} else {
		base = 1 + deathCount(t[headerDeath], queue)
	}
	if quorum {
		if n, ok := intOf(t[headerDeliveryCount]); ok {
			if n > 0 {
				base += int(n)
			}
			return base
		}
	}
	if redelivered {
		base++
	}
	return base
}

// deathCount sums the x-death counts of queue and its wait queues.
func deathCount(v any, queue string) int {
	deaths, ok := v.([]any)
	if !ok {
		return 0
	}
	prefix := queue + ".wait."
	total := 0
	for _, d := range deaths {
		t, ok := d.(amqp.Table)
		if !ok {
			continue
		}
		q, _ := t["queue"].(string)
		if q != queue && !strings.HasPrefix(q, prefix) {
			continue
		}
		if n, ok := intOf(t["count"]); ok && n > 0 {
			total += int(n)
		}
	}
	return total
}

// moveTable builds the headers of a copy of a delivery (a wait-queue hop or
// a dead letter): the delivery's own table (x-death and non-string values
// included) with the message's string headers laid over it, minus the
// broker's per-delivery x-delivery-count and the CC and BCC routing
// headers: published again, those would also route the copy to every queue
// they name (a retry back to work at once, a dead letter into a live queue).
// RabbitMQ's own dead-lettering drops them for the same reason.
func moveTable(orig amqp.Table, h ackwise.Headers, dropPrefix string) amqp.Table {
	t := make(amqp.Table, len(orig)+len(h)+2)
	for k, v := range orig {
		if dropPrefix != "" && strings.HasPrefix(k, dropPrefix) {
			continue
		}
		t[k] = v
	}
	for _, kv := range h {
		if dropPrefix != "" && strings.HasPrefix(kv.Key, dropPrefix) {
			t[kv.Key] = kv.Value // the message's own, not the delivery's
			continue
		}
		t[kv.Key] = wireValue(orig, kv.Key, kv.Value)
	}
	delete(t, headerDeliveryCount)
	delete(t, headerCC)
	delete(t, headerBCC)
	return t
}

// deadLetterTable is moveTable for dead letters: envelope headers of an
// earlier dead-lettering are replaced by env's, and credential headers
// (dlq.SecretHeaders) are left out, from the delivery's table too.
func deadLetterTable(orig amqp.Table, h ackwise.Headers, env dlq.Envelope) amqp.Table {
	t := moveTable(orig, env.Apply(h), dlq.HeaderPrefix)
	for k := range t {
		if dlq.IsSecretHeader(k) {
			delete(t, k)
		}
	}
	return t
}
