package middleware

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"strconv"

	"github.com/ackwise/ackwise"
)

// ErrInvalid marks a message that can never be handled: a payload that does
// not decode, a field that breaks the schema. Wrap it (fmt.Errorf("...: %w",
// middleware.ErrInvalid)) in validators and decoders; [Validate] and
// [Permanentize] turn it into a permanent error.
var ErrInvalid = errors.New("middleware: invalid message")

// ErrorMatcher reports whether err belongs to a family of errors. It must
// inspect err with errors.Is/As, never by its text, and be safe for
// concurrent use.
type ErrorMatcher func(err error) bool

// MatchIs matches errors for which errors.Is(err, target) holds.
func MatchIs(target error) ErrorMatcher {
	return func(err error) bool { return errors.Is(err, target) }
}

// MatchAs matches errors for which errors.As finds an E in err's chain.
func MatchAs[E error]() ErrorMatcher {
	return func(err error) bool {
		var e E
		return errors.As(err, &e)
	}
}

// DecodeErrors matches [ErrInvalid] and the decode errors of the standard
// library: encoding/json syntax, type and invalid-target errors,
// encoding/xml syntax errors, corrupt base64 and hex input, and
// strconv parse errors. A payload that failed to decode once fails every
// time, so these are permanent.
func DecodeErrors(err error) bool {
	var (
		jsonSyntax  *json.SyntaxError
		jsonType    *json.UnmarshalTypeError
		jsonInvalid *json.InvalidUnmarshalError
		xmlSyntax   *xml.SyntaxError
		b64         base64.CorruptInputError
		hexInvalid  hex.InvalidByteError
		num         *strconv.NumError
	)
	return errors.Is(err, ErrInvalid) ||
		errors.As(err, &jsonSyntax) || errors.As(err, &jsonType) || errors.As(err, &jsonInvalid) ||
		errors.As(err, &xmlSyntax) || errors.As(err, &b64) || errors.As(err, &hexInvalid) ||
		errors.Is(err, hex.ErrLength) || errors.As(err, &num)
}

// Validate returns middleware that runs check on each message before the
// handler. An error from check is returned marked [ackwise.Permanent] (it
// wraps [ErrInvalid] too), so the message goes to the dead-letter destination
// at once and the handler never sees it. An error that check already marked
// with a class keeps that class, and context errors are never marked (a
// check cut short by a timeout or a shutdown says nothing about the message:
// it is retried). check must be safe for concurrent use; a nil check
// disables the middleware.
func Validate(check func(ctx context.Context, msg *ackwise.Message) error) ackwise.Middleware {
	return func(next ackwise.Handler) ackwise.Handler {
		if check == nil {
			return next
		}
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			if err := check(ctx, msg); err != nil {
				if ackwise.ClassOf(err) != ackwise.ClassTransient ||
					errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
					return err
				}
				if !errors.Is(err, ErrInvalid) {
					err = fmt.Errorf("%w: %w", ErrInvalid, err)
				}
				return ackwise.Permanent(err)
			}
			return next.Handle(ctx, msg)
		})
	}
}

// Permanentize returns middleware that marks [ackwise.Permanent] every error
// the handler returns that one of match recognizes, so decode and schema
// errors reach the dead-letter destination at once instead of spending the
// retry budget. With no matchers it uses [DecodeErrors]. Errors that already
// carry a class ([ackwise.RetryAfter], [ackwise.Discard], …) keep it, and
// context errors are never marked (a cancelled handler is not a broken
// message).
func Permanentize(match ...ErrorMatcher) ackwise.Middleware {
	if len(match) == 0 {
		match = []ErrorMatcher{DecodeErrors}
	}
	return func(next ackwise.Handler) ackwise.Handler {
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			err := next.Handle(ctx, msg)
			if err == nil || ackwise.ClassOf(err) != ackwise.ClassTransient ||
				errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			for _, m := range match {
				if m != nil && m(err) {
					return ackwise.Permanent(err)
				}
			}
			return err
		})
	}
}
