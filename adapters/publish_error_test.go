package adapters_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

func TestPublishError(t *testing.T) {
	t.Parallel()
	if err := adapters.NewPublishError(make([]error, 3)); err != nil {
		t.Fatalf("NewPublishError of no failures = %v, want nil", err)
	}
	transient := errors.New("nacked")
	tooLarge := ackwise.Permanent(errors.New("too large"))
	gone := ackwise.Discard(errors.New("gone"))
	errs := []error{nil, transient, nil, tooLarge, gone, transient, transient}
	err := adapters.NewPublishError(errs)
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok || len(pe.Failed) != 5 || pe.Failed[0].Index != 1 || pe.Failed[1].Index != 3 {
		t.Fatalf("NewPublishError = %#v", err)
	}
	if !errors.Is(err, transient) || !errors.Is(err, tooLarge) {
		t.Error("errors.Is does not see every failure")
	}
	if c := ackwise.ClassOf(err); c != ackwise.ClassPermanent {
		t.Errorf("class %v, want permanent (one failure is)", c)
	}
	if c := ackwise.ClassOf(adapters.NewPublishError([]error{gone, transient})); c != ackwise.ClassTransient {
		t.Errorf("class of discard and transient %v, want transient (as errors.Join)", c)
	}
	if c := ackwise.ClassOf(adapters.NewPublishError([]error{gone, nil, gone})); c != ackwise.ClassDiscard {
		t.Errorf("class of discards %v, want discard", c)
	}
	want := "5 message(s) not published: msgs[1]: nacked; msgs[3]: too large; msgs[4]: gone; and 2 more"
	if got := err.Error(); got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}

	// PublishFailures: the list of a PublishError, wrapped or not; every
	// message for a plain error or a list that does not fit.
	if f := adapters.PublishFailures(errors.Join(errors.New("ctx"), err), len(errs)); len(f) != 5 || f[1].Index != 3 {
		t.Errorf("PublishFailures of a wrapped PublishError = %v", f)
	}
	plain := errors.New("closed")
	if f := adapters.PublishFailures(plain, 2); len(f) != 2 || f[0] != (adapters.PublishFailure{Index: 0, Err: plain}) || f[1].Index != 1 {
		t.Errorf("PublishFailures of a plain error = %v", f)
	}
	if f := adapters.PublishFailures(err, 4); len(f) != 4 || f[3].Err != err {
		t.Errorf("PublishFailures of a PublishError with an index out of range = %v, want every message", f)
	}
	if f := adapters.PublishFailures(nil, 2); f != nil {
		t.Errorf("PublishFailures(nil) = %v", f)
	}
	if strings.Contains(err.Error(), "msgs[6]") {
		t.Error("Error() lists more than the first few")
	}
}
