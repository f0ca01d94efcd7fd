package ackwise

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// BatchHandler handles messages in batches: a database or warehouse writer
// that does better with one statement and one transaction for many rows.
// The consumer engine (consumer.NewBatch) calls it with up to its
// configured batch size of messages; messages of one key (or partition,
// under that ordering) never share a batch, so a batch holds the next
// message of each of its keys and per-key order holds across batches.
//
// HandleBatch reports an outcome for every message of msgs:
//   - nil: each one succeeded, and is acknowledged;
//   - a [*BatchError] with one entry per message: each has its own outcome
//     (nil for success), retried, dead-lettered or discarded by the class
//     of its own error, exactly as if a [Handler] had returned it;
//   - any other error: every message failed with it.
//
// HandleBatch may be called concurrently from many goroutines, for
// different batches. It must not keep msgs (or the messages in it) after it
// returns: the engine reuses them. The engine cancels ctx when the consumer
// shuts down past its drain deadline.
type BatchHandler interface {
	HandleBatch(ctx context.Context, msgs []*Message) error
}

// BatchHandlerFunc adapts an ordinary function to a [BatchHandler].
type BatchHandlerFunc func(ctx context.Context, msgs []*Message) error

// HandleBatch calls f(ctx, msgs).
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, msgs []*Message) error {
	return f(ctx, msgs)
}

// BatchMiddleware wraps a BatchHandler with behaviour of its own.
type BatchMiddleware func(BatchHandler) BatchHandler

// ChainBatch wraps h in the middleware mw, the first one outermost, as
// [Chain] does for a Handler.
func ChainBatch(h BatchHandler, mw ...BatchMiddleware) BatchHandler {
	for i := len(mw) - 1; i >= 0; i-- {
		if mw[i] != nil {
			h = mw[i](h)
		}
	}
	return h
}

// BatchError gives each message of a batch its own outcome: Errs[i] is
// the error of msgs[i] of the HandleBatch call (nil: it succeeded). A
// BatchError whose length differs from the batch's is a bug in the
// handler: the engine then fails every message of the batch with an error
// that says so.
//
// errors.Is and errors.As see every non-nil entry, and so do [ClassOf] and
// [Classify], as for an errors.Join; the engine reads the entries one by
// one.
type BatchError struct {
	Errs []error
}

// NewBatchError returns a BatchError for a batch of n messages, every
// entry nil (succeeded) until set.
func NewBatchError(n int) *BatchError {
	return &BatchError{Errs: make([]error, n)}
}

// Set records err as the outcome of the batch's message i.
func (e *BatchError) Set(i int, err error) { e.Errs[i] = err }

// Err returns nil when every entry is nil, else e: what a HandleBatch that
// filled e returns.
func (e *BatchError) Err() error {
	for _, err := range e.Errs {
		if err != nil {
			return e
		}
	}
	return nil
}

// maxBatchListed bounds how many failures Error spells out.
const maxBatchListed = 3

// Error names how many messages of the batch failed and the first few.
func (e *BatchError) Error() string {
	var b strings.Builder
	failed := 0
	for _, err := range e.Errs {
		if err != nil {
			failed++
		}
	}
	fmt.Fprintf(&b, "%d of %d message(s) of the batch failed:", failed, len(e.Errs))
	listed := 0
	for i, err := range e.Errs {
		if err == nil {
			continue
		}
		if listed == maxBatchListed {
			fmt.Fprintf(&b, "; and %d more", failed-maxBatchListed)
			break
		}
		if listed > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, " msgs[%d]: %v", i, err)
		listed++
	}
	return b.String()
}

// Unwrap returns the non-nil entries, in order.
func (e *BatchError) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// ErrBatchLength is the error of every message of a batch whose handler
// returned a [*BatchError] with a length other than the batch's.
var ErrBatchLength = errors.New("ackwise: batch handler returned a BatchError whose length differs from the batch's")

// BatchOutcomes fills errs, one entry per message of a batch of len(errs),
// from err, the error HandleBatch returned: nil everywhere for nil, the
// entries of a *BatchError of the right length, else err for every message
// (ErrBatchLength, wrapped, for a *BatchError of another length).
func BatchOutcomes(err error, errs []error) {
	if err == nil {
		clear(errs)
		return
	}
	var be *BatchError
	if errors.As(err, &be) {
		if len(be.Errs) == len(errs) {
			copy(errs, be.Errs)
			return
		}
		err = fmt.Errorf("%w: %d entries for %d messages", ErrBatchLength, len(be.Errs), len(errs))
	}
	for i := range errs {
		errs[i] = err
	}
}
