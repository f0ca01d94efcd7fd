package adapters

import (
	"errors"
	"fmt"
	"strings"
)

// PublishError is the error of a [Sink.Publish] call that knows which of
// its messages failed. Failed lists them in ascending Index order, each with
// its own error; a message of the call not listed was confirmed by the
// broker. A listed message was not confirmed, which is not the same as not
// published: one whose error is the ctx's or a lost connection's may still
// have been stored.
//
// errors.Is and errors.As see every listed error, and so do
// [ackwise.ClassOf] and [ackwise.Classify], as for an errors.Join: the
// error's class is that of the first failure marked other than Discard
// (a Permanent failure listed after a RetryAfter one leaves the error
// rate-limited), and Discard only when every failure is discarded. Read the
// failures one by one ([PublishFailures]) to act on each.
type PublishError struct {
	Failed []PublishFailure
}

// PublishFailure is one message a Publish call could not get confirmed.
type PublishFailure struct {
	// Index is the message's position in the msgs of the Publish call.
	Index int
	// Err says why, with the sink's usual text and class marks.
	Err error
}

// maxListed bounds how many failures Error spells out.
const maxListed = 3

// Error names how many messages failed and the first few, with their
// errors.
func (e *PublishError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d message(s) not published:", len(e.Failed))
	for i, f := range e.Failed {
		if i == maxListed {
			fmt.Fprintf(&b, "; and %d more", len(e.Failed)-maxListed)
			break
		}
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, " msgs[%d]: %v", f.Index, f.Err)
	}
	return b.String()
}

// Unwrap returns the error of every failed message, in Index order.
func (e *PublishError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		errs[i] = f.Err
	}
	return errs
}

// NewPublishError returns the error of a Publish call whose message i ended
// with errs[i] (nil: confirmed): nil when every one is nil, else a
// *PublishError listing the others.
func NewPublishError(errs []error) error {
	var failed []PublishFailure
	for i, err := range errs {
		if err != nil {
			failed = append(failed, PublishFailure{Index: i, Err: err})
		}
	}
	if failed == nil {
		return nil
	}
	return &PublishError{Failed: failed}
}

// PublishFailures returns the messages that err, the error of a Publish
// call of n messages, says were not confirmed: the list of the
// *PublishError found in err (errors.As) when it is well formed (at least
// one failure, each with an error, indexes ascending and below n), else
// every message, with err. It returns nil for a nil err.
func PublishFailures(err error, n int) []PublishFailure {
	if err == nil {
		return nil
	}
	if pe, ok := errors.AsType[*PublishError](err); ok && fits(pe, n) {
		return pe.Failed
	}
	all := make([]PublishFailure, n)
	for i := range all {
		all[i] = PublishFailure{Index: i, Err: err}
	}
	return all
}

// fits reports whether pe lists at least one failure, each with an error,
// and its indexes are ascending and below n. Not so, it tells nothing
// usable (an error that lists no message would pass for a success).
func fits(pe *PublishError, n int) bool {
	if len(pe.Failed) == 0 {
		return false
	}
	prev := -1
	for _, f := range pe.Failed {
		if f.Err == nil || f.Index <= prev || f.Index >= n {
			return false
		}
		prev = f.Index
	}
	return true
}
