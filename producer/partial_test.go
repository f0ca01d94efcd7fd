package producer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/retry"
)

// scriptedSink fails, on its nth call, the messages the script's nth map
// names (by event ID) with their errors, and confirms the others. It
// records the IDs of every call.
type scriptedSink struct {
	script []map[string]error
	calls  [][]string
}

func (s *scriptedSink) Publish(_ context.Context, msgs ...*ackwise.Message) error {
	var ids []string
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		ids = append(ids, m.ID)
		if n := len(s.calls); n < len(s.script) {
			errs[i] = s.script[n][m.ID]
		}
	}
	s.calls = append(s.calls, ids)
	return adapters.NewPublishError(errs)
}

func (s *scriptedSink) Close() error { return nil }

// A sink that reports per message gets only the failed messages again:
// the confirmed ones are not published twice, a permanent failure is not
// retried while a transient one beside it is, and the error lists, by the
// caller's indexes, only the messages that failed in the end.
func TestPublishRetriesOnlyFailedMessages(t *testing.T) {
	t.Parallel()
	tooLarge := ackwise.Permanent(errors.New("too large"))
	nacked := errors.New("nacked")
	sink := &scriptedSink{script: []map[string]error{
		{"b": tooLarge, "c": nacked, "d": nacked},
		{"d": nacked},
	}}
	p, err := producer.New(sink, producer.Config{Retry: retry.Policy{MaxAttempts: 5, InitialInterval: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*ackwise.Message
	for _, id := range []string{"a", "b", "c", "d"} {
		msgs = append(msgs, &ackwise.Message{ID: id})
	}
	err = p.Publish(context.Background(), msgs...)
	if g := fmt.Sprint(sink.calls); g != "[[a b c d] [c d] [d]]" {
		t.Fatalf("calls %s, want the failed transient messages only, again", g)
	}
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok || len(pe.Failed) != 1 || pe.Failed[0].Index != 1 || !errors.Is(pe.Failed[0].Err, tooLarge) {
		t.Fatalf("Publish = %v, want an adapters.PublishError listing msgs[1] (b) alone", err)
	}
	if ackwise.ClassOf(err) != ackwise.ClassPermanent {
		t.Errorf("class %v, want permanent", ackwise.ClassOf(err))
	}
}

// A transient failure that outlasts the attempts is listed with the
// caller's index, beside a message confirmed on a later attempt.
func TestPublishListsWhatFailedInTheEnd(t *testing.T) {
	t.Parallel()
	nacked := errors.New("nacked")
	sink := &scriptedSink{script: []map[string]error{
		{"a": nacked, "c": nacked},
		{"c": nacked},
		{"c": nacked},
	}}
	p, err := producer.New(sink, producer.Config{Retry: retry.Policy{MaxAttempts: 3, InitialInterval: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []*ackwise.Message{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	err = p.Publish(context.Background(), msgs...)
	failed := adapters.PublishFailures(err, len(msgs))
	if len(failed) != 1 || failed[0].Index != 2 || !errors.Is(failed[0].Err, nacked) {
		t.Fatalf("Publish = %v, want msgs[2] (c) alone failed", err)
	}
	if !slices.Equal(sink.calls[1], []string{"a", "c"}) || len(sink.calls) != 3 {
		t.Fatalf("calls %v", sink.calls)
	}
}

// fixedSink returns err from every Publish call.
type fixedSink struct{ err error }

func (s fixedSink) Publish(context.Context, ...*ackwise.Message) error { return s.err }
func (s fixedSink) Close() error                                       { return nil }

// A sink's PublishError that lists no message, or a message without an
// error, says nothing usable about which failed: Publish must not take it
// for a success (the messages were not confirmed); it stands for every
// message, as an error that is no PublishError does.
func TestPublishMalformedPublishErrorIsNoSuccess(t *testing.T) {
	t.Parallel()
	for name, perr := range map[string]*adapters.PublishError{
		"empty":   {},
		"nil Err": {Failed: []adapters.PublishFailure{{Index: 1}}},
	} {
		p, err := producer.New(fixedSink{perr}, producer.Config{Retry: retry.Policy{MaxAttempts: 2, InitialInterval: time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		msgs := []*ackwise.Message{{ID: "a"}, {ID: "b"}}
		err = p.Publish(context.Background(), msgs...)
		if err == nil {
			t.Errorf("%s: Publish = nil, want an error: the sink confirmed nothing", name)
			continue
		}
		if f := adapters.PublishFailures(err, len(msgs)); len(f) != 2 {
			t.Errorf("%s: PublishFailures = %v, want both messages", name, f)
		}
	}
}
