package rabbitmq

import (
	"math"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
)

// deaths builds an x-death history of well-formed entries, newest first.
func deaths(entries ...amqp.Table) []any {
	a := make([]any, len(entries))
	for i, e := range entries {
		a[i] = e
	}
	return a
}

// with returns a copy of the well-formed entry e with key set to v, or
// removed when v is nil.
func with(e amqp.Table, key string, v any) amqp.Table {
	c := amqp.Table{}
	for k, x := range e {
		c[k] = x
	}
	if v == nil {
		delete(c, key)
	} else {
		c[key] = v
	}
	return c
}

// TestAttemptOf: the attempt of a delivery counts only hops the source's own
// topology made (a return from one of its wait queues, by a well-formed
// x-death whose newest entry names one with reason expired), and
// redeliveries the broker flagged; a producer's ackwise-attempt, x-death and
// x-delivery-count on a first delivery count nothing, and no sum wraps.
func TestAttemptOf(t *testing.T) {
	t.Parallel()
	const w1, w10, work = "q.wait.1s", "q.wait.10s", "q"
	wait := []string{w1, w10}
	ret := func(count int64) amqp.Table { return wellFormedDeath(w1, "expired", count) }
	many := make([]any, maxDeaths+1)
	for i := range many {
		many[i] = wellFormedDeath("other-"+string(rune('a'+i%26))+string(rune('a'+i/26)), "expired", 1)
	}
	many[0] = ret(1)
	for _, c := range []struct {
		name           string
		t              amqp.Table
		redelivered    bool
		quorum         bool
		plain          bool
		want           int
		wantReturned   bool
		wantWellFormed bool
	}{
		{name: "first delivery", t: amqp.Table{}, want: 1},
		{name: "classic redelivery", t: amqp.Table{}, redelivered: true, want: 2},
		{name: "quorum redelivery", t: amqp.Table{headerDeliveryCount: int64(3)}, redelivered: true, quorum: true, want: 4},
		{name: "quorum first delivery, producer's count", t: amqp.Table{headerDeliveryCount: int64(1e9)}, quorum: true, want: 1},
		{name: "quorum redelivery, count a string", t: amqp.Table{headerDeliveryCount: "5"}, redelivered: true, quorum: true, want: 2},
		{name: "quorum redelivery, count negative", t: amqp.Table{headerDeliveryCount: int64(-5)}, redelivered: true, quorum: true, want: 2},
		{name: "quorum redelivery, count MaxInt64", t: amqp.Table{headerDeliveryCount: int64(math.MaxInt64)}, redelivered: true, quorum: true, want: maxAttempt},
		{name: "quorum redelivery, count uint64 max", t: amqp.Table{headerDeliveryCount: uint64(math.MaxUint64)}, redelivered: true, quorum: true, want: 2},
		{name: "classic, producer's delivery count", t: amqp.Table{headerDeliveryCount: int64(1e9)}, redelivered: true, want: 2},
		{name: "producer's attempt", t: amqp.Table{ackwise.HeaderAttempt: "5"}, want: 1},
		{name: "producer's attempt 1e9", t: amqp.Table{ackwise.HeaderAttempt: "1000000000"}, want: 1},
		{name: "producer's attempt MaxInt64", t: amqp.Table{ackwise.HeaderAttempt: int64(math.MaxInt64)}, redelivered: true, want: 2},

		{name: "return", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: "2"}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return without ackwise-attempt", t: amqp.Table{headerDeath: deaths(ret(3))}, want: 4, wantReturned: true, wantWellFormed: true},
		{name: "return, retries in place", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: "7"}, want: 7, wantReturned: true, wantWellFormed: true},
		{name: "return, attempt below its hops", t: amqp.Table{headerDeath: deaths(ret(4)), ackwise.HeaderAttempt: "2"}, want: 5, wantReturned: true, wantWellFormed: true},
		{name: "return, attempt an int", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: int32(3)}, want: 3, wantReturned: true, wantWellFormed: true},
		{name: "return, attempt 1e9", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: "1000000000"}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return, attempt MaxInt64", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: int64(math.MaxInt64)}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return, attempt +3", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: "+3"}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return, attempt -3", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: "-3"}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return, attempt ' 3'", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: " 3"}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return, attempt 0x3", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: "0x3"}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return, attempt empty", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: ""}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return, attempt a float", t: amqp.Table{headerDeath: deaths(ret(1)), ackwise.HeaderAttempt: 3.0}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return through two tiers", t: amqp.Table{headerDeath: deaths(wellFormedDeath(w10, "expired", 2), ret(3))}, want: 6, wantReturned: true, wantWellFormed: true},
		{name: "return, counts saturate", t: amqp.Table{headerDeath: deaths(wellFormedDeath(w10, "expired", maxDeathCount), ret(maxDeathCount))}, want: maxAttempt, wantReturned: true, wantWellFormed: true},
		{name: "return, the work queue's entry not counted", t: amqp.Table{headerDeath: deaths(ret(1), wellFormedDeath(work, "rejected", 1e9))}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return, a wait queue's other reason not counted", t: amqp.Table{headerDeath: deaths(ret(1), wellFormedDeath(w10, "rejected", 1e9))}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return, quorum redelivery", t: amqp.Table{headerDeath: deaths(ret(2)), ackwise.HeaderAttempt: "3", headerDeliveryCount: int64(2)}, redelivered: true, quorum: true, want: 5, wantReturned: true, wantWellFormed: true},
		{name: "return, original-expiration", t: amqp.Table{headerDeath: deaths(with(ret(1), "original-expiration", "60000"))}, want: 2, wantReturned: true, wantWellFormed: true},
		{name: "return, count an int32", t: amqp.Table{headerDeath: deaths(with(ret(1), "count", int32(2)))}, want: 3, wantReturned: true, wantWellFormed: true},

		{name: "newest entry the work queue", t: amqp.Table{headerDeath: deaths(wellFormedDeath(work, "rejected", 1e9), ret(1)), ackwise.HeaderAttempt: "1000000000"}, want: 1, wantWellFormed: true},
		{name: "newest entry a wait queue, rejected", t: amqp.Table{headerDeath: deaths(wellFormedDeath(w1, "rejected", 1e9))}, want: 1, wantWellFormed: true},
		{name: "newest entry a wait-queue-like name", t: amqp.Table{headerDeath: deaths(wellFormedDeath("q.wait.7s", "expired", 1e9))}, want: 1, wantWellFormed: true},
		{name: "newest entry a prefix of a wait queue", t: amqp.Table{headerDeath: deaths(wellFormedDeath("q.wait.1", "expired", 1e9))}, want: 1, wantWellFormed: true},
		{name: "plain source", t: amqp.Table{headerDeath: deaths(ret(5)), ackwise.HeaderAttempt: "6"}, plain: true, want: 1, wantWellFormed: true},

		{name: "x-death an array of a string", t: amqp.Table{headerDeath: []any{"s"}, ackwise.HeaderAttempt: "9"}, want: 1},
		{name: "x-death a string", t: amqp.Table{headerDeath: "s"}, want: 1},
		{name: "x-death a table", t: amqp.Table{headerDeath: ret(1)}, want: 1},
		{name: "x-death empty", t: amqp.Table{headerDeath: []any{}}, want: 1},
		{name: "x-death nil entry", t: amqp.Table{headerDeath: []any{nil}}, want: 1},
		{name: "count a string", t: amqp.Table{headerDeath: deaths(with(ret(1), "count", "x"))}, want: 1},
		{name: "count negative", t: amqp.Table{headerDeath: deaths(ret(-1))}, want: 1},
		{name: "count over the bound", t: amqp.Table{headerDeath: deaths(ret(maxDeathCount + 1))}, want: 1},
		{name: "count MaxInt64", t: amqp.Table{headerDeath: deaths(ret(math.MaxInt64))}, want: 1},
		{name: "count a float", t: amqp.Table{headerDeath: deaths(with(ret(1), "count", 1.0))}, want: 1},
		{name: "count uint64 over int64", t: amqp.Table{headerDeath: deaths(with(ret(1), "count", uint64(math.MaxUint64)))}, want: 1},
		{name: "queue bytes", t: amqp.Table{headerDeath: deaths(with(ret(1), "queue", []byte(w1)))}, want: 1},
		{name: "reason missing", t: amqp.Table{headerDeath: deaths(with(ret(1), "reason", nil))}, want: 1},
		{name: "time missing", t: amqp.Table{headerDeath: deaths(with(ret(1), "time", nil))}, want: 1},
		{name: "time a string", t: amqp.Table{headerDeath: deaths(with(ret(1), "time", "now"))}, want: 1},
		{name: "routing-keys a string", t: amqp.Table{headerDeath: deaths(with(ret(1), "routing-keys", w1))}, want: 1},
		{name: "routing-keys holding an int", t: amqp.Table{headerDeath: deaths(with(ret(1), "routing-keys", []any{w1, int64(1)}))}, want: 1},
		{name: "an unknown field", t: amqp.Table{headerDeath: deaths(with(ret(1), "x-extra", "v"))}, want: 1},
		{name: "a nested table", t: amqp.Table{headerDeath: deaths(with(ret(1), "exchange", amqp.Table{"a": amqp.Table{}}))}, want: 1},
		{name: "two entries for one queue and reason", t: amqp.Table{headerDeath: deaths(ret(1), ret(1))}, want: 1},
		{name: "too many entries", t: amqp.Table{headerDeath: many}, want: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			wq := wait
			if c.plain {
				wq = nil
			}
			got, isReturn := attemptOf(c.t, c.redelivered, c.quorum, wq)
			if got != c.want || isReturn != c.wantReturned {
				t.Errorf("attemptOf = %d, return %v; want %d, %v", got, isReturn, c.want, c.wantReturned)
			}
			if _, ok := readDeaths(c.t[headerDeath]); ok != c.wantWellFormed {
				t.Errorf("x-death read as well formed: %v, want %v", ok, c.wantWellFormed)
			}
		})
	}
}

// TestMoveTableDeathHeaders: a copy of a first delivery (wait hop or dead
// letter) carries none of a producer's x-death, x-first-death-* and
// x-last-death-*, nor its ackwise-attempt: the hop headers are those the
// source sets. A copy of a return keeps the history as the broker wrote
// it, its string summaries, and drops a summary of another type.
func TestMoveTableDeathHeaders(t *testing.T) {
	t.Parallel()
	forged := amqp.Table{
		headerDeath:              []any{"s"},
		"x-first-death-queue":    "q.wait.1s",
		"x-last-death-reason":    "expired",
		ackwise.HeaderAttempt:    "1000000000",
		"ackwise-first-failure":  "1970-01-01T00:00:00Z",
		headerDeliveryCount:      int64(1e9),
		"x-tenant":               "acme",
		"x-first-death-exchange": amqp.Table{"a": "b"},
	}
	msg := &ackwise.Message{Headers: fromTable(forged), FirstFailure: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	got := moveTable(forged, hopHeaders(msg, 2), "", false)
	want := amqp.Table{"x-tenant": "acme", ackwise.HeaderAttempt: "2", ackwise.HeaderFirstFailure: "2026-01-02T03:04:05Z"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("copy of a first delivery: %v, want %v", got, want)
	}

	history := deaths(wellFormedDeath("q.wait.1s", "expired", 1))
	ret := amqp.Table{
		headerDeath:              history,
		"x-first-death-queue":    "q.wait.1s",
		"x-first-death-reason":   "expired",
		"x-first-death-exchange": int64(1),
		ackwise.HeaderAttempt:    "2",
	}
	msg = &ackwise.Message{Headers: fromTable(ret), Attempt: 2, FirstFailure: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	got = moveTable(ret, hopHeaders(msg, 3), "", true)
	want = amqp.Table{
		headerDeath:                history,
		"x-first-death-queue":      "q.wait.1s",
		"x-first-death-reason":     "expired",
		ackwise.HeaderAttempt:      "3",
		ackwise.HeaderFirstFailure: "2026-01-02T03:04:05Z",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("copy of a return: %v, want %v", got, want)
	}
}

// TestSinkDropsDeathHeaders: a handler forwarding a delivery's headers
// through a Sink publishes no x-death, also when a producer sent it as a
// string (a scalar header the message carries).
func TestSinkDropsDeathHeaders(t *testing.T) {
	t.Parallel()
	h := ackwise.HeadersOf(headerDeath, "s", "x-first-death-queue", "q", "x-tenant", "acme")
	if got := toTable(h, nil, 0); !reflect.DeepEqual(got, amqp.Table{"x-tenant": "acme"}) {
		t.Errorf("sink table %v", got)
	}
}
