package ackwise

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Class says what the engine does with a failed message.
type Class int

const (
	// ClassTransient failures are retried with backoff until the retry policy's
	// attempts run out, then dead-lettered with reason max-attempts. It is the
	// class of every error nothing else classifies.
	ClassTransient Class = iota
	// ClassPermanent failures cannot succeed on retry (a malformed payload, a
	// validation error): the message is dead-lettered at once.
	ClassPermanent
	// ClassRateLimited failures are retried after the delay the error carries
	// (see [RetryAfter]) instead of the policy's backoff; they still count as
	// attempts.
	ClassRateLimited
	// ClassDiscard failures are acknowledged and dropped on purpose, with a
	// count; nothing is dead-lettered.
	ClassDiscard
)

var classNames = [...]string{"transient", "permanent", "rate-limited", "discard"}

// String returns the class name used in the ackwise-dlq-error-class header.
func (c Class) String() string {
	if c >= 0 && int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// ParseClass is the inverse of [Class.String].
func ParseClass(s string) (Class, error) {
	for i, n := range classNames {
		if n == s {
			return Class(i), nil
		}
	}
	return 0, fmt.Errorf("ackwise: unknown error class %q", s)
}

// classified marks an error with a class. It unwraps to the error it wraps, so
// errors.Is and errors.As see through it.
type classified struct {
	err   error
	class Class
	after time.Duration
}

func (e *classified) Error() string { return e.err.Error() }

func (e *classified) Unwrap() error { return e.err }

// Permanent marks err as permanent: the message goes to the dead-letter
// destination at once, without retries. The mark survives %w wrapping.
// Permanent(nil) is nil, as with backoff.Permanent, so that
// `return ackwise.Permanent(validate(msg))` succeeds for a valid message.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, class: ClassPermanent}
}

// RetryAfter marks err as rate-limited: the message is retried after d
// instead of the retry policy's backoff (an HTTP 429 with Retry-After). The
// attempt still counts toward the policy's maximum. A d of zero or less uses
// the policy's backoff. The policy's MaxInterval does not cap d; a retry
// through the broker waits at most the source's Capabilities.MaxDelay.
// RetryAfter(nil, d) is nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, class: ClassRateLimited, after: d}
}

// Discard marks err as discardable: the message is acknowledged and dropped,
// counted but not dead-lettered. Use it for messages that are obsolete, not for
// ones that are broken. Joined with an error not marked Discard, it does not
// drop the message (see [ClassOf]). Discard(nil) is nil: the message is
// handled.
func Discard(err error) error {
	if err == nil {
		return nil
	}
	return &classified{err: err, class: ClassDiscard}
}

// ClassOf returns the class of err: the class mark found through %w
// wrapping, else ClassTransient. Through a chain of %w the outermost mark
// wins. Of an errors.Join (or a fmt.Errorf with several %w) the first
// operand carrying a mark other than Discard wins, wherever the mark sits
// inside it; Discard wins only when every operand is discarded, because a
// message is dropped only when nothing in its error asks for it to be kept:
// errors.Join(Discard(a), b) is transient, as b alone would be, and
// errors.Join(Discard(a), Permanent(b)) is permanent. A nil error has no
// class and returns ClassTransient; callers check for nil first.
func ClassOf(err error) Class {
	if c := markOf(err); c != nil {
		return c.class
	}
	return ClassTransient
}

// markOf returns the mark that classifies err, as ClassOf describes, or nil
// when there is none (or only Discard marks beside unmarked errors).
func markOf(err error) *classified {
	switch e := err.(type) {
	case nil:
		return nil
	case *classified:
		return e // the outermost mark of a chain
	}
	if x, ok := err.(interface{ As(any) bool }); ok {
		// An error that converts itself, tried before it is unwrapped, as
		// errors.As tries it.
		var c *classified
		if x.As(&c) {
			return c
		}
	}
	switch e := err.(type) {
	case interface{ Unwrap() error }:
		return markOf(e.Unwrap())
	case interface{ Unwrap() []error }:
		var discard *classified
		all := true // every operand discarded so far
		for _, op := range e.Unwrap() {
			switch c := markOf(op); {
			case c == nil:
				all = false
			case c.class != ClassDiscard:
				return c
			case discard == nil:
				discard = c
			}
		}
		if all {
			return discard
		}
	}
	return nil
}

// RetryAfterOf returns the delay carried by a [RetryAfter] error and whether
// there was one: the mark ClassOf classifies err by is a RetryAfter with a
// positive delay.
func RetryAfterOf(err error) (time.Duration, bool) {
	if c := markOf(err); c != nil && c.class == ClassRateLimited && c.after > 0 {
		return c.after, true
	}
	return 0, false
}

// Classification is the verdict on one error.
type Classification struct {
	Class Class
	// After is the delay a rate-limited error asked for; zero means the retry
	// policy's backoff.
	After time.Duration
}

// Classifier maps errors an application knows (a validation error, an HTTP
// 429) to a class. It returns ok=false for errors it does not recognize, which
// are then classified by [ClassOf]. A Classifier must be safe for concurrent
// use and must inspect errors with errors.Is/As, never by their text.
type Classifier func(err error) (c Classification, ok bool)

// Classify classifies err: the class marks set with [Permanent], [RetryAfter]
// or [Discard] win (the one [ClassOf] goes by), then each classifier in
// order, then ClassTransient.
func Classify(err error, classifiers ...Classifier) Classification {
	if c := markOf(err); c != nil {
		return Classification{Class: c.class, After: c.after}
	}
	for _, f := range classifiers {
		if f == nil {
			continue
		}
		if cl, ok := f(err); ok {
			return cl
		}
	}
	return Classification{Class: ClassTransient}
}

// IsShutdown reports whether err is the handler giving up because its
// context was cancelled or timed out by the engine's shutdown; such a failure
// is never settled, so the broker redelivers the message.
func IsShutdown(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}
