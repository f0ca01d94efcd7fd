package rabbitmq

import (
	"math"
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
// per-delivery count, and the x-death history (a string x-death among
// the headers is a producer's) with its x-first-death-* and
// x-last-death-* summaries: the message published anew has been
// dead-lettered nowhere.
// CC and BCC become what RabbitMQ requires of them, an array of strings
// (as a string, the broker refuses the message, closing the channel): one
// routing key per header, every value of a repeated key in order.
func toTable(h ackwise.Headers, orig amqp.Table, extra int) amqp.Table {
	t := make(amqp.Table, len(h)+extra)
	for _, kv := range h {
		if kv.Key == headerDeliveryCount || kv.Key == headerDeath || isDeathHeader(kv.Key) {
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
	if x, ok := v.(uint64); ok {
		return strconv.FormatUint(x, 10), true
	}
	if n, ok := integer(v); ok {
		return strconv.FormatInt(n, 10), true
	}
	return "", false
}

// integer returns v as an int64 when it is an integer of any AMQP width;
// not a string, and not a uint64 beyond int64.
func integer(v any) (int64, bool) {
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
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	}
	return 0, false
}

// Bounds on the counts read from a delivery's headers. A producer sets
// any header it likes (x-death, x-delivery-count and ackwise-attempt
// included), so none of them is taken as it comes (invariant 10).
const (
	// maxAttempt bounds Message.Attempt and the ackwise-attempt taken from
	// a header (ackwise.MaxAttempt): sums of counts saturate at it.
	maxAttempt = ackwise.MaxAttempt
	// maxDeathCount bounds an x-death count: RabbitMQ increments the
	// count of an entry it matches, so a count near MaxInt64 would
	// overflow there. No message was dead-lettered two billion times.
	maxDeathCount = math.MaxInt32
	// maxDeaths bounds the entries of an x-death history: RabbitMQ keeps
	// one per (queue, reason) (its grouping of them is quadratic), and a
	// return from a wait queue carries those of the source's own queues
	// alone: at most a few per queue.
	maxDeaths = 4 * (maxTiers + 1)
)

// death is one entry of an x-death history.
type death struct {
	queue, reason string
	count         int64
}

// Fields of an x-death entry as RabbitMQ writes it, with their AMQP types.
// original-expiration is there only when the message had an expiration.
var deathFields = map[string]func(any) bool{
	"queue":    isString,
	"reason":   isString,
	"exchange": isString,
	"count": func(v any) bool {
		n, ok := integer(v)
		return ok && n >= 0 && n <= maxDeathCount
	},
	"routing-keys": func(v any) bool {
		a, ok := v.([]any)
		if !ok {
			return false
		}
		for _, k := range a {
			if !isString(k) {
				return false
			}
		}
		return true
	},
	"time":                func(v any) bool { _, ok := v.(time.Time); return ok },
	"original-expiration": isString,
}

func isString(v any) bool { _, ok := v.(string); return ok }

// readDeaths returns the entries of the x-death history v, newest first,
// when it is well formed, as RabbitMQ writes it: an array of at most
// maxDeaths tables, each with queue, reason, exchange (strings), count (an
// integer in [0, maxDeathCount]), routing-keys (an array of strings) and
// time (a timestamp), perhaps original-expiration (a string), nothing
// else, and no two for the same queue and reason. A malformed history
// (or none) gives ok false: it is no record of hops, and it is never
// copied onto a message the broker will dead-letter, whose dead-letter
// worker crashes on one (RabbitMQ 3.10's quorum worker, with every quorum
// queue's dead-lettering after it, on an array holding a string or a
// count that is a string).
func readDeaths(v any) (deaths []death, ok bool) {
	a, ok := v.([]any)
	if !ok || len(a) == 0 || len(a) > maxDeaths {
		return nil, false
	}
	deaths = make([]death, 0, len(a))
	for _, e := range a {
		t, ok := e.(amqp.Table)
		if !ok || len(t) < len(deathFields)-1 {
			return nil, false
		}
		for k, v := range t {
			valid, known := deathFields[k]
			if !known || !valid(v) {
				return nil, false
			}
		}
		d := death{}
		var hasQ, hasR, hasE, hasC, hasK, hasT bool
		d.queue, hasQ = t["queue"].(string)
		d.reason, hasR = t["reason"].(string)
		_, hasE = t["exchange"]
		d.count, hasC = integer(t["count"])
		_, hasK = t["routing-keys"]
		_, hasT = t["time"]
		if !hasQ || !hasR || !hasE || !hasC || !hasK || !hasT {
			return nil, false
		}
		for _, o := range deaths {
			if o.queue == d.queue && o.reason == d.reason {
				return nil, false
			}
		}
		deaths = append(deaths, d)
	}
	return deaths, true
}

// returned reports whether a delivery with headers t is a return from one
// of the source's wait queues (waitQueues, the names the topology has;
// none on a plain source): its x-death history is well formed and its
// newest entry says one of those queues dead-lettered it on expiry. It
// returns the history's entries too.
func returned(t amqp.Table, waitQueues []string) ([]death, bool) {
	deaths, ok := readDeaths(t[headerDeath])
	if !ok || deaths[0].reason != "expired" || !slices.Contains(waitQueues, deaths[0].queue) {
		return nil, false
	}
	return deaths, true
}

// attemptOf computes Message.Attempt of a delivery with headers t (see the
// package doc), and whether it is a return from one of waitQueues.
//
// A return counts its hops through the wait queues in its x-death history:
// 1 + their counts, or ackwise-attempt (which Nack sets on the copy it
// moves; it counts retries in place and redeliveries too) when it is at
// least that and at most maxAttempt. Any other delivery is a first
// delivery from a producer, whose ackwise-attempt and x-death say nothing
// ackwise did: attempt 1. Then, on a quorum queue, a redelivery adds its
// x-delivery-count, which the broker writes on redeliveries only (on a
// first delivery the producer's value arrives as it was sent); on a
// classic queue a redelivery adds one. The sums saturate at maxAttempt.
func attemptOf(t amqp.Table, redelivered, quorum bool, waitQueues []string) (attempt int, isReturn bool) {
	n := int64(1)
	deaths, isReturn := returned(t, waitQueues)
	if isReturn {
		for _, d := range deaths {
			if d.reason == "expired" && slices.Contains(waitQueues, d.queue) {
				n = addCapped(n, d.count)
			}
		}
		if a, ok := attemptHeader(t[ackwise.HeaderAttempt]); ok && a >= n {
			n = a
		}
	}
	if redelivered {
		c := int64(1)
		if quorum {
			if dc, ok := integer(t[headerDeliveryCount]); ok && dc >= 1 {
				c = dc
			}
		}
		n = addCapped(n, c)
	}
	return int(n), isReturn
}

// addCapped adds b ≥ 0 to a in [0, maxAttempt], saturating at maxAttempt.
func addCapped(a, b int64) int64 {
	if b > maxAttempt-a {
		return maxAttempt
	}
	return a + b
}

// attemptHeader reads an ackwise-attempt value strictly: an integer, or a
// string of decimal digits alone, in [1, maxAttempt].
func attemptHeader(v any) (int64, bool) {
	n, ok := integer(v)
	if s, isStr := v.(string); isStr {
		if s == "" || len(s) > 7 || strings.Trim(s, "0123456789") != "" {
			return 0, false
		}
		n, _ = strconv.ParseInt(s, 10, 64)
		ok = true
	}
	return n, ok && n >= 1 && n <= maxAttempt
}

// eventIDOf is Message.ID of a delivery with headers h and message-id
// messageID: ackwise-event-id, else the message-id but one the adapter
// made up for a copy of a message without either (anonIDPrefix).
func eventIDOf(h ackwise.Headers, messageID string) string {
	if id := h.Get(ackwise.HeaderEventID); id != "" {
		return id
	}
	if strings.HasPrefix(messageID, anonIDPrefix) {
		return ""
	}
	return messageID
}

// moveTable builds the headers of a copy of a delivery (a wait-queue hop or
// a dead letter): the delivery's own table (non-string values included)
// with the message's string headers laid over it, minus the broker's
// per-delivery x-delivery-count and the CC and BCC routing headers:
// published again, those would also route the copy to every queue they
// name (a retry back to work at once, a dead letter into a live queue).
// RabbitMQ's own dead-lettering drops them for the same reason. The hop
// headers (ackwise-attempt, ackwise-first-failure) are h's alone, strings,
// never the delivery's (nor of its wire type).
//
// The x-death history and its x-first-death-* and x-last-death-* summaries
// are kept only for a return from a wait queue (keepDeaths; its history is
// well formed, see returned), and then only as RabbitMQ writes them: a
// summary that is not a string is left out. On any other delivery they
// are a producer's, and a wait queue's dead-lettering would count and
// carry them on (and crash on a malformed history).
func moveTable(orig amqp.Table, h ackwise.Headers, dropPrefix string, keepDeaths bool) amqp.Table {
	t := make(amqp.Table, len(orig)+len(h)+2)
	for k, v := range orig {
		if dropPrefix != "" && strings.HasPrefix(k, dropPrefix) || ackwise.IsHopHeader(k) {
			continue
		}
		t[k] = v
	}
	for _, kv := range h {
		if dropPrefix != "" && strings.HasPrefix(kv.Key, dropPrefix) || ackwise.IsHopHeader(kv.Key) {
			t[kv.Key] = kv.Value // the message's own, not the delivery's
			continue
		}
		t[kv.Key] = wireValue(orig, kv.Key, kv.Value)
	}
	delete(t, headerDeliveryCount)
	delete(t, headerCC)
	delete(t, headerBCC)
	delete(t, headerDeath)
	for k := range t {
		if isDeathHeader(k) && (!keepDeaths || !isString(orig[k])) {
			delete(t, k)
		}
	}
	if keepDeaths {
		t[headerDeath] = orig[headerDeath]
	}
	return t
}

// deadLetterTable is moveTable for dead letters: envelope headers of an
// earlier dead-lettering are replaced by env's, and credential headers
// (dlq.SecretHeaders) are left out, from the delivery's table too.
func deadLetterTable(orig amqp.Table, h ackwise.Headers, env dlq.Envelope, keepDeaths bool) amqp.Table {
	t := moveTable(orig, env.Apply(h), dlq.HeaderPrefix, keepDeaths)
	for k := range t {
		if dlq.IsSecretHeader(k) {
			delete(t, k)
		}
	}
	return t
}
