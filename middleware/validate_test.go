package middleware_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

func returning(err error) ackwise.Handler {
	return ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return err })
}

type schemaError struct{ field string }

func (e *schemaError) Error() string { return "schema: bad " + e.field }

func TestPermanentize(t *testing.T) {
	t.Parallel()
	var v struct{ N int }
	jsonSyntax := json.Unmarshal([]byte("{"), &v)
	jsonType := json.Unmarshal([]byte(`{"N":"x"}`), &v)
	_, b64 := base64.StdEncoding.DecodeString("!!!")
	_, num := strconv.Atoi("x")
	errDown := errors.New("db down")
	for _, tc := range []struct {
		name  string
		mw    ackwise.Middleware
		err   error
		class ackwise.Class
	}{
		{"json syntax", middleware.Permanentize(), fmt.Errorf("decode: %w", jsonSyntax), ackwise.ClassPermanent},
		{"json type", middleware.Permanentize(), jsonType, ackwise.ClassPermanent},
		{"base64", middleware.Permanentize(), b64, ackwise.ClassPermanent},
		{"strconv", middleware.Permanentize(), num, ackwise.ClassPermanent},
		{"ErrInvalid", middleware.Permanentize(), fmt.Errorf("amount: %w", middleware.ErrInvalid), ackwise.ClassPermanent},
		{"other stays transient", middleware.Permanentize(), errDown, ackwise.ClassTransient},
		{"context error stays", middleware.Permanentize(middleware.MatchIs(context.DeadlineExceeded)), context.DeadlineExceeded, ackwise.ClassTransient},
		{"class kept", middleware.Permanentize(), ackwise.RetryAfter(jsonSyntax, time.Second), ackwise.ClassRateLimited},
		{"MatchAs", middleware.Permanentize(middleware.MatchAs[*schemaError]()), fmt.Errorf("x: %w", &schemaError{"amount"}), ackwise.ClassPermanent},
		{"MatchIs", middleware.Permanentize(middleware.MatchIs(errDown)), errDown, ackwise.ClassPermanent},
		{"custom matchers replace defaults", middleware.Permanentize(middleware.MatchIs(errDown)), jsonSyntax, ackwise.ClassTransient},
	} {
		err := tc.mw(returning(tc.err)).Handle(t.Context(), &ackwise.Message{})
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: %v lost the original error", tc.name, err)
		}
		if c := ackwise.ClassOf(err); c != tc.class {
			t.Errorf("%s: class %v, want %v", tc.name, c, tc.class)
		}
	}
	if err := middleware.Permanentize()(returning(nil)).Handle(t.Context(), &ackwise.Message{}); err != nil {
		t.Fatalf("nil became %v", err)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ran := false
	next := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { ran = true; return nil })
	bad := &schemaError{"amount"}
	check := func(_ context.Context, msg *ackwise.Message) error {
		switch string(msg.Payload) {
		case "bad":
			return bad
		case "slow":
			return ackwise.RetryAfter(errors.New("schema registry busy"), time.Second)
		}
		return nil
	}
	h := middleware.Validate(check)(next)
	err := h.Handle(t.Context(), &ackwise.Message{Payload: []byte("bad")})
	if ran || ackwise.ClassOf(err) != ackwise.ClassPermanent || !errors.Is(err, middleware.ErrInvalid) || !errors.As(err, new(*schemaError)) {
		t.Fatalf("invalid message: ran %v, err %v; want a permanent ErrInvalid wrapping the check's error, handler not run", ran, err)
	}
	err = h.Handle(t.Context(), &ackwise.Message{Payload: []byte("slow")})
	if ran || ackwise.ClassOf(err) != ackwise.ClassRateLimited {
		t.Fatalf("classified check error: ran %v, err %v (class %v); want its class kept", ran, err, ackwise.ClassOf(err))
	}
	if err := h.Handle(t.Context(), &ackwise.Message{Payload: []byte("ok")}); err != nil || !ran {
		t.Fatalf("valid message: ran %v, err %v", ran, err)
	}
}

// TestValidateTimeoutIsNotInvalid: a check cut short by its deadline (a slow
// schema registry under middleware.Timeout) must not dead-letter a message
// that may be valid: it stays transient, like Permanentize's context errors.
func TestValidateTimeoutIsNotInvalid(t *testing.T) {
	t.Parallel()
	ran := false
	next := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { ran = true; return nil })
	check := func(ctx context.Context, _ *ackwise.Message) error {
		<-ctx.Done() // the lookup waits on a dependency until the deadline
		return fmt.Errorf("schema lookup: %w", ctx.Err())
	}
	h := middleware.Timeout(10 * time.Millisecond)(middleware.Validate(check)(next))
	err := h.Handle(t.Context(), &ackwise.Message{})
	if ran || !errors.Is(err, middleware.ErrTimeout) || ackwise.ClassOf(err) != ackwise.ClassTransient || errors.Is(err, middleware.ErrInvalid) {
		t.Fatalf("check timed out: ran %v, err %v (class %v); want a transient ErrTimeout, not invalid", ran, err, ackwise.ClassOf(err))
	}
}
