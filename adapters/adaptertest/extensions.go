package adaptertest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// The cases below check the optional parts a source declares in its
// Extensions, each only where it is declared: a source that leaves one nil
// skips its case.

// declared opens a fixture shaped by cfg and a source on it, and skips t,
// saying why (because), unless the source declares the extension named
// part, as has tells.
func (h Harness) declared(t *testing.T, cfg FixtureConfig, part string, has func(adapters.Extensions) bool, because string) (Fixture, adapters.Source, adapters.Extensions) {
	t.Helper()
	f := h.Open(t, cfg)
	src := f.NewSource(t)
	ext := src.Extensions()
	if !has(ext) {
		t.Skipf("the source declares no %s (Extensions.%s nil): %s, nothing to check", part, part, because)
	}
	return f, src, ext
}

// snapshot is a copy of m that shares no memory with it (Handle aside).
func snapshot(m *ackwise.Message) ackwise.Message {
	cp := *m
	cp.Payload = bytes.Clone(m.Payload)
	cp.Headers = m.Headers.Clone()
	return cp
}

// changed names the fields of m that differ from was, Handle aside (a
// receipt need not be comparable; settling m shows it is intact).
func changed(was ackwise.Message, m *ackwise.Message) []string {
	var d []string
	add := func(field string, differs bool) {
		if differs {
			d = append(d, field)
		}
	}
	add("ID", was.ID != m.ID)
	add("Key", was.Key != m.Key)
	add("Payload", !bytes.Equal(was.Payload, m.Payload))
	add("Headers", !slices.Equal(was.Headers, m.Headers))
	add("Source", was.Source != m.Source)
	add("Partition", was.Partition != m.Partition)
	add("Offset", was.Offset != m.Offset)
	add("BrokerID", was.BrokerID != m.BrokerID)
	add("Attempt", was.Attempt != m.Attempt)
	add("PublishedAt", !was.PublishedAt.Equal(m.PublishedAt))
	add("FirstFailure", !was.FirstFailure.Equal(m.FirstFailure))
	return d
}

// requirePublished fails t unless m carries what the message of the same ID
// in sent carried.
func requirePublished(t *testing.T, m *ackwise.Message, sent []*ackwise.Message) {
	t.Helper()
	for _, want := range sent {
		if want.ID != m.ID {
			continue
		}
		if m.Key != want.Key || !bytes.Equal(m.Payload, want.Payload) || m.Headers.Get("x-seq") != want.Headers.Get("x-seq") {
			t.Fatalf("delivery of %s: key %q payload %q x-seq %q, want %q %q %q", m.ID, m.Key, m.Payload, m.Headers.Get("x-seq"), want.Key, want.Payload, want.Headers.Get("x-seq"))
		}
		return
	}
	t.Fatalf("received %s, not one of the messages published", m.ID)
}

// testRecycler checks Recycle where the source declares it: a message
// recycled once settled may be handed out again, as a later delivery that
// carries its own record whole, while the messages still in flight keep
// every field and still settle; a message the source did not deliver is
// ignored, never handed out.
func testRecycler(t *testing.T, h Harness) {
	f, src, ext := h.declared(t, FixtureConfig{Lease: 5 * time.Second}, "Recycler", func(e adapters.Extensions) bool { return e.Recycler != nil },
		"it hands out new messages only")
	rc := ext.Recycler
	in := batch(6, 6)
	h.publish(t, f, in[:2])
	kept, done := h.receiveOne(t, src), h.receiveOne(t, src)
	requirePublished(t, kept, in[:2])
	requirePublished(t, done, in[:2])
	was := snapshot(kept)
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	if err := src.Ack(ctx, done); err != nil {
		t.Fatalf("ack: %v", err)
	}
	foreign := &ackwise.Message{ID: "not-delivered", Payload: []byte("mine")}
	rc.Recycle(done, foreign)
	h.publish(t, f, in[2:])
	reused := false
	for range in[2:] {
		m := h.receiveOne(t, src)
		switch m {
		case foreign:
			t.Fatal("the source handed out a message it did not deliver, recycled by someone else")
		case kept:
			t.Fatalf("the source handed out %s again while it was in flight (not recycled)", was.ID)
		case done:
			reused = true
		}
		requirePublished(t, m, in[2:])
		if err := src.Ack(ctx, m); err != nil {
			t.Fatalf("ack of %s: %v", m.ID, err)
		}
	}
	if d := changed(was, kept); len(d) > 0 {
		t.Fatalf("%s, in flight while other messages were recycled and handed out, changed: %v", was.ID, d)
	}
	if err := src.Ack(ctx, kept); err != nil {
		t.Fatalf("ack of %s, in flight while other messages were recycled: %v", was.ID, err)
	}
	if foreign.ID != "not-delivered" || string(foreign.Payload) != "mine" {
		t.Fatalf("Recycle changed a message the source did not deliver: %+v", foreign)
	}
	if !reused {
		t.Logf("the recycled message was not handed out again within %d deliveries (allowed: Recycle lets the source reuse it, it need not)", len(in)-2)
	}
}

// testBatchAck checks AckBatch where the source declares it: it acks like
// Ack, reports per message (a second ack of the same delivery fails as Ack
// would, beside one that succeeds), a settle after it fails, and what it
// acked is not delivered again after a restart.
func testBatchAck(t *testing.T, h Harness) {
	f, src, ext := h.declared(t, FixtureConfig{Lease: time.Second}, "BatchAcker", func(e adapters.Extensions) bool { return e.BatchAcker != nil },
		"it acks one message at a time")
	acker := ext.BatchAcker
	in := batch(4, 1)
	h.publish(t, f, in[:3])
	got := []*ackwise.Message{h.receiveOne(t, src), h.receiveOne(t, src), h.receiveOne(t, src)}
	for i, m := range got {
		if m.ID != in[i].ID {
			t.Fatalf("received %s at %d, want %s", m.ID, i, in[i].ID)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	errs := make([]error, 2)
	acker.AckBatch(ctx, got[:2], errs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("AckBatch: message %d: %v", i, err)
		}
	}
	if err := src.Release(ctx, got[1]); err == nil {
		t.Errorf("Release of %s after AckBatch acked it: nil, want an error", got[1].ID)
	}
	errs = []error{nil, errors.New("not set")}
	acker.AckBatch(ctx, []*ackwise.Message{got[0], got[2]}, errs)
	if errs[0] == nil {
		t.Fatal("AckBatch of a message acked before: no error, want the one Ack returns")
	}
	if errs[1] != nil {
		t.Fatalf("AckBatch: third message: %v", errs[1])
	}
	if err := src.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	// After a restart the next delivery is a message published after the
	// acked ones: none of them comes back.
	h.publish(t, f, in[3:])
	if next := h.receiveOne(t, f.NewSource(t)); next.ID != in[3].ID {
		t.Fatalf("after the restart received %s, want %s (acked messages came back)", next.ID, in[3].ID)
	}
}

// testDetacher checks Detach where the source declares it: the payload
// keeps its bytes in memory of its own (no longer the memory it pointed
// into), every other field stays as it was, and the message still settles;
// a second Detach changes nothing, and a message the source did not deliver
// is left alone. So are the other deliveries.
func testDetacher(t *testing.T, h Harness) {
	f, src, ext := h.declared(t, FixtureConfig{Lease: 5 * time.Second}, "Detacher", func(e adapters.Extensions) bool { return e.Detacher != nil },
		"its payloads share no memory with other records")
	d := ext.Detacher
	in := batch(2, 2)
	in[0].Payload = bytes.Repeat([]byte("detach me "), 100)
	h.publish(t, f, in)
	a, b := h.receiveOne(t, src), h.receiveOne(t, src)
	requirePublished(t, a, in)
	requirePublished(t, b, in)
	m, other := a, b
	if b.ID == in[0].ID {
		m, other = b, a
	}
	was, wasOther := snapshot(m), snapshot(other)
	before := m.Payload
	d.Detach(m)
	if c := changed(was, m); len(c) > 0 {
		t.Fatalf("Detach changed %v of %s, want its payload's bytes and every other field kept", c, was.ID)
	}
	if len(m.Payload) > 0 && &m.Payload[0] == &before[0] {
		t.Fatalf("after Detach the payload of %s is still in the memory it was delivered in", was.ID)
	}
	detached := m.Payload
	d.Detach(m)
	if c := changed(was, m); len(c) > 0 || &m.Payload[0] != &detached[0] {
		t.Fatalf("a second Detach of %s changed it (%v), want nothing done", was.ID, c)
	}
	mine := []byte("mine")
	foreign := &ackwise.Message{ID: "not-delivered", Payload: mine}
	d.Detach(foreign)
	if &foreign.Payload[0] != &mine[0] || foreign.ID != "not-delivered" {
		t.Fatal("Detach changed a message the source did not deliver")
	}
	if c := changed(wasOther, other); len(c) > 0 {
		t.Fatalf("Detach of %s changed %v of %s", was.ID, c, wasOther.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	for _, x := range []*ackwise.Message{m, other} {
		if err := src.Ack(ctx, x); err != nil {
			t.Fatalf("ack of %s after Detach: %v", x.ID, err)
		}
	}
}

// testInvalidator checks OnInvalid where the source declares it: after an
// event that takes deliveries from the source (Fixture.Invalidate, or
// Close), the source calls f, by then Valid is false for some of the
// deliveries it holds (f may call Valid), and a delivery that stopped being
// Valid never is again.
func testInvalidator(t *testing.T, h Harness) {
	f, src, ext := h.declared(t, FixtureConfig{Lease: 10 * time.Second, Partitions: 2}, "Invalidator", func(e adapters.Extensions) bool { return e.Invalidator != nil },
		"the engine learns a delivery is lost when its wait ends")
	inv := ext.Invalidator
	const n = 8
	in := batch(n, n) // keys on every partition
	h.publish(t, f, in)
	var held []*ackwise.Message
	for range in {
		held = append(held, h.receiveOne(t, src))
	}
	var mu sync.Mutex
	var calls int
	var invalid []*ackwise.Message // not Valid when f was first called
	told := make(chan struct{})
	inv.OnInvalid(func() {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls > 1 {
			return
		}
		for _, m := range held {
			if !src.Valid(m) {
				invalid = append(invalid, m)
			}
		}
		close(told)
	})
	event, what := f.Invalidate, "Fixture.Invalidate"
	if event == nil {
		event, what = func(t testing.TB, src adapters.Source) {
			if err := src.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}, "Close"
	}
	event(t, src)
	select {
	case <-told:
	case <-time.After(h.Timeout):
		t.Fatalf("the source did not call OnInvalid's f within %v of %s", h.Timeout, what)
	}
	mu.Lock()
	gone := slices.Clone(invalid)
	mu.Unlock()
	if len(gone) == 0 {
		t.Fatalf("OnInvalid's f was called after %s while Valid was still true for all %d deliveries: f must come after Valid turned false", what, len(held))
	}
	for _, m := range gone {
		if src.Valid(m) {
			t.Fatalf("Valid(%s) true again after it was false", m.ID)
		}
	}
	t.Logf("%s made %d of %d deliveries no longer Valid", what, len(gone), len(held))
	// Hand back what is held, so that a rebalance waiting for it ends.
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	failed := 0
	var first error
	for _, m := range held {
		if err := src.Release(ctx, m); err != nil {
			failed++
			first = cmp.Or(first, err)
		}
	}
	if failed > 0 {
		t.Logf("Release after %s failed for %d deliveries (allowed: they were lost), the first with: %v", what, failed, first)
	}
}
