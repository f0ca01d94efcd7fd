package kafka

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// TestInPlaceWaitDetachesPayload: a message retried in place does not keep
// the fetch it came from alive while it waits. Its Payload points into the
// fetch on the first attempt; from the first wait on it is a copy of its
// own (Source.Detach, called by the engine), made once.
func TestInPlaceWaitDetachesPayload(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 50, func(int) string { return "k" })
	type seen struct {
		data    *byte
		payload []byte
	}
	got := make(chan seen, 3)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID != "ev-7" {
			return nil
		}
		got <- seen{unsafe.SliceData(m.Payload), bytes.Clone(m.Payload)}
		if m.Attempt < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	runConsumer(t, openSource(t, cfg), h, consumer.Config{RetryMode: consumer.RetryInPlace,
		Retry: retry.Policy{MaxAttempts: 5, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Jitter: retry.NoJitter}})
	var runs [3]seen
	for i := range runs {
		select {
		case runs[i] = <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("ev-7 ran %d times, want 3", i)
		}
	}
	for i, r := range runs {
		if string(r.payload) != "7" {
			t.Fatalf("attempt %d: payload %q, want %q", i+1, r.payload, "7")
		}
	}
	if runs[1].data == runs[0].data {
		t.Fatal("attempt 2 ran on the fetch's bytes: the wait kept the fetch alive")
	}
	if runs[2].data != runs[1].data {
		t.Fatal("attempt 3 ran on another copy: the payload was copied on every wait, not once")
	}
}

// TestBreakerHoldDetachesPayload: the messages the open breaker holds do
// not keep their fetches alive either. Two keys fail at once and open the
// breaker (Threshold 2); whichever failed second is held by the breaker,
// the other waits in place; both run again on bytes of their own.
func TestBreakerHoldDetachesPayload(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 2, func(i int) string { return "k" + strconv.Itoa(i) })
	var mu sync.Mutex
	runs := map[string][]*byte{}
	again := make(chan string, 2)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		runs[m.ID] = append(runs[m.ID], unsafe.SliceData(m.Payload))
		n := len(runs[m.ID])
		mu.Unlock()
		if n == 1 {
			return errors.New("dependency down")
		}
		again <- m.ID
		return nil
	})
	runConsumer(t, openSource(t, cfg), h, consumer.Config{Concurrency: 2, RetryMode: consumer.RetryInPlace,
		Breaker: &consumer.Breaker{Threshold: 2, ProbeInterval: time.Millisecond},
		Retry:   retry.Policy{MaxAttempts: 5, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Jitter: retry.NoJitter}})
	for range 2 {
		select {
		case <-again:
		case <-time.After(10 * time.Second):
			t.Fatal("the failed messages did not run again")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for id, r := range runs {
		if r[1] == r[0] {
			t.Errorf("%s ran again on the fetch's bytes: its wait kept the fetch alive", id)
		}
	}
}

// TestShareInPlaceWaitDetachesPayload: on a share group, where retries
// always wait in place, a waiting record keeps neither its fetch's payload
// (a copy of its own from the first wait on) nor its record's bytes (the
// record stays for its acknowledgement); its dead letter still carries the
// payload byte for byte.
func TestShareInPlaceWaitDetachesPayload(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	in := publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })[0]
	src := openShare(t, cfg)
	type seen struct {
		data      *byte
		recordVal []byte
	}
	got := make(chan seen, 2)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		got <- seen{unsafe.SliceData(m.Payload), m.Handle.(*shareReceipt).r.Value}
		if m.Attempt == 1 {
			return errors.New("dependency down")
		}
		return ackwise.Permanent(errors.New("bad payload"))
	})
	log := make(outcomeLog, 16)
	runShareConsumer(t, src, h, consumer.Config{Concurrency: 1, MaxInFlight: 1, Observer: log,
		Retry: retry.Policy{MaxAttempts: 5, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Jitter: retry.NoJitter}})
	for _, want := range []consumer.Outcome{consumer.Retried, consumer.DeadLettered} {
		if o := awaitOutcome(t, log); o != want {
			t.Fatalf("outcome %v, want %v", o, want)
		}
	}
	first, second := <-got, <-got
	if first.recordVal == nil || second.recordVal != nil {
		t.Fatalf("record value %q on the first run, %q on the second: want the record's bytes let go after the wait", first.recordVal, second.recordVal)
	}
	if second.data == first.data {
		t.Fatal("the second run read the fetch's bytes: the wait kept the fetch alive")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dls := readAll(ctx, t, brokers, src.cfg.DeadLetterTopic)
	if len(dls) != 1 || !bytes.Equal(dls[0].Value, in.Payload) {
		t.Fatalf("dead letters %v: want one with the payload %q", dls, in.Payload)
	}
}
