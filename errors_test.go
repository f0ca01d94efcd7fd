package ackwise_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

type httpError struct{ status int }

// asOnly converts itself to the errors it holds through As and Is methods,
// without Unwrap, as multi-error types written before errors.Join did.
type asOnly struct{ errs []error }

func (e asOnly) Error() string { return "several errors" }

func (e asOnly) Is(target error) bool {
	for _, err := range e.errs {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

func (e asOnly) As(target any) bool {
	for _, err := range e.errs {
		if errors.As(err, target) {
			return true
		}
	}
	return false
}

// asAndUnwrap wraps cause and converts itself, through As, to what as
// holds: errors.As tries the As method before it unwraps.
type asAndUnwrap struct{ cause, as error }

func (e asAndUnwrap) Error() string { return e.cause.Error() }

func (e asAndUnwrap) Unwrap() error { return e.cause }

func (e asAndUnwrap) As(target any) bool { return errors.As(e.as, target) }

func (e *httpError) Error() string { return http.StatusText(e.status) }

func TestClassSurvivesWrapping(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	cases := []struct {
		name  string
		err   error
		class ackwise.Class
		after time.Duration
	}{
		{"plain is transient", base, ackwise.ClassTransient, 0},
		{"permanent", ackwise.Permanent(base), ackwise.ClassPermanent, 0},
		{"wrapped permanent", fmt.Errorf("decode order: %w", ackwise.Permanent(base)), ackwise.ClassPermanent, 0},
		{"twice wrapped retry-after", fmt.Errorf("a: %w", fmt.Errorf("b: %w", ackwise.RetryAfter(base, time.Minute))), ackwise.ClassRateLimited, time.Minute},
		{"discard", ackwise.Discard(base), ackwise.ClassDiscard, 0},
		{"joined", errors.Join(errors.New("x"), ackwise.Permanent(base)), ackwise.ClassPermanent, 0},
		// The first operand with a mark other than Discard wins, however
		// deep; Discard only when every operand is discarded (ClassOf's doc).
		{"joined discard beside unmarked", errors.Join(ackwise.Discard(base), errors.New("db down")), ackwise.ClassTransient, 0},
		{"joined discard beside permanent", errors.Join(ackwise.Discard(base), ackwise.Permanent(errors.New("bad"))), ackwise.ClassPermanent, 0},
		{"joined discard beside retry-after", errors.Join(ackwise.Discard(base), fmt.Errorf("w: %w", ackwise.RetryAfter(errors.New("429"), time.Second))), ackwise.ClassRateLimited, time.Second},
		{"joined discards", errors.Join(ackwise.Discard(base), fmt.Errorf("w: %w", ackwise.Discard(errors.New("old")))), ackwise.ClassDiscard, 0},
		{"nested join with unmarked", errors.Join(ackwise.Discard(base), errors.Join(ackwise.Discard(errors.New("old")), errors.New("db down"))), ackwise.ClassTransient, 0},
		{"discard of a join", ackwise.Discard(errors.Join(base, errors.New("db down"))), ackwise.ClassDiscard, 0},
		{"several %w", fmt.Errorf("%w and %w", ackwise.Discard(base), errors.New("db down")), ackwise.ClassTransient, 0},
		{"joined deep mark first", errors.Join(fmt.Errorf("a: %w", ackwise.Permanent(base)), ackwise.Discard(errors.New("x"))), ackwise.ClassPermanent, 0},
		{"joined first mark wins", errors.Join(ackwise.Permanent(base), ackwise.RetryAfter(errors.New("429"), time.Second)), ackwise.ClassPermanent, 0},
		// errors.As honours an As method; so does the classification.
		{"As method", fmt.Errorf("w: %w", asOnly{[]error{base, ackwise.Permanent(errors.New("bad"))}}), ackwise.ClassPermanent, 0},
		{"As method before Unwrap", asAndUnwrap{cause: base, as: ackwise.Permanent(errors.New("bad"))}, ackwise.ClassPermanent, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ackwise.ClassOf(tc.err); got != tc.class {
				t.Fatalf("ClassOf = %v, want %v", got, tc.class)
			}
			if cl := ackwise.Classify(tc.err); cl.Class != tc.class || cl.After != tc.after {
				t.Fatalf("Classify = %+v, want %v after %v", cl, tc.class, tc.after)
			}
			if !errors.Is(tc.err, base) {
				t.Fatal("errors.Is lost the wrapped error")
			}
		})
	}
}

func TestClassifierMapsApplicationErrors(t *testing.T) {
	t.Parallel()
	byStatus := func(err error) (ackwise.Classification, bool) {
		var he *httpError
		if !errors.As(err, &he) {
			return ackwise.Classification{}, false
		}
		switch {
		case he.status == http.StatusTooManyRequests:
			return ackwise.Classification{Class: ackwise.ClassRateLimited, After: 30 * time.Second}, true
		case he.status >= 400 && he.status < 500:
			return ackwise.Classification{Class: ackwise.ClassPermanent}, true
		}
		return ackwise.Classification{}, false
	}
	if cl := ackwise.Classify(fmt.Errorf("charge: %w", &httpError{429}), byStatus); cl.Class != ackwise.ClassRateLimited || cl.After != 30*time.Second {
		t.Fatalf("429 → %+v", cl)
	}
	if cl := ackwise.Classify(&httpError{422}, byStatus); cl.Class != ackwise.ClassPermanent {
		t.Fatalf("422 → %+v", cl)
	}
	if cl := ackwise.Classify(&httpError{503}, byStatus); cl.Class != ackwise.ClassTransient {
		t.Fatalf("503 → %+v", cl)
	}
	// An explicit mark wins over a classifier.
	if cl := ackwise.Classify(ackwise.Discard(&httpError{422}), byStatus); cl.Class != ackwise.ClassDiscard {
		t.Fatalf("marked discard → %+v", cl)
	}
	// A Discard beside an unmarked error does not drop the message: the
	// classifiers decide, then ClassTransient.
	if cl := ackwise.Classify(errors.Join(ackwise.Discard(errors.New("obsolete")), &httpError{422}), byStatus); cl.Class != ackwise.ClassPermanent {
		t.Fatalf("discard joined with 422 → %+v", cl)
	}
	if cl := ackwise.Classify(errors.Join(ackwise.Discard(errors.New("obsolete")), &httpError{503}), byStatus); cl.Class != ackwise.ClassTransient {
		t.Fatalf("discard joined with 503 → %+v", cl)
	}
}

func TestParseClassRoundTrips(t *testing.T) {
	t.Parallel()
	for c := ackwise.ClassTransient; c <= ackwise.ClassDiscard; c++ {
		got, err := ackwise.ParseClass(c.String())
		if err != nil || got != c {
			t.Fatalf("ParseClass(%q) = %v, %v", c.String(), got, err)
		}
	}
	if _, err := ackwise.ParseClass("fatal"); err == nil {
		t.Fatal("unknown class accepted")
	}
}

func TestIsShutdown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	if ackwise.IsShutdown(ctx, context.Canceled) {
		t.Fatal("shutdown reported while ctx alive")
	}
	cancel()
	if !ackwise.IsShutdown(ctx, fmt.Errorf("query: %w", context.Canceled)) {
		t.Fatal("wrapped cancellation not seen as shutdown")
	}
	if ackwise.IsShutdown(ctx, errors.New("other")) {
		t.Fatal("unrelated error seen as shutdown")
	}
}

func TestChainOrder(t *testing.T) {
	t.Parallel()
	var trace []string
	mw := func(name string) ackwise.Middleware {
		return func(next ackwise.Handler) ackwise.Handler {
			return ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
				trace = append(trace, name)
				return next.Handle(ctx, m)
			})
		}
	}
	h := ackwise.Chain(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		trace = append(trace, "handler")
		return nil
	}), mw("a"), nil, mw("b"))
	_ = h.Handle(context.Background(), &ackwise.Message{})
	if fmt.Sprint(trace) != "[a b handler]" {
		t.Fatalf("order %v", trace)
	}
}

// TestMarkNilIsNil: marking a nil error gives nil, as backoff.Permanent
// does, so `return ackwise.Permanent(validate(msg))` succeeds for a valid
// message. Before, it returned a non-nil error and every valid message was
// dead-lettered (Discard: dropped; RetryAfter: retried).
func TestMarkNilIsNil(t *testing.T) {
	t.Parallel()
	for name, err := range map[string]error{
		"Permanent":  ackwise.Permanent(nil),
		"Discard":    ackwise.Discard(nil),
		"RetryAfter": ackwise.RetryAfter(nil, time.Second),
	} {
		if err != nil {
			t.Errorf("%s(nil) = %v (class %v), want nil", name, err, ackwise.ClassOf(err))
		}
	}
}
